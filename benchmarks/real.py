"""`runwatch bench real`: runwatch's detectors scored on the labelled real corpus
(``tests/realcorpus``, issue 22 parts 2 and 6), the dev and the test half apart.

The synthetic suite of ``bench detect`` was written beside the detectors; this corpus was
labelled by hand from the raw numbers (``PROTOCOL.md``) and split by a hash of each path
before any tuning, so its **test half is the headline figure** and is never used for
tuning. Each file is read as ``runwatch analyze`` reads it (:func:`bot.inspection.analyzed`, the
default configuration) and its findings are scored against ``LABELS.toml``.

A label family/kind is reached by these signals:

| label family / kind | runwatch signals |
|---|---|
| loss / nonfinite, spike | spike |
| loss / instability, divergence | divergence, spike |
| eval / nonfinite | spike (on the eval metric the label names) |
| eval / overfit | overfit |
| grad_norm / spike, shift | grad_norm |
| throughput / drop | throughput_drop |
| plateau / plateau | plateau |
| rl / loss_burst | divergence |
| rl / reward_collapse | reward_collapse |
| rl / nonfinite | spike |

Scoring:

- A finding **matches** an event when its signal reaches the event's family/kind, its
  metric is the label's (both names through the alias table, case aside; when runwatch read
  no tag of the label's name the metric is not compared, and the dev outcomes say so), and
  either its onset lies within the **tolerance** of the label's onset — 5 logged points of
  the label's metric (of the finding's, where runwatch read no tag of the label's name)
  before or after it, widened to 2% of the file's step span where that is more — or the
  finding spans the label's onset (its onset before it and it resolved at or after it, or
  still firing).
- A clear or mild event is **found** when a finding matches it; its delay is the earliest
  matching finding's ``detected_step`` − the label's onset, in those logged points and in %
  of the file's step span (negative: raised before the labelled onset).
- Borderline events are neither required nor punished: a finding that matches one is no
  false alarm. A finding that matches no event of any grade is a **false alarm**; findings
  of signals the corpus does not label (oscillation, lr_schedule, …) are false alarms too,
  so the figure is what a user would be shown. Files with status ``excluded`` are skipped.
- Precision is the share of findings matching a clear or mild event among those that are
  not borderline matches; F1 joins it with the recall on clear and mild events.
- On healthy files: findings, critical findings and **channel messages** — findings at or
  above ``[alerting] min_severity`` (default ``warning``), the ones the alert lifecycle
  posts — per healthy file, each counted once (grouping may post several in one message,
  so this is an upper bound).
"""

from __future__ import annotations

import csv
import logging
import statistics
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import track
from rich.table import Table

from analyzers import Finding
from bot.alerting.pipeline import SEVERITY_RANK
from bot.config import AlertingConfig, Config, Secrets, Settings
from connectors.aliases import AliasTable

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "realcorpus"
SPLITS = ("test", "dev")
FAMILIES = ("loss", "eval", "grad_norm", "throughput", "plateau", "rl")
SIGNALS: dict[tuple[str, str], frozenset[str]] = {
    ("loss", "nonfinite"): frozenset({"spike"}),
    ("loss", "spike"): frozenset({"spike"}),
    ("loss", "instability"): frozenset({"divergence", "spike"}),
    ("loss", "divergence"): frozenset({"divergence", "spike"}),
    ("eval", "nonfinite"): frozenset({"spike"}),
    ("eval", "overfit"): frozenset({"overfit"}),
    ("grad_norm", "spike"): frozenset({"grad_norm"}),
    ("grad_norm", "shift"): frozenset({"grad_norm"}),
    ("throughput", "drop"): frozenset({"throughput_drop"}),
    ("plateau", "plateau"): frozenset({"plateau"}),
    ("rl", "loss_burst"): frozenset({"divergence"}),
    ("rl", "reward_collapse"): frozenset({"reward_collapse"}),
    ("rl", "nonfinite"): frozenset({"spike"}),
}
COUNTED = ("clear", "mild")  # the grades recall is measured on
TOLERANCE_POINTS = 5
TOLERANCE_SHARE = 0.02
_ALIASES = AliasTable()


def _name(metric: str) -> str:
    return _ALIASES.canonical(metric).lower()


@dataclass(frozen=True)
class Event:
    """One labelled event of one file."""

    path: str
    family: str
    kind: str
    metric: str
    onset: int
    grade: str


@dataclass(frozen=True)
class LabelledFile:
    path: str
    split: str
    status: str  # healthy | event | excluded
    events: tuple[Event, ...] = ()


