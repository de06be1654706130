"""GPU memory: the run sits near the device's capacity, or it died out of memory."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from analyzers import register
from analyzers.base import Analyzer, RunData
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_number
from analyzers.stats.trend import theil_sen_rows
from analyzers.streaming import FiniteIndex, Streams

# Where a run's device capacity is looked up, in the unit its memory is logged in:
# the run's metadata first, then its configuration.
CAPACITY_KEY = "gpu_mem_total"
# Metadata fields that carry a failed run's reason (W&B's exit, MLflow's status).
_FAILURE_KEYS = ("status", "error")
_OUT_OF_MEMORY = re.compile(r"out of memory|\bOOM\b|OutOfMemoryError", re.IGNORECASE)
# Resolve once memory is this much of capacity below the threshold (hysteresis).
_RESOLVE_MARGIN = 0.05
# A median reading above this multiple of the capacity cannot be memory on that device:
# the two are in different units, and no verdict is better than a wrong one.
_UNIT_MISMATCH = 2.0
# Points of context shown before the onset, and the cap on evidence points.
_CONTEXT_BEFORE = 5
_MAX_EVIDENCE_POINTS = 30
# Candidate points whose trend-aware level is computed at once (bounds the memory used).
_TREND_CHUNK = 2048
# The unit check reads the median of the first this many finite readings (all of them in a
# shorter run): a unit does not change mid-run, and a fixed sample lets a poll resume.
_UNIT_POINTS = 10_000


@dataclass(frozen=True)
class _Episode:
    onset: int  # index among the finite points
    detected: int  # index among the finite points
    resolved: int | None  # index of the last point of the resolving run
    trend: bool = False  # fired by the trend-aware level rather than the persistence rule


@dataclass
class _State:
    """What one poll leaves for the next: the finite points' positions, the capacity the
    episodes were judged against, the unit check once its sample is complete, the highest
    reading, the finite index from which episodes are looked for again (the run is not
    near capacity there, nor just before it) and the episodes before it."""

    index: FiniteIndex = field(default_factory=FiniteIndex)
    capacity: float | None = None
    units_ok: bool | None = None
    peak: float = -math.inf  # over the first ``peaked`` finite points
    peaked: int = 0
    resume: int = 0
    episodes: list[_Episode] = field(default_factory=list)


@register
class Memory(Analyzer):
    """GPU memory near capacity, or an out-of-memory failure.

    *Signal* (SIGNALS.md ``memory``). Two findings:

    * **near capacity** (``warning``): memory is at or above ``threshold`` of the
      device's capacity, by either of two rules, whichever fires first. *Persistence*:
      ``patience`` logged points in a row at or above it; the onset is the first of them,
      the detection the ``patience``-th (a sudden jump). *Trend*: a reading at or above
      it whose trend-aware level is too — the Theil–Sen line (median of the pairwise
      slopes, median intercept) through the last ``window`` readings, read at the latest
      one; the detection is that reading, the onset the first reading at or above the
      threshold among the ``window`` (a creep, whose noisy readings straddle the
      threshold for many points before ``patience`` of them in a row are above it). It
      resolves once ``patience`` points in a row are below ``threshold - 0.05`` of
      capacity. The capacity is the ``capacity``
      parameter, else ``gpu_mem_total`` in the run's metadata, else in its
      configuration, always in the unit ``metric`` is logged in. Without a capacity this
      rule says nothing: how close is too close cannot be told from the readings alone
      (a peak-memory metric climbs by design, and a steady one may sit at 98% for days).
    * **out of memory** (``critical``): the run's metadata ``status`` or ``error`` says
      it failed out of memory (``CUDA out of memory``, ``OutOfMemoryError``, ``OOM``).
      Onset and detection are the run's last logged step; it stays firing for this
      attempt.

    Parameters
    ----------
    metric : str, default "gpu_mem"
        The tag watched (allocated or reserved memory, peak or current).
    capacity : float or None, default None
        The device's memory in the metric's unit; None reads it from the run. Set it
        where the source does not record the device.
    threshold : float, default 0.95
        Share of capacity that counts as near the limit. Lower warns earlier, when a
        longer batch could still fit; higher only warns on the brink.
    patience : int, default 5
        Points in a row at or above the threshold before firing, and below it before
        resolving. More ignores a brief peak (an evaluation with a larger batch); fewer
        warns sooner.
    window : int, default 20
        Readings the trend-aware level is fitted to (at least 3). Longer averages more
        noise away and ignores longer peaks (the fit ignores up to about a quarter of its
        points), but follows a creep's bend more slowly; shorter reacts to a creep sooner
        and lets noise or a short peak through more easily.

    *False-positive guard*: ``patience`` points in a row, never one peak; the trend rule
    needs the latest reading above the threshold too, and its robust fit ignores a peak
    of up to about a quarter of the ``window`` (a run sitting below the threshold with
    noise never fires: its level is its median, not its highest readings); a resolve
    level below the firing one, so memory hovering at the threshold does not flap; no
    verdict without a capacity, and none when the median of the first 10,000 readings is
    above twice the capacity (the two are in different units — e.g. bytes against GB — which is a
    configuration error, not a full GPU). Non-finite readings are skipped.

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import RunData
    >>> mem = np.concatenate([np.full(100, 60.0), np.linspace(60.0, 79.0, 50),
    ...                       np.full(50, 79.0)])
    >>> data = RunData.from_series("demo", {"gpu_mem": mem}, meta={"gpu_mem_total": 80.0})
    >>> [finding] = Memory().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.severity, finding.state
    (143, 143, 'warning', 'firing')
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    gpu_mem reached 95% of its 80.00 capacity at step 143 (76.29) and its trend over the
    last 20 points was there by step 143; peak 79.00 (99%) at step 150
    >>> jump = np.concatenate([np.full(100, 60.0), np.full(50, 78.0)])
    >>> data = RunData.from_series("demo", {"gpu_mem": jump}, meta={"gpu_mem_total": 80.0})
    >>> [finding] = Memory().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.evidence["fired_by"]
    (101, 105, 'persistence')
    >>> failed = RunData.from_series("demo", {"gpu_mem": mem},
    ...                              meta={"status": "failed: CUDA out of memory"})
    >>> [finding] = Memory().detect(failed)
    >>> finding.severity, finding.onset_step, finding.summary
    ('critical', 200, "the run failed out of memory after step 200 ('failed: CUDA out of memory')")
    """

    signal = "memory"

    def __init__(self, metric: str = "gpu_mem", capacity: float | None = None,
                 threshold: float = 0.95, patience: int = 5, window: int = 20) -> None:
        check_metric(metric)
        if capacity is not None:
            check_real("capacity", capacity, 0.0)
        check_real("threshold", threshold, _RESOLVE_MARGIN, below=1.0)
        check_int("patience", patience, 1)
        check_int("window", window, 3)
        self.metric = metric
        self.capacity = capacity
        self.threshold = threshold
        self.patience = patience
        self.window = window
        self._streams: Streams[_State] = Streams()

    def detect(self, data: RunData) -> list[Finding]:
        series = data.series(self.metric)
        values = series.to_numpy(dtype=float)
        steps = series.index.to_numpy(dtype=np.int64)
        capacity, origin = self._capacity(data.meta)
        tags = (self.metric,)
        state = self._streams.resume(data, tags)
        if state is None or state.capacity != capacity:
            state = _State(capacity=capacity)
        count = state.index.extend(values)
        new = values[state.index.positions(state.peaked, count)]
        if new.size:
            state.peak = max(state.peak, float(new.max()))
        state.peaked = count
        units_ok = state.units_ok
        if units_ok is None and capacity is not None and count:
            head = values[state.index.positions(0, min(count, _UNIT_POINTS))]
            units_ok = bool(np.median(head) <= _UNIT_MISMATCH * capacity)
            if count >= _UNIT_POINTS:
                state.units_ok = units_ok
        findings = []
        if capacity is not None and units_ok:
            # The trend-aware level looks back ``window - 1`` points before the resume point.
            lo = max(0, state.resume - (self.window - 1))
            context = values[state.index.positions(lo, count)]
            # An onset is never looked for before the previous episode's resolution.
            floor = state.episodes[-1].resolved + 1 if state.episodes else 0
            fresh = [_Episode(e.onset + lo, e.detected + lo,
                              None if e.resolved is None else e.resolved + lo, e.trend)
                     for e in self._episodes(context, capacity, state.resume - lo, lo,
                                             floor - lo)]
            findings += [self._near_finding(data, steps, values, state.index, capacity, origin,
                                            episode) for episode in state.episodes + fresh]
            self._settle(state, values[state.index.positions(state.resume, count)], capacity,
                         fresh, count)
        self._streams.save(data, tags, state)
        failure = _out_of_memory(data.meta)
        if failure is not None:
            last = (int(steps[state.index.positions(count - 1, count)[0]]), float(
                values[state.index.positions(count - 1, count)[0]])) if count else None
            findings.append(self._oom_finding(data, last, state.peak if count else None,
                                              capacity, failure))
        return findings

    def _settle(self, state: _State, tail: np.ndarray, capacity: float,
                fresh: list[_Episode], count: int) -> None:
        """Resume later from the last point not at the threshold, when no episode is open:
        no run of high readings spans it, so judging from there is judging from the start."""
        if fresh and fresh[-1].resolved is None:
            return
        high = tail >= self.threshold * capacity
        last_ok = np.flatnonzero(~high)
        if not last_ok.size:
            return
        resume = state.resume + int(last_ok[-1]) + 1
        if fresh and resume <= fresh[-1].resolved:
            return
        state.episodes += fresh
        state.resume = resume

    def _capacity(self, meta: dict[str, Any]) -> tuple[float | None, str]:
        if self.capacity is not None:
            return float(self.capacity), "parameter"
        config = meta.get("config")
        for origin, where in (("meta", meta), ("config", config)):
            value = where.get(CAPACITY_KEY) if isinstance(where, dict) else None
            if (isinstance(value, Real) and not isinstance(value, bool)
                    and math.isfinite(value) and value > 0):
                return float(value), origin
        return None, ""

    def _episodes(self, values: np.ndarray, capacity: float, start: int, offset: int,
                  floor: int) -> list[_Episode]:
        """The episodes detected from ``start`` on; ``values[0]`` is finite point ``offset``
        of the run, the points before ``start`` are the trend's look-back, and a trend
        episode's onset is not before ``floor`` (the previous episode's end)."""
        limit = self.threshold * capacity
        above = values >= limit
        high = _run_ends(above, self.patience)
        low = _run_ends(values < (self.threshold - _RESOLVE_MARGIN) * capacity, self.patience)
        episodes = []
        while start < len(values):
            fired = _first_after(high, start + self.patience - 1)
            trend = self._trend_fire(values, above, limit, start, fired, offset)
            if trend is not None:
                window = above[max(floor, trend - self.window + 1):trend + 1]
                onset, fired = trend - len(window) + int(np.argmax(window)) + 1, trend
            elif fired is not None:
                onset = fired - self.patience + 1
            else:
                break
            resolved = _first_after(low, fired + self.patience)
            episodes.append(_Episode(onset, fired, resolved, trend is not None))
            if resolved is None:
                break
            start = floor = resolved + 1
        return episodes

    def _trend_fire(self, values: np.ndarray, above: np.ndarray, limit: float, start: int,
                    before: int | None, offset: int) -> int | None:
        """The first point from ``start`` (and before ``before``) at or above ``limit`` whose
        trend-aware level is too: the Theil–Sen line through the last ``window`` points, read
        at the latest. None when there is none."""
        w = self.window
        first = max(start, w - 1 - offset)
        end = len(values) if before is None else before
        candidates = first + np.flatnonzero(above[first:end])
        if not candidates.size:
            return None
        for lo in range(0, candidates.size, _TREND_CHUNK):
            at = candidates[lo:lo + _TREND_CHUNK]
            y = values[at[:, None] + np.arange(1 - w, 1)]
            _, level = theil_sen_rows(y)
            hit = np.flatnonzero(level >= limit)
            if hit.size:
                return int(at[hit[0]])
        return None

    def _near_finding(self, data: RunData, steps: np.ndarray, values: np.ndarray,
                      index: FiniteIndex, capacity: float, origin: str,
                      episode: _Episode) -> Finding:
        """The finding of an episode whose onset and resolution are finite indices."""
        first = max(0, episode.onset - _CONTEXT_BEFORE)
        count = index.count
        end = count if episode.resolved is None else episode.resolved + 1
        span = index.positions(first, end)
        local_steps, local = steps[span], values[span]
        onset = episode.onset - first
        onset_step = int(local_steps[onset])
        detected = episode.detected - first
        peak_at = onset + int(np.argmax(local[onset:]))
        peak = float(local[peak_at])
        how = (f"its trend over the last {self.window} points was there by step "
               f"{int(local_steps[detected])}" if episode.trend
               else f"stayed there for {self.patience} points")
        summary = (f"{self.metric} reached {100 * self.threshold:.0f}% of its "
                   f"{fmt_number(capacity)} capacity at step {onset_step} "
                   f"({fmt_number(local[onset])}) and {how}; peak {fmt_number(peak)} "
                   f"({100 * peak / capacity:.0f}%) at step {int(local_steps[peak_at])}")
        evidence = {
            "rule": "near_capacity",
            "capacity": capacity,
            "capacity_from": origin,
            "threshold": self.threshold,
            "fired_by": "trend" if episode.trend else "persistence",
            "peak": peak,
            "peak_step": int(local_steps[peak_at]),
            "points": [[int(local_steps[i]), float(local[i])]
                       for i in range(min(len(local), _MAX_EVIDENCE_POINTS))],
        }
        return self.finding(
            data, onset_step=onset_step, detected_step=int(local_steps[detected]),
            summary=summary, evidence=evidence,
            rollback_to=None,  # the weights are fine: fixes change the batch
            resolved_step=None if episode.resolved is None else int(local_steps[-1]))

    def _oom_finding(self, data: RunData, last: tuple[int, float] | None,
                     peak: float | None, capacity: float | None, failure: str) -> Finding:
        last_step = data.last_step() or 0
        evidence: dict[str, Any] = {"rule": "out_of_memory", "failure": failure,
                                    "capacity": capacity}
        if last is not None:
            evidence["last"] = list(last)
            evidence["peak"] = peak
        summary = f"the run failed out of memory after step {last_step} ({failure!r})"
        return self.finding(data, severity="critical", onset_step=last_step,
                            detected_step=last_step, summary=summary, evidence=evidence,
                            rollback_to=None)


def _out_of_memory(meta: dict[str, Any]) -> str | None:
    """The metadata text that reports an out-of-memory failure, if any."""
    for key in _FAILURE_KEYS:
        text = meta.get(key)
        if isinstance(text, str) and _OUT_OF_MEMORY.search(text):
            return text
    return None


def _run_ends(ok: np.ndarray, length: int) -> np.ndarray:
    """Positions that end a run of ``length`` true values (each such window's last point)."""
    counts = np.concatenate(([0], np.cumsum(ok)))
    return np.flatnonzero(counts[length:] - counts[:-length] == length) + length - 1


def _first_after(ends: np.ndarray, position: int) -> int | None:
    """The first of ``ends`` at or after ``position``."""
    later = ends[np.searchsorted(ends, position):][:1]
    return int(later[0]) if later.size else None
