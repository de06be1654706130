"""`runwatch bench detect`: how well each signal is detected, against labelled events.

Two parts, scored the same way:

- a seeded, labelled **synthetic suite**: base curves ``c + a·(S1 + t0)^-b − C·S2`` where
  ``S1`` is the LR area and ``S2`` its annealing area (the LR-annealing scaling law of Tissue
  et al. 2024, so an LR decay lowers the loss as it does in real runs), under warmup+cosine,
  linear and warmup-stable-decay schedules, with AR(1) Student-t noise whose size changes over
  the run; every signal injected at several strengths with its onset labelled; negative
  controls that must stay quiet;
- the real logs of ``../shared/corpus`` with the events labelled by hand in
  ``benchmarks/data/corpus_labels.toml`` (skipped when the corpus is absent).

Scoring, per signal: a detection (a finding's ``detected_step``) is a true positive when it
falls inside ``[onset, onset + tolerance]`` of a labelled event not yet matched; a second
detection of the same event, a detection before the onset and one with no event are false
positives (no point adjustment). A case may name signals that are a legitimate consequence
of its event (an eval loss that rises also stops improving: ``diminishing_returns`` on an
``overfit`` case): their detections from the event's onset on are neither counted for nor
against. Delays are ``detected_step - onset`` in steps and in the signal's unit (logged
points; evaluations for eval signals; save intervals for ``checkpoint_gap``, whose series is
the saves). False alarms per 10k steps count every detection on the negative controls that
carry what the signal reads.

Peer baselines run on the same data, each on the signals its public rule covers:
OLMo-core's ``StabilityMonitorCallback``, llm-foundry's ``KillLossSpike``, Lightning's
``SpikeDetection``, the W&B ``MetricZScoreFilter`` automation, Megatron's rerun-state-machine
checks (NaN/Inf and ``is_unexpectedly_large``) and Keras/Lightning ``EarlyStopping``.
"""

from __future__ import annotations

import functools
import importlib
import math
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import track
from rich.table import Table

import analyzers
from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.stats.metric import tags_under
from benchmarks.synthetic import (
    CAPACITY_GB,
    EVAL_SIGNALS,
    FOREVER,
    PERIODIC_UNITS,
    STRENGTHS,
    Case,
    Detection,
    Event,
    _runs,
    synthetic_suite,
)


def _series(data: RunData, tag: str) -> tuple[np.ndarray, np.ndarray]:
    s = data.series(tag)
    return s.index.to_numpy(dtype=np.int64), s.to_numpy(dtype=float)