@dataclass
class FileRead:
    """What runwatch made of one file: its findings, and the steps each tag was logged at
    (the points delays and tolerances are counted in)."""

    findings: list[Finding] = field(default_factory=list)
    steps: dict[str, np.ndarray] = field(default_factory=dict)  # canonical, lowercase tag
    error: str | None = None  # why nothing could be read

    @property
    def points(self) -> int:
        return sum(len(s) for s in self.steps.values())

    def span(self) -> tuple[int, int]:
        every = [s for s in self.steps.values() if len(s)]
        return (int(min(s[0] for s in every)), int(max(s[-1] for s in every))) if every \
            else (0, 0)

    def steps_of(self, metric: str) -> np.ndarray | None:
        """The label's metric's steps, or None when runwatch read no tag of that name."""
        return self.steps.get(_name(metric))


def load_corpus(root: Path = CORPUS) -> list[LabelledFile]:
    """The manifest's files with their frozen split and their labels."""
    with open(root / "MANIFEST.csv", newline="") as handle:
        splits = {row["path"]: row["split"] for row in csv.DictReader(handle)}
    labels = tomllib.loads((root / "LABELS.toml").read_text())["file"]
    files = []
    for entry in labels:
        events = tuple(Event(entry["path"], e["family"], e["kind"], e.get("metric", ""),
                             int(e["onset"]), e["grade"]) for e in entry.get("event", []))
        files.append(LabelledFile(entry["path"], splits[entry["path"]], entry["status"],
                                  events))
    missing = set(splits) - {f.path for f in files}
    if missing:
        raise ValueError(f"unlabelled manifest files: {', '.join(sorted(missing))}")
    return files


def read_file(path: Path) -> FileRead:
    """Findings as ``runwatch analyze`` gives them with the default configuration."""
    from bot.inspection import analyzed

    settings = Settings(config=Config(), secrets=Secrets(), config_path=None,
                        db_path=":memory:")
    read = FileRead()
    try:
        with analyzed(settings, str(path)) as (engine, ingested, findings):
            read.findings = findings
            for run in sorted(ingested):
                metrics = engine.store.run_data(run).metrics
                for tag, group in metrics.groupby("tag"):
                    steps = np.sort(group["step"].to_numpy(dtype=np.int64))
                    key = _name(str(tag))
                    read.steps[key] = np.sort(np.concatenate([read.steps[key], steps])) \
                        if key in read.steps else steps
    except ValueError as exc:  # a file runwatch cannot read
        read.error = str(exc)
    if not read.steps and read.error is None:
        read.error = "no metric points found"
    return read


