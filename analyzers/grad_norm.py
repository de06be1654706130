"""Gradient norm: a sudden spike (an abnormal batch), a level shift that stays, or a sustained
climb (an optimiser heading to instability)."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from analyzers import register
from analyzers.base import Analyzer, RunData
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_number
from analyzers.spike import Spike
from analyzers.stats.robust import (
    MAD_TO_SD,
    clean_start,
    clean_window,
    first_run,
    median_se,
    moving_median,
    positive_before,
    positive_from,
    robust_sd,
    row_median_sd,
)
from analyzers.streaming import Streams

# Rows of rolling windows handled at once: bounds memory when ``window`` is large.
_CHUNK_ELEMENTS = 2_000_000
# Points of context shown before the onset, and the cap on evidence points.
_CONTEXT_BEFORE = 5
_MAX_EVIDENCE_POINTS = 30
# The start-up (the norm still falling from its first steps' level) lasts at most this
# many baseline windows.
_MAX_START_UP = 10
# In the start-up a candidate is judged against the median of this many last points (where
# the falling norm is now), not the window's.
_NOW = 5
# The climb rule, in blocks of ``trend_window // _REFERENCE`` points: the reference level is
# the median of ``_REFERENCE`` blocks ending ``_LAG`` blocks back (a climb caught within
# that many blocks is judged against a level from before it); the noise scale comes from
# the ``_SCALE_HISTORY`` blocks before the reference's end; the recent level is the median
# of the last ``_RECENT`` blocks.
_REFERENCE = 40
_LAG = 40
_SCALE_HISTORY = 160
_RECENT = 10
# A block adds at most this many standard deviations to the CUSUM (a spike episode is one
# block or two, not a climb); the noise scale has a floor (a constant norm) and the
# block-to-block correlation a ceiling (a norm that only wanders).
_CLIP = 3.0
# The reference must be a level the norm held: its later half's median may not stand more
# than _HELD_Z standard errors above its earlier half's (in a block's long-run deviation:
# the difference of two medians of _REFERENCE // 2 blocks).
_HELD_Z = 3.0
_HALF_SE = math.sqrt(2) * float(median_se(_REFERENCE // 2))
_MIN_SCALE = 0.005
_MAX_RHO = 0.9
# A shift's new level must stand above every level the norm held (a median of
# ``shift_points`` points) in this many baseline windows before it.
_SHIFT_MEMORY = 10


@dataclass(frozen=True)
class _Spike:
    onset: int  # index among the judged (finite, positive) points
    resolved: int | None  # index of the last point of the resolving run
    median: float  # baseline median, log scale
    scale: float  # robust standard deviation of the baseline, log scale
    baseline_points: int
    end: int = 0  # index after the episode's last point (start of the resolving run)
    detected: int = 0  # index of the point it was judged at (onset, or the point after it)
    carried: float = math.nan  # the next point's height over the median, log scale
    rho: float = 0.0  # the baseline's lag-1 autocorrelation
    trend: bool = False  # judged in the start-up: ``median`` is where its trend had reached


@dataclass(frozen=True)
class _Shift:
    """A level shift, as series positions, with the levels before and after (log scale)."""

    onset: int
    detected: int
    resolved: int | None
    before: float
    after: float


@dataclass
class _ShiftScan:
    """What the shift rule settled: the start-up's end, the first judged point (index
    among the finite, positive ones) whose candidacy is not judged yet, the one where the
    last closed shift resolved (-1: none), and the closed shifts."""

    start: int
    resume: int
    after: int = -1
    closed: list[_Shift] = field(default_factory=list)


@dataclass(frozen=True)
class _Climb:
    """A climb episode, as steps: ready to be reported without the history."""

    onset_step: int
    detected_step: int
    resolved_step: int | None
    reference_steps: tuple[int, int]
    reference: float  # log scale
    level: float  # the recent level at detection, log scale
    scale: float  # long-run standard deviation of a block median, log scale
    cusum: float
    detected_block: int


@dataclass
class _Blocks:
    """The climb rule's running state: the median (log scale) and the first and last step
    of every complete block since the warm-up; the CUSUM, the last block where it was
    zero, the first block a reference may start at (after the last episode), and the open
    and closed episodes."""

    next_position: int = -1  # series position where the next block begins (-1: not yet)
    count: int = 0  # complete blocks judged
    medians: list[float] = field(default_factory=list)
    first_steps: list[int] = field(default_factory=list)
    last_steps: list[int] = field(default_factory=list)
    cusum: float = 0.0
    zero: int = -1
    below: int = -1  # the last block whose recent level was not above the reference
    held: bool | None = None  # whether the level the current excursion left was held
    fresh_from: int = 0
    open: _Climb | None = None
    climbs: list[_Climb] = field(default_factory=list)


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
    ``min_ratio`` times that median, that is not a shock of the norm's own autocorrelated
    noise (see the guard: on a norm whose log has lag-1 autocorrelation, the candidate is
    judged at the next point). One finding per episode, onset at the first abnormal
    point, detection there or at the next point; it resolves once ``resolve_points``
    consecutive points are back below the geometric midpoint of the median and the firing
    level; points of an episode are left out of every later baseline.

    A **shift** is a new level that stays: the median of the ``shift_points`` points from
    a point on is at least ``shift_ratio`` times the median of the ``window`` points before
    it, that point itself is above the geometric midpoint of the two levels, and the two
    stretches do not overlap (the lower quartile of the later one is above the 90th
    percentile of the earlier one), and the new level stands at least ``sqrt(shift_ratio)``
    times above every level the norm held (a median of ``shift_points`` points) in the
    ``10 * window`` points before (an autocorrelated, fat-tailed norm wanders through
    levels like it; a new one has not been there). A norm that steps from ≈4 to 16–20 for
    the rest of the run while the loss still falls (issue 22) is neither a spike (one
    point ≥ 4.5x its
    median, which then "never resolves": the shift read as a jump, or missed when no single
    point reaches 4.5x) nor a climb the CUSUM sees before it has ``2 * trend_window``
    points of history (a 300-point fine-tune never gets there). Onset at that point,
    detection ``shift_points - 1`` points later; it resolves once the median of the last
    ``shift_points`` points is back under the midpoint. A spike whose onset lies in the
    shift's first points (from ``window`` points before it to its detection) is the same
    event: when that spike episode came back it is reported as the spike (a high stretch,
    not a new level), otherwise as the shift; a climb that overlaps the shift (onset to
    resolution) is the shift too.

    A **climb** is a departure upwards from a level the norm held. The norm is cut into
    blocks of ``trend_window / 40`` points (their medians blunt single spikes). Each block
    is compared with a reference level, the median of the ``trend_window`` points that end
    ``trend_window`` points before it, in units of the long-run standard deviation of a
    block median (from the spread of the block medians about their centred running median
    of ``trend_window`` points, and of their steps, over the ``4 * trend_window`` points
    before the reference's end: an AR(1) correction, so that the autocorrelated wander of a
    step-level series is not taken for evidence; a trailing median would lag a trend,
    such as the start-up's fall, and read it as noise, two to three times the norm's own). A
    one-sided CUSUM adds up these residuals less ``climb_slack`` (each clipped at 3):
    evidence accumulates while the norm stays above its reference, however slowly it
    rose. The climb fires when the CUSUM reaches ``climb_threshold`` *and* the median of
    the last ``trend_window / 4`` points is at least ``min_rise`` times the reference,
    and the level the excursion left was one the norm held: the reference in force where
    the excursion began (the CUSUM or the recent level last at or below it) has its later
    half's median no more than three standard errors above its earlier half's (a norm that
    rises from the start has no level to leave; a reference later in a long climb trails
    into the climb itself).
    Its onset is the first block of the last stretch in which both the CUSUM and
    the recent level stood above zero and the reference. It resolves once the median
    of the last ``trend_window`` points is no higher than that of the ``trend_window``
    before them (the norm levelled off or came back), at least ``trend_window`` points
    after detection; the next climb is judged against a reference from after that.

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
    min_ratio : float, default 4.5
        Multiple of the median a spike must also reach. Guards a very steady norm whose
        MAD is tiny; lower reports moderate jumps that rarely matter (and, on a
        fat-tailed norm, its ordinary excursions). A batch whose gradient is six times
        its neighbours' lands at 4.6–4.9 times the median when its own point sits low in
        the norm's ~10% batch-to-batch noise: 5 missed those (benchmark seeds 0, 4, 9;
        4.5 finds them at a cost of one more false spike in about two seeds).
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
        The ``min_rel`` of the ``spike`` rule the guard defers to: the rise of the loss
        over its recent median (0.5 = +50% of its magnitude) a loss spike must also reach.
    carry_threshold : float, default 3.0
        Standard deviations of the shock test (guard below): the next point must stand
        more than this many above the level, and within this many innovation deviations
        of the carry-over the norm's autocorrelation predicts, for a candidate to be the
        noise's own shock. Higher calls fewer candidates shocks (more reports of the
        noise's own fat tail); lower also drops spikes that linger a little. 0 turns the
        test off (every candidate is reported at its own point).
    trend_window : int, default 200
        Points in the climb rule's reference level (a multiple of 40 is exact; at least
        40). It also sets how far back the reference lies, the block size and the
        resolution window. Longer trusts a steadier level and sees slower climbs, but
        needs ``2 * trend_window`` points of history after the warm-up before it judges.
    min_rise : float, default 1.15
        Factor by which the recent level must exceed the reference. Lower reports smaller
        drifts (the norm often grows a little as the LR decays); higher reports a climb
        later.
    climb_threshold : float, default 15.0
        CUSUM (in long-run standard deviations of a block median) a climb must reach.
        Higher rides out longer noisy stretches above the reference; lower reports a
        slow climb sooner.
    climb_slack : float, default 0.5
        Standard deviations a block must stand above the reference to add to the CUSUM
        (half the smallest shift it is tuned to; it also absorbs the reference's own
        error). Lower reacts to smaller climbs and wanders more on noise.
    shift_ratio : float, default 2.5
        Factor by which the median after a shift must exceed the median before it. Lower
        reports smaller steps (a norm that rises 1.5–2x as the LR decays is not one: it
        rises over hundreds of points, not within ``shift_points``).
    shift_points : int, default 20
        Points the new level must hold. More waits longer and ignores shorter episodes
        (those are spikes); fewer reports sooner.

    *False-positive guard*: ``grace_period`` skips the start-up norms, and while the norm
    is still falling from its first steps' level (the median of the later half of the
    baseline window below that of its earlier half; at most ten windows) a candidate is
    judged against where the fall has reached, not the window's median: the median of
    its last 5 points, with the robust deviation of the window's residuals around its
    straight trend as the noise (the fall itself is not noise, and a storm that ends
    bends the trend and widens it). A norm that falls for the whole of a short
    fine-tune's log never leaves its start-up; it used to be judged nowhere, and a
    100x batch in it went unreported (issue 22). A
    grad-norm spike that comes with a loss spike is ``spike``'s to report (its evidence
    carries the grad norm): when a loss point within ``coincide_points`` logged points of
    the spike's step lies in an episode that ``spike`` reports (its rule with its
    defaults on ``loss_metric``, ``min_rel = loss_rise``: a non-finite loss, or a rise
    beyond the loss's own noise, not a mere rise over its median), no grad-norm finding
    is made (an inhibition, as in Alertmanager). A per-point norm is autocorrelated and
    fat-tailed: its own shocks reach ×5–×40 now and then, as high as an abnormal batch, but
    they decay at the series' own pace, while an abnormal batch is one point (an additive
    against an innovation outlier, Fox 1972). So when the baseline window's residuals around
    its straight trend have a positive lag-1 autocorrelation rho (residuals clipped at 3
    deviations), a candidate of height h over the trend's level is judged at the next point,
    and it is the noise's own shock, no finding, when that point stands more than
    ``carry_threshold`` deviations above the level *and* within ``carry_threshold``
    innovation deviations (``sd * sqrt(1 - rho**2)``) of ``rho * h``. A point back at the
    level, or one that stays up far longer than the noise's dynamics carry (an episode, not
    a shock), fires;
    with no autocorrelation the two cannot be told apart and the candidate fires at once.
    The price: a real spike that happens to decay at the norm's own pace is not
    reported, and an autocorrelated norm's spike is reported one point later.
    Non-finite and non-positive norms are skipped: fp16 overflow steps log an infinite
    norm and skip the update, and a zero norm is not a spike. On a per-batch norm that
    swings by orders of magnitude, a spike must stand out on that scale too. The climb
    rule judges block medians, never single points, clips each
    block's contribution, scales by a long-run (autocorrelation-corrected) noise
    estimate, needs a reference level held for ``trend_window`` points (a norm that
    rises from the start of a fine-tune, as LoRA adapters grow, has none), a CUSUM
    beyond ``climb_threshold`` and a rise of at least ``min_rise``; it resolves on a
    different test (no rise over ``trend_window`` points) than it fires.

    *Streaming*: a poll re-reads only the ``window`` points before the last settled
    position for spikes (a candidate at the last point waiting for its next one is not
    settled), and the new complete blocks (plus the fixed number of blocks
    their windows reach back to) for climbs; the loss spikes the guard defers to come
    from a ``spike`` of its own, which streams the same way. The findings are those of the
    run analysed at once.

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

    A climb: flat for 1000 points, then x4 over the next 1000 (onset at step 1001):

    >>> norm = 0.3 * np.exp(0.1 * rng.standard_normal(2000))
    >>> norm[1000:] *= 4.0 ** (np.arange(1000) / 1000)
    >>> [climb] = GradNorm().detect(RunData.from_series("demo", {"grad_norm": norm}))
    >>> climb.onset_step, climb.detected_step, climb.state
    (1046, 1140, 'firing')
    """

    signal = "grad_norm"

    def __init__(self, metric: str = "grad_norm", loss_metric: str = "train/loss",
                 window: int = 50, threshold: float = 6.0, min_ratio: float = 4.5,
                 grace_period: int = 20, resolve_points: int = 5, coincide_points: int = 2,
                 loss_rise: float = 0.5, carry_threshold: float = 3.0,
                 trend_window: int = 200, min_rise: float = 1.15,
                 climb_threshold: float = 15.0, climb_slack: float = 0.5,
                 shift_ratio: float = 2.5, shift_points: int = 20) -> None:
        check_metric(metric)
        check_metric(loss_metric, "loss_metric")
        check_int("window", window, 3)
        check_real("threshold", threshold, 0.0)
        check_real("min_ratio", min_ratio, 1.0)
        check_int("grace_period", grace_period, 0)
        check_int("resolve_points", resolve_points, 1)
        check_int("coincide_points", coincide_points, 0)
        check_real("loss_rise", loss_rise, 0.0)
        check_real("carry_threshold", carry_threshold, 0.0, allow_equal=True)
        check_int("trend_window", trend_window, _REFERENCE)
        check_real("min_rise", min_rise, 1.0)
        check_real("climb_threshold", climb_threshold, 0.0)
        check_real("climb_slack", climb_slack, 0.0, allow_equal=True)
        check_real("shift_ratio", shift_ratio, 1.0)
        check_int("shift_points", shift_points, 2)
        self.metric = metric
        self.loss_metric = loss_metric
        self.window = window
        self.threshold = threshold
        self.min_ratio = min_ratio
        self.grace_period = grace_period
        self.resolve_points = resolve_points
        self.coincide_points = coincide_points
        self.loss_rise = loss_rise
        self.carry_threshold = carry_threshold
        self.trend_window = trend_window
        self.min_rise = min_rise
        self.climb_threshold = climb_threshold
        self.climb_slack = climb_slack
        self.shift_ratio = shift_ratio
        self.shift_points = shift_points
        self._streams: Streams[_State] = Streams()
        self._shift_streams: Streams[_ShiftScan] = Streams()
        # The loss spikes the inhibition defers to, read as ``spike`` reports them.
        self._loss_spikes = Spike(metric=loss_metric, min_rel=loss_rise)

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
        loss_spikes = self._loss_spikes.spans(data)
        spikes = state.spikes + fresh
        shifts = []
        for shift in self._shifts(data, values):
            lo, hi = max(0, shift.onset - self.window), shift.detected
            inside = [s for s in spikes if lo <= s.onset <= hi]
            if any(s.resolved is not None for s in inside):
                continue  # an episode that came back: the spike's
            spikes = [s for s in spikes if s not in inside]
            shifts.append(shift)
        spans = [(int(steps[s.onset]), None if s.resolved is None else int(steps[s.resolved]))
                 for s in shifts]
        findings = [self._shift_finding(data, steps, values, shift) for shift in shifts]
        for spike in spikes:
            checked = self._loss_around(loss_steps, loss_values, loss_spikes,
                                        int(steps[spike.onset]))
            if not any(jumped for _, _, jumped in checked):
                findings.append(self._spike_finding(data, steps, values, spike, checked))
        climbs = blocks.climbs + ([blocks.open] if blocks.open is not None else [])
        findings += [self._climb_finding(data, climb) for climb in climbs
                     if not any((end is None or climb.onset_step <= end)
                                and (climb.resolved_step is None
                                     or climb.resolved_step >= onset)
                                for onset, end in spans)]
        return sorted(findings, key=lambda f: (f.onset_step, f.detected_step))

    # --- shifts -------------------------------------------------------------------

    def _shifts(self, data: RunData, values: np.ndarray) -> list[_Shift]:
        """Every level shift (see the class), in series positions. Each poll judges only
        the candidates it has not judged, with the ``11 * window`` points before them that
        their test reads; a shift still open is judged again from its onset."""
        judged = np.flatnonzero(np.isfinite(values) & (values > 0))
        logs = np.log(values[judged])
        n, w, k = len(logs), self.window, self.shift_points
        start = max(self._settled(logs), w)
        scan = self._shift_streams.resume(data, (self.metric,))
        if scan is None or scan.start != start:
            scan = _ShiftScan(start, start)
        lo = max(0, scan.resume - (_SHIFT_MEMORY + 1) * w)
        part = logs[lo:]
        before = np.full(len(part), np.nan)
        before[w:] = moving_median(part, w)[w - 1:-1]
        held_before = moving_median(part, k)  # the median of the k points up to each
        after = np.full(len(part), np.nan)
        held = max(len(part) - k + 1, 0)  # none while fewer than k points are read
        after[:held] = held_before[k - 1:k - 1 + held]
        rise = math.log(self.shift_ratio)
        with np.errstate(invalid="ignore"):
            candidates = lo + np.flatnonzero((after - before >= rise)
                                             & (part >= (before + after) / 2))
        closed, after_last, opened = list(scan.closed), scan.after, None
        for i in candidates[candidates >= scan.resume].tolist():
            if i <= after_last + w:
                continue
            p = i - lo
            if np.quantile(part[p:p + k], 0.25) <= np.quantile(part[p - w:p], 0.9):
                continue
            held = held_before[max(k - 1, p - _SHIFT_MEMORY * w):p]
            if held.size and after[p] - np.nanmax(held) < rise / 2:
                continue  # the norm's own wander has held levels like it
            middle = float(before[p] + after[p]) / 2
            recent = moving_median(part[p:], k)  # the median of the k points up to each
            back = np.flatnonzero(recent[k - 1:] < middle)
            resolved = None if not back.size else i + k - 1 + int(back[0])
            shift = _Shift(int(judged[i]), int(judged[i + k - 1]),
                           None if resolved is None else int(judged[resolved]),
                           float(before[p]), float(after[p]))
            if resolved is None:
                opened = (i, shift)
                break
            closed.append(shift)
            after_last = resolved
        resume = opened[0] if opened else max(scan.resume, n - k + 1)
        self._shift_streams.save(data, (self.metric,),
                                 _ShiftScan(start, resume, after_last, closed))
        return closed + ([opened[1]] if opened else [])

    def _shift_finding(self, data: RunData, steps: np.ndarray, values: np.ndarray,
                       shift: _Shift) -> Finding:
        before, after = math.exp(shift.before), math.exp(shift.after)
        onset_step = int(steps[shift.onset])
        summary = (f"{self.metric} shifted from {fmt_number(before)} (median of the {self.window} "
                   f"points before step {onset_step}) to {fmt_number(after)} (median of the "
                   f"{self.shift_points} points from it), {after / before:.1f}x")
        summary += ("; it has stayed there" if shift.resolved is None else
                    f"; back under {fmt_number(math.sqrt(before * after))} at step "
                    f"{int(steps[shift.resolved])}")
        first = max(0, shift.onset - _CONTEXT_BEFORE)
        shown = range(first, min(len(values), first + _MAX_EVIDENCE_POINTS))
        evidence = {"rule": "shift", "before": before, "after": after,
                    "ratio": after / before, "shift_ratio": self.shift_ratio,
                    "points": [[int(steps[i]), float(values[i])] for i in shown]}
        return self.finding(data, onset_step=onset_step,
                            detected_step=int(steps[shift.detected]), summary=summary,
                            evidence=evidence,
                            resolved_step=None if shift.resolved is None
                            else int(steps[shift.resolved]))

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
        from_start = state.spike_context < 0
        first_judged = self._settled(logs) if from_start else state.spike_context
        # The start-up (a norm still falling) is judged against its trend: from the start
        # only, as the state settles after it.
        found, pending = self._spikes(logs, first_judged,
                                      max(self.grace_period, 1) if from_start else None)
        n = len(logs)

        def at(k: int) -> int:  # series position of judged index k (len: past the end)
            return lo + int(judged[k]) if k < n else len(values)

        fresh = [replace(e, onset=at(e.onset), end=at(e.end), detected=at(e.detected),
                         resolved=None if e.resolved is None else at(e.resolved))
                 for e in found]
        settled = state
        # A candidate waiting for its next point is judged again by the next poll.
        for k in [n if pending is None else pending] + [e.onset for e in reversed(found)]:
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

    def _settled(self, logs: np.ndarray) -> int:
        """The first judged index after the warm-up at which the norm is no longer falling
        from its start-up level: the median of the later half of the (up to) ``window``
        points before it is not below that of the earlier half. At most ``_MAX_START_UP``
        windows; ``len(logs)`` when the start-up has not ended yet."""
        first = max(self.grace_period, 1)
        last = min(len(logs), first + _MAX_START_UP * self.window)
        for k in range(first, last):
            half = min(self.window, k) // 2
            if not half or (np.median(logs[k - half:k])
                            >= np.median(logs[k - 2 * half:k - half])):
                return k
        return last

    def _spikes(self, logs: np.ndarray, first_judged: int, start_up: int | None = None
                ) -> tuple[list[_Spike], int | None]:
        """The spikes from ``first_judged`` on, and from ``start_up`` (when given) to it
        against the start-up's trend; and the candidate waiting for its next point."""
        n = len(logs)
        raw_hits = self._raw_hits(logs)
        raw_hits = raw_hits[raw_hits >= first_judged]
        excluded = np.zeros(n, dtype=bool)
        # Points below this index have a baseline that differs from the plain rolling one
        # (partial at the start, or holding an episode's points): judged one by one.
        judge_alone_until = self.window
        spikes: list[_Spike] = []
        pending: int | None = None
        start = first_judged if start_up is None else min(start_up, first_judged)
        while start < n:
            trend = start < first_judged
            if trend:  # the start-up: against the trend, point by point
                hit = self._first_trend_hit(logs, excluded, start, min(first_judged, n))
                if hit is None:
                    start = first_judged
                    continue
            else:
                hit = self._first_hit_alone(logs, excluded, start,
                                            min(judge_alone_until, n))
            if hit is None:
                later = raw_hits[np.searchsorted(raw_hits, max(start, judge_alone_until)):][:1]
                if not later.size:
                    break
                hit = int(later[0])
            window = clean_window(logs, excluded, hit, self.window)
            level, slope, noise, rho = _dynamics(window)
            if trend:
                median, scale = _now(window)
            else:
                median, scale = (float(v[0]) for v in row_median_sd(window[None, :]))
            carried = math.nan
            detected = hit
            if rho > 0 and self.carry_threshold:  # the point after it tells a shock apart
                if hit + 1 >= n:
                    pending = hit  # judged once the next point is logged
                    break
                carried = float(logs[hit + 1]) - median
                detected = hit + 1
                if self._own_shock(float(logs[hit]) - level, float(logs[hit + 1]) - level
                                   - slope, noise, rho):
                    start = hit + 1
                    continue
            firing = median + max(math.log(self.min_ratio), self.threshold * scale)
            level = (median + firing) / 2
            resolved = first_run(logs, hit + 1, self.resolve_points,
                                 lambda v, level=level: v < level)
            end = n if resolved is None else resolved - self.resolve_points + 1
            excluded[hit:end] = True
            spikes.append(_Spike(hit, resolved, median, scale, int(window.size), end,
                                 detected, carried, rho, trend))
            if resolved is None:
                break
            judge_alone_until = max(judge_alone_until, end + self.window)
            start = resolved + 1
        return spikes, pending

    def _first_trend_hit(self, logs: np.ndarray, excluded: np.ndarray, k_from: int,
                         k_to: int) -> int | None:
        """First index in [k_from, k_to) that spikes against where the norm is now (see
        ``_now``): while the norm falls from its start-up level, the window's median lags
        behind it and its spread holds the fall itself, so a 50x batch on a norm falling
        10x over the window would stand only a few of those deviations above it."""
        for k in range(k_from, k_to):
            if excluded[k]:
                continue
            window = clean_window(logs, excluded, k, self.window)
            if window.size < 4:
                continue
            level, noise = _now(window)
            above = float(logs[k]) - level
            if above > math.log(self.min_ratio) and above > self.threshold * noise:
                return k
        return None

    def _own_shock(self, height: float, carried: float, noise: float, rho: float) -> bool:
        """Whether a candidate ``height`` above the level (log scale) whose next point
        stands ``carried`` above it is a shock of the norm's own autocorrelated noise: the
        next point is neither back within ``carry_threshold`` standard deviations of the
        level (where it is after an abnormal batch) nor ``carry_threshold`` innovation
        standard deviations (``noise * sqrt(1 - rho**2)``) away from the ``rho * height``
        that the lag-1 autocorrelation carries over from a shock of the process itself."""
        if noise <= 0 or rho <= 0:
            return False
        innovation = noise * math.sqrt(1 - rho * rho)
        return (carried > self.carry_threshold * noise
                and abs(carried - rho * height) < self.carry_threshold * innovation)

    def _raw_hits(self, logs: np.ndarray) -> np.ndarray:
        """Indices that spike against the plain rolling window of the previous points."""
        if len(logs) <= self.window:
            return np.empty(0, dtype=np.int64)
        # The ratio test needs only the median, which rolls cheaply: it screens, and the
        # exact test then runs on the few candidates left.
        median = moving_median(logs, self.window)
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
                     loss_spikes: list[tuple[int, int | None]],
                     step: int) -> list[tuple[int, float, bool]]:
        """The loss points near ``step``: (step, value, whether it lies in one of the
        ``loss_spikes``: their first and last steps, oldest first, None while open)."""
        if not loss_steps.size:
            return []
        centre = int(np.searchsorted(loss_steps, step, side="right")) - 1
        first = max(0, centre - self.coincide_points)
        last = min(len(loss_steps), max(centre, 0) + self.coincide_points + 1)
        checked = []
        for i in range(first, last):
            at = int(loss_steps[i])
            # The last loss spike begun by then: is it still going at this point?
            latest = bisect.bisect_right(loss_spikes, at, key=lambda span: span[0]) - 1
            ends = loss_spikes[latest][1] if latest >= 0 else -math.inf
            checked.append((at, float(loss_values[i]), ends is None or at <= ends))
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
        level = ("the level its start-up fall had reached" if spike.trend
                 else "its recent median")
        summary = (f"{self.metric} jumped to {fmt_number(value)} at step {onset_step} "
                   f"({value / median:.1f}x {level} {fmt_number(median)} over "
                   f"{spike.baseline_points} point{'' if spike.baseline_points == 1 else 's'})")
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
        if math.isfinite(spike.carried):
            evidence["next_ratio"] = math.exp(spike.carried)
            evidence["autocorrelation"] = spike.rho
        return self.finding(data, onset_step=onset_step,
                            detected_step=int(steps[spike.detected]), summary=summary,
                            evidence=evidence, resolved_step=(
                                None if spike.resolved is None else int(steps[spike.resolved])))

    # --- climb --------------------------------------------------------------------
    # Every statistic a block is judged on is a function of the block medians up to it:
    # a poll reads the new blocks and the fixed number of blocks their windows reach back to.

    def _climb(self, values: np.ndarray, steps: np.ndarray, blocks: _Blocks) -> _Blocks:
        """The climb rule's state with every block completed since the last poll judged.

        The state is extended in place (its lists only grow; ``count`` marks what is
        complete, so a poll that failed half-way leaves nothing behind)."""
        for name in ("medians", "first_steps", "last_steps"):
            del getattr(blocks, name)[blocks.count:]
        size = self.trend_window // _REFERENCE
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
        cusum, zero, below, held = blocks.cusum, blocks.zero, blocks.below, blocks.held
        open_, fresh_from = blocks.open, blocks.fresh_from
        stats = self._block_statistics(blocks.medians, old)
        slack, threshold = self.climb_slack, self.climb_threshold
        min_level = math.log(self.min_rise)
        for i, j in enumerate(range(old, len(blocks.medians))):
            if open_ is not None:
                if j - open_.detected_block >= _REFERENCE and stats["rise"][i] <= 0:
                    blocks.climbs.append(replace(open_, resolved_step=blocks.last_steps[j]))
                    open_, cusum, zero, below, held = None, 0.0, j, j, None
                    fresh_from = j - _REFERENCE + 1
                continue
            if j - _LAG - _REFERENCE < fresh_from:  # no clean reference yet
                zero = below = j
                held = None
                continue
            reference, scale = float(stats["reference"][i]), float(stats["scale"][i])
            z = min(_CLIP, max(-_CLIP, (blocks.medians[j] - reference) / scale))
            cusum = max(0.0, cusum + z - slack)
            if cusum == 0.0:
                zero = j
            excess = float(stats["recent"][i]) - reference
            if excess <= 0:
                below = j
            # Whether the reference is a held level is judged where the excursion starts
            # (the level it left); later references trail into the climb itself.
            if cusum == 0.0 or excess <= 0 or held is None:
                held = not float(stats["drift"][i]) > _HELD_Z * _HALF_SE * scale
            if cusum >= threshold and excess >= min_level and held:
                first = j - _LAG - _REFERENCE
                open_ = _Climb(
                    onset_step=blocks.first_steps[max(zero, below) + 1],
                    detected_step=blocks.last_steps[j], resolved_step=None,
                    reference_steps=(blocks.first_steps[first],
                                     blocks.last_steps[first + _REFERENCE - 1]),
                    reference=reference, level=float(stats["recent"][i]), scale=scale,
                    cusum=cusum, detected_block=j)
        blocks.cusum, blocks.zero, blocks.below, blocks.held = cusum, zero, below, held
        blocks.open, blocks.fresh_from = open_, fresh_from
        blocks.next_position = int(positions[-1, -1]) + 1
        blocks.count = len(blocks.medians)
        return blocks

    @staticmethod
    def _block_statistics(medians: list[float], old: int) -> dict[str, np.ndarray]:
        """Per block from ``old`` on (log scale): the reference level (the median of the
        ``_REFERENCE`` blocks that end ``_LAG`` blocks before it), the long-run standard
        deviation of a block median, the recent level (the median of the last ``_RECENT``
        blocks) and the rise of the median of the last ``_REFERENCE`` blocks over the
        ``_REFERENCE`` before them."""
        first = max(0, old - (_LAG + _REFERENCE + _SCALE_HISTORY + 1))
        m = pd.Series(medians[first:])
        count = len(m)
        new = np.arange(old - first, count)
        lagged = new - _LAG - 1

        def at_lag(series: pd.Series) -> np.ndarray:  # the value at block j - _LAG - 1
            rows = series.to_numpy()
            return np.where(lagged >= 0, rows[np.maximum(lagged, 0)], np.nan)

        def rolled(series: pd.Series, window: int) -> pd.Series:
            return pd.Series(moving_median(series.to_numpy(), window, min_count=1),
                             index=series.index)

        running = rolled(m, _REFERENCE)
        # The scale comes from the ``_SCALE_HISTORY`` blocks before the reference's end:
        # the spread of the block medians about their running median, and that of their
        # steps (for symmetric noise, the median |step| is the MAD of the steps).
        # The running median of the window centred on each block is the trailing one that
        # ends _REFERENCE // 2 - 1 blocks later (those lie before the block judged).
        centred = running.shift(1 - _REFERENCE // 2)
        level_sd = MAD_TO_SD * at_lag(rolled((m - centred).abs(), _SCALE_HISTORY))
        step_sd = MAD_TO_SD / math.sqrt(2) * at_lag(rolled(m.diff().abs(), _SCALE_HISTORY))
        level_sd = np.nan_to_num(level_sd, nan=0.0)
        step_sd = np.nan_to_num(step_sd, nan=0.0)
        # AR(1) on the block medians: var(step) = 2 var (1 - rho); a sum of n blocks then
        # varies as n var (1 + rho) / (1 - rho), which is what the CUSUM adds up.
        sd = np.maximum(np.maximum(level_sd, step_sd), _MIN_SCALE)
        rho = np.clip(1 - (step_sd / sd) ** 2, 0.0, _MAX_RHO)
        # The median of _REFERENCE whole blocks: the running one once that many exist.
        full = np.where(np.arange(count) >= _REFERENCE - 1, running.to_numpy(), np.nan)
        halves = rolled(m, _REFERENCE // 2)
        earlier = new - _REFERENCE
        return {
            "reference": at_lag(running),
            "scale": sd * np.sqrt((1 + rho) / (1 - rho)),
            "recent": rolled(m, _RECENT).to_numpy()[new],
            "rise": full[new] - np.where(earlier >= 0, full[np.maximum(earlier, 0)], np.nan),
            # The reference's later half against its earlier half: a level held, or a rise.
            "drift": at_lag(halves - halves.shift(_REFERENCE // 2)),
        }

    def _climb_finding(self, data: RunData, climb: _Climb) -> Finding:
        rise = math.exp(climb.level - climb.reference)
        reference, level = math.exp(climb.reference), math.exp(climb.level)
        lo, hi = climb.reference_steps
        points = _RECENT * (self.trend_window // _REFERENCE)
        summary = (f"{self.metric} has climbed to {fmt_number(level)} (median of the last "
                   f"{points} points), {rise:.2f}x its level {fmt_number(reference)} over "
                   f"steps {lo}–{hi}; the rise has built up since step {climb.onset_step} "
                   f"beyond the norm's own noise (CUSUM {climb.cusum:.1f} ≥ "
                   f"{self.climb_threshold:g})")
        evidence = {
            "rule": "climb",
            "reference_steps": [lo, hi],
            "reference": reference,
            "level": level,
            "rise": rise,
            "min_rise": self.min_rise,
            "cusum": climb.cusum,
            "noise_sd": climb.scale,
        }
        return self.finding(data, onset_step=climb.onset_step,
                            detected_step=climb.detected_step, summary=summary,
                            evidence=evidence, resolved_step=climb.resolved_step)


def _now(window: np.ndarray) -> tuple[float, float]:
    """Where a falling norm is now and its noise (log scale): the median of the window's
    last ``_NOW`` points, and the robust standard deviation of the window's residuals
    around its straight trend (the fall is not noise; a bend in it, a storm that ends,
    only widens the noise)."""
    return float(np.median(window[-_NOW:])), _dynamics(window)[2]


def _dynamics(window: np.ndarray) -> tuple[float, float, float, float]:
    """A baseline window's (log scale) straight trend and noise: the level the trend
    reaches at the next point, its slope per point (the difference of the two halves'
    medians), the robust standard deviation of the residuals around it (``1.4826 * MAD``)
    and their lag-1 autocorrelation, with each residual clipped at ``_CLIP`` standard
    deviations so that one shock does not make it. rho is in [0, ``_MAX_RHO``]; 0 for a
    window too short or constant."""
    width = window.size
    if width < 4:
        return float(np.median(window)) if width else 0.0, 0.0, 0.0, 0.0
    half = width // 2
    slope = float(np.median(window[width - half:]) - np.median(window[:half])) / (width - half)
    residuals = window - slope * (np.arange(width) - (width - 1) / 2)
    centre = float(np.median(residuals))
    noise = robust_sd(residuals)
    level = centre + slope * (width + 1) / 2
    if noise <= 0:
        return level, slope, 0.0, 0.0
    clipped = np.clip(residuals - centre, -_CLIP * noise, _CLIP * noise)
    rho = float(np.dot(clipped[1:], clipped[:-1]) / np.dot(clipped, clipped))
    return level, slope, noise, min(_MAX_RHO, max(0.0, rho))
