"""Throughput drop: the run keeps going, but each step has become markedly slower."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from analyzers import register
from analyzers.base import Analyzer, RunData
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_number
from analyzers.stats.robust import first_run, moving_median, positive_before, positive_from
from analyzers.streaming import Streams

# Rows of windows handled at once: bounds memory when ``window`` is large.
_CHUNK_ELEMENTS = 2_000_000
# Points of context shown before the onset, and the cap on evidence points.
_CONTEXT_BEFORE = 5
_MAX_EVIDENCE_POINTS = 30
_MODES = ("max", "min")


@dataclass(frozen=True)
class _Drop:
    onset: int  # index among the judged (finite, positive) points
    resolved: int | None  # index of the last point of the recovering run
    before: float  # level before the drop, log of the speed
    baseline_points: int
    end: int = 0  # index after the drop's last point (start of the recovering run)


@dataclass
class _State:
    """What one poll leaves for the next: the scan resumes at series position ``resume``
    (``context`` judged points of level come first; -1: from the start, with the
    warm-up), after the settled drops (in series positions)."""

    resume: int = 0
    context: int = -1
    drops: list[_Drop] = field(default_factory=list)


@register
class ThroughputDrop(Analyzer):
    """Throughput drop: a lasting level shift down in tokens/s (or samples/s).

    *Signal* (SIGNALS.md ``throughput_drop``). The speed is judged on a log scale. A drop
    begins at the first point from which ``patience`` points in a row all sit at least
    ``min_drop`` below the level before it, the median of the previous ``window`` points.
    The finding's onset is that first point; it is detected at the ``patience``-th. It
    resolves once ``patience`` points in a row are back within ``recovery`` of the old
    level; a later drop is a new finding, judged against a level that leaves the earlier
    drop's points out. Non-finite and non-positive values are skipped (a stopped run is
    ``stalled``'s to report).

    Parameters
    ----------
    metric : str, default "throughput"
        The tag watched.
    mode : {"max", "min"}, default "max"
        ``"max"`` for a speed (tokens/s, samples/s: higher is better); ``"min"`` for a
        time per step (s/it, ms per iteration), judged as its inverse.
    window : int, default 50
        Points in the level before a drop. Longer is steadier and rides out clusters of
        slow steps; shorter follows a speed that drifts (e.g. with sequence length).
    min_drop : float, default 0.3
        Relative fall of the speed that counts as a drop (0.3 = 30% slower). Lower also
        reports mild slowdowns; higher only the severe ones.
    patience : int, default 10
        Points in a row that must all be down before firing, and back up before
        resolving (the rule's ``for:`` period). More rides out longer evaluation or
        checkpoint pauses; fewer alerts sooner.
    recovery : float, default 0.1
        How close to the old level (0.1 = within 10%) the speed must come back to
        resolve. Smaller than ``min_drop``, so a speed hovering near the threshold does
        not flap.
    grace_period : int, default 20
        Points at the start never judged nor used as a level (warm-up, compilation and
        the first data-loader fill make the first steps unrepresentative).

    *False-positive guard*: one slow step — an evaluation pause, a checkpoint save, a
    garbage collection — never fires, nor does any run of slow steps shorter than
    ``patience``, since every one of ``patience`` points in a row must be down; and the
    level they are compared with is a median, which periodic slow steps do not drag
    down. ``grace_period`` skips the warm-up, and a run that speeds up never fires.

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import RunData
    >>> rng = np.random.default_rng(0)
    >>> tokens_per_s = 50_000 * np.exp(0.03 * rng.standard_normal(400))
    >>> tokens_per_s[::25] /= 4  # an evaluation pause every 25 points: never fires
    >>> tokens_per_s[200:300] *= 0.5  # a data-loading bottleneck for 100 points
    >>> [finding] = ThroughputDrop().detect(RunData.from_series("demo",
    ...                                                         {"throughput": tokens_per_s}))
    >>> finding.onset_step, finding.detected_step, finding.state, finding.resolved_step
    (201, 210, 'resolved', 314)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    throughput fell 50% from step 201: 24,647 over its first 10 points, against a median of
    49,697 over the 50 points before
    """

    signal = "throughput_drop"

    def __init__(self, metric: str = "throughput", mode: str = "max", window: int = 50,
                 min_drop: float = 0.3, patience: int = 10, recovery: float = 0.1,
                 grace_period: int = 20) -> None:
        check_metric(metric)
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
        check_int("window", window, 3)
        check_real("min_drop", min_drop, 0.0, below=1.0)
        check_int("patience", patience, 1)
        check_real("recovery", recovery, 0.0, allow_equal=True)
        if recovery >= min_drop:
            raise ValueError(f"recovery must be smaller than min_drop ({min_drop!r}), "
                             f"got {recovery!r}")
        check_int("grace_period", grace_period, 0)
        self.metric = metric
        self.mode = mode
        self.window = window
        self.min_drop = min_drop
        self.patience = patience
        self.recovery = recovery
        self.grace_period = grace_period
        self._streams: Streams[_State] = Streams()

    def detect(self, data: RunData) -> list[Finding]:
        series = data.series(self.metric)
        if series.empty:
            return []
        values = series.to_numpy(dtype=float)
        steps = series.index.to_numpy(dtype=np.int64)
        tags = (self.metric,)
        state = self._streams.resume(data, tags) or _State()
        fresh, settled = self._scan(values, state)
        self._streams.save(data, tags, settled)
        return [self._finding(data, steps, values, drop) for drop in state.drops + fresh]

    # Judging a point needs only the ``window`` judged points before it and the
    # ``patience`` after it: each poll resumes from the last position with that much
    # drop-free history before it, so its cost does not grow with the history.

    def _scan(self, values: np.ndarray, state: _State) -> tuple[list[_Drop], _State]:
        """The drops from ``state.resume`` on (series positions), and the state a later
        poll resumes from."""
        lo = state.resume
        tail = values[lo:]
        judged = np.flatnonzero(np.isfinite(tail) & (tail > 0))
        # The log of the speed: a time per step is the inverse of a speed.
        speed = np.log(tail[judged]) * (1.0 if self.mode == "max" else -1.0)
        grace = self.grace_period if state.context < 0 else 0
        found = self._drops(speed, grace)
        n = len(speed)

        def at(k: int) -> int:  # series position of judged index k (n: past the end)
            return lo + int(judged[k]) if k < n else len(values)

        fresh = [replace(d, onset=at(d.onset), end=at(d.end),
                         resolved=None if d.resolved is None else at(d.resolved))
                 for d in found]
        first_judged = grace + self.window
        for k in [n - self.patience + 1] + [d.onset for d in reversed(found)]:
            before = [d for d in found if d.onset < k]
            context = k - self.window
            if k <= first_judged or context < grace:
                break
            last = before[-1] if before else None
            if last is None or (last.resolved is not None and last.resolved < k
                                and last.end <= context):
                return fresh, _State(at(context), self.window,
                                     state.drops + fresh[:len(before)])
        return fresh, state

    def _drops(self, speed: np.ndarray, grace: int) -> list[_Drop]:
        n = len(speed)
        usable = speed[grace:]
        if len(usable) < self.window + self.patience:
            return []
        fall = math.log(1 - self.min_drop)
        # The fastest of each run of `patience` points, and the level before its first.
        fastest = np.full(len(usable), np.inf)
        fastest[:len(usable) - self.patience + 1] = _rolling_max(usable, self.patience)
        level = np.full(len(usable), np.nan)
        level[self.window:] = moving_median(usable, self.window)[self.window - 1:-1]
        with np.errstate(invalid="ignore"):
            raw_hits = np.flatnonzero(fastest <= level + fall) + grace
        excluded = np.zeros(n, dtype=bool)
        # Points below this index have a level window holding an earlier drop's points.
        judge_alone_until = 0
        drops: list[_Drop] = []
        start = grace + self.window
        while start <= n - self.patience:
            hit = self._first_hit_alone(speed, excluded, start,
                                        min(judge_alone_until, n - self.patience + 1), fall,
                                        grace)
            if hit is None:
                later = raw_hits[np.searchsorted(raw_hits, max(start, judge_alone_until)):][:1]
                if not later.size:
                    break
                hit = int(later[0])
            before = self._clean_window(speed, excluded, hit, grace)
            level_before = float(np.median(before))
            back = level_before + math.log(1 - self.recovery)
            recovered = first_run(speed, hit + self.patience, self.patience,
                                  lambda v, back=back: v >= back)
            end = n if recovered is None else recovered - self.patience + 1
            excluded[hit:end] = True
            drops.append(_Drop(hit, recovered, level_before, int(before.size), end))
            if recovered is None:
                break
            judge_alone_until = end + self.window
            start = recovered + 1
        return drops

    def _first_hit_alone(self, speed: np.ndarray, excluded: np.ndarray, k_from: int,
                         k_to: int, fall: float, grace: int) -> int | None:
        """First index in [k_from, k_to) whose run of ``patience`` points is down against
        the median of the ``window`` clean points before it."""
        if k_from >= k_to:
            return None
        clean = np.flatnonzero(~excluded[grace:k_to]) + grace
        candidates = np.arange(k_from, k_to)
        available = np.searchsorted(clean, candidates)
        candidates = candidates[available >= self.window]
        if not candidates.size:
            return None
        available = available[available >= self.window]
        rows = available[:, None] - self.window + np.arange(self.window)
        level = np.median(speed[clean[rows]], axis=1)
        runs = speed[candidates[:, None] + np.arange(self.patience)]
        first = np.flatnonzero(runs.max(axis=1) <= level + fall)[:1]
        return int(candidates[first[0]]) if first.size else None

    def _clean_window(self, speed: np.ndarray, excluded: np.ndarray, k: int,
                      grace: int) -> np.ndarray:
        """The last ``window`` points after the warm-up before index ``k`` outside any drop."""
        clean = np.flatnonzero(~excluded[grace:k]) + grace
        return speed[clean[-self.window:]]

    def _finding(self, data: RunData, steps: np.ndarray, values: np.ndarray,
                 drop: _Drop) -> Finding:
        """The finding of a drop whose onset, end and resolution are series positions."""
        sign = 1.0 if self.mode == "max" else -1.0
        onset_step = int(steps[drop.onset])
        context_end = len(values) if drop.resolved is None else drop.resolved + 1
        first_points = positive_from(values, drop.onset, len(values), self.patience)
        detected = int(first_points[-1])
        after = float(np.median(sign * np.log(values[first_points])))
        fell = 1 - math.exp(after - drop.before)
        before_value, after_value = math.exp(sign * drop.before), math.exp(sign * after)
        if self.mode == "max":
            change = f"{self.metric} fell {100 * fell:.0f}% from step {onset_step}"
        else:
            change = (f"{self.metric} rose {after_value / before_value:.1f}x from step "
                      f"{onset_step} (the speed fell {100 * fell:.0f}%)")
        summary = (f"{change}: {_fmt(after_value)} over its first {self.patience} points, "
                   f"against a median of {_fmt(before_value)} over the "
                   f"{drop.baseline_points} points before")
        shown = (positive_before(values, drop.onset, _CONTEXT_BEFORE)
                 + positive_from(values, drop.onset, context_end, _MAX_EVIDENCE_POINTS))
        return self.finding(
            data,
            onset_step=onset_step,
            detected_step=int(steps[detected]),
            summary=summary,
            evidence={
                "mode": self.mode,
                "before": before_value,
                "baseline_points": drop.baseline_points,
                "after": after_value,
                "drop": fell,
                "min_drop": self.min_drop,
                "points": [[int(steps[i]), float(values[i])]
                           for i in shown[:_MAX_EVIDENCE_POINTS]],
            },
            rollback_to=None,  # a slow run needs no rollback: its weights are fine
            resolved_step=None if drop.resolved is None else int(steps[drop.resolved]),
        )


def _rolling_max(values: np.ndarray, width: int) -> np.ndarray:
    """``max(values[i:i + width])`` for every full window, in chunks of bounded memory."""
    windows = sliding_window_view(values, width)
    rows = max(1, _CHUNK_ELEMENTS // width)
    return np.concatenate([windows[lo:lo + rows].max(axis=1)
                           for lo in range(0, len(windows), rows)])


def _fmt(value: float) -> str:
    """A speed or a step time: whole numbers with thousands separated from 1,000 (below,
    and from a million on, as ``fmt_number``)."""
    return f"{value:,.0f}" if 1000 <= abs(value) < 1e6 else fmt_number(value)
