"""GPU memory: the run sits near the device's capacity, or it died out of memory."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np

from analyzers import register
from analyzers.base import (
    Analyzer,
    Finding,
    RunData,
    check_int,
    check_metric,
    check_real,
    fmt_number,
)

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


@dataclass(frozen=True)
class _Episode:
    onset: int  # index among the finite points
    resolved: int | None  # index of the last point of the resolving run


@register
class Memory(Analyzer):
    """GPU memory near capacity, or an out-of-memory failure.

    *Signal* (SIGNALS.md ``memory``). Two findings:

    * **near capacity** (``warning``): ``patience`` logged points in a row at or above
      ``threshold`` of the device's capacity. The onset is the first of them, the
      detection the ``patience``-th; it resolves once ``patience`` points in a row are
      below ``threshold - 0.05`` of capacity. The capacity is the ``capacity``
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

    *False-positive guard*: ``patience`` points in a row, never one peak; a resolve
    level below the firing one, so memory hovering at the threshold does not flap; no
    verdict without a capacity, and none when the readings' median is above twice the
    capacity (the two are in different units — e.g. bytes against GB — which is a
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
    (143, 147, 'warning', 'firing')
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    gpu_mem reached 95% of its 80.00 capacity at step 143 (76.29) and stayed there for 5
    points; peak 79.00 (99%) at step 150
    >>> failed = RunData.from_series("demo", {"gpu_mem": mem},
    ...                              meta={"status": "failed: CUDA out of memory"})
    >>> [finding] = Memory().detect(failed)
    >>> finding.severity, finding.onset_step, finding.summary
    ('critical', 200, "the run failed out of memory after step 200 ('failed: CUDA out of memory')")
    """

    signal = "memory"

    def __init__(self, metric: str = "gpu_mem", capacity: float | None = None,
                 threshold: float = 0.95, patience: int = 5) -> None:
        check_metric(metric)
        if capacity is not None:
            check_real("capacity", capacity, 0.0)
        check_real("threshold", threshold, _RESOLVE_MARGIN, below=1.0)
        check_int("patience", patience, 1)
        self.metric = metric
        self.capacity = capacity
        self.threshold = threshold
        self.patience = patience

    def detect(self, data: RunData) -> list[Finding]:
        series = data.series(self.metric)
        values = series.to_numpy(dtype=float)
        finite = np.isfinite(values)
        steps = series.index.to_numpy(dtype=np.int64)[finite]
        values = values[finite]
        findings = []
        capacity, origin = self._capacity(data.meta)
        if capacity is not None and values.size and np.median(values) <= _UNIT_MISMATCH * capacity:
            findings += [self._near_finding(data, steps, values, capacity, origin, episode)
                         for episode in self._episodes(values, capacity)]
        failure = _out_of_memory(data.meta)
        if failure is not None:
            findings.append(self._oom_finding(data, steps, values, capacity, failure))
        return findings

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

    def _episodes(self, values: np.ndarray, capacity: float) -> list[_Episode]:
        high = _run_ends(values >= self.threshold * capacity, self.patience)
        low = _run_ends(values < (self.threshold - _RESOLVE_MARGIN) * capacity, self.patience)
        episodes = []
        start = 0
        while start < len(values):
            fired = _first_after(high, start + self.patience - 1)
            if fired is None:
                break
            onset = fired - self.patience + 1
            resolved = _first_after(low, fired + self.patience)
            episodes.append(_Episode(onset, resolved))
            if resolved is None:
                break
            start = resolved + 1
        return episodes

    def _near_finding(self, data: RunData, steps: np.ndarray, values: np.ndarray,
                      capacity: float, origin: str, episode: _Episode) -> Finding:
        onset_step = int(steps[episode.onset])
        detected = episode.onset + self.patience - 1
        end = len(values) if episode.resolved is None else episode.resolved + 1
        peak_at = episode.onset + int(np.argmax(values[episode.onset:end]))
        peak = float(values[peak_at])
        summary = (f"{self.metric} reached {100 * self.threshold:.0f}% of its "
                   f"{fmt_number(capacity)} capacity at step {onset_step} "
                   f"({fmt_number(values[episode.onset])}) and stayed there for "
                   f"{self.patience} points; peak {fmt_number(peak)} "
                   f"({100 * peak / capacity:.0f}%) at step {int(steps[peak_at])}")
        first = max(0, episode.onset - _CONTEXT_BEFORE)
        shown = range(first, min(end, first + _MAX_EVIDENCE_POINTS))
        evidence = {
            "rule": "near_capacity",
            "capacity": capacity,
            "capacity_from": origin,
            "threshold": self.threshold,
            "peak": peak,
            "peak_step": int(steps[peak_at]),
            "points": [[int(steps[i]), float(values[i])] for i in shown],
        }
        return self.finding(
            data, onset_step=onset_step, detected_step=int(steps[detected]), summary=summary,
            evidence=evidence, rollback_to=None,  # the weights are fine: fixes change the batch
            resolved_step=None if episode.resolved is None else int(steps[episode.resolved]))

    def _oom_finding(self, data: RunData, steps: np.ndarray, values: np.ndarray,
                     capacity: float | None, failure: str) -> Finding:
        last = data.last_step() or 0
        evidence: dict[str, Any] = {"rule": "out_of_memory", "failure": failure,
                                    "capacity": capacity}
        if values.size:
            evidence["last"] = [int(steps[-1]), float(values[-1])]
            evidence["peak"] = float(values.max())
        summary = f"the run failed out of memory after step {last} ({failure!r})"
        return self.finding(data, severity="critical", onset_step=last, detected_step=last,
                            summary=summary, evidence=evidence, rollback_to=None)


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