def read_corpus(files: list[LabelledFile], root: Path = CORPUS,
                console: Console | None = None) -> dict[str, FileRead]:
    """Every file that is not excluded, read; the engine's per-file notices (malformed
    lines, …) are held back, 150 files' worth would bury the tables."""
    logger = logging.getLogger("runwatch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        wanted = [f for f in files if f.status != "excluded"]
        return {f.path: read_file(root / f.path)
                for f in track(wanted, description="reading the real corpus",
                               console=console or Console(), transient=True)}
    finally:
        logger.setLevel(level)


def _points(event: Event, finding: Finding, read: FileRead) -> np.ndarray:
    """The steps of the label's metric, or of the finding's where runwatch read no tag of
    the label's name (or the label names none): what tolerance and delay count in."""
    steps = read.steps_of(event.metric) if event.metric else None
    return steps if steps is not None else read.steps.get(_name(finding.metric),
                                                          np.empty(0, dtype=np.int64))


def _window(event: Event, finding: Finding, read: FileRead) -> tuple[float, float]:
    """The steps a finding's onset may lie in: 5 logged points either side of the label's
    onset, or 2% of the file's span, whichever reaches further."""
    first, last = read.span()
    slack = TOLERANCE_SHARE * (last - first)
    low, high = event.onset - slack, event.onset + slack
    steps = _points(event, finding, read)
    if len(steps):
        i = int(np.searchsorted(steps, event.onset))
        low = min(low, steps[max(i - TOLERANCE_POINTS, 0)])
        high = max(high, steps[min(i + TOLERANCE_POINTS, len(steps) - 1)])
    return low, high


def matches(finding: Finding, event: Event, read: FileRead) -> bool:
    """Whether ``finding`` reports ``event`` (see the module's docstring)."""
    if finding.signal not in SIGNALS.get((event.family, event.kind), ()):
        return False
    if event.metric and read.steps_of(event.metric) is not None \
            and _name(finding.metric) != _name(event.metric):
        return False
    low, high = _window(event, finding, read)
    end = finding.resolved_step if finding.resolved_step is not None else read.span()[1]
    return low <= finding.onset_step <= high or finding.onset_step <= event.onset <= end


@dataclass
class Delay:
    points: int
    share: float  # of the file's step span, in %


def _delay(finding: Finding, event: Event, read: FileRead) -> Delay:
    steps = _points(event, finding, read)
    late = int(np.count_nonzero((steps > event.onset) & (steps <= finding.detected_step)))
    early = int(np.count_nonzero((steps > finding.detected_step) & (steps <= event.onset)))
    first, last = read.span()
    return Delay(late - early, 100.0 * (finding.detected_step - event.onset)
                 / max(last - first, 1))


@dataclass
class Outcome:
    """One file scored: events found (with their delay) or missed, false alarms, and the
    findings that only matched a borderline event."""

    file: LabelledFile
    read: FileRead
    found: list[tuple[Event, Finding, Delay]] = field(default_factory=list)
    missed: list[Event] = field(default_factory=list)
    true: list[Finding] = field(default_factory=list)
    borderline: list[Finding] = field(default_factory=list)
    false: list[Finding] = field(default_factory=list)
    unnamed: list[Event] = field(default_factory=list)  # label metric not among the tags


def score_file(file: LabelledFile, read: FileRead) -> Outcome:
    outcome = Outcome(file, read)
    counted = [e for e in file.events if e.grade in COUNTED]
    for event in file.events:
        if event.metric and read.steps and read.steps_of(event.metric) is None:
            outcome.unnamed.append(event)
    for event in counted:
        hits = [f for f in read.findings if matches(f, event, read)]
        if hits:
            first = min(hits, key=lambda f: (f.detected_step, f.onset_step))
            outcome.found.append((event, first, _delay(first, event, read)))
        else:
            outcome.missed.append(event)
    for finding in read.findings:
        if any(matches(finding, e, read) for e in counted):
            outcome.true.append(finding)
        elif any(matches(finding, e, read) for e in file.events):
            outcome.borderline.append(finding)
        else:
            outcome.false.append(finding)
    return outcome


def score(files: list[LabelledFile], reads: dict[str, FileRead]) -> list[Outcome]:
    """Every file that is not excluded and was read, scored."""
    return [score_file(f, reads[f.path]) for f in files
            if f.status != "excluded" and f.path in reads]


def _ratio(hit: int, total: int) -> str:
    return f"{hit}/{total} = {hit / total:.2f}" if total else "— (no event)"


def _delays(found: list[tuple[Event, Finding, Delay]]) -> str:
    if not found:
        return "—"
    points = statistics.median(d.points for _, _, d in found)
    share = statistics.median(d.share for _, _, d in found)
    return f"{points:g} pts, {share:.1f}% of the run"


def summarise(outcomes: list[Outcome], min_severity: str = "warning") -> dict[str, Any]:
    """The figures of one half, as rows of a figure | value table."""
    found = [x for o in outcomes for x in o.found]
    missed = [e for o in outcomes for e in o.missed]
    events = len(found) + len(missed)
    healthy = [o for o in outcomes if o.file.status == "healthy"]
    true = sum(len(o.true) for o in outcomes)
    false = sum(len(o.false) for o in outcomes)
    precision = true / (true + false) if true + false else 1.0
    recall = len(found) / events if events else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    lowest = SEVERITY_RANK[min_severity]
    posted = sum(SEVERITY_RANK[f.severity] >= lowest for o in healthy for f in o.read.findings)
    unread = sorted(Path(o.file.path).name for o in outcomes if o.read.error)
    by_signal = Counter(f.signal for o in outcomes for f in o.false)
    result: dict[str, Any] = {
        "files scored": f"{len(outcomes)} ({len(healthy)} healthy, "
                        f"{len(outcomes) - len(healthy)} with an event)",
        "files that gave no points": f"{len(unread)}" + (f" ({', '.join(unread)})"
                                                         if unread else ""),
        "recall, clear + mild": _ratio(len(found), events),
    }
    for family in FAMILIES:
        hit = [x for x in found if x[0].family == family]
        total = len(hit) + sum(e.family == family for e in missed)
        result[f"recall: {family}"] = _ratio(len(hit), total) + (
            f"; median delay {_delays(hit)}" if hit else "")
    nonfinite = [x for x in found if x[0].kind == "nonfinite"]
    result["recall: non-finite"] = _ratio(
        len(nonfinite), len(nonfinite) + sum(e.kind == "nonfinite" for e in missed)) + (
        f"; median delay {_delays(nonfinite)}" if nonfinite else "")
    result["median delay (found events)"] = _delays(found)
    result["labelled events on a metric runwatch did not read under that name"] = sum(
        len(o.unnamed) for o in outcomes)
    result["findings"] = (f"{true + false + sum(len(o.borderline) for o in outcomes)} "
                          f"({true} on clear/mild events, "
                          f"{sum(len(o.borderline) for o in outcomes)} on borderline events, "
                          f"{false} false alarms)")
    result["false alarms by signal"] = ", ".join(
        f"{s} {n}" for s, n in by_signal.most_common()) or "none"
    result[f"false alarms ≥ {min_severity} (posted)"] = sum(
        SEVERITY_RANK[f.severity] >= lowest for o in outcomes for f in o.false)
    result["precision"] = f"{precision:.2f}"
    result["F1"] = f"{f1:.2f}"
    per = len(healthy) or 1
    result["healthy files: findings per file"] = (
        f"{sum(len(o.read.findings) for o in healthy) / per:.2f} "
        f"({sum(bool(o.read.findings) for o in healthy)} of {len(healthy)} files have any)")
    result["healthy files: critical findings"] = sum(
        f.severity == "critical" for o in healthy for f in o.read.findings)
    result[f"healthy files: channel messages per file (≥ {min_severity})"] = \
        f"{posted / per:.2f} ({posted} in all)"
    return result


def outcome_lines(outcomes: list[Outcome]) -> list[str]:
    """Per file, what was missed and what was raised for nothing: to guide tuning, so only
    ever called on the dev half."""
    lines = []
    for o in outcomes:
        notes = [f"  missed {e.family}/{e.kind} ({e.grade}) on {e.metric or '-'} at {e.onset}"
                 for e in o.missed]
        notes += [f"  found {e.family}/{e.kind} ({e.grade}) at {e.onset}: {f.signal} on "
                  f"{f.metric}, onset {f.onset_step}, detected {f.detected_step} "
                  f"(delay {d.points} pts, {d.share:.1f}%)" for e, f, d in o.found]
        notes += [f"  false alarm: {f.signal} {f.severity} on {f.metric}, onset "
                  f"{f.onset_step}, detected {f.detected_step}"
                  + (f", resolved {f.resolved_step}" if f.resolved_step is not None else "")
                  for f in o.false]
        notes += [f"  label metric {e.metric!r} is not among the tags read "
                  f"({', '.join(sorted(o.read.steps)) or 'none'})" for e in o.unnamed]
        if o.read.error:
            notes.append(f"  unread: {o.read.error}")
        if notes:
            lines.append(f"{o.file.path} [{o.file.status}]")
            lines.extend(notes)
    return lines


def _table(title: str, result: dict[str, Any]) -> Table:
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value")
    for key, value in result.items():
        table.add_row(key, str(value))
    return table


SCORING = (f"found: a finding of a mapped signal on the label's metric with its onset within "
           f"max({TOLERANCE_POINTS} logged points, {TOLERANCE_SHARE:.0%} of the run) of the "
           f"labelled onset, or spanning it; borderline events neither required nor "
           f"punished; every other finding a false alarm (mapping: benchmarks/real.py)")


def main_real(*, output: str, console: Console, outcomes: bool = False,
              root: Path = CORPUS) -> int:
    from benchmarks.report import write_section

    started = time.perf_counter()
    # Tuning (``--outcomes``) reads the dev half alone: the test half's figures are not
    # shown while anyone tunes, only in the run that reports them.
    splits = ("dev",) if outcomes else SPLITS
    files = [f for f in load_corpus(root) if f.split in splits]
    reads = read_corpus(files, root, console)
    min_severity = AlertingConfig().min_severity
    titles = {"test": "Real corpus, test half: the headline (issue 22)",
              "dev": "Real corpus, dev half: the only half tuned on (issue 22)"}
    for split in splits:
        scored = score([f for f in files if f.split == split], reads)
        result = {"scoring": SCORING, **summarise(scored, min_severity),
                  "files excluded by label": sum(f.status == "excluded" for f in files
                                                 if f.split == split)}
        console.print(_table(titles[split], result))
        write_section(Path(output), titles[split], "runwatch bench real", result)
        if outcomes and split == "dev":
            console.print("\n".join(outcome_lines(scored)), markup=False, highlight=False)
    console.print(f"{len(reads)} files read and scored in {time.perf_counter() - started:.0f} s;"
                  f" written to {output}")
    return 0
