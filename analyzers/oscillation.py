"""Loss oscillation: the loss swings up and down with a regular period."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzers import register
from analyzers.base import Analyzer, RunData
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_number
from analyzers.stats.robust import robust_sd
from analyzers.streaming import Streams

# Window lengths tried, in periods: a large swing is significant over two periods already,
# a faint one needs more: a steady swing's power grows with the window, so twelve periods
# carry 1.5 times eight periods' power. Each is tested on its own (more windows, more chances
# for noise).
_CYCLES = (2, 3, 4, 6, 8, 12)
# Ratio between neighbouring candidate periods: a swing halfway between two of them drifts
# by about a twentieth of a period per period against the nearer, so it keeps about 0.9 of its
# power in a four-period window, 0.6 in an eight- and 0.3 in a twelve-period one (sinc^2 of
# the drift); the short windows carry such a swing. Below _WHOLE_PERIODS points every whole
# number is a candidate (rounding the ratio grid would leave gaps of up to 17% there).
_PERIOD_RATIO = 1.1
_WHOLE_PERIODS = 20
# Evaluations per period (every point for periods under this many points).
_EVALUATIONS_PER_PERIOD = 4
# The noise is measured over the last this many periods (at least _NOISE_POINTS points): as
# long as the longest window, so that no verdict rests on a noise fit from fewer points than
# its own window, and so that the one period of differences across a swing's onset (which
# the differences ``P`` apart do not cancel) is a smaller share of the fit: with eight
# periods it inflated the noise at the period three- to six-fold right after the onset.
_NOISE_PERIODS = 12
_NOISE_POINTS = 128
# The swing must be present in each half of its window with at least this share of its
# whole in-phase sum (and in every period with a positive one): one burst is not a swing.
_HALF_SHARE = 0.25
# While a finding is open its swing holds as long as the power over ``_HOLD_CYCLES`` periods
# stays above this share of ``significance`` (a weaker test than firing's, so that a swing
# near the threshold does not flap).
_HOLD_SHARE = 0.25
_HOLD_CYCLES = 3
# The trend (for ``min_swing``) is measured over at least this many periods.
_TREND_CYCLES = 4
# Values further than this many typical point-to-point steps (their 90th percentile) from
# the median are clipped, before any running sum: a finite blow-up (1e12) would otherwise
# leave the sums without a significant digit of the loss. A real swing is far smaller.
_CLIP_STEPS = 1e4
# The log's resolution and the clip level are measured on the first this many finite points
# (all of them in a shorter run): they describe the logger and the loss's scale, and fixed
# once measured they let a poll resume instead of re-reading the history.
_CONTEXT_POINTS = 10_000
# Candidate periods whose residual and noise model are kept at a time.
_KEPT = 3
# Evaluations screened at a time.
_CHUNK = 8192
# Share of ``significance`` under which a roughly fitted power rules an evaluation out (the
# rough and the exact fit differ by rounding only).
_SCREEN = 0.9
# AR(1) coefficients the noise model is fitted over (a random walk is the limit at 1).
_PHI = np.concatenate((np.linspace(-0.9, 0.9, 600, endpoint=False),
                       1 - np.geomspace(0.1, 1e-4, 600)))


@dataclass(frozen=True)
class _Measures:
    """One candidate period's measures over windows of ``cycles`` periods ending at
    ``positions`` (context coordinates)."""

    period: int
    cycles: int
    positions: np.ndarray
    power: np.ndarray  # periodogram of the residual at the period over the noise's spectrum
    amplitude: np.ndarray  # of the swing at the period
    level: np.ndarray  # mean of the loss over the window
    slope: np.ndarray  # change of the loss per point over the window (whole periods apart)
    phi: np.ndarray  # AR(1) coefficient of the noise
    steady: np.ndarray  # the swing is in phase in every period and in both halves

    def at(self, keep: np.ndarray) -> _Measures:
        return _Measures(self.period, self.cycles, self.positions[keep], self.power[keep],
                         self.amplitude[keep], self.level[keep], self.slope[keep],
                         self.phi[keep], self.steady[keep])


@dataclass(frozen=True)
class _Episode:
    fired: int  # position of the evaluation that fired
    measures: _Measures  # at ``fired``, for the period that fits best there
    resolved: int | None  # position from which it was known to be over


@dataclass(frozen=True)
class _Report:
    """A settled episode's finding, less what the run's checkpoints decide."""

    onset_step: int
    detected_step: int
    summary: str
    evidence: dict[str, Any]
    resolved_step: int | None


@dataclass
class _State:
    """What one poll leaves for the next: the finite index from which passing evaluations
    are looked for again (none passed in the ``max_period`` before it, and every episode
    before it is over), the non-finite positions seen, the frozen resolution and clip
    level, and the settled episodes' reports."""

    resume: int = 0
    seen: int = 0
    gaps: list[int] = field(default_factory=list)
    resolution: float | None = None
    clip: tuple[float, float] | None = None
    reports: list[_Report] = field(default_factory=list)


