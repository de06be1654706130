"""Gradient norm: a sudden spike (an abnormal batch) or a sustained climb (an optimiser
heading to instability)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

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
from analyzers.stats import (
    MAD_TO_SD,
    clean_start,
    clean_window,
    first_run,
    positive_before,
    positive_from,
    row_median_sd,
)
from analyzers.streaming import Streams

# Rows of rolling windows handled at once: bounds memory when ``window`` is large.
_CHUNK_ELEMENTS = 2_000_000
# Points of context shown before the onset, and the cap on evidence points.
_CONTEXT_BEFORE = 5
_MAX_EVIDENCE_POINTS = 30
# The trend window is cut into this many blocks; their medians carry the trend test.
_BLOCKS = 10
_PAIRS = np.triu_indices(_BLOCKS, 1)
# Mann–Kendall on the block medians: S's standard deviation without ties, and the one-sided
# z a rising window must reach (p < 0.01).
_MK_SD = math.sqrt(_BLOCKS * (_BLOCKS - 1) * (2 * _BLOCKS + 5) / 18)
_MK_Z = 2.326
# A climb must rise this many robust standard deviations of the norm's own wander.
_WANDER = 5.0
# … measured over up to this many window lengths before the window.
_HISTORY = 8
# Window scales of the climb rule: 1, 2, 4, … times ``trend_window``.
_SCALES = 7


@dataclass(frozen=True)
class _Spike:
    onset: int  # index among the judged (finite, positive) points
    resolved: int | None  # index of the last point of the resolving run
    median: float  # baseline median, log scale
    scale: float  # robust standard deviation of the baseline, log scale
    baseline_points: int
    end: int = 0  # index after the episode's last point (start of the resolving run)


@dataclass(frozen=True)
class _Climb:
    """A climb episode, as steps: ready to be reported without the history."""

    onset_step: int
    detected_step: int
    resolved_step: int | None
    window_steps: tuple[int, int]
    medians: tuple[float, ...]  # the ten (super-)block medians, log scale
    rise: float  # log scale
    z: float
    scale: int  # blocks per super-block


@dataclass
class _Blocks:
    """The climb rule's running state: the median (log scale), the ten-block level and the
    first and last step of every complete block since the warm-up; per
    window scale the rising windows in a row and the first block of that run; the open and
    closed episodes."""

    next_position: int = -1  # series position where the next block begins (-1: not yet)
    count: int = 0  # complete blocks judged
    medians: list[float] = field(default_factory=list)
    levels: list[float] = field(default_factory=list)  # median of the ten blocks up to each
    first_steps: list[int] = field(default_factory=list)
    last_steps: list[int] = field(default_factory=list)
    runs: list[int] = field(default_factory=lambda: [0] * _SCALES)
    run_starts: list[int] = field(default_factory=lambda: [0] * _SCALES)
    open: _Climb | None = None
    climbs: list[_Climb] = field(default_factory=list)
    fresh_from: int = 0  # first block a window may start at: after the last episode


@dataclass
class _State:
    """What one poll leaves for the next: the spike scan resumes at series position
    ``spike_from`` (``spike_context`` judged points of context come first), after the
    settled spikes (in series positions); and the climb rule's blocks."""

    spike_from: int = 0
    spike_context: int = -1  # -1: from the start, with the warm-up
    spikes: list[_Spike] = field(default_factory=list)
    blocks: _Blocks = field(default_factory=_Blocks)