def _rolling_before(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population std of the ``window`` values before each point (NaN until full;
    a non-finite value in the window makes them NaN, as a plain running sum would)."""
    prior = pd.Series(values).shift(1).rolling(window, min_periods=window)
    return prior.mean().to_numpy(), prior.std(ddof=0).to_numpy()


def olmo_stability(values: np.ndarray, window: int = 128, threshold: float = 6.0
                   ) -> np.ndarray:
    """OLMo-core ``StabilityMonitorCallback``: a value above the mean of the last ``window``
    values plus ``threshold`` population standard deviations, once the window is full."""
    mean, std = _rolling_before(values, window)
    with np.errstate(invalid="ignore"):
        return (std >= 1e-10) & (values > mean + threshold * std)


def foundry_kill_loss_spike(values: np.ndarray, window: int = 100, multiplier: float = 2.0,
                            patience: int = 4) -> np.ndarray:
    """llm-foundry ``KillLossSpike``: a loss at or above ``multiplier`` times the mean of the
    last ``window`` losses for more than ``patience`` steps in a row (the window holds every
    loss, outliers included)."""
    mean, _ = _rolling_before(values, window)
    with np.errstate(invalid="ignore"):
        outlier = values >= multiplier * mean
    run = np.zeros(len(values), dtype=np.int64)
    count = 0
    for i, flag in enumerate(outlier):
        count = count + 1 if flag else 0
        run[i] = count
    return run > patience


def lightning_spike_detection(values: np.ndarray, window: int = 10, warmup: int = 1,
                              rtol: float = 2.0) -> np.ndarray:
    """Lightning ``SpikeDetection`` (mode min, ``finite_only``): a non-finite loss, or one
    that is not below the last accepted value and differs from the running mean of the last
    ``window`` accepted values by ``rtol`` times that mean. Spikes are not accepted."""
    flags = np.zeros(len(values), dtype=bool)
    accepted: list[float] = []
    last = 0.0
    for i, value in enumerate(values):
        spike = False
        if i >= warmup:
            if not math.isfinite(value):
                spike = True
            elif value - last > 0:
                mean = sum(accepted[-window:]) / len(accepted[-window:]) if accepted else 0.0
                spike = abs(value - mean) >= abs(rtol * mean)
        flags[i] = spike
        if not spike and math.isfinite(value):
            accepted.append(value)
            last = value
    return flags


def wandb_zscore(values: np.ndarray, window: int = 30, threshold: float = 3.0,
                 direction: str = "increase") -> np.ndarray:
    """W&B ``MetricZScoreFilter`` automation: the z-score of a value against the mean and
    standard deviation of the previous ``window`` values beyond ``threshold``."""
    mean, std = _rolling_before(values, window)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (values - mean) / std
        return z >= threshold if direction == "increase" else z <= -threshold


def megatron_checks(values: np.ndarray, threshold: float = 10.0, samples: int = 100
                    ) -> np.ndarray:
    """Megatron's rerun state machine: a NaN/Inf loss (``check_for_nan_in_loss``), or a
    loss at least ``threshold`` times the largest of its first ``samples`` finite values
    (``is_unexpectedly_large``, the spiky-loss check)."""
    finite = np.isfinite(values)
    first = np.abs(values[finite][:samples])
    flags = ~finite
    if len(first) == samples:
        after = np.flatnonzero(finite)[samples:]
        flags[after] |= np.abs(values[after]) >= threshold * first.max()
    return flags


def early_stopping(values: np.ndarray, patience: int = 3, min_delta: float = 0.0) -> int | None:
    """Keras/Lightning ``EarlyStopping`` (mode min): the index of the check at which
    ``patience`` checks in a row have not improved on the best; it stops the run."""
    best, wait = math.inf, 0
    for i, value in enumerate(values):
        if not math.isfinite(value):
            return i  # check_finite
        if value < best - min_delta:
            best, wait = value, 0
        else:
            wait += 1
            if wait >= patience:
                return i
    return None


def _flagged(signal: str, steps: np.ndarray, flags: np.ndarray) -> list[Detection]:
    return [Detection(signal, int(steps[i])) for i in _runs(flags)[0]]


def _baseline_spike(rule: Callable[[np.ndarray], np.ndarray],
                    tags: dict[str, str]) -> Callable[[RunData], list[Detection]]:
    def run(data: RunData) -> list[Detection]:
        found = []
        for tag, signal in tags.items():
            steps, values = _series(data, tag)
            if len(values):
                found += _flagged(signal, steps, rule(values))
        return found
    return run


def _wandb(data: RunData) -> list[Detection]:
    found = []
    for tag, signal, direction in (("train/loss", "spike", "increase"),
                                   ("grad_norm", "grad_norm", "increase"),
                                   ("throughput", "throughput_drop", "decrease")):
        steps, values = _series(data, tag)
        if len(values):
            found += _flagged(signal, steps, wandb_zscore(values, direction=direction))
    return found


def _early_stopping(data: RunData) -> list[Detection]:
    found = []
    steps, values = _series(data, "eval/loss")
    # A stop on a non-finite value (Lightning's check_finite) is no verdict on overfitting,
    # convergence or a plateau: it is the loss blowing up, which these signals do not cover.
    stop = early_stopping(values) if len(values) else None
    if stop is not None and math.isfinite(values[stop]):
        found += [Detection(s, int(steps[stop])) for s in ("overfit", "diminishing_returns")]
    # On the training loss, as Lightning monitors an epoch-level ``train_loss``: its mean
    # over each interval between evaluations (or over 100 logged points without them).
    t_steps, t_values = _series(data, "train/loss")
    if len(t_values):
        if len(steps) >= 2:
            bounds = np.searchsorted(t_steps, steps, side="right")
        else:
            bounds = np.arange(100, len(t_values) + 1, 100)
        means, ends, lo = [], [], 0
        for hi in bounds:
            if hi > lo:
                means.append(float(np.mean(t_values[lo:hi])))
                ends.append(int(t_steps[hi - 1]))
            lo = hi
        stop = early_stopping(np.asarray(means))
        if stop is not None and math.isfinite(means[stop]):
            found.append(Detection("plateau", ends[stop]))
    return found


# name → (signals covered, detector)
BASELINES: dict[str, tuple[frozenset[str], Callable[[RunData], list[Detection]]]] = {
    "OLMo-core 6σ/128": (frozenset({"spike", "grad_norm"}), _baseline_spike(
        olmo_stability, {"train/loss": "spike", "grad_norm": "grad_norm"})),
    "llm-foundry KillLossSpike": (frozenset({"spike"}), _baseline_spike(
        foundry_kill_loss_spike, {"train/loss": "spike"})),
    "Lightning SpikeDetection": (frozenset({"spike"}), _baseline_spike(
        lightning_spike_detection, {"train/loss": "spike"})),
    "W&B z-score 3σ/30": (frozenset({"spike", "grad_norm", "throughput_drop"}), _wandb),
    "Megatron NaN + 10x": (frozenset({"spike"}), _baseline_spike(
        megatron_checks, {"train/loss": "spike"})),
    "EarlyStopping p=3": (frozenset({"overfit", "plateau", "diminishing_returns"}),
                          _early_stopping),
}


def ours(data: RunData, detectors: list[analyzers.Analyzer]
         ) -> tuple[list[Detection], dict[str, float], list[Any]]:
    """Every registered analyzer's findings as detections, with seconds per analyzer."""
    found, seconds, findings = [], {}, []
    for analyzer in detectors:
        started = time.perf_counter()
        result = analyzer.detect(data)
        seconds[analyzer.signal] = time.perf_counter() - started
        findings += result
        found += [Detection(f.signal, int(f.detected_step)) for f in result]
    return found, seconds, findings


# --------------------------------------------------------------------------- scoring

@dataclass
class Score:
    """Event-level counts for one signal (or one variant of it)."""

    events: int = 0
    tp: int = 0
    fp: int = 0
    duplicates: int = 0
    early: int = 0
    delays: list[int] = field(default_factory=list)
    delays_units: list[float] = field(default_factory=list)
    delays_share: list[float] = field(default_factory=list)  # delay / the run's steps
    negative_alarms: int = 0
    negative_steps: int = 0  # steps of the negative controls that carry what it reads
    by_strength: dict[str, list[int]] = field(default_factory=dict)  # strength → [hit, n]

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / self.events if self.events else None

    @property
    def f1(self) -> float | None:
        """None without events; 0 with events and no true positive (no detection at all
        leaves the precision undefined, but nothing was found)."""
        p, r = self.precision, self.recall
        if r is None:
            return None
        if p is None or p + r == 0:
            return 0.0
        return 2 * p * r / (p + r)


def match(events: list[Event], detections: list[int],
          allowed: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """Match one case's detections (steps) of one signal to its events of that signal.

    A detection inside ``[onset, onset + tolerance]`` of an unmatched event is a true
    positive; inside the window of an event already matched, a duplicate; before every
    onset, an early alarm; the first inside one of the ``allowed`` stretches
    (``[start, end)``, where the signal is true) is not scored, a later one in the same
    stretch is a duplicate (a finding that flaps); anything else a false positive. Returns
    the counts and, per event, its delay or None.
    """
    delays: list[int | None] = [None] * len(events)
    tp = fp = duplicates = early = 0
    excused: set[int] = set()  # the allowed stretches whose one detection is used
    order = sorted(range(len(events)), key=lambda i: events[i].onset)
    for step in sorted(detections):
        hit = next((i for i in order if delays[i] is None
                    and events[i].onset <= step <= events[i].onset + events[i].tolerance), None)
        if hit is not None:
            delays[hit] = step - events[hit].onset
            tp += 1
            continue
        stretch = next((k for k, (lo, hi) in enumerate(allowed or []) if lo <= step < hi),
                       None)
        if any(events[i].onset <= step <= events[i].onset + events[i].tolerance
               for i in order):
            duplicates += 1
            fp += 1
        elif stretch is not None and stretch not in excused:
            excused.add(stretch)
        elif stretch is not None:
            duplicates += 1
            fp += 1
        else:
            fp += 1
            if events and all(step < e.onset for e in events):
                early += 1
    return {"tp": tp, "fp": fp, "duplicates": duplicates, "early": early, "delays": delays}


def _reads(signal: str, data: RunData) -> bool:
    """Whether a run carries what ``signal``'s analyzer reads: its false alarms per 10k steps
    count only the negative-control steps of such runs (a text signal can raise nothing on
    a run with no logged generations; counting those steps would dilute its figure)."""
    if signal in ("repetition", "role_confusion", "over_refusal"):
        return len(data.generations) > 0
    prefix = _input_prefixes().get(signal)
    return prefix is None or bool(tags_under(data.tags(), prefix))


@functools.cache
def _input_prefixes() -> dict[str, str]:
    """The tags (or prefixes) the cross-metric signals read, as their analyzers default."""
    from analyzers.business_flat import BusinessFlat
    from analyzers.forgetting import Forgetting
    from analyzers.reward_hacking import RewardHacking
    return {"reward_hacking": RewardHacking().metric, "business_flat": BusinessFlat().metric,
            "forgetting": Forgetting().metric}


def score(cases: list[Case], detections: dict[str, list[Detection]],
          signals: Iterable[str]) -> tuple[dict[str, Score], dict[tuple[str, str], Score],
                                           int]:
    """Per signal and per (signal, variant) scores over the cases; and the negative-control
    steps. Each score's false alarms per 10k steps are counted over the negative controls
    that carry what its signal reads (``_reads``)."""
    per_signal = {s: Score() for s in signals}
    per_variant: dict[tuple[str, str], Score] = {}
    negative_steps = sum(c.steps for c in cases if c.negative)
    for case in cases:
        found = detections.get(case.name, [])
        for signal, total in per_signal.items():
            if case.negative and _reads(signal, case.data):
                total.negative_steps += case.steps
            events = [e for e in case.events if e.signal == signal]
            steps = [d.step for d in found if d.signal == signal]
            if not events and not steps:
                continue
            result = match(events, steps, case.allowed.get(signal))
            total.events += len(events)
            total.tp += result["tp"]
            total.fp += result["fp"]
            total.duplicates += result["duplicates"]
            total.early += result["early"]
            if case.negative:
                total.negative_alarms += result["fp"]
            for event, delay in zip(events, result["delays"], strict=True):
                variant = per_variant.setdefault((signal, event.variant), Score())
                variant.events += 1
                tally = total.by_strength.setdefault(event.strength, [0, 0])
                tally[1] += 1
                vt = variant.by_strength.setdefault(event.strength, [0, 0])
                vt[1] += 1
                if delay is not None:
                    for s in (total, variant):
                        s.delays.append(delay)
                        s.delays_units.append(delay / event.unit)
                        s.delays_share.append(delay / max(1, case.steps))
                    variant.tp += 1
                    tally[0] += 1
                    vt[0] += 1
    for (signal, _), variant in per_variant.items():
        variant.negative_steps = per_signal[signal].negative_steps
    return per_signal, per_variant, negative_steps


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarise(s: Score) -> dict[str, Any]:
    return {
        "events": s.events, "tp": s.tp, "fp": s.fp, "duplicates": s.duplicates,
        "precision": s.precision, "recall": s.recall, "f1": s.f1,
        "median_delay_steps": _percentile(s.delays, 50),
        "p90_delay_steps": _percentile(s.delays, 90),
        "median_delay_units": _percentile(s.delays_units, 50),
        "p90_delay_units": _percentile(s.delays_units, 90),
        "median_delay_share": _percentile(s.delays_share, 50),
        "false_alarms_per_10k": (1e4 * s.negative_alarms / s.negative_steps
                                 if s.negative_steps else None),
        "recall_by_strength": {k: v[0] / v[1] for k, v in s.by_strength.items() if v[1]},
    }


# --------------------------------------------------------------------------- runs

@dataclass
class SuiteResult:
    cases: int
    steps: int
    negative_steps: int
    seconds: float
    ours: dict[str, dict[str, Any]]
    variants: dict[tuple[str, str], dict[str, Any]]
    baselines: dict[str, dict[str, dict[str, Any]]]
    covered: dict[str, frozenset[str]]
    missing: list[str]
    analyzer_seconds: dict[str, float]


def available_analyzers(settings: dict[str, dict[str, Any]] | None = None
                        ) -> list[analyzers.Analyzer]:
    """One instance of every default analyzer that can be imported; a module that is
    missing or broken is left out (reported as not available), never a crash."""
    for module in analyzers.DEFAULT_ANALYZERS:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a half-written analyzer must not stop the bench
            continue
    settings = settings or {}
    built = []
    for signal, cls in sorted(analyzers.REGISTRY.items()):
        try:
            built.append(cls(**settings.get(signal, {})))
        except (TypeError, ValueError):
            continue
    return built


def run_detectors(cases: list[Case], *, console: Console | None = None,
                  settings: dict[str, dict[str, Any]] | None = None,
                  description: str = "detect") -> tuple[dict[str, dict[str, list[Detection]]],
                                                        dict[str, float]]:
    """Ours and every baseline over the cases: {detector: {case: detections}}."""
    detectors = available_analyzers(settings)
    out: dict[str, dict[str, list[Detection]]] = {"runwatch": {}}
    out.update({name: {} for name in BASELINES})
    seconds: dict[str, float] = {}
    iterator = track(cases, description=description, console=console) if console else cases
    for case in iterator:
        found, spent, _ = ours(case.data, detectors)
        out["runwatch"][case.name] = found
        for signal, s in spent.items():
            seconds[signal] = seconds.get(signal, 0.0) + s
        for name, (_, detector) in BASELINES.items():
            out[name][case.name] = detector(case.data)
    return out, seconds


def labelled_signals(cases: list[Case]) -> list[str]:
    return sorted({e.signal for c in cases for e in c.events})


def evaluate(cases: list[Case], console: Console | None = None,
             settings: dict[str, dict[str, Any]] | None = None) -> SuiteResult:
    started = time.perf_counter()
    found, seconds = run_detectors(cases, console=console, settings=settings)
    registered = {a.signal for a in available_analyzers(settings)}
    signals = sorted(set(labelled_signals(cases)) | registered)
    per_signal, per_variant, negative_steps = score(cases, found["runwatch"], signals)
    baselines = {}
    for name, (covered, _) in BASELINES.items():
        b_signal, _, _ = score(cases, found[name], sorted(covered))
        baselines[name] = {s: summarise(v) for s, v in b_signal.items()}
    return SuiteResult(
        cases=len(cases), steps=sum(c.steps for c in cases), negative_steps=negative_steps,
        seconds=time.perf_counter() - started,
        ours={s: summarise(v) for s, v in per_signal.items()},
        variants={k: summarise(v) for k, v in per_variant.items()},
        baselines=baselines, covered={n: c for n, (c, _) in BASELINES.items()},
        missing=sorted(set(CATALOG) - registered),
        analyzer_seconds=seconds)


# --------------------------------------------------------------------------- corpus

def corpus_labels(path: Path | None = None) -> list[dict[str, Any]]:
    """The hand-made labels of the real logs (``benchmarks/data/corpus_labels.toml``)."""
    if path is None:
        text = resources.files("benchmarks.data").joinpath("corpus_labels.toml").read_text()
    else:
        text = Path(path).read_text()
    return tomllib.loads(text)["run"]


def read_runs(path: Path) -> list[RunData]:
    """Every run in a log file or folder, read as ``runwatch analyze`` reads it (the
    connectors' readers, aliases applied), without a store."""
    from analyzers.base import METRIC_COLUMNS
    from connectors.registry import open_source

    runs = []
    for reader in open_source(str(path)).discover():
        batch = reader.read(None, final=True)
        if batch.points.empty:
            continue
        metrics = batch.points[METRIC_COLUMNS].reset_index(drop=True)
        runs.append(RunData(run=reader.run, metrics=metrics, checkpoints=batch.checkpoints,
                            meta=batch.meta))
    return sorted(runs, key=lambda r: r.run)


def corpus_cases(corpus: Path, labels: list[dict[str, Any]] | None = None,
                 console: Console | None = None) -> list[Case]:
    """One case per run of every labelled corpus file that exists; the file's events go
    with its first run (files hold one run, except wide CSVs of a sweep)."""
    labels = corpus_labels() if labels is None else labels
    cases = []
    iterator = track(labels, description="corpus", console=console) if console else labels
    for entry in iterator:
        path = corpus / entry["file"]
        if not path.exists():
            continue
        events = [Event(e["signal"], int(e["onset"]), int(e["tolerance"]),
                        e.get("variant", ""), "", 1, e.get("reason", ""))
                  for e in entry.get("event", [])]
        allowed = {s: [(0, FOREVER)] for s in entry.get("allowed", [])}
        for stretch in entry.get("allow", []):
            allowed.setdefault(stretch["signal"], []).append(
                (int(stretch["start"]), int(stretch["end"])))
        runs = read_runs(path)
        for k, data in enumerate(runs):
            first = int(data.metrics["step"].min())
            last = int(data.metrics["step"].max())
            name = entry["file"] if len(runs) == 1 else f"{entry['file']}::{data.run}"
            cases.append(Case(name, data, events if k == 0 else [], max(1, last - first),
                              negative=entry.get("verdict") == "no visible problem",
                              allowed=allowed))
    return cases


@dataclass
class CorpusResult:
    files: int
    ours: dict[str, dict[str, Any]]
    baselines: dict[str, dict[str, dict[str, Any]]]
    negatives: list[dict[str, Any]]
    missed: list[str]
    false_alarms: list[str]
    seconds: float


def evaluate_corpus(corpus: Path, console: Console | None = None) -> CorpusResult | None:
    if not corpus.is_dir():
        return None
    started = time.perf_counter()
    cases = corpus_cases(corpus, console=console)
    detectors = available_analyzers()
    found: dict[str, dict[str, list[Detection]]] = {"runwatch": {}}
    found.update({name: {} for name in BASELINES})
    severities: dict[str, list[str]] = {}
    for case in cases:
        detections, _, findings = ours(case.data, detectors)
        found["runwatch"][case.name] = detections
        severities[case.name] = [f"{f.severity}:{f.signal}@{f.detected_step}" for f in findings]
        for name, (_, detector) in BASELINES.items():
            found[name][case.name] = detector(case.data)
    signals = sorted(set(labelled_signals(cases)) | {a.signal for a in detectors})
    per_signal, _, negative_steps = score(cases, found["runwatch"], signals)
    baselines = {}
    for name, (covered, _) in BASELINES.items():
        b_signal, _, _ = score(cases, found[name], sorted(covered))
        baselines[name] = {s: summarise(v) for s, v in b_signal.items()}
    negatives, missed, false_alarms = [], [], []
    for case in cases:
        dets = found["runwatch"][case.name]
        for signal in {e.signal for e in case.events}:
            events = [e for e in case.events if e.signal == signal]
            result = match(events, [d.step for d in dets if d.signal == signal],
                           case.allowed.get(signal))
            missed += [f"{case.name}: {signal} @ {e.onset}"
                       for e, d in zip(events, result["delays"], strict=True) if d is None]
        labelled = {e.signal for e in case.events}
        for signal in sorted({d.signal for d in dets} - labelled):
            steps = sorted(d.step for d in dets if d.signal == signal)
            if match([], steps, case.allowed.get(signal))["fp"]:
                false_alarms.append(f"{case.name}: {signal} @ {', '.join(map(str, steps))}")
        if case.negative:
            kinds = severities[case.name]
            negatives.append({"file": case.name,
                              "critical": sum(k.startswith("critical") for k in kinds),
                              "warning": sum(k.startswith("warning") for k in kinds),
                              "findings": kinds})
    return CorpusResult(
        files=len(cases), seconds=time.perf_counter() - started,
        ours={s: summarise(v) for s, v in per_signal.items()},
        baselines=baselines, negatives=negatives, missed=missed, false_alarms=false_alarms)


# --------------------------------------------------------------------------- speed

def bench_speed(points: int = 1_000_000, new: int = 100, seed: int = 0) -> dict[str, Any]:
    """Seconds to analyse a run of ``points`` logged steps (loss, LR, grad norm, throughput,
    memory; an eval every 100 steps) from scratch with every analyzer, and the cost of a
    poll that brings ``new`` more points on top of 10k and of ``points`` of history, as a
    watcher sees it (:func:`_watched_poll`): stored, read back from SQLite on top of the
    previous poll's data, analysed by analyzers that resume from their state.

    From scratch, reading the series out of the run's long frame (``RunData.series``) is
    timed apart from the analyzers."""
    rng = np.random.default_rng(seed)

    def run_of(n: int) -> RunData:
        steps = np.arange(1, n + 1)
        loss = 2.0 + 8.0 * (steps + 50.0) ** -0.4 + 0.02 * rng.standard_normal(n)
        evals = steps[99::100]
        return RunData.from_series("speed", {
            "train/loss": loss, "lr": np.full(n, 3e-4),
            "grad_norm": 0.5 * np.exp(0.1 * rng.standard_normal(n)),
            "throughput": 1e5 * np.exp(0.02 * rng.standard_normal(n)),
            "gpu_mem": np.full(n, 60.0),
            "eval/loss": pd.Series(loss[evals - 1] + 0.05, index=evals)},
            checkpoints=[Checkpoint(int(s), f"ckpt/checkpoint-{s}")
                         for s in range(1000, n + 1, 1000)],
            meta={"gpu_mem_total": CAPACITY_GB})

    def read(data: RunData) -> float:
        started = time.perf_counter()
        for tag in data.tags():
            data.series(tag)
        return time.perf_counter() - started

    def timed(detectors: list[analyzers.Analyzer], data: RunData
              ) -> tuple[float, dict[str, float]]:
        per: dict[str, float] = {}
        for a in detectors:
            t = time.perf_counter()
            a.detect(data)
            per[a.signal] = time.perf_counter() - t
        return sum(per.values()), per

    result: dict[str, Any] = {"points per tag": points, "tags": 6}
    big = run_of(points)
    reading = read(big)
    total, per = timed(available_analyzers(), big)
    result[f"{points:,} points from scratch s"] = reading + total
    result["of which reading the series s"] = reading
    slowest = sorted(per.items(), key=lambda kv: -kv[1])[:3]
    result["slowest analyzers"] = ", ".join(f"{k} {v:.2f}s" for k, v in slowest)
    for history in (10_000, points):
        poll = _watched_poll(run_of(history + 7 * new), history, new, timed)
        label = f"{new} new points on {history:,} history"
        result[f"{label}: storing s"] = poll["storing"]
        result[f"{label}: reading from the store s"] = poll["reading"]
        result[f"{label}: analysing s"] = poll["analysing"]
        result[f"{label}: slowest"] = poll["slowest"]
    return result


def _watched_poll(whole: RunData, history: int, new: int,
                  timed: Callable[[list[analyzers.Analyzer], RunData],
                                  tuple[float, dict[str, float]]],
                  polls: int = 5) -> dict[str, Any]:
    """One poll of a watcher, as the engine does it, on a real SQLite store holding
    ``history`` steps of the run: ``new`` points are stored (``Store.ingest``), read back
    on top of the previous poll's data (``Store.run_data(since=…)``) and analysed by
    analyzers that resume from their state, with the time of the poll (so time-based
    signals are judged too). The polls measured are the ``polls`` after the first that
    follows the whole read (as after a restart), so they show the steady state; each figure
    is their median."""
    import gc
    import tempfile

    from bot.store import Store

    rows = whole.metrics.assign(wall_time=1.7e9 + whole.metrics["step"].astype(float))
    old = rows[rows["step"] <= history]
    args = {"run": "speed", "source": "bench", "log_path": "bench", "cursor_key": "k",
            "cursor": {}, "checkpoints": whole.checkpoints, "meta": whole.meta,
            "malformed": [], "skipped_values": 0, "notices": []}
    detectors = available_analyzers()
    with tempfile.TemporaryDirectory() as folder:
        store = Store(str(Path(folder) / "speed.db"))
        store.ingest(points=old.iloc[:0], **args)
        with store.transaction() as db:  # the history, in bulk (not what is measured)
            db.conn.executemany(
                "INSERT INTO metrics (run, attempt, tag, step, value, wall_time) "
                "VALUES ('speed', 1, ?, ?, ?, ?)",
                old[["tag", "step", "value", "wall_time"]].itertuples(index=False))
        data = store.run_data("speed")
        data.now = 1.7e9 + history + 5
        timed(detectors, data)  # the analyzers settle their state on the history
        measured: list[tuple[float, float, float, dict[str, float]]] = []
        for lo in range(history, history + (polls + 1) * new, new):
            batch = rows[(rows["step"] > lo) & (rows["step"] <= lo + new)]
            gc.collect()  # a collection of the bench's own garbage is not the poll's cost
            started = time.perf_counter()
            store.ingest(points=batch.sort_values("step", kind="stable"), **args)
            storing = time.perf_counter() - started
            started = time.perf_counter()
            data = store.run_data("speed", since=data)
            reading = time.perf_counter() - started
            data.now = 1.7e9 + lo + new + 5
            cost, per = timed(detectors, data)
            if lo > history:  # the first poll after the whole read settles the state
                measured.append((storing, reading, cost, per))
        store.close()
    per = {a.signal: float(np.median([m[3][a.signal] for m in measured])) for a in detectors}
    slowest = sorted(per.items(), key=lambda kv: -kv[1])[:3]
    return {"storing": float(np.median([m[0] for m in measured])),
            "reading": float(np.median([m[1] for m in measured])),
            "analysing": float(np.median([m[2] for m in measured])),
            "slowest": ", ".join(f"{k} {v * 1000:.1f}ms" for k, v in slowest)}


# --------------------------------------------------------------------------- report

def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and value.is_integer() and digits == 0:
        return str(int(value))
    return f"{value:.{digits}f}"


def _delay(s: dict[str, Any], unit: str) -> str:
    if s["median_delay_steps"] is None:
        return "–"
    share = ("" if unit == "evals" or s["median_delay_share"] is None
             else f"; {100 * s['median_delay_share']:.1f}% of the run")
    return (f"{s['median_delay_steps']:.0f} / {s['p90_delay_steps']:.0f} "
            f"({s['median_delay_units']:.1f} / {s['p90_delay_units']:.1f} {unit}{share})")


def target_misses(signal: str, s: dict[str, Any],
                  baselines: dict[str, dict[str, Any]] | None = None,
                  variants: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """What the issue's targets ask of a signal and this result does not reach: spike
    recall ≥ 0.95 (NaN/Inf included), median delay ≤ 1 point and ≤ 0.5 false alarms per 10k
    steps, and NaN/Inf (the ``nan/inf`` variant, labelled with no tolerance) recall 1.0 at
    zero delay; lr_schedule recall 1.0 (its tolerance is 3 points); every other signal F1 ≥
    0.9 and a median delay of at most 3 evaluations (3 save intervals for checkpoint_gap,
    whose series is the saves; step-level series: 2% of the run); and
    on every signal an F1 above each of ``baselines`` ({name: its result}) that covers it
    (or, both perfect, equal to it).
    ``variants`` maps this signal's variants to their results."""
    if not s["events"]:
        return []
    misses = []
    for name, b in sorted((baselines or {}).items()):
        # A tie at a perfect 1.0 is no miss: nothing scores above it.
        if b["events"] and b["f1"] is not None and (s["f1"] or 0.0) <= b["f1"] < 1.0:
            misses.append(f"F1 not above {name}")
    if signal == "spike":
        nonfinite = (variants or {}).get("nan/inf")
        if nonfinite is not None and (nonfinite["recall"] or 0.0) < 1.0:
            misses.append("NaN/Inf recall < 1.0 at 0 delay")
        if (s["recall"] or 0.0) < 0.95:
            misses.append("recall < 0.95")
        if (s["median_delay_units"] or 0.0) > 1:
            misses.append("delay > 1 pt")
        if (s["false_alarms_per_10k"] or 0.0) > 0.5:
            misses.append("> 0.5 false alarms /10k")
        return misses
    if signal == "lr_schedule" and (s["recall"] or 0.0) < 1.0:
        misses.append("recall < 1.0")
    if (s["f1"] or 0.0) < 0.9:
        misses.append("F1 < 0.9")
    if s["median_delay_units"] is not None:
        unit = PERIODIC_UNITS.get(signal)
        if unit is not None and s["median_delay_units"] > 3:
            misses.append(f"delay > 3 {unit}")
        if unit is None and s["median_delay_share"] > 0.02:
            misses.append("delay > 2% of the run")
    return misses


def _unit(signal: str) -> str:
    return PERIODIC_UNITS.get(signal, "pts")


def _misses(result: SuiteResult, signal: str) -> list[str]:
    """``target_misses`` of one signal in a suite's result (its baselines and variants)."""
    return target_misses(
        signal, result.ours[signal],
        {n: b[signal] for n, b in result.baselines.items() if signal in b},
        {v: stats for (sig, v), stats in result.variants.items() if sig == signal})


def seed_rows(results: dict[int, SuiteResult]) -> tuple[list[str], list[list[str]]]:
    """The across-seeds table: per signal, F1 and median delay on each seed ("✗" where a
    target is missed) and the seeds on which every target is met."""
    seeds = sorted(results)
    header = ["signal", *(f"seed {k}: F1 / delay" for k in seeds), "targets met"]
    rows = []
    for signal in sorted(results[seeds[0]].ours):
        if not any(results[k].ours[signal]["events"] for k in seeds):
            continue
        cells, met = [], 0
        for k in seeds:
            s, misses = results[k].ours[signal], _misses(results[k], signal)
            met += not misses
            unit = PERIODIC_UNITS.get(signal)
            delay = ("–" if s["median_delay_units"] is None
                     else f"{s['median_delay_units']:.1f} {unit}" if unit
                     else f"{100 * s['median_delay_share']:.1f}%")
            cells.append(f"{_fmt(s['f1'])} / {delay}" + (" ✗" if misses else ""))
        rows.append([signal, *cells, f"{met} of {len(seeds)}"])
    return header, rows


def detection_tables(result: SuiteResult) -> tuple[list[str], list[list[str]]]:
    """Rows of the main table: ours and each covering baseline per signal."""
    header = ["signal", "detector", "events", "precision", "recall", "F1",
              "delay median / p90, steps (units)", "false alarms /10k steps",
              "recall weak / medium / strong", "issue target"]
    rows = []
    for signal, s in sorted(result.ours.items()):
        if not s["events"] and signal in result.missing:
            continue
        misses = _misses(result, signal)
        if not s["events"]:
            rows.append([signal, "runwatch", "0", "–", "–", "–", "no synthetic cases",
                         _fmt(s["false_alarms_per_10k"]), "–", "–"])
            continue
        for name, stats in [("runwatch", s)] + [
                (n, b[signal]) for n, b in result.baselines.items() if signal in b]:
            strengths = stats["recall_by_strength"]
            by = " / ".join(_fmt(strengths.get(k)) for k in STRENGTHS) \
                if any(k in strengths for k in STRENGTHS) else ", ".join(
                    f"{k} {_fmt(v)}" for k, v in sorted(strengths.items()))
            rows.append([signal if name == "runwatch" else "", name, str(stats["events"]),
                         _fmt(stats["precision"]), _fmt(stats["recall"]), _fmt(stats["f1"]),
                         _delay(stats, _unit(signal)), _fmt(stats["false_alarms_per_10k"]),
                         by, ("missed: " + ", ".join(misses) if misses else "met")
                         if name == "runwatch" else ""])
    return header, rows


def variant_rows(result: SuiteResult) -> tuple[list[str], list[list[str]]]:
    header = ["signal", "variant", "events", "recall", "delay median / p90, steps (units)"]
    rows = [[signal, variant, str(s["events"]), _fmt(s["recall"]), _delay(s, _unit(signal))]
            for (signal, variant), s in sorted(result.variants.items())]
    return header, rows


def corpus_rows(result: CorpusResult) -> tuple[list[str], list[list[str]]]:
    header = ["signal", "detector", "events", "TP", "FP", "precision", "recall"]
    rows = []
    for signal, s in sorted(result.ours.items()):
        if not s["events"] and not s["fp"]:
            continue
        for name, stats in [("runwatch", s)] + [
                (n, b[signal]) for n, b in result.baselines.items() if signal in b]:
            rows.append([signal if name == "runwatch" else "", name, str(stats["events"]),
                         str(stats["tp"]), str(stats["fp"]), _fmt(stats["precision"]),
                         _fmt(stats["recall"])])
    return header, rows


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _rich(title: str, header: list[str], rows: list[list[str]]) -> Table:
    table = Table(*header, title=title)
    for row in rows:
        table.add_row(*row)
    return table


def _slowest(seconds: dict[str, float], count: int = 3) -> str:
    """The ``count`` analyzers that took longest over the suite, with their seconds."""
    top = sorted(seconds.items(), key=lambda item: -item[1])[:count]
    return ", ".join(f"{signal} {spent:.1f} s" for signal, spent in top) or "none"


def markdown_section(suite: SuiteResult, corpus: CorpusResult | None, command: str,
                     speed: dict[str, Any] | None = None,
                     seeds: dict[int, SuiteResult] | None = None) -> str:
    import os
    import platform
    from datetime import UTC, datetime

    header, rows = detection_tables(suite)
    v_header, v_rows = variant_rows(suite)
    parts = [
        f"`{command}` — {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{suite.cases} synthetic runs, {suite.steps:,} steps "
        f"({suite.negative_steps:,} in negative controls), {suite.seconds:.0f} s "
        f"(slowest analyzers: {_slowest(suite.analyzer_seconds)}).",
        "",
        "Event-level scoring: a detection counts only inside [onset, onset + tolerance] of "
        "a labelled event; a second detection of an event, one before its onset and one "
        "with no event are false positives. Delay is detected step − onset (units: logged "
        "points; evaluations for eval signals; save intervals for checkpoint_gap, whose "
        "series is the saves). False alarms count every detection on "
        "the negative controls (LR-anneal drops, warmup-stable-decay, slow steps at "
        "evaluations and checkpoints, a resumed attempt, very noisy small-batch losses, a "
        "near-zero per-batch loss, multi-epoch SFT drops, a general suite wobbling within "
        "its noise while the domain eval improves, a business metric improving with the "
        "loss, RL with the reward up and the KL flat or growing while the judged eval "
        "saturates, a live run with regular 5–20 min evaluation pauses polled inside one or "
        "between steps, finished runs, "
        "diverse or list-like generations, role markers quoted in code blocks and "
        "red-team prompts refused), with one exception, in every run: a healthy run "
        "converges, so in each stretch where the noise-free training loss is flat by "
        "plateau's own rule (less than 1% fall over its window) the first plateau finding, "
        "and in each stretch where the noise-free eval loss meets the default stop-loss "
        "rule (3 evaluations under 0.5% each) the first diminishing_returns finding, are "
        "true and not scored; a second one in the same stretch is a false positive (a "
        "finding that flaps). A consequence of an injected event (an overfit finding on a "
        "run whose eval loss stalls, a diminishing_returns finding on one whose loss swings, "
        "…) is excused the same way from the event's onset. "
        "Baselines are scored on the "
        "signals their rule covers; false alarms per 10k steps of a signal count the "
        "negative controls that carry what it reads (generations for the text signals, "
        "a reward, a business or a general suite). Tolerances: spike 2 points (NaN/Inf "
        "0; a loss held high for 20–60 points, 10), grad-norm "
        "spike 2 points, climb 20% of the run, plateau 20% of the run, throughput 20 "
        "points, memory 10 points (OOM 0), checkpoint gap max(3 intervals, 1000 steps), "
        "overfit 10 evals, diminishing returns 12 evals, lr_schedule 3 points, oscillation "
        "12 periods, forgetting 10 evals (onset: the first evaluation below the general "
        "suite's level), business_flat 12 evals (onset: the first evaluation after the "
        "business metric stops, placed where the loss still falls), reward_hacking 10 "
        "evals (onset: the first evaluation past the judged eval's best), stalled 0 (onset "
        "and detection are the last logged step; the watcher polls 30 min / 2 h / 12 h "
        "after it), repetition, role_confusion and over_refusal 5 evals (onset: the first "
        "evaluation whose generations carry the injected loops, user turns or refusals).",
        "",
        _markdown(header, rows),
        "",
        "Per variant (runwatch):",
        "",
        _markdown(v_header, v_rows),
    ]
    if seeds and len(seeds) > 1:
        s_header, s_rows = seed_rows(seeds)
        parts += ["", f"Across seeds (the same suite drawn with {len(seeds)} seeds; F1 / "
                      "median delay; ✗: a target of the issue missed on that seed, including "
                      "F1 above each covering baseline):", "", _markdown(s_header, s_rows)]
    from benchmarks.bound import LENIENT_THRESHOLD, THRESHOLD, bound_rows, found_delays

    o_header, o_rows = bound_rows(found_delays(suite.ours, suite.variants))
    parts += ["", "What any detector could reach, for the delay targets that are hardest to "
                  "meet (`benchmarks/bound.py`): an oracle that knows the healthy run an event was "
                  "injected into, its onset, the change's exact shape and the noise model "
                  "runs the matched filter, the best test there is; its median delay is "
                  f"where the whitened change reaches {THRESHOLD:g} standard deviations (the "
                  "threshold of a detector that looks thousands of times and keeps healthy "
                  "runs quiet). A real detector learns all of that from the run and can only "
                  "be later; where the oracle's median is over the target, no detector "
                  "meets it on this suite. The lenient oracle stops at "
                  f"{LENIENT_THRESHOLD:g} deviations, as a detector that accepts false alarms on "
                  "healthy runs for speed would. The oracle's recall within each event's "
                  "tolerance says "
                  "how much of the F1 target is within reach.", "",
              _markdown(o_header, o_rows)]
    if suite.missing:
        parts += ["", "Not available (no analyzer registered): " + ", ".join(suite.missing)
                  + "."]
    if corpus is not None:
        c_header, c_rows = corpus_rows(corpus)
        parts += ["", f"Real logs (`../shared/corpus`, {corpus.files} runs, labels in "
                      f"`benchmarks/data/corpus_labels.toml`):", "", _markdown(c_header, c_rows)]
        quiet = [n for n in corpus.negatives if n["critical"] == 0 and n["warning"] <= 1]
        parts += ["", f"Runs marked NO VISIBLE PROBLEM: {len(quiet)} of "
                      f"{len(corpus.negatives)} within the target (no critical, at most one "
                      f"warning)."]
        loud = [n for n in corpus.negatives if n not in quiet]
        parts += [f"- {n['file']}: {', '.join(n['findings'])}" for n in loud]
        if corpus.missed:
            parts += ["", "Missed labelled events: " + "; ".join(corpus.missed) + "."]
        if corpus.false_alarms:
            parts += ["", "Unlabelled findings: " + "; ".join(corpus.false_alarms) + "."]
    else:
        parts += ["", "Real logs: the corpus folder was not found; not scored."]
    if speed is not None:
        parts += ["", "Speed (every analyzer, one run):", "", "| figure | value |",
                  "|---|---|"]
        parts += [f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |"
                  for k, v in speed.items()]
    return "\n".join(parts) + "\n"


def write_section(path: Path, body: str, name: str = "Detection") -> None:
    import re

    text = path.read_text() if path.exists() else "# Benchmarks\n"
    section = f"## {name}\n\n{body}"
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else \
        text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def default_corpus() -> Path:
    import os

    env = os.environ.get("RUNWATCH_CORPUS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "corpus"


def explain(cases: list[Case], detections: dict[str, list[Detection]], signal: str
            ) -> list[str]:
    """One line per case where ``signal`` was labelled or detected: its events, detections
    and the verdict (hit with delay, missed, false positive) — what a developer tuning one
    analyzer reads."""
    lines = []
    for case in cases:
        events = [e for e in case.events if e.signal == signal]
        steps = sorted(d.step for d in detections.get(case.name, []) if d.signal == signal)
        if not events and not steps:
            continue
        result = match(events, steps, case.allowed.get(signal))
        labels = ", ".join(f"{e.onset}+{e.tolerance}" for e in events) or "none"
        verdicts = [f"hit +{d}" if d is not None else "MISSED" for d in result["delays"]]
        if result["fp"]:
            verdicts.append(f"{result['fp']} FALSE" + (f" ({result['duplicates']} dup)"
                                                        if result["duplicates"] else ""))
        lines.append(f"{case.name}: events {labels}; detected {steps or 'none'} → "
                     f"{', '.join(verdicts) or 'ignored'} (last step {case.data.last_step()})")
    return lines


def focus(signals: list[str], *, console: Console, seed: int = 0, repeats: int = 4) -> int:
    """``runwatch bench detect --signal S``: the whole suite (a detector's false alarms on
    other signals' runs count too), scored for some signals and explained case by case;
    writes nothing (a partial report must not replace the full table)."""
    from benchmarks.bound import LENIENT_THRESHOLD, bounds

    cases = synthetic_suite(seed, repeats)
    found, _ = run_detectors(cases, console=console)
    per_signal, per_variant, negative_steps = score(cases, found["runwatch"], signals)
    baselines: dict[str, dict[str, dict[str, Any]]] = {}
    for name, (covered, _) in BASELINES.items():
        b_signal, _, _ = score(cases, found[name], sorted(covered & set(signals)))
        baselines[name] = {s: summarise(v) for s, v in b_signal.items()}
    for signal in signals:
        s = summarise(per_signal[signal])
        misses = target_misses(
            signal, s, {n: b[signal] for n, b in baselines.items() if signal in b},
            {v: summarise(stats) for (sig, v), stats in per_variant.items()
             if sig == signal})
        share = ("" if signal in EVAL_SIGNALS or s["median_delay_share"] is None
                 else f" ({100 * s['median_delay_share']:.1f}% of the run)")
        console.print(f"[bold]{signal}[/]: events {s['events']} precision "
                      f"{_fmt(s['precision'])} recall {_fmt(s['recall'])} F1 {_fmt(s['f1'])} "
                      f"delay median {_fmt(s['median_delay_units'], 1)} p90 "
                      f"{_fmt(s['p90_delay_units'], 1)} {_unit(signal)}{share}; false "
                      f"alarms/10k {_fmt(s['false_alarms_per_10k'])}; issue target: "
                      f"{', '.join(misses) if misses else 'met'}")
        for bound, lenient in zip(bounds([signal]),
                                  bounds([signal], threshold=LENIENT_THRESHOLD), strict=True):
            console.print(f"  oracle (benchmarks/bound.py): median delay {bound.median():.1f} "
                          f"{bound.unit}, {bound.within():.0%} of events within the target "
                          f"(at {LENIENT_THRESHOLD:g}σ: {lenient.median():.1f} {lenient.unit}, "
                          f"{lenient.within():.0%})", markup=False, highlight=False)
        for name, b in baselines.items():
            if signal in b:
                console.print(f"  baseline {name}: precision {_fmt(b[signal]['precision'])} "
                              f"recall {_fmt(b[signal]['recall'])} F1 {_fmt(b[signal]['f1'])}"
                              f"; false alarms/10k {_fmt(b[signal]['false_alarms_per_10k'])}",
                              markup=False, highlight=False)
        for line in explain(cases, found["runwatch"], signal):
            console.print("  " + line, markup=False, highlight=False, soft_wrap=True)
    return 0


def main_detect(*, output: str, console: Console, seed: int = 0, repeats: int = 4,
                corpus: Path | None = None, speed: bool = False,
                signals: list[str] | None = None, seeds: int = 1) -> int:
    if seeds < 1:
        console.print(f"--seeds must be 1 or more (got {seeds}): how many seeds to draw the "
                      "suite with")
        return 2
    if signals:
        unknown = sorted(set(signals) - set(CATALOG))
        if unknown:
            console.print(f"unknown signal {', '.join(unknown)}; known: "
                          f"{', '.join(sorted(CATALOG))}")
            return 2
        return focus(signals, console=console, seed=seed, repeats=repeats)
    cases = synthetic_suite(seed, repeats)
    suite = evaluate(cases, console=console)
    header, rows = detection_tables(suite)
    console.print(_rich("Detection — synthetic suite", header, rows))
    corpus_result = evaluate_corpus(corpus or default_corpus(), console=console)
    if corpus_result is None:
        console.print("corpus not found: real logs not scored")
    else:
        c_header, c_rows = corpus_rows(corpus_result)
        console.print(_rich("Detection — real logs", c_header, c_rows))
    across = {seed: suite}
    for other in range(seed + 1, seed + seeds):
        across[other] = evaluate(synthetic_suite(other, repeats), console=console)
    if seeds > 1:
        s_header, s_rows = seed_rows(across)
        console.print(_rich("Detection — across seeds", s_header, s_rows))
    speed_result = bench_speed() if speed else None
    command = f"runwatch bench detect --seed {seed} --repeats {repeats}" + \
        (f" --seeds {seeds}" if seeds > 1 else "") + (" --speed" if speed else "")
    write_section(Path(output), markdown_section(suite, corpus_result, command, speed_result,
                                                 across))
    console.print(f"synthetic suite: {suite.cases} runs in {suite.seconds:.0f} s; "
                  f"written to {output}")
    return 0


__all__ = ["BASELINES", "Case", "Detection", "Event", "bench_speed", "evaluate",
           "evaluate_corpus", "main_detect", "match", "score", "synthetic_suite"]