@register
class Oscillation(Analyzer):
    """Loss oscillation: the loss swings up and down with a regular period.

    *Signal* (SIGNALS.md ``oscillation``; 003 §5.2 case 1: the loss fell normally, then from
    step 2000 oscillated periodically because the LR sat at a high constant after warmup).
    For each candidate period ``P`` (``min_period`` to ``max_period`` logged points: every
    whole number up to 20, then a geometric grid 10% apart; evaluated four times a period)
    the loss is detrended by subtracting, twice, its trailing mean over the last ``P``
    points: that removes any level, straight or quadratic trend, needs no look-ahead and
    leaves a swing of period ``P`` (and the noise at that period) exactly as it is. Over
    windows of the last 2, 3, 4, 6, 8 and 12 periods (at least ``min_window`` points) the
    residual's periodogram at the period, ``|sum r_t exp(-2 pi i t / P)|^2 / W``, is
    compared with the spectrum that the loss's own noise has there: an AR(1) model
    (coefficient and variance) fitted to the loss's differences ``P`` points apart over the
    last twelve periods (at least 128 points). Those differences cancel a swing of period
    ``P`` (all but the one period across its onset, a small share of twelve periods), so a
    swing does not hide itself by inflating the noise estimate, and an AR(1)
    spectrum rises towards long periods as slowly wandering noise does, so that does not
    look periodic. The ratio (``power``) is exponentially distributed under such noise; a
    finding fires at the first evaluation where it reaches ``significance``, with the
    swing in phase in every period of the window and holding at least a quarter of the
    in-phase sum in each half of it (one burst, a spike or an LR step, is not a swing),
    an amplitude (``2 |sum| / W``) of at least ``min_amplitude`` of the loss level and
    above the log's resolution, a swing steeper than the trend (``min_swing``; the trend
    over at least four periods, the amplitude less two standard errors of its noise), and
    the power still reaching ``significance`` once the window's residuals are clipped at
    four robust standard deviations. A large swing therefore fires after two or three
    periods, a faint one after up to twelve; the period it reports is known to about a
    k-th of itself from a k-period window. Its onset: going back from there without a
    break, a period at a time and then point by point, the earliest one-period window in
    which the swing reached half its size, plus half a period (a swing starting at ``t``
    half fills the window starting half a period earlier); no earlier than the grace
    period. It resolves once, for ``persistence`` periods, the power over
    the last three periods at the finding's period (or a neighbour on the grid) has stayed
    under a quarter of ``significance``: a weaker test than firing's, so a swing near the
    threshold does not flap. A later oscillation is a new finding. Non-finite values are
    skipped (they are ``spike``'s job); periods and windows count logged points, and the
    finding states them in steps too (to within 5%, the grid's spacing).

    Parameters
    ----------
    metric : str, default "train/loss"
        The tag watched.
    min_period : int, default 4
        Shortest period looked for, in logged points. Shorter periods are hard to tell
        from batch-to-batch noise.
    max_period : int, default 100
        Longest period looked for, in logged points. Longer finds slower swings but needs
        four times as many points before it can say anything.
    min_window : int, default 30
        Fewest points in a window, whatever the period: short periods are judged over
        more of them (a period of 4 points over 8 periods), so a few noisy points cannot
        line up by chance. Larger is steadier and slower.
    significance : float, default 25.0
        Power the swing must reach: its periodogram over the noise's spectrum at its
        period. Noise exceeds ``z`` with probability ``exp(-z)`` in one window; real losses
        have fatter tails and every period, window and evaluation is a chance, so it is set
        well above that (the largest seen in the benchmark's healthy runs is about 22).
        Lower fires sooner and on fainter swings, with more false alarms.
    min_amplitude : float, default 0.01
        Amplitude (half the peak-to-peak swing) relative to the loss level that counts as
        an oscillation. Lower reports faint ripples of very smooth losses.
    min_swing : float, default 3.0
        How much steeper the swing must be than the trend: the swing's largest slope
        ``2 * pi * amplitude / P`` over the trend's slope. At 3 the loss climbs back by
        about half its swing each period; a loss that falls in steps (a drop at each epoch
        boundary) reaches at most 2 and is not an oscillation.
    persistence : int, default 3
        Periods the weaker test must fail before the finding resolves. More keeps a
        finding open through a pause in the swing; fewer resolves sooner.
    grace_period : int, default 50
        Finite points at the start never judged (warm-up, where the loss falls fastest).

    *False-positive guard*: noise has no period, so its power at any period is that of its
    spectrum, which the AR(1) fit measures (from differences a period apart, which a swing
    of that period does not reach); the threshold leaves room for fat tails and for the
    many periods and windows tried (none of 400k points of loud AR(1) noise, coefficients
    0.5 to 0.98, nor of white, random-walk, small-batch and heavy-tailed noise, fires in
    the tests). A spike, an LR step or a resumed run's bump is one burst: its power sits
    in one period of the window, not in phase in all of them; a few spikes that happen to
    fall a period apart lose their power once clipped at four robust standard deviations
    (a swing's residuals are not touched). A loss that falls in steps
    at each epoch boundary is periodic once detrended but fails ``min_swing`` (it never
    climbs back; the trend is measured over at least four periods and the amplitude less
    its noise, so a noisy staircase is not lifted over the bar by chance). A finite
    blow-up is clipped before any running sum (``_CLIP_STEPS`` typical steps from the
    median). ``min_amplitude`` ignores ripples too small to matter, and the swing must
    also be larger than the log's resolution (the smallest gap between distinct values),
    so a loss logged with four decimals that flips between 0.0001 and 0.0002 is rounding,
    not a swing. ``min_window`` gives each verdict enough points and ``grace_period``
    skips the warm-up.

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import RunData
    >>> rng = np.random.default_rng(0)
    >>> t = np.arange(1000)
    >>> loss = 2.0 + 2.0 * np.exp(-t / 100) + 0.02 * rng.standard_normal(1000)
    >>> loss[600:] += 0.1 * np.sin(2 * np.pi * (t[600:] - 600) / 20)  # from step 601
    >>> [finding] = Oscillation().detect(RunData.from_series("demo", {"train/loss": loss}))
    >>> finding.onset_step, finding.detected_step, finding.state
    (599, 625, 'firing')
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    train/loss oscillates with a period of 18 steps and amplitude 0.0814 (4.1% of its level
    2.01) from step 599: over steps 590–625 (2 periods) the swing carries 46 times the power
    its own noise has at that period
    """

    signal = "oscillation"
    # below 10k points a scan redoes the whole look-back (its noise scale is not frozen yet):
    # a watcher rescans after 2% more points (at most 50), not every poll
    rejudge_share = 0.02

    def __init__(self, metric: str = "train/loss", min_period: int = 4, max_period: int = 100,
                 min_window: int = 30, significance: float = 25.0,
                 min_amplitude: float = 0.01, min_swing: float = 3.0, persistence: int = 3,
                 grace_period: int = 50) -> None:
        check_metric(metric)
        check_int("min_period", min_period, 4)
        check_int("max_period", max_period, min_period)
        check_int("min_window", min_window, 8)
        check_real("significance", significance, 0.0)
        check_real("min_amplitude", min_amplitude, 0.0, allow_equal=True)
        check_real("min_swing", min_swing, 0.0, allow_equal=True)
        check_int("persistence", persistence, 1)
        check_int("grace_period", grace_period, 0)
        self.metric = metric
        self.min_period = min_period
        self.max_period = max_period
        self.min_window = min_window
        self.significance = significance
        self.min_amplitude = min_amplitude
        self.min_swing = min_swing
        self.persistence = persistence
        self.grace_period = grace_period
        self._streams: Streams[_State] = Streams()

    def detect(self, data: RunData) -> list[Finding]:
        series = data.series(self.metric)
        all_values = series.to_numpy(dtype=float)
        all_steps = series.index.to_numpy(dtype=np.int64)
        tags = (self.metric,)
        state = self._streams.resume(data, tags) or _State()
        tail = all_values[state.seen:]
        state.gaps += (state.seen + np.flatnonzero(~np.isfinite(tail))).tolist()
        state.seen = len(all_values)
        count = len(all_values) - len(state.gaps)  # finite points
        if count < self.grace_period + self.min_window:
            self._streams.save(data, tags, state)
            return []
        gap_index = np.asarray(state.gaps, dtype=np.int64) - np.arange(len(state.gaps))

        def positions(lo: int, hi: int) -> np.ndarray:
            """Series positions of finite points lo … hi - 1."""
            k = np.arange(lo, hi)
            return k + np.searchsorted(gap_index, k, side="right")

        if state.resolution is None:
            head = all_values[positions(0, min(count, _CONTEXT_POINTS))]
            resolution, clip = _scale(head)
            if count >= _CONTEXT_POINTS:
                state.resolution, state.clip = resolution, clip
        else:
            resolution, clip = state.resolution, state.clip
        settled = list(state.reports)
        offset = max(0, state.resume - self._lookback())
        at = positions(offset, count)
        values, steps = all_values[at], all_steps[at]
        with np.errstate(all="ignore"):
            context = _Context(values, offset, resolution, clip)
            best = self._scan(context, state.resume - offset)
            episodes = self._episodes(context, best)
            reports = [self._report(steps, context, e) for e in episodes]
        self._settle(state, best, episodes, reports, offset, count)
        self._streams.save(data, tags, state)
        return [self.finding(data, onset_step=r.onset_step, detected_step=r.detected_step,
                             summary=r.summary, evidence=r.evidence,
                             resolved_step=r.resolved_step)
                for r in settled + reports]

    def _lookback(self) -> int:
        """Finite points an evaluation reads before its position (noise window and lag, or
        detrending and the longest window)."""
        period = self.max_period
        return max(self._noise_window(period) + period,
                   (max(_CYCLES) + 2) * period + self.min_window) + 1

    def _settle(self, state: _State, best: np.ndarray, episodes: list[_Episode],
                reports: list[_Report], offset: int, count: int) -> None:
        """Move the resume point as late as it can go: once the resolution and clip are
        frozen, after every episode's end, and with no passing evaluation in the
        ``max_period`` before it."""
        if state.resolution is None:
            return
        latest = count - self.max_period - 1
        passing = np.flatnonzero(best[:max(0, latest - offset)] > 0) + offset
        candidate = latest
        if passing.size and candidate - int(passing[-1]) <= self.max_period + 1:
            return
        settled = [r for r, e in zip(reports, episodes, strict=True)
                   if e.resolved is not None and e.resolved + offset < candidate]
        if len(settled) < len(reports) or candidate <= state.resume:
            return
        state.reports += settled
        state.resume = candidate

    def periods(self) -> list[int]:
        """The candidate periods, in logged points: every whole number up to
        ``_WHOLE_PERIODS``, then a geometric grid."""
        low = max(self.min_period, _WHOLE_PERIODS)
        count = math.floor(math.log(self.max_period / low, _PERIOD_RATIO)) + 1
        grid = np.round(low * _PERIOD_RATIO ** np.arange(count)).astype(int)
        whole = range(self.min_period, min(_WHOLE_PERIODS, self.max_period + 1))
        return sorted(set(grid.tolist()) | set(whole) | {self.max_period})

    def cycles(self, period: int) -> list[int]:
        """Window lengths, in periods, tried for ``period``: those of ``_CYCLES`` with at
        least ``min_window`` points (the longest if none has)."""
        fit = [k for k in _CYCLES if k * period >= self.min_window]
        return fit or [max(_CYCLES)]

    def _noise_window(self, period: int) -> int:
        return _noise_window(period)

    # ------------------------------------------------------------------- evaluation
    def _windows(self, context: _Context, period: int, cycles: list[int],
                 at: np.ndarray | None, start: int = 0,
                 ) -> list[tuple[int, np.ndarray | range, int | None]]:
        """The window lengths of ``cycles`` with evaluations, each with the positions its
        windows end at (a tail of the longest list; a range on the grid, from ``start`` on)
        and their stride (None for ``at``)."""
        offset, n = context.offset, len(context.values)
        base = 2 * period - 2  # context position of the residual's first point
        stride = max(1, period // _EVALUATIONS_PER_PERIOD)
        span = self._noise_window(period)
        windows = []
        for k in cycles:
            width = k * period
            # The window, its detrending and the noise window (less what the run's start
            # cuts off) must lie in the context; evaluations sit on one grid over the run.
            lo = max(base + width - 1, self.grace_period + width - 1 - offset,
                     span + period - 1 if offset else period + 2 * _lag(period), start)
            ends: np.ndarray | range
            if at is None:
                first = lo + (-(lo + offset)) % stride
                ends = range(first, n, stride)
                step: int | None = stride
            else:
                ends = at[(at >= lo) & (at < n)]
                step = None
            if len(ends):
                windows.append((k, ends, step))
        return windows

    def _measure(self, context: _Context, period: int, cycles: list[int],
                 at: np.ndarray | None = None) -> list[_Measures]:
        """``period``'s measures, one per window length in ``cycles``: at the positions
        ``at`` (context coordinates), or every ``period / 4`` finite points of the run, from
        the first whole window after the grace period."""
        if len(context.values) < 3 * period:
            return []
        windows = [(k, _select(ends, slice(None)), step)
                   for k, ends, step in self._windows(context, period, cycles, at)]
        if not windows:
            return []
        detrended = context.detrended(period)
        # Every window's positions are a tail of the longest list: the noise is fitted once.
        longest = max((ends for _, ends, _ in windows), key=len)
        spectra, phis = detrended.spectrum(longest)
        out = []
        for k, ends, step in windows:
            whole, size, amplitude, level = self._swing(context, detrended, k, ends, step)
            spectrum, phi = spectra[len(longest) - len(ends):], phis[len(longest) - len(ends):]
            power = size**2 / (k * period * spectrum)
            slope = self._slope(context, period, k, ends)
            steady = self._steady(detrended, k, ends, whole, size)
            out.append(_Measures(period, k, ends, power, amplitude, level, slope, phi, steady))
        return out

    def _passing(self, context: _Context, period: int, start: int = 0) -> list[_Measures]:
        """:meth:`_measure` over the run, at the evaluations that pass (:meth:`_passes`)
        only: the cheap tests go first (the amplitude, then the swing in phase and steeper
        than the trend even at infinite power), then a rough fit of the noise, and the
        exact fit (running sums over the whole run) is made only where those pass. Only
        the evaluations from context position ``start`` on are made."""
        if len(context.values) < 3 * period:
            return []
        windows = self._windows(context, period, self.cycles(period), None, start)
        if not windows:
            return []
        detrended = context.detrended(period)
        stage = []
        for k, ends, step in windows:
            ends = _select(ends, self._loud(context, detrended, k, ends, step))
            whole, size, amplitude, level = self._swing(context, detrended, k, ends, None)
            slope = self._slope(context, period, k, ends)
            keep = np.flatnonzero(
                self._steady(detrended, k, ends, whole, size)
                & (2 * np.pi * amplitude / period * (1 + 1e-9) >= self.min_swing * np.abs(slope)))
            stage.append((k, ends[keep], size[keep], amplitude[keep], level[keep], slope[keep]))
        ends = np.unique(np.concatenate([ends for _, ends, *_ in stage]))
        if ends.size and ends.size * self._noise_window(period) <= len(context.values):
            # Screened first with the noise fitted from each window's own sums (the same
            # fit but for rounding, which moves it by under 1e-6): what stays under
            # _SCREEN of the significance there cannot reach it with the exact fit.
            rough = detrended.rough_spectrum(ends)
            for index, (k, at, *rest) in enumerate(stage):
                spectrum = rough[np.searchsorted(ends, at)]
                power = rest[0]**2 / (k * period * spectrum)
                keep = ~((spectrum > 0) & (power < _SCREEN * self.significance))
                stage[index] = (k, at[keep], *(x[keep] for x in rest))
            ends = np.unique(np.concatenate([ends for _, ends, *_ in stage]))
        if not ends.size:
            return []
        spectra, phis = detrended.spectrum(ends)
        out = []
        for k, at, size, amplitude, level, slope in stage:
            where = np.searchsorted(ends, at)
            spectrum, phi = spectra[where], phis[where]
            power = size**2 / (k * period * spectrum)
            keep = (power >= self.significance) & self._steep(amplitude, power, slope, period)
            out.append(_Measures(period, k, at[keep], power[keep], amplitude[keep], level[keep],
                                 slope[keep], phi[keep], np.ones(np.count_nonzero(keep), bool)))
        return out

    def _swing(self, context: _Context, detrended: _Detrended, k: int, ends: np.ndarray,
               step: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The residual's Fourier sum over windows of ``k`` periods ending at ``ends``, its
        size, the swing's amplitude and the loss's mean level there."""
        fourier, base, cumulative = detrended.fourier, detrended.base, context.cumulative
        width = k * detrended.period
        whole = _pick(fourier, 1 - base, ends, step) - _pick(fourier, 1 - base - width,
                                                             ends, step)
        size = np.abs(whole)
        amplitude = 2 * size / width
        level = (_pick(cumulative, 1, ends, step) - _pick(cumulative, 1 - width, ends, step)
                 ) / width
        return whole, size, amplitude, level

    def _loud(self, context: _Context, detrended: _Detrended, k: int,
              ends: np.ndarray | range, step: int | None) -> np.ndarray:
        """The indices into ``ends`` where the swing's amplitude reaches ``min_amplitude`` of
        the level and the log's resolution. A chunk at a time (small temporaries are cheaper
        to make than ones as long as the run), screened first by a cheaper form of the
        amplitude test made 1e-9 more lenient than the exact one (far more than either's
        rounding), so that it lets through every evaluation the exact one passes."""
        fourier, base, cumulative = detrended.fourier, detrended.base, context.cumulative
        width = k * detrended.period
        lenient = self.min_amplitude / 2 * (1 - 1e-9)
        found = []
        for lo in range(0, len(ends), _CHUNK):
            part = ends[lo:lo + _CHUNK]
            if lenient <= 0:
                chosen = np.arange(len(part))
            else:
                # |whole| >= min_amplitude / 2 * |width * level| (amplitude = 2 |whole| / W)
                size = np.abs(_pick(fourier, 1 - base, part, step)
                              - _pick(fourier, 1 - base - width, part, step))
                change = _pick(cumulative, 1, part, step) - _pick(cumulative, 1 - width, part,
                                                                  step)
                np.abs(change, out=change)
                change *= lenient
                chosen = np.flatnonzero(size >= change)
                if not chosen.size:
                    continue
                part = _select(part, chosen)
            _, _, amplitude, level = self._swing(context, detrended, k, part,
                                                 None if lenient > 0 else step)
            loud = amplitude >= self.min_amplitude * np.abs(level)
            loud &= amplitude > context.resolution
            found.append(chosen[loud] + lo)
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    @staticmethod
    def _slope(context: _Context, period: int, k: int, ends: np.ndarray) -> np.ndarray:
        """The loss's change per point over windows of ``k`` periods ending at ``ends``."""
        cumulative = context.cumulative
        last = cumulative[ends + 1] - cumulative[ends + 1 - period]
        # The trend is measured over at least _TREND_CYCLES periods: over two, the noise
        # in two period means can make a loss that falls in steps look like it climbs.
        reach = np.minimum(max(k, _TREND_CYCLES), (ends + 1) // period) * period
        first_period = cumulative[ends + 1 - reach + period] - cumulative[ends + 1 - reach]
        return (last - first_period) / period / (reach - period)

    @staticmethod
    def _steady(detrended: _Detrended, k: int, ends: np.ndarray, whole: np.ndarray,
                size: np.ndarray) -> np.ndarray:
        """Whether the swing is in phase in every period of the window and holds at least
        ``_HALF_SHARE`` of the in-phase sum in each half of it."""
        fourier, period = detrended.fourier, detrended.period
        i = ends - detrended.base + 1  # fourier index just past each window end
        phase = np.conj(whole) / np.where(size > 0, size, 1.0)
        shares = np.stack([((fourier[i - j * period] - fourier[i - (j + 1) * period])
                            * phase).real for j in range(k)])
        newer = shares[:k // 2].sum(axis=0)
        older = shares[k // 2:].sum(axis=0)
        return ((shares.min(axis=0) > 0) & (newer >= _HALF_SHARE * size)
                & (older >= _HALF_SHARE * size))

    def _power(self, context: _Context, period: int, cycles: int,
               at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The positions of ``at`` with a window of ``cycles`` periods, and its power there."""
        if len(context.values) < 3 * period:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        windows = self._windows(context, period, [cycles], at)
        if not windows:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        [(_, ends, _)] = windows
        detrended = context.detrended(period)
        size = self._swing(context, detrended, cycles, ends, None)[1]
        spectrum, _ = detrended.spectrum(ends)
        return ends, size**2 / (cycles * period * spectrum)

    def _steep(self, amplitude: np.ndarray, power: np.ndarray, slope: np.ndarray,
               period: int) -> np.ndarray:
        """Whether the swing (less two standard errors of its noise) is ``min_swing`` times
        steeper than the trend."""
        return (2 * np.pi * amplitude * (1 - np.sqrt(2 / power)) / period
                >= self.min_swing * np.abs(slope))

    def _passes(self, m: _Measures, resolution: float) -> np.ndarray:
        return (m.steady & (m.power >= self.significance)
                & (m.amplitude >= self.min_amplitude * np.abs(m.level))
                & (m.amplitude > resolution)
                & self._steep(m.amplitude, m.power, m.slope, m.period))

    def _scan(self, context: _Context, start: int = 0) -> np.ndarray:
        """Per position, the passing period with the most power there (0: none); positions
        before ``start`` (settled on an earlier poll) are not evaluated again, so that a
        poll's cost follows its new points, not the lookback."""
        n = len(context.values)
        best = np.zeros(n, dtype=np.int64)
        fit = np.full(n, -np.inf)
        for period in self.periods():
            for m in self._passing(context, period, max(start, 0)):
                better = m.power > fit[m.positions]
                fit[m.positions[better]] = m.power[better]
                best[m.positions[better]] = period
        return best

    # --------------------------------------------------------------------- episodes
    def _episodes(self, context: _Context, best: np.ndarray) -> list[_Episode]:
        """A passing evaluation fires; the episode then lasts until its own period stops
        holding (see :meth:`_end`), and the next passing evaluation after that fires
        again."""
        passing = np.flatnonzero(best > 0)
        episodes: list[_Episode] = []
        k = 0
        while k < len(passing):
            position = int(passing[k])
            measures = self._refine(context, int(best[position]), position)
            if not self._robust(context, measures, position):
                k += 1
                continue
            end = self._end(context, measures, position)
            episodes.append(_Episode(position, measures, end))
            if end is None:
                break
            k = int(np.searchsorted(passing, end, side="right"))
        return episodes

    def _refine(self, context: _Context, period: int, position: int) -> _Measures:
        """The measures at ``position`` of the window that fits best there (the most power)
        among the passing windows of the period that fired and of its grid neighbours."""
        grid = self.periods()
        index = grid.index(period)
        best: _Measures | None = None
        for candidate in grid[max(index - 1, 0):index + 2]:
            for m in self._measure(context, candidate, self.cycles(candidate),
                                   np.array([position])):
                if not self._passes(m, context.resolution)[0]:
                    continue
                if best is None or m.power[0] > best.power[0]:
                    best = m
        assert best is not None
        return best

    def _robust(self, context: _Context, m: _Measures, position: int) -> bool:
        """Whether the swing still reaches ``significance`` once the window's residuals are
        clipped at four robust standard deviations (1.4826 median absolute deviations)
        from their median: a few spikes that happen to fall a period apart carry their
        power in a handful of points, a swing (whose residuals lie within 0.71 amplitude
        of their median half the time) is left untouched."""
        period = m.period
        width = m.cycles * period
        segment = context.values[position - width - 2 * period + 3:position + 1]
        prefix = _prefix(segment)
        once = segment[period - 1:] - (prefix[period:] - prefix[:-period]) / period
        prefix = _prefix(once)
        residual = once[period - 1:] - (prefix[period:] - prefix[:-period]) / period
        residual = np.clip(residual, -context.clip, context.clip)
        centre = np.median(residual)
        spread = 4 * robust_sd(residual)
        clipped = np.clip(residual, centre - spread, centre + spread)
        phase = np.exp(-2j * np.pi * np.arange(width) / period)
        size = abs(np.sum(residual * phase))
        if size == 0:
            return False
        kept = abs(np.sum(clipped * phase)) / size
        return bool(m.power[0] * kept**2 >= self.significance)

    def _end(self, context: _Context, fired_with: _Measures, fired: int) -> int | None:
        """The first position after ``fired`` that ends ``persistence`` periods in which,
        at the finding's period and its neighbours on the grid, the power over windows as
        long as the one that fired (at least ``_HOLD_CYCLES`` periods) stayed under
        ``_HOLD_SHARE`` of ``significance``; None while the oscillation may still be going
        on."""
        period = fired_with.period
        grid = self.periods()
        index = grid.index(period)
        n = len(context.values)
        holding = np.zeros(n, dtype=bool)
        after = np.arange(fired + 1, n)
        for neighbour in grid[max(index - 1, 0):index + 2]:
            cycles = max(_HOLD_CYCLES, fired_with.cycles, -(-self.min_window // neighbour))
            ends, power = self._power(context, neighbour, cycles, after)
            holding[ends[power >= _HOLD_SHARE * self.significance]] = True
        gap = self.persistence * period
        quiet = ~holding[fired + 1:]
        counts = np.concatenate(([0], np.cumsum(quiet)))
        full = np.flatnonzero(counts[gap:] - counts[:-gap] == gap)
        return fired + int(full[0]) + gap if full.size else None

    # ---------------------------------------------------------------------- finding
    def _report(self, steps: np.ndarray, context: _Context, episode: _Episode) -> _Report:
        m = episode.measures
        at, period, cycles = episode.fired, m.period, m.cycles
        width = cycles * period
        first = at - width + 1  # the window the verdict used
        spacing = float(np.median(np.diff(steps[first:at + 1])))
        period_steps = period * spacing
        amplitude, level = float(m.amplitude[0]), float(m.level[0])
        relative = amplitude / abs(level) if level else math.inf
        onset = self._onset(context, at, period, amplitude)
        onset_step = int(steps[onset])
        power, phi = float(m.power[0]), float(m.phi[0])
        summary = (f"{self.metric} oscillates with a period of {period_steps:.0f} steps and "
                   f"amplitude {fmt_number(amplitude)} ({100 * relative:.1f}% of its level "
                   f"{fmt_number(level)}) from step {onset_step}: over steps "
                   f"{int(steps[first])}–{int(steps[at])} ({cycles} periods) the swing "
                   f"carries {power:.0f} times the power its own noise has at that period")
        slope = float(m.slope[0])
        swing = 2 * math.pi * amplitude / period / abs(slope) if slope else math.inf
        resolved = None
        if episode.resolved is not None:
            resolved = int(steps[episode.resolved])
        return _Report(
            onset_step=onset_step,
            detected_step=int(steps[at]),
            summary=summary,
            evidence={
                "period_points": period,
                "period_steps": period_steps,
                "amplitude": amplitude,
                "level": level,
                "relative_amplitude": relative,
                "power": power,
                "noise_ar1": phi,
                "cycles": cycles,
                "trend_per_point": slope,
                "swing_ratio": swing,
                "window_steps": [int(steps[first]), int(steps[at])],
            },
            resolved_step=resolved,
        )

    def _onset(self, context: _Context, fired: int, period: int, amplitude: float) -> int:
        """Where the swing began: going back from ``fired`` a period at a time, as long as
        the swing at ``period`` over one period still reaches half ``amplitude`` (no further
        than the look-back every poll keeps), then point by point to the earliest
        one-period window that still does. A swing starting at ``t`` fills half of the
        window starting at ``t - period / 2``, so that is where it began."""
        values = context.values
        limit = max(fired + 2 * period - 1 - self._lookback(), 0,
                    self.grace_period - context.offset)
        segment = values[max(limit - 2 * period + 2, 0):fired + 1]
        prefix = _prefix(segment)
        once = segment[period - 1:] - (prefix[period:] - prefix[:-period]) / period
        prefix = _prefix(once)
        residual = once[period - 1:] - (prefix[period:] - prefix[:-period]) / period
        start = fired + 1 - len(residual)  # position of residual[0]
        if len(residual) < period:
            return fired
        phase = _prefix(residual * np.exp(-2j * np.pi * np.arange(len(residual)) / period))
        swing = 2 / period * np.abs(phase[period:] - phase[:-period])  # by window start
        reached = swing >= amplitude / 2
        first = len(swing) - 1
        if not reached[first]:
            return start + first
        while first - period >= 0 and reached[first - period]:
            first -= period
        floor = max(first - period + 1, 0)
        while first > floor and reached[first - 1]:
            first -= 1
        if first == 0:
            return start
        return min(start + first + period // 2, fired)


class _Noise:
    """The AR(1) noise model of a loss at one period, fitted to its differences ``period``
    points apart (which a swing of that period does not reach) over trailing windows."""

    def __init__(self, values: np.ndarray, period: int,
                 buffers: dict[str, np.ndarray] | None = None) -> None:
        self.period = period
        self.lag = _lag(period)
        buffers = {} if buffers is None else buffers
        # Running sums two at a time, as the real and imaginary parts of one complex running
        # sum (the same additions, in half the passes).
        length, lag = len(values) - period, self.lag
        first = _take(buffers, "sums", length + 1, len(values) + 1)
        pair = first.view(float).reshape(-1, 2)
        pair[0] = 0
        diff = pair[1:, 0]  # diff[j] at position j + period
        np.subtract(values[period:], values[:-period], out=diff)
        np.multiply(diff, diff, out=pair[1:, 1])
        second = _take(buffers, "products", length, len(values) + 1)
        pair = second.view(float).reshape(-1, 2)
        pair[0] = 0
        np.multiply(diff[1:], diff[:-1], out=pair[1:, 0])
        np.multiply(diff[lag:], diff[:-lag], out=pair[1:length - lag + 1, 1])
        pair[length - lag + 1:, 1] = 0
        for sums in (first, second):
            np.cumsum(sums[1:], out=sums[1:])
        self.sums, self.squares = first.real, first.imag
        self.next, self.far = second.real, second.imag[:length - lag + 1]

    def spectrum(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The noise's spectral density at the period and its AR(1) coefficient, fitted
        over the differences ``lo`` … ``hi - 1`` (see :func:`_ar1`)."""
        return _ar1(self.period, hi - lo, self.sums[hi] - self.sums[lo],
                    self.squares[hi] - self.squares[lo], self.next[hi - 1] - self.next[lo],
                    self.far[hi - self.lag] - self.far[lo])[:2]


def _ar1(period: int, count: np.ndarray, total: np.ndarray, squares: np.ndarray,
         near: np.ndarray, far: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The AR(1) noise's spectral density at the period, its coefficient and the variance
    of the differences, from ``count`` differences ``period`` points apart: their sum, sum
    of squares and sums of products of neighbours and of differences ``_lag(period)``
    apart. The coefficient is fitted both from neighbouring differences and from
    differences a quarter period apart; the larger spectrum is kept (noise made of fast and
    slow parts looks less correlated point to point than it is over a period)."""
    mean = total / count
    variance = squares / count - mean**2
    p = period
    best = np.zeros(len(count))
    best_phi = np.zeros(len(count))
    for lag, sums in ((1, near), (_lag(period), far)):
        covariance = sums / (count - lag) - mean**2
        rho = covariance / variance
        table, coefficients = _table(p, lag)
        phi = np.interp(rho, table, coefficients)
        marginal = variance / (2 * (1 - phi**p))
        density = marginal * (1 - phi**2) / (1 - 2 * phi * math.cos(2 * math.pi / p)
                                             + phi**2)
        better = density > best
        best = np.where(better, density, best)
        best_phi = np.where(better, phi, best_phi)
    # Sums that overflowed (values beyond ~1e154, whose squares are infinite) measure no
    # noise: an infinite density, so that no swing is significant against it (a density
    # of 0 would make every one infinitely so).
    best = np.where(np.isfinite(variance), best, np.inf)
    return best, best_phi, variance


@functools.cache
def _table(period: int, lag: int) -> tuple[np.ndarray, np.ndarray]:
    """The correlation ``lag`` points apart of AR(1) noise's differences ``period`` points
    apart, in increasing order, and the AR(1) coefficients that give them."""
    phi = _PHI
    table = (2 * phi**lag - phi**abs(period - lag) - phi**(period + lag)) / (2 * (1 - phi**period))
    order = np.argsort(table)
    return table[order], phi[order]


def _lag(period: int) -> int:
    return max(1, period // 4)


def _noise_window(period: int) -> int:
    return max(_NOISE_PERIODS * period, _NOISE_POINTS)


class _Context:
    """What every candidate period shares: the values (finite points from the ``offset``-th
    on), their running sum, the log's resolution and the clip level of residuals."""

    def __init__(self, values: np.ndarray, offset: int = 0, resolution: float | None = None,
                 clip: float | None = None) -> None:
        if resolution is None or clip is None:
            resolution, clip = _scale(values)
        centre, spread = clip
        # A finite blow-up is clipped before any running sum is taken: 1e12 would leave
        # the sums (and sums of squares) without a single significant digit of the loss.
        self.values = np.clip(values, centre - spread, centre + spread)
        self.offset = offset
        self.cumulative = _prefix(self.values)
        self.resolution = resolution
        self.clip = 2 * spread
        self._detrended: dict[int, _Detrended] = {}
        self._scratch: np.ndarray | None = None

    def detrended(self, period: int) -> _Detrended:
        """``period``'s residual and noise model. The last ``_KEPT`` periods asked for are
        kept (an episode measures the same three again and again); a new one takes over
        the buffers of the one asked for longest ago (which must no longer be in use)."""
        found = self._detrended.pop(period, None)
        if found is None:
            buffers: dict[str, np.ndarray] = {}
            if len(self._detrended) >= _KEPT:
                buffers = self._detrended.pop(next(iter(self._detrended))).release()
            found = _Detrended(self, period, buffers)
        self._detrended[period] = found
        return found

    def scratch(self) -> np.ndarray:
        """Three rows of working space as long as the values plus one."""
        if self._scratch is None:
            self._scratch = np.empty((3, len(self.values) + 1))
        return self._scratch


class _Detrended:
    """One candidate period's residual (the values less their trailing mean over a period,
    twice, clipped) as a running sum of ``r_t exp(-2 pi i t / P)`` (``t`` counted from the
    run's first finite point), and its noise model (fitted on first use)."""

    def __init__(self, context: _Context, period: int, buffers: dict[str, np.ndarray]) -> None:
        values, cumulative = context.values, context.cumulative
        n = len(values)
        scratch = context.scratch()
        once = scratch[0, :n - period + 1]
        np.subtract(cumulative[period:], cumulative[:-period], out=once)
        once /= period
        np.subtract(values[period - 1:], once, out=once)
        twice = scratch[1, :n - period + 2]
        twice[0] = 0
        np.cumsum(once, out=twice[1:])
        residual = scratch[2, :n - 2 * period + 2]
        np.subtract(twice[period:], twice[:-period], out=residual)
        residual /= period
        np.subtract(once[period - 1:], residual, out=residual)
        if np.isfinite(context.clip):
            np.clip(residual, -context.clip, context.clip, out=residual)
        self.base = 2 * period - 2  # context position of residual[0]
        turns = np.roll(_turns(period), -((context.offset + self.base) % period))
        # The running sum of residual * turns (repeated), built in place: whole periods as
        # rows times the period's turns, then the rest.
        length, rows = len(residual), len(residual) // period
        fourier = _take(buffers, "fourier", length + 1, n + 1)
        fourier[0] = 0
        np.multiply(residual[:rows * period].reshape(rows, period), turns,
                    out=fourier[1:rows * period + 1].reshape(rows, period))
        np.multiply(residual[rows * period:], turns[:length - rows * period],
                    out=fourier[rows * period + 1:])
        np.cumsum(fourier[1:], out=fourier[1:])
        self.fourier = fourier
        self.period = period
        self._values = values
        self._buffers = buffers
        self._noise: _Noise | None = None

    def spectrum(self, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The noise's spectral density at the period and its AR(1) coefficient, fitted over
        the noise window of evaluations ending at ``ends`` (the noise's running sums are
        only taken once asked for)."""
        period = self.period
        if self._noise is None:
            self._noise = _Noise(self._values, period, self._buffers)
        span = _noise_window(period)
        return self._noise.spectrum(np.maximum(ends - span + 1, period) - period,
                                    ends - period + 1)

    def rough_spectrum(self, ends: np.ndarray) -> np.ndarray:
        """:meth:`spectrum`'s density from the noise window's own sums instead of running
        sums over the run (the same up to rounding; cheap for a few positions), NaN where
        the differences' mean is so large against their spread that rounding could
        matter."""
        period, values = self.period, self._values
        span = _noise_window(period)
        lo, hi = np.maximum(ends - span + 1, period) - period, ends - period + 1
        lag = _lag(period)
        at = lo[:, None] + np.arange(int((hi - lo).max()))
        inside = at < hi[:, None]
        at = np.where(inside, at, 0)
        diff = np.where(inside, values[at + period] - values[at], 0.0)
        squares = (diff * diff).sum(axis=1)
        density, _, variance = _ar1(period, hi - lo, diff.sum(axis=1), squares,
                                    (diff[:, 1:] * diff[:, :-1]).sum(axis=1),
                                    (diff[:, lag:] * diff[:, :-lag]).sum(axis=1))
        return np.where(variance > 1e-3 * squares / (hi - lo), density, np.nan)

    def release(self) -> dict[str, np.ndarray]:
        """Give up the buffers (for another period to reuse); self is unusable after."""
        buffers, self._buffers = self._buffers, {}
        del self.fourier, self._noise
        return buffers


def _take(buffers: dict[str, np.ndarray], name: str, length: int, size: int) -> np.ndarray:
    """The first ``length`` entries of the complex buffer ``name`` (made ``size`` long if it
    is missing or short)."""
    if name not in buffers or len(buffers[name]) < length:
        buffers[name] = np.empty(max(size, length), dtype=complex)
    return buffers[name][:length]


@functools.cache
def _turns(period: int) -> np.ndarray:
    """``exp(-2 pi i t / period)`` for ``t`` = 0 … ``period - 1``."""
    turns = np.exp(-2j * np.pi * np.arange(period) / period)
    turns.flags.writeable = False
    return turns


def _scale(values: np.ndarray) -> tuple[float, tuple[float, float]]:
    """The log's resolution (the smallest gap between distinct values: what it rounds to, 0
    if constant) and the clip range of the values: their median plus or minus
    ``_CLIP_STEPS`` typical steps (the 90th percentile of the point-to-point steps, which
    neither a rounded log's many repeated values nor a few blow-ups move)."""
    distinct = np.unique(values)
    resolution = float(np.diff(distinct).min()) if len(distinct) > 1 else 0.0
    steps = np.abs(np.diff(values))
    step = float(np.quantile(steps, 0.9)) if len(steps) else 0.0
    centre = float(np.median(values)) if len(values) else 0.0
    return resolution, (centre, _CLIP_STEPS * step if step > 0 else np.inf)


def _select(ends: np.ndarray | range, index: np.ndarray | slice) -> np.ndarray:
    """``ends[index]`` as an array."""
    if isinstance(ends, range):
        if isinstance(index, slice):
            return np.arange(ends.start, ends.stop, ends.step)[index]
        return ends.start + ends.step * index
    return ends[index]


def _pick(array: np.ndarray, shift: int, ends: np.ndarray, step: int | None) -> np.ndarray:
    """``array[ends + shift]``; a strided view where ``ends`` are ``step`` apart."""
    if step is None:
        return array[ends + shift]
    start = int(ends[0]) + shift
    return array[start:start + (len(ends) - 1) * step + 1:step]


def _prefix(values: np.ndarray) -> np.ndarray:
    """Running sums with a leading zero: ``prefix[j] - prefix[i]`` is ``sum(values[i:j])``."""
    prefix = np.empty(len(values) + 1, dtype=np.result_type(values, float))
    prefix[0] = 0
    np.cumsum(values, out=prefix[1:])
    return prefix