@register
class GradNorm(Analyzer):
    """Gradient norm: a spike far above its recent level, or a steady climb.

    *Signal* (SIGNALS.md ``grad_norm``). Two rules, both on the log of the gradient norm
    (it is multiplicative: batch to batch it swings by factors, not by amounts).

    A **spike** is a point more than ``threshold`` robust standard deviations
    (``1.4826 * MAD``) above the median of the previous ``window`` points *and* at least
    ``min_ratio`` times that median. One finding per episode, onset and detection at the
    first abnormal point; it resolves once ``resolve_points`` consecutive points are back
    below the geometric midpoint of the median and the firing level; points of an episode
    are left out of every later baseline.

    A **climb** is judged on windows of ``trend_window`` points and of 2, 4, … 64 times
    that, after the warm-up, so that a slow climb over thousands of points is seen long
    before it has tripled. Each window is cut into ten (super-)blocks whose medians must
    rise steadily (a one-sided Mann–Kendall test, p < 0.01) by at least ``min_rise``
    (the shortest window) or ``min_slow_rise`` (the longer ones) along their Theil–Sen
    line, and by more than the norm's own wander (below). A window of ``2**k`` times
    ``trend_window`` is judged every ``2**k`` blocks of ``trend_window // 10`` points;
    ``patience`` rising windows in a row fire at the shortest scale, one fewer per
    doubling at the longer ones (at least one). The onset is the first step of the first
    rising window; the episode resolves at the first window of the firing scale whose
    fitted rise is under half its minimum (log scale), and the next one is judged on
    windows that start after that.

    Parameters
    ----------
    metric : str, default "grad_norm"
        The tag watched.
    loss_metric : str, default "train/loss"
        The loss checked by the inhibition guard below.
    window : int, default 50
        Points in a spike's rolling baseline. Longer is steadier; shorter follows a norm
        that drifts, but trusts fewer points.
    threshold : float, default 6.0
        Robust standard deviations (log scale) above the median a spike must reach. Lower
        catches smaller spikes and fires more on a noisy per-batch norm.
    min_ratio : float, default 5.0
        Multiple of the median a spike must also reach. Guards a very steady norm whose
        MAD is tiny; lower reports moderate jumps that rarely matter.
    grace_period : int, default 20
        Points at the start never judged by either rule (the first steps' norms are
        routinely tens of times the later level). Longer hides an early blow-up.
    resolve_points : int, default 5
        Points in a row back near the old level needed to resolve a spike. More avoids a
        resolve/fire flap; fewer resolves sooner.
    coincide_points : int, default 2
        Logged loss points either side of a spike's step searched for a loss spike. Wider
        hands more grad-norm spikes to ``spike``.
    loss_rise : float, default 0.5
        Rise of the loss over the median of its previous ``window`` points (0.5 = +50%,
        the ``spike`` analyzer's ``min_rel``) that counts as a loss spike for the guard.
    trend_window : int, default 100
        Points judged together by the climb rule (at least 20). Longer sees a slower
        climb and rides out noise, but needs more history and reacts later.
    min_rise : float, default 3.0
        Factor by which the fitted line must rise across the shortest window. Lower also
        flags the gentle rise many healthy fine-tunes show; higher only flags a run away.
    min_slow_rise : float, default 1.5
        Factor by which it must rise across the longer windows (200 points and up by
        default). Lower reports a slow drift that may be benign (the norm often grows as
        the LR decays); higher reports a slow climb later.
    patience : int, default 3
        Rising evaluations in a row before the climb rule fires. More rides out one
        noisy stretch; fewer alerts sooner.

    *False-positive guard*: ``grace_period`` skips the start-up norms. A grad-norm spike
    that comes with a loss spike is ``spike``'s to report (its evidence carries the grad
    norm): when the loss within ``coincide_points`` logged points of the spike's step is
    non-finite or above ``(1 + loss_rise)`` times the median of its previous ``window``
    points, no grad-norm finding is made (an inhibition, as in Alertmanager). Non-finite
    and non-positive norms are skipped: fp16 overflow steps log an infinite norm and skip
    the update, and a zero norm is not a spike. On a per-batch norm that swings by
    orders of magnitude, a spike must stand out on that scale too. The climb rule judges
    block medians, never single points: a median over a block blunts both outliers and
    the step-to-step autocorrelation that makes a plain trend test on raw points see
    trends everywhere; and since a slowly wandering norm can still pass a rank test, the
    fitted rise must also be large (``min_rise``, ``min_slow_rise``) and last
    ``patience`` evaluations, the window must end above every level of the window's
    length before it by half its rise, and the rise must reach five robust standard
    deviations of the level's change over a window's length in up to eight window
    lengths of history before it (a norm that wanders by factors keeps revisiting its
    recent levels; a rise right after the warm-up has no history and is not judged). It
    resolves at a lower rise than it fires.

    *Streaming*: a poll re-reads only the ``window`` points before the last settled
    position for spikes, and the new complete blocks (plus the medians of the widest
    window) for climbs; the findings are those of the run analysed at once.

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import RunData
    >>> rng = np.random.default_rng(0)
    >>> loss = 2.0 + 0.02 * rng.standard_normal(300)
    >>> grad_norm = 0.3 * np.exp(0.1 * rng.standard_normal(300))
    >>> grad_norm[200] = 3.0
    >>> data = RunData.from_series("demo", {"train/loss": loss, "grad_norm": grad_norm})
    >>> [finding] = GradNorm().detect(data)
    >>> finding.onset_step, finding.severity, finding.state, finding.resolved_step
    (201, 'warning', 'resolved', 206)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    grad_norm jumped to 3.00 at step 201 (10.2x its recent median 0.295 over 50 points);
    train/loss did not jump with it

    A loss spike at the same step inhibits the grad-norm finding (``spike`` reports it):

    >>> loss[200] = 9.0
    >>> GradNorm().detect(RunData.from_series("demo", {"train/loss": loss,
    ...                                                "grad_norm": grad_norm}))
    []
    """

    signal = "grad_norm"

    def __init__(self, metric: str = "grad_norm", loss_metric: str = "train/loss",
                 window: int = 50, threshold: float = 6.0, min_ratio: float = 5.0,
                 grace_period: int = 20, resolve_points: int = 5, coincide_points: int = 2,
                 loss_rise: float = 0.5, trend_window: int = 100, min_rise: float = 3.0,
                 min_slow_rise: float = 1.5, patience: int = 3) -> None:
        check_metric(metric)
        check_metric(loss_metric, "loss_metric")
        check_int("window", window, 3)
        check_real("threshold", threshold, 0.0)
        check_real("min_ratio", min_ratio, 1.0)
        check_int("grace_period", grace_period, 0)
        check_int("resolve_points", resolve_points, 1)
        check_int("coincide_points", coincide_points, 0)
        check_real("loss_rise", loss_rise, 0.0)
        check_int("trend_window", trend_window, 2 * _BLOCKS)
        check_real("min_rise", min_rise, 1.0)
        check_real("min_slow_rise", min_slow_rise, 1.0)
        check_int("patience", patience, 1)
        self.metric = metric
        self.loss_metric = loss_metric
        self.window = window
        self.threshold = threshold
        self.min_ratio = min_ratio
        self.grace_period = grace_period
        self.resolve_points = resolve_points
        self.coincide_points = coincide_points
        self.loss_rise = loss_rise
        self.trend_window = trend_window
        self.min_rise = min_rise
        self.min_slow_rise = min_slow_rise
        self.patience = patience
        self._streams: Streams[_State] = Streams()

    def detect(self, data: RunData) -> list[Finding]:
        series = data.series(self.metric)
        if series.empty:
            return []
        values = series.to_numpy(dtype=float)
        steps = series.index.to_numpy(dtype=np.int64)
        tags = (self.metric,)
        state = self._streams.resume(data, tags) or _State()
        fresh, settled = self._scan_spikes(values, state)
        blocks = self._climb(values, steps, state.blocks)
        self._streams.save(data, tags, replace(settled, blocks=blocks))
        loss = data.series(self.loss_metric)
        loss_steps = loss.index.to_numpy(dtype=np.int64)
        loss_values = loss.to_numpy(dtype=float)
        findings = []
        for spike in state.spikes + fresh:
            checked = self._loss_around(loss_steps, loss_values, int(steps[spike.onset]))
            if not any(jumped for _, _, jumped in checked):
                findings.append(self._spike_finding(data, steps, values, spike, checked))
        climbs = blocks.climbs + ([blocks.open] if blocks.open is not None else [])
        findings += [self._climb_finding(data, climb) for climb in climbs]
        return sorted(findings, key=lambda f: (f.onset_step, f.detected_step))

    # --- spikes -------------------------------------------------------------------
    # Judging a point needs only the ``window`` judged points before it: each poll
    # resumes from the last position with that much episode-free history before it.

    def _scan_spikes(self, values: np.ndarray, state: _State) -> tuple[list[_Spike], _State]:
        """The spikes from ``state.spike_from`` on (series positions), and the state a
        later poll resumes from."""
        lo = state.spike_from
        tail = values[lo:]
        # Overflow steps (inf) and zero norms carry no level: judged points only.
        judged = np.flatnonzero(np.isfinite(tail) & (tail > 0))
        logs = np.log(tail[judged])
        first_judged = (max(self.grace_period, 1) if state.spike_context < 0
                        else state.spike_context)
        found = self._spikes(logs, first_judged)
        n = len(logs)

        def at(k: int) -> int:  # series position of judged index k (len: past the end)
            return lo + int(judged[k]) if k < n else len(values)

        fresh = [replace(e, onset=at(e.onset), end=at(e.end),
                         resolved=None if e.resolved is None else at(e.resolved))
                 for e in found]
        settled = state
        for k in [n] + [e.onset for e in reversed(found)]:
            before = [e for e in found if e.onset < k]
            context = k - self.window
            if k <= first_judged or context < 0:
                break
            last = before[-1] if before else None
            if last is None or (last.resolved is not None and last.resolved < k
                                and last.end <= context):
                settled = _State(at(context), self.window,
                                 state.spikes + fresh[:len(before)])
                break
        return fresh, settled

    def _spikes(self, logs: np.ndarray, first_judged: int) -> list[_Spike]:
        n = len(logs)
        raw_hits = self._raw_hits(logs)
        raw_hits = raw_hits[raw_hits >= first_judged]
        excluded = np.zeros(n, dtype=bool)
        # Points below this index have a baseline that differs from the plain rolling one
        # (partial at the start, or holding an episode's points): judged one by one.
        judge_alone_until = self.window
        spikes: list[_Spike] = []
        start = first_judged
        while start < n:
            hit = self._first_hit_alone(logs, excluded, start, min(judge_alone_until, n))
            if hit is None:
                later = raw_hits[np.searchsorted(raw_hits, max(start, judge_alone_until)):][:1]
                if not later.size:
                    break
                hit = int(later[0])
            window = clean_window(logs, excluded, hit, self.window)
            median, scale = (float(v[0]) for v in row_median_sd(window[None, :]))
            firing = median + max(math.log(self.min_ratio), self.threshold * scale)
            level = (median + firing) / 2
            resolved = first_run(logs, hit + 1, self.resolve_points,
                                 lambda v, level=level: v < level)
            end = n if resolved is None else resolved - self.resolve_points + 1
            excluded[hit:end] = True
            spikes.append(_Spike(hit, resolved, median, scale, int(window.size), end))
            if resolved is None:
                break
            judge_alone_until = max(judge_alone_until, end + self.window)
            start = resolved + 1
        return spikes

    def _raw_hits(self, logs: np.ndarray) -> np.ndarray:
        """Indices that spike against the plain rolling window of the previous points."""
        if len(logs) <= self.window:
            return np.empty(0, dtype=np.int64)
        # The ratio test needs only the median, which pandas rolls cheaply: it screens,
        # and the exact test then runs on the few candidates left.
        median = pd.Series(logs).rolling(self.window).median().to_numpy()
        above = logs[self.window:] - median[self.window - 1:-1]
        candidates = np.flatnonzero(above > math.log(self.min_ratio) - 1e-9) + self.window
        windows = sliding_window_view(logs[:-1], self.window)
        rows = max(1, _CHUNK_ELEMENTS // self.window)
        hits = []
        for lo in range(0, len(candidates), rows):
            chunk = candidates[lo:lo + rows]
            spiking = self._is_spike(logs[chunk], *row_median_sd(windows[chunk - self.window]))
            hits.append(chunk[spiking])
        return np.concatenate(hits) if hits else np.empty(0, dtype=np.int64)

    def _first_hit_alone(self, logs: np.ndarray, excluded: np.ndarray, k_from: int,
                         k_to: int) -> int | None:
        """First index in [k_from, k_to) that spikes against its own window of clean points."""
        if k_from >= k_to:
            return None
        lo = clean_start(excluded, k_from, self.window)
        clean = lo + np.flatnonzero(~excluded[lo:k_to])
        candidates = np.arange(k_from, k_to)
        available = np.searchsorted(clean, candidates)  # clean points before each candidate
        full = available >= self.window
        hits = np.zeros(len(candidates), dtype=bool)
        if full.any():
            rows = available[full][:, None] - self.window + np.arange(self.window)
            hits[full] = self._is_spike(logs[candidates[full]], *row_median_sd(logs[clean[rows]]))
        for i in np.flatnonzero(~full & (available > 0)):
            window = logs[clean[:available[i]]]
            hits[i] = self._is_spike(logs[candidates[i]:candidates[i] + 1],
                                     *row_median_sd(window[None, :]))[0]
        first = np.flatnonzero(hits)[:1]
        return int(candidates[first[0]]) if first.size else None

    def _is_spike(self, current: np.ndarray, median: np.ndarray,
                  scale: np.ndarray) -> np.ndarray:
        above = current - median
        return (above > math.log(self.min_ratio)) & (above > self.threshold * scale)

    def _loss_around(self, loss_steps: np.ndarray, loss_values: np.ndarray,
                     step: int) -> list[tuple[int, float, bool]]:
        """The loss points near ``step``: (step, value, whether it is a loss spike)."""
        if not loss_steps.size:
            return []
        centre = int(np.searchsorted(loss_steps, step, side="right")) - 1
        first = max(0, centre - self.coincide_points)
        last = min(len(loss_steps), max(centre, 0) + self.coincide_points + 1)
        checked = []
        for i in range(first, last):
            value = float(loss_values[i])
            before = loss_values[max(0, i - self.window):i]
            before = before[np.isfinite(before)]
            if not math.isfinite(value):
                jumped = True
            elif before.size:
                jumped = value > (1 + self.loss_rise) * float(np.median(before))
            else:
                jumped = False  # no history: nothing to compare with
            checked.append((int(loss_steps[i]), value, jumped))
        return checked

    def _spike_finding(self, data: RunData, steps: np.ndarray, values: np.ndarray,
                       spike: _Spike, checked: list[tuple[int, float, bool]]) -> Finding:
        """The finding of a spike whose onset, end and resolution are series positions."""
        onset_step = int(steps[spike.onset])
        body = values[spike.onset:spike.end]
        body = np.where(np.isfinite(body) & (body > 0), body, -np.inf)
        peak_at = spike.onset + int(np.argmax(body))
        median = math.exp(spike.median)
        value = float(values[spike.onset])
        peak = float(values[peak_at])
        context_end = len(values) if spike.resolved is None else spike.resolved + 1
        before = positive_before(values, spike.onset, _CONTEXT_BEFORE)
        shown = before + positive_from(values, spike.onset, context_end,
                                       _MAX_EVIDENCE_POINTS - len(before))
        z = ((math.log(value) - spike.median) / spike.scale if spike.scale > 0
             else math.inf)
        summary = (f"{self.metric} jumped to {fmt_number(value)} at step {onset_step} "
                   f"({value / median:.1f}x its recent median {fmt_number(median)} over "
                   f"{spike.baseline_points} points)")
        if peak_at != spike.onset:
            summary += f", peaking at {fmt_number(peak)} at step {int(steps[peak_at])}"
        summary += (f"; {self.loss_metric} did not jump with it" if checked
                    else f"; no {self.loss_metric} logged near it")
        evidence = {
            "rule": "spike",
            "baseline": median,
            "baseline_points": spike.baseline_points,
            "ratio": value / median,
            "robust_z": z,
            "peak": peak,
            "peak_step": int(steps[peak_at]),
            "points": [[int(steps[i]), float(values[i])] for i in shown],
            "loss_checked": [[s, v] for s, v, _ in checked],
        }
        return self.finding(data, onset_step=onset_step, detected_step=onset_step,
                            summary=summary, evidence=evidence, resolved_step=(
                                None if spike.resolved is None else int(steps[spike.resolved])))

    # --- climb --------------------------------------------------------------------

    def _climb(self, values: np.ndarray, steps: np.ndarray, blocks: _Blocks) -> _Blocks:
        """The climb rule's state with every block completed since the last poll judged.

        The state is extended in place (its lists only grow; ``count`` marks what is
        complete, so a poll that failed half-way leaves nothing behind)."""
        for name in ("medians", "levels", "first_steps", "last_steps"):
            del getattr(blocks, name)[blocks.count:]
        size = self.trend_window // _BLOCKS
        if blocks.next_position < 0:  # the blocks begin after the warm-up
            judged = np.flatnonzero(np.isfinite(values) & (values > 0))
            if len(judged) <= self.grace_period:
                return blocks
            blocks.next_position = int(judged[self.grace_period])
        lo = blocks.next_position
        tail = values[lo:]
        judged = lo + np.flatnonzero(np.isfinite(tail) & (tail > 0))
        complete = len(judged) // size
        if not complete:
            return blocks
        positions = judged[:complete * size].reshape(complete, size)
        old = blocks.count
        blocks.medians += np.median(np.log(values[positions]), axis=1).tolist()
        blocks.first_steps += steps[positions[:, 0]].tolist()
        blocks.last_steps += steps[positions[:, -1]].tolist()
        # Only the blocks the longest window of a new evaluation reaches back to are read.
        widest = 2 ** (_SCALES - 1)
        offset = max(0, (old // widest - _BLOCKS) * widest)
        medians = np.asarray(blocks.medians[offset:])
        # The level: the median of the last ten blocks.
        recent = medians[max(0, old - offset - _BLOCKS + 1):]
        levels = np.full(len(medians) - (old - offset), -np.inf)
        if len(recent) >= _BLOCKS:
            rolled = np.median(sliding_window_view(recent, _BLOCKS), axis=1)
            levels[len(levels) - len(rolled):] = rolled
        blocks.levels += levels.tolist()
        verdicts = [self._windows(medians, offset, old, k) for k in range(_SCALES)]
        for b in range(old + 1, len(blocks.medians) + 1):
            for k in range(_SCALES):
                width = 2 ** k
                if b % width or b < _BLOCKS * width:
                    continue
                first_end, windows, z, rise, rising = verdicts[k]
                i = b // width - first_end
                if blocks.open is None and not blocks.runs[k] and not rising[i]:
                    continue  # nothing to start, continue or resolve
                self._judge(blocks, k, b, (windows[i], float(z[i]), float(rise[i])))
        blocks.next_position = int(positions[-1, -1]) + 1
        blocks.count = len(blocks.medians)
        return blocks

    def _windows(self, medians: np.ndarray, offset: int, old: int, k: int) -> tuple:
        """Scale ``k``'s windows that end with a block after ``old`` (and a few before):
        the index of the first one's last super-block + 1, then per window the super-block
        medians, Mann–Kendall z, rise and whether those two pass. ``medians`` are the block
        medians from block ``offset`` (a multiple of every scale's width) on."""
        width = 2 ** k
        groups = (offset + len(medians)) // width
        first_group = max(0, old // width + 1 - _BLOCKS)
        if groups - first_group < _BLOCKS:
            return 0, np.empty((0, _BLOCKS)), np.empty(0), np.empty(0), []
        medians = medians[first_group * width - offset:groups * width - offset]
        grouped = medians.reshape(-1, width)
        super_medians = np.median(grouped, axis=1)
        windows = sliding_window_view(super_medians, _BLOCKS)
        first, second = _PAIRS
        differences = windows[:, second] - windows[:, first]
        score = np.sign(differences).sum(axis=1)
        z = (score - np.sign(score)) / _MK_SD
        slopes = differences / (second - first)
        middle = slopes.shape[1] // 2
        rise = np.partition(slopes, middle, axis=1)[:, middle] * (_BLOCKS - 1)
        rising = ((z >= _MK_Z) & (rise >= self._needed_rise(k))).tolist()
        return first_group + _BLOCKS, windows, z, rise, rising

    def _judge(self, blocks: _Blocks, k: int, b: int, verdict: tuple) -> None:
        """One window of scale ``2**k`` ending with block ``b - 1``.

        It is rising when its ten super-block medians rise steadily (Mann–Kendall) by at
        least the scale's minimum rise, beyond the norm's own wander (see
        :meth:`_beyond_wander`).
        ``patience`` rising windows in a row at the shortest scale fire, one fewer per
        doubling at the longer ones (each of their windows rests on more points, and they
        are judged less often), at least one; the episode resolves at that scale's first
        window whose fitted rise is under half its minimum (log scale).
        """
        width = 2 ** k
        first = b - _BLOCKS * width
        if first < blocks.fresh_from:  # the window still holds the last episode
            return
        medians, z, rise = verdict
        needed = self._needed_rise(k)
        if blocks.open is not None:
            if blocks.open.scale == width and rise < needed / 2:
                blocks.climbs.append(replace(blocks.open, resolved_step=blocks.last_steps[b - 1]))
                blocks.open = None
                blocks.runs = [0] * _SCALES
                blocks.fresh_from = b
            return
        rising = z >= _MK_Z and rise >= needed and self._beyond_wander(blocks, first, width,
                                                                      float(medians[-1]), rise)
        if rising:
            blocks.runs[k] += 1
            if blocks.runs[k] == 1:
                blocks.run_starts[k] = first
        else:
            blocks.runs[k] = 0
        if blocks.runs[k] >= max(1, self.patience - k):
            blocks.open = _Climb(
                onset_step=blocks.first_steps[blocks.run_starts[k]],
                detected_step=blocks.last_steps[b - 1], resolved_step=None,
                window_steps=(blocks.first_steps[first], blocks.last_steps[b - 1]),
                medians=tuple(float(m) for m in medians), rise=rise, z=z, scale=width)

    def _beyond_wander(self, blocks: _Blocks, first: int, width: int, last: float,
                       rise: float) -> bool:
        """Whether a window starting at block ``first`` rises beyond the norm's own wander:
        it must end above every level held over the window's length before it by half its
        rise, and its rise must reach ``_WANDER`` robust standard deviations of the level's
        change over a window's length in the two window lengths before it (a wandering
        norm keeps revisiting its recent levels; an early rise has nothing to compare
        with)."""
        span = _BLOCKS * width
        if first < span + _BLOCKS:
            return False
        levels = np.asarray(blocks.levels[max(_BLOCKS - 1, first - _HISTORY * span):first])
        if last - float(levels[-span:].max()) < rise / 2:
            return False
        changes = levels[span:] - levels[:-span]
        return rise >= _WANDER * MAD_TO_SD * float(np.median(np.abs(changes - np.median(changes))))

    def _needed_rise(self, k: int) -> float:
        """The minimum rise (log scale) of a window ``2**k`` times ``trend_window`` long:
        ``min_rise`` for the shortest, ``min_slow_rise`` for the longer ones."""
        return math.log(self.min_rise if k == 0 else self.min_slow_rise)

    def _climb_finding(self, data: RunData, climb: _Climb) -> Finding:
        size = self.trend_window // _BLOCKS
        points = _BLOCKS * size * climb.scale
        medians = np.exp(np.asarray(climb.medians))
        rise = math.exp(climb.rise)
        lo, hi = climb.window_steps
        summary = (f"{self.metric} has climbed {rise:.1f}x over the last {points} "
                   f"points (steps {lo}–{hi}): block medians "
                   f"{fmt_number(medians[0])} → {fmt_number(medians[-1])}, rising steadily "
                   f"(Mann–Kendall z {climb.z:.1f})")
        evidence = {
            "rule": "climb",
            "window_steps": [lo, hi],
            "block_medians": medians.tolist(),
            "rise": rise,
            "min_rise": math.exp(self._needed_rise(int(math.log2(climb.scale)))),
            "mann_kendall_z": climb.z,
        }
        return self.finding(data, onset_step=climb.onset_step,
                            detected_step=climb.detected_step, summary=summary,
                            evidence=evidence, resolved_step=climb.resolved_step)

