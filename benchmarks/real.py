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

- An onset labelled as an epoch number where runwatch reads the rows by step (a Lightning
  CSV labelled per epoch) is first mapped to that epoch's first step of the label's metric
  through the run's ``epoch`` tag (:func:`in_steps`, PROTOCOL.md), on both halves.
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
import math
import statistics
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field, replace
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
    epoch: int | None = None  # the onset as labelled, where it was an epoch (see in_steps)


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
    values: dict[str, np.ndarray] = field(default_factory=dict)  # aligned with ``steps``
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
                    steps = group["step"].to_numpy(dtype=np.int64)
                    values = group["value"].to_numpy(dtype=float)
                    key = _name(str(tag))
                    if key in read.steps:
                        steps = np.concatenate([read.steps[key], steps])
                        values = np.concatenate([read.values[key], values])
                    order = np.argsort(steps, kind="stable")
                    read.steps[key], read.values[key] = steps[order], values[order]
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


def in_steps(event: Event, read: FileRead) -> Event:
    """``event`` with its onset in the steps runwatch reads rows by. A label's onset is the
    step the log prints (PROTOCOL.md), but a log that prints an epoch beside the step (a
    Lightning CSV, early-stopped per epoch) may carry labels counted in epochs: an onset
    that is none of the label metric's logged steps (of any tag's, where the label names
    no metric runwatch read) but is one of the run's logged ``epoch`` values is read as
    that epoch and mapped to the first step of the label's metric logged in it (at or
    after the first row of that epoch; that row's own step where the metric is not logged
    after it). A unit conversion, the same on both halves; ``epoch`` keeps the labelled
    number."""
    epochs = read.values.get("epoch")
    if event.epoch is not None or epochs is None or not len(epochs):
        return event
    steps = read.steps_of(event.metric) if event.metric else None
    logged = steps if steps is not None else np.concatenate(list(read.steps.values()))
    if event.onset in logged:
        return event
    rows = np.flatnonzero(np.isfinite(epochs) & (epochs == event.onset))
    if not rows.size:
        return event
    first = int(read.steps["epoch"][rows[0]])
    later = steps[steps >= first] if steps is not None else np.empty(0, dtype=np.int64)
    return replace(event, onset=int(later[0]) if later.size else first, epoch=event.onset)


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
    events = [in_steps(e, read) for e in file.events]
    counted = [e for e in events if e.grade in COUNTED]
    for event in events:
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
        elif any(matches(finding, e, read) for e in events):
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
    result["clear + mild onsets labelled in epochs, read as steps"] = sum(
        e.epoch is not None for e in [x[0] for x in found] + missed)
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


def _onset(event: Event) -> str:
    return f"{event.onset}" + (f" (epoch {event.epoch})" if event.epoch is not None else "")


def outcome_lines(outcomes: list[Outcome]) -> list[str]:
    """Per file, what was missed and what was raised for nothing: to guide tuning, so only
    ever called on the dev half."""
    lines = []
    for o in outcomes:
        notes = [f"  missed {e.family}/{e.kind} ({e.grade}) on {e.metric or '-'} at "
                 f"{_onset(e)}" for e in o.missed]
        notes += [f"  found {e.family}/{e.kind} ({e.grade}) at {_onset(e)}: {f.signal} on "
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


# --- the oracle: what the logged points allow with hindsight (dev half only) ------------

ORACLE_BEFORE = 20  # points before the labelled onset that set the level and its noise
ORACLE_WARM_UP = 5  # a metric's first points are warm-up (PROTOCOL.md): never the level
ORACLE_MIN_BEFORE = 5  # fewer than this: too few points to judge
ORACLE_MADS = 6.0  # deviations (raw MAD) that clear the bar, the protocol's own (or its ratio)
ORACLE_VERDICTS = ("detectable", "under the oracle's bar", "metric not read",
                   "onset in epochs, steps read", "onset outside the logged steps",
                   "too few points before the onset")


def _level(before: np.ndarray) -> tuple[float, float]:
    """The median of ``before`` and its raw MAD (never 0: a constant stretch gets 1e-6 of
    its level, so any real move clears it)."""
    median = float(np.median(before))
    mad = float(np.median(np.abs(before - median)))
    return median, max(mad, 1e-6 * max(abs(median), 1e-12))


def _out(points: np.ndarray, before: np.ndarray, ratio: float, up: bool = True
         ) -> np.ndarray:
    """Whether each of ``points`` stands more than ``ORACLE_MADS`` MADs of ``before``
    above (``up``) or below its median, or beyond ``ratio`` times it (a share of its
    magnitude: 1.5 = +50% up, 0.6 = -40% down): the protocol's two bars."""
    median, mad = _level(before)
    sign = 1.0 if up else -1.0
    far = sign * (points - median) > ORACLE_MADS * mad
    bound = median + (ratio - 1.0) * abs(median)
    return far | (points >= bound if up else points <= bound)


def oracle_verdict(event: Event, read: FileRead) -> str:
    """Whether ``event`` is detectable in principle from the points runwatch read, by a
    simple rule that knows the labelled onset (hindsight): its points deviate from the
    ``ORACLE_BEFORE`` points before the onset by more than ``ORACLE_MADS`` MADs or the
    protocol's ratio for its kind, in the way its kind says; else why not (one of
    ``ORACLE_VERDICTS``: the label's metric is not among the tags read, the onset is an
    epoch number where runwatch read steps, it lies outside the metric's logged steps,
    too few points before it, or the points do not clear the bar)."""
    key = _name(event.metric) if event.metric else ""
    if key not in read.steps:
        return "metric not read"
    steps, values = read.steps[key], read.values[key]
    epochs = read.values.get("epoch", np.empty(0))
    if event.onset not in steps and event.onset in epochs[np.isfinite(epochs)].astype(int):
        return "onset in epochs, steps read"  # a Lightning CSV labelled per epoch
    if not len(steps) or not steps[0] <= event.onset <= steps[-1]:
        return "onset outside the logged steps"
    at = int(np.searchsorted(steps, event.onset))
    if event.kind == "nonfinite":
        near = values[max(0, at - 1):at + 2]
        return "detectable" if (~np.isfinite(near)).any() else "under the oracle's bar"
    if event.kind == "plateau":
        # hindsight: from the onset, a stretch of max(20 points, a quarter of the log)
        # whose first and last thirds' medians differ by under 2% of the level
        width = max(20, len(values) // 4)
        stretch = values[at:at + width]
        stretch = stretch[np.isfinite(stretch)]
        third = len(stretch) // 3
        if len(stretch) < 20:
            return "too few points before the onset"  # or after it: no stretch to judge
        first, last = float(np.median(stretch[:third])), float(np.median(stretch[-third:]))
        return "detectable" if abs(first - last) < 0.02 * abs(first) else \
            "under the oracle's bar"
    before = values[max(ORACLE_WARM_UP, at - ORACLE_BEFORE):at]
    before = before[np.isfinite(before)]
    after = values[at:]
    after = after[np.isfinite(after)]
    if len(before) < ORACLE_MIN_BEFORE or not len(after):
        return "too few points before the onset"
    kind = event.kind
    if kind == "spike":
        ok = bool(_out(after[:2], before, 5.0 if key == 'grad_norm' else 2.0).any())
    elif kind in ("instability", "loss_burst"):
        ok = int(np.count_nonzero(_out(after[:5], before, 3.0 if kind == "loss_burst"
                                       else 1.5))) >= (2 if kind == "loss_burst" else 3)
    elif kind == "divergence":
        ok = bool(_out(np.array([np.median(after)]), before, 1.3)[0]) and len(after) >= 2
    elif kind == "shift":
        held = after[:max(10, len(after) // 4)]
        level = np.array([np.median(held)])
        ok = len(held) >= 5 and bool(_out(level, before, 2.0)[0]
                                     or _out(level, before, 0.5, up=False)[0])
    elif kind == "overfit":
        best = float(np.min(before))
        jumps = np.abs(np.diff(before))
        noise = 1.4826 * float(np.median(jumps)) / math.sqrt(2) if len(jumps) else 0.0
        ok = len(after) >= 2 and int(np.count_nonzero(after[:5] > best + 3 * noise)) >= 2 \
            and float(np.median(after[:5])) > best
    elif kind == "drop":
        slow = "time" in key  # a step time rises when throughput drops
        ok = int(np.count_nonzero(_out(after[:9], before, 1 / 0.7 if slow else 0.7,
                                       up=slow))) >= 5
    elif kind == "reward_collapse":
        ok = int(np.count_nonzero(_out(after[:5], before, 0.6, up=False))) >= 5
    else:
        ok = False
    return "detectable" if ok else "under the oracle's bar"


def oracle_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Per family, the clear and mild events: found by runwatch, and the oracle's verdict
    on each (found or missed); the last row adds them up."""
    rows = []
    for family in (*FAMILIES, "all"):
        tally: Counter[str] = Counter()
        found_detectable = missed_detectable = 0
        for o in outcomes:
            found = {id(e) for e, _, _ in o.found}
            for event in [e for e, _, _ in o.found] + o.missed:
                if family != "all" and event.family != family:
                    continue
                verdict = oracle_verdict(event, o.read)
                tally[verdict] += 1
                tally["events"] += 1
                tally["found"] += id(event) in found
                if verdict == "detectable":
                    found_detectable += id(event) in found
                    missed_detectable += id(event) not in found
                tally["reachable"] += verdict == "detectable" or id(event) in found
        if not tally["events"]:
            continue
        n = tally["events"]
        detectable = tally["detectable"]
        rows.append({
            "family": family, "events": n, "found by runwatch": tally["found"],
            **{v: tally[v] for v in ORACLE_VERDICTS},
            "ceiling (detectable or found)": f"{tally['reachable']}/{n} = "
                                             f"{tally['reachable'] / n:.2f}",
            "runwatch on the detectable": _ratio(found_detectable, detectable),
            "missed yet detectable": missed_detectable,
        })
    return rows


def _oracle_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no clear or mild event)"
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]
    return "\n".join(lines)


ORACLE_TITLE = "Real corpus, dev half: what an oracle with hindsight reaches (issue 22)"
ORACLE_RULE = (f"per clear or mild event, on the points runwatch read of the label's metric: "
               f"the {ORACLE_BEFORE} points before the labelled onset (not the metric's "
               f"first {ORACLE_WARM_UP}, warm-up) set a median and a MAD; the event is "
               f"detectable when its points clear {ORACLE_MADS:g} MADs or the protocol's "
               f"ratio for its kind (2x a loss spike, 5x a grad-norm one, 1.5x an "
               f"instability, 1.3x a divergence, 3x an RL loss burst, 2x or 0.5x a shift, "
               f"-30% throughput, -40% reward) the way its kind says (spike: one of the "
               f"first 2; instability: 3 of the first 5; RL loss burst: 2 of 5; divergence: "
               f"the median of the rest of the log; shift: the median of the next "
               f"max(10, a quarter) points, either way; throughput drop: 5 of the next 9 "
               f"slower; reward collapse: 5 of 5 lower; overfit: 2 of the next 5 "
               f"evaluations above the best by 3x the eval's point-to-point noise; "
               f"plateau: the first and last thirds of max(20 points, a quarter of the log) "
               f"from the onset within 2%; non-finite: a NaN/Inf at the onset); label and "
               f"format issues first: the metric not read under the label's name, the "
               f"onset an epoch number where runwatch read steps, the onset outside the "
               f"metric's logged steps, fewer than "
               f"{ORACLE_MIN_BEFORE} points before the onset")


def write_oracle(path: Path, rows: list[dict[str, Any]]) -> None:
    """The oracle table as its own BENCHMARKS.md section, replaced in place."""
    import re
    from datetime import UTC, datetime

    section = (f"## {ORACLE_TITLE}\n\n`runwatch bench real --oracle` — "
               f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; dev half only (no test-half "
               f"file is inspected event by event). Rule: {ORACLE_RULE}.\n\n"
               f"{_oracle_table(rows)}\n")
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^## {re.escape(ORACLE_TITLE)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else \
        text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


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
              oracle: bool = False, root: Path = CORPUS) -> int:
    from benchmarks.report import write_section

    started = time.perf_counter()
    # Tuning (``--outcomes``) reads the dev half alone: the test half's figures are not
    # shown while anyone tunes, only in the run that reports them.
    if oracle:  # per event, so the dev half alone, like ``outcomes``
        files = [f for f in load_corpus(root) if f.split == "dev"]
        rows = oracle_rows(score(files, read_corpus(files, root, console)))
        console.print(f"{ORACLE_TITLE}\n{ORACLE_RULE}\n\n{_oracle_table(rows)}",
                      markup=False, highlight=False)
        write_oracle(Path(output), rows)
        console.print(f"dev half read in {time.perf_counter() - started:.0f} s; written to "
                      f"{output}")
        return 0
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
