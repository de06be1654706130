"""Loss oscillation: the loss swings up and down with a regular period."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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
from analyzers.streaming import Streams

# The trend is the centred moving average over this many periods: it removes a straight
# trend and nothing of a swing of that period, and (unlike one period) it leaves slowly
# wandering noise positively correlated half a period apart, so that fails the trough test.
_TREND_PERIODS = 2
# Ratio between neighbouring candidate periods: a swing between two of them drifts by under
# a twentieth of a period per period against the nearer, which keeps its correlation two
# periods back above 0.8 of its true value. Below _WHOLE_PERIODS points every whole number
# is a candidate (rounding the ratio grid would leave gaps of up to 17% there).
_PERIOD_RATIO = 1.1
_WHOLE_PERIODS = 20
# Evaluations per period (every point for periods under this many points).
_EVALUATIONS_PER_PERIOD = 4
# Residuals further than this many median point-to-point steps from their trend are
# clipped: a finite blow-up (1e12) would otherwise swamp the window sums for the rest of
# the run. A real swing is far smaller.
_CLIP_STEPS = 1e4
# The log's resolution and the clip level are measured on the first this many finite points
# (all of them in a shorter run): they describe the logger and the loss's scale, and fixed
# once measured they let a poll resume instead of re-reading the history.
_CONTEXT_POINTS = 10_000


@dataclass(frozen=True)
class _Measures:
    """One candidate period's measures at its evaluation positions (a window's last point;
    the verdict also uses the trend's look-ahead, ``after`` points further)."""

    period: int
    positions: np.ndarray
    corr: np.ndarray  # correlation of the residual with itself one period back
    half: np.ndarray  # … half a period back
    double: np.ndarray  # … two periods back
    amplitude: np.ndarray  # sqrt(2 * covariance one period back)
    level: np.ndarray  # mean of the loss over the window
    slope: np.ndarray  # change of the trend per point over the window

    def at(self, keep: np.ndarray) -> _Measures:
        return _Measures(self.period, self.positions[keep], self.corr[keep], self.half[keep],
                         self.double[keep], self.amplitude[keep], self.level[keep],
                         self.slope[keep])


@dataclass(frozen=True)
class _Episode:
    first: int  # position of the first passing evaluation of the run that fired
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
    clip: float | None = None
    reports: list[_Report] = field(default_factory=list)


@register
class Oscillation(Analyzer):
    """Loss oscillation: the loss swings up and down with a regular period.

    *Signal* (SIGNALS.md ``oscillation``; 003 §5.2 case 1: the loss fell normally, then from
    step 2000 oscillated periodically because the LR sat at a high constant after warmup).
    For each candidate period ``P`` (``min_period`` to ``max_period`` logged points: every
    whole number up to 20, then a geometric grid 10% apart; evaluated four times a
    period) the loss is detrended by its centred moving average over exactly two periods,
    which removes a straight trend and nothing of a swing of period ``P``. Over the last
    ``max(cycles * P, min_window)`` points the residual must correlate at least
    ``min_corr`` with itself one period and two periods earlier, and at most
    ``-min_corr`` half a period earlier: the loss repeats itself every period and is at
    the opposite extreme half a period later (the residual is first averaged over
    ``P // smooth`` points, which keeps the swing and shrinks batch noise). The swing's
    amplitude (from the covariance
    one period apart: ``sqrt(2 * cov)``) must reach ``min_amplitude`` of the loss level
    and, as a slope, ``min_swing`` times the trend's. A finding fires when some period
    passes at every evaluation for ``persistence`` periods (gaps of under a period are
    bridged); its onset is the first period of that window in which the swing reached
    half its size. It resolves once, for ``persistence`` periods, the residual at the
    finding's period (or a neighbour on the grid) has correlated less than
    ``min_corr / 2`` one period back or more than ``-min_corr / 2`` half a period back: a
    weaker test than firing's, so a swing near the threshold does not flap. A later
    oscillation is a new finding. Non-finite values are skipped (they are ``spike``'s
    job); periods and windows count logged points, and the finding states them in steps
    too (to within 5%, the grid's spacing).

    Parameters
    ----------
    metric : str, default "train/loss"
        The tag watched.
    min_period : int, default 4
        Shortest period looked for, in logged points. Shorter periods are hard to tell
        from batch-to-batch noise.
    max_period : int, default 100
        Longest period looked for, in logged points. Longer finds slower swings but needs
        ``cycles`` times as many points before it can say anything.
    cycles : int, default 6
        Periods in the window each period is judged on. More asks for a swing sustained
        over more periods (steadier, slower to fire); at least 3, since two periods back
        must fit.
    min_window : int, default 64
        Fewest points in a window, whatever the period. Short periods then span many
        cycles, so batch noise cannot line up by chance; larger is steadier and slower.
    min_corr : float, default 0.45
        Correlation the residual must reach one and two periods back (and its negative
        half a period back). It is about the share of the residual's variance that
        repeats: 0.45 finds a swing whose amplitude is 1.3 times the noise's standard
        deviation; higher asks for a cleaner swing, lower admits autocorrelated noise.
    min_amplitude : float, default 0.01
        Amplitude (half the peak-to-peak swing) relative to the loss level that counts as
        an oscillation. Lower reports faint ripples of very smooth losses.
    min_swing : float, default 3.0
        How much steeper the swing must be than the trend: the swing's largest slope
        ``2 * pi * amplitude / P`` over the trend's slope. At 3 the loss climbs back by
        about half its swing each period; a loss that falls in steps (a drop at each epoch
        boundary) reaches at most about 2.6 and is not an oscillation.
    persistence : int, default 3
        Periods the verdict must hold before firing, and periods the weaker test must
        fail before resolving. More ignores shorter bursts; fewer fires and resolves
        sooner.
    grace_period : int, default 50
        Finite points at the start never judged (warm-up, where the loss falls fastest).
    smooth : int, default 6
        The residual is averaged over the last ``P // smooth`` points before the
        correlations are taken (no averaging for periods under ``smooth`` points; 0 turns
        it off). A swing survives the average almost whole (its amplitude is reported
        corrected for the loss), per-batch noise shrinks with it, so a swing under the
        noise of a small-batch loss shows sooner. Smaller (longer averages) also makes
        slowly wandering noise look periodic; larger averages less.

    *False-positive guard*: noise has no period, so it fails the three correlations;
    noise that wanders slowly (autocorrelated, AR(1) or random-walk-like) mostly stays
    positively correlated half a period back against a two-period trend and fails the
    trough, and the rest rarely lines up over ``cycles`` periods (none in 400k points of
    AR(1) noise, coefficients 0.5 to 0.98, in the tests); a repeating pattern with no swing
    shape (a fixed data order) does not anti-correlate half a period back either. A loss
    that falls in steps at each epoch boundary is periodic once detrended but fails
    ``min_swing`` (it never climbs back). ``min_amplitude`` ignores ripples too small to
    matter, and the swing must also be larger than the log's resolution (the smallest gap
    between distinct values), so a loss logged with four decimals that flips between
    0.0001 and 0.0002 is rounding, not a swing. ``min_window`` and ``cycles`` give each
    verdict enough points, ``persistence`` asks for it to hold over periods, and
    ``grace_period`` skips the warm-up.

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
    (601, 735, 'firing')
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    train/loss oscillates with a period of 20 steps and amplitude 0.0947 (4.7% of its level
    2.00) from step 601: over steps 597–735 it correlates +0.93 with itself one period
    earlier and -0.96 half a period earlier
    """

    signal = "oscillation"

    def __init__(self, metric: str = "train/loss", min_period: int = 4, max_period: int = 100,
                 cycles: int = 6, min_window: int = 64, min_corr: float = 0.45,
                 min_amplitude: float = 0.01, min_swing: float = 3.0, persistence: int = 3,
                 grace_period: int = 50, smooth: int = 6) -> None:
        check_metric(metric)
        check_int("min_period", min_period, 4)
        check_int("max_period", max_period, min_period)
        check_int("cycles", cycles, 3)
        check_int("min_window", min_window, 8)
        check_real("min_corr", min_corr, 0.0, below=1.0)
        check_real("min_amplitude", min_amplitude, 0.0, allow_equal=True)
        check_real("min_swing", min_swing, 0.0, allow_equal=True)
        check_int("persistence", persistence, 1)
        check_int("grace_period", grace_period, 0)
        self.metric = metric
        self.min_period = min_period
        self.max_period = max_period
        self.cycles = cycles
        self.min_window = min_window
        self.min_corr = min_corr
        self.min_amplitude = min_amplitude
        self.min_swing = min_swing
        self.persistence = persistence
        self.grace_period = grace_period
        self.smooth = smooth
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
            best = self._scan(context)
            best[:state.resume - offset] = 0
            episodes = self._episodes(context, best)
            reports = [self._report(steps, context, e) for e in episodes]
        self._settle(state, best, episodes, reports, offset, count)
        self._streams.save(data, tags, state)
        return [self.finding(data, onset_step=r.onset_step, detected_step=r.detected_step,
                             summary=r.summary, evidence=r.evidence,
                             resolved_step=r.resolved_step)
                for r in settled + reports]

    def _lookback(self) -> int:
        """Finite points an evaluation reads before its position (window, smoothing and
        trend)."""
        return self._window(self.max_period) + 2 * self.max_period + 1

    def _settle(self, state: _State, best: np.ndarray, episodes: list[_Episode],
                reports: list[_Report], offset: int, count: int) -> None:
        """Move the resume point as late as it can go: once the resolution and clip are
        frozen, past every evaluation still waiting for look-ahead, after every episode's
        end, and with no passing evaluation in the ``max_period`` before it (so no run of
        passing evaluations spans it)."""
        if state.resolution is None:
            return
        latest = count - 2 * self.max_period - 2
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

    def _smoothing(self, period: int) -> int:
        return max(1, period // self.smooth) if self.smooth else 1

    def _window(self, period: int) -> int:
        return max(self.cycles * period, self.min_window)

    # ------------------------------------------------------------------- evaluation
    def _measure(self, context: _Context, period: int, stride: int) -> _Measures:
        """``period``'s measures every ``stride`` positions, from the first whole window
        after the grace period to the last point the trend reaches."""
        values, n = context.values, len(context.values)
        width = _TREND_PERIODS * period
        before = width // 2
        window = self._window(period)
        length = n - width + 1  # residual points: positions before … before + length - 1
        # Evaluations sit on one grid over the whole run, wherever these values start.
        start = max(window - 1, self.grace_period + window - 1 - before) - context.offset
        first = max(window - 1, start)
        first += (start - first) % stride
        count = -(-(length - first) // stride) if length > first else 0
        if count <= 0:
            empty = np.empty(0)
            return _Measures(period, np.empty(0, dtype=np.int64), *([empty] * 6))
        cumulative = context.cumulative
        trend = (cumulative[width:] - cumulative[:-width]) / width
        residual = _smooth(np.clip(values[before:before + length] - trend, -context.clip,
                                   context.clip), self._smoothing(period))
        ends = slice(first, first + (count - 1) * stride + 1, stride)  # residual coordinates

        def window_sum(prefix: np.ndarray, lo: int, hi: int) -> np.ndarray:
            """Sums of the summed array over [u + lo, u + hi) for each window end u."""
            return (prefix[first + hi:first + hi + (count - 1) * stride + 1:stride]
                    - prefix[first + lo:first + lo + (count - 1) * stride + 1:stride])

        energy = _prefix(residual * residual)

        def correlation(lag: int) -> tuple[np.ndarray, np.ndarray]:
            products = _prefix(residual[:-lag] * residual[lag:])
            total = window_sum(products, 1 - window, 1 - lag)
            early = window_sum(energy, 1 - window, 1 - lag)
            late = window_sum(energy, 1 - window + lag, 1)
            return total / np.sqrt(early * late), total / (window - lag)

        corr, covariance = correlation(period)
        half, _ = correlation(period // 2)
        double, _ = correlation(2 * period)
        level = window_sum(cumulative[before:], 1 - window, 1) / window
        slope = (trend[ends] - trend[first - window + 1:first - window + 1 + (count - 1)
                                     * stride + 1:stride]) / (window - 1)
        positions = np.arange(first, first + (count - 1) * stride + 1, stride) + before
        return _Measures(period, positions, corr, half, double,
                         np.sqrt(2 * np.maximum(covariance, 0.0))
                         / _gain(period, self._smoothing(period)), level, slope)

    def _passes(self, m: _Measures, resolution: float) -> np.ndarray:
        return ((m.corr >= self.min_corr) & (m.double >= self.min_corr)
                & (m.half <= -self.min_corr)
                & (m.amplitude >= self.min_amplitude * np.abs(m.level))
                & (m.amplitude > resolution)
                & (2 * np.pi * m.amplitude / m.period >= self.min_swing * np.abs(m.slope)))

    def _scan(self, context: _Context) -> np.ndarray:
        """Per position, the passing period that fits best (0: none): the highest sum of
        the three correlations' strengths. Two periods back tells neighbouring candidates
        apart best, since a wrong period's drift doubles there."""
        n = len(context.values)
        best = np.zeros(n, dtype=np.int64)
        fit = np.full(n, -np.inf)
        for period in self.periods():
            m = self._measure(context, period, max(1, period // _EVALUATIONS_PER_PERIOD))
            m = m.at(self._passes(m, context.resolution))
            score = _fit(m)
            better = score > fit[m.positions]
            fit[m.positions[better]] = score[better]
            best[m.positions[better]] = period
        return best

    # --------------------------------------------------------------------- episodes
    def _episodes(self, context: _Context, best: np.ndarray) -> list[_Episode]:
        """Runs of passing evaluations (a gap of up to a period is bridged) fire once they
        last ``persistence`` periods; the episode then lasts until its own period stops
        holding (see :meth:`_end`)."""
        passing = np.flatnonzero(best > 0)
        episodes: list[_Episode] = []
        k, run_start, last = 0, -1, -1
        while k < len(passing):
            position = int(passing[k])
            period = int(best[position])
            if run_start < 0 or position - last > int(best[last]):
                run_start = position
            last = position
            if position - run_start + 1 >= self.persistence * period:
                measures = self._refine(context, period, position)
                end = self._end(context, measures.period, position)
                episodes.append(_Episode(run_start, position, measures, end))
                if end is None:
                    break
                k = int(np.searchsorted(passing, end, side="right"))
                run_start = -1
                continue
            k += 1
        return episodes

    def _refine(self, context: _Context, period: int, position: int) -> _Measures:
        """The measures at ``position`` of the period that fits best there, among the one
        that fired and its grid neighbours that pass there too. (Each period is evaluated
        at its own positions, so the one that fired is only the best of those evaluated
        at that point.)"""
        grid = self.periods()
        at = grid.index(period)
        best: _Measures | None = None
        for candidate in grid[max(at - 1, 0):at + 2]:
            m = self._measure_at(context, candidate, position)
            if m is None or not (candidate == period or self._passes(m, context.resolution)[0]):
                continue
            if best is None or _fit(m) > _fit(best):
                best = m
        assert best is not None
        return best

    def _measure_at(self, context: _Context, period: int, position: int) -> _Measures | None:
        """:meth:`_measure`'s measures for the one window ending at ``position``."""
        values = context.values
        width = _TREND_PERIODS * period
        before, after = width // 2, width - 1 - width // 2
        window = self._window(period)
        lo = position - window + 1
        if lo - before < 0 or position + after >= len(values):
            return None
        # The residuals the smoothing reaches back to, as far as there are any.
        smoothing = self._smoothing(period)
        first = max(before, lo - (smoothing - 1))
        segment = values[first - before:position + after + 1]
        trend = np.convolve(segment, np.ones(width) / width, mode="valid")
        residual = _smooth(np.clip(segment[before:before + len(trend)] - trend,
                                   -context.clip, context.clip), smoothing)[-window:]
        trend = trend[-window:]

        def correlation(lag: int) -> tuple[float, float]:
            early, late = residual[:-lag], residual[lag:]
            total = float(early @ late)
            return total / math.sqrt(float(early @ early) * float(late @ late)), \
                total / (window - lag)

        corr, covariance = correlation(period)
        measures = [corr, correlation(period // 2)[0], correlation(2 * period)[0],
                    math.sqrt(2 * max(covariance, 0.0)) / _gain(period, smoothing),
                    float(np.mean(values[lo:position + 1])),
                    float(trend[-1] - trend[0]) / (window - 1)]
        return _Measures(period, np.array([position]), *(np.array([v]) for v in measures))

    def _end(self, context: _Context, period: int, fired: int) -> int | None:
        """The first position after ``fired`` that ends ``persistence`` periods in which,
        at ``period`` and its neighbours on the grid, the residual correlated less than
        ``min_corr / 2`` one period back or more than ``-min_corr / 2`` half a period
        back (a weaker test than firing's, so a swing near the threshold does not flap);
        None while the oscillation may still be going on."""
        grid = self.periods()
        at = grid.index(period)
        holding = np.zeros(len(context.values), dtype=bool)
        reach = len(context.values)
        for neighbour in grid[max(at - 1, 0):at + 2]:
            m = self._measure(context, neighbour, 1)
            holds = (m.corr >= self.min_corr / 2) & (m.half <= -self.min_corr / 2)
            holding[m.positions[holds]] = True
            if m.positions.size:
                reach = min(reach, int(m.positions[-1]) + 1)
        gap = self.persistence * period
        quiet = ~holding[fired + 1:reach]
        counts = np.concatenate(([0], np.cumsum(quiet)))
        full = np.flatnonzero(counts[gap:] - counts[:-gap] == gap)
        return fired + int(full[0]) + gap if full.size else None

    # ---------------------------------------------------------------------- finding
    def _report(self, steps: np.ndarray, context: _Context, episode: _Episode) -> _Report:
        m = episode.measures
        at, period = episode.fired, m.period
        window = self._window(period)
        width = _TREND_PERIODS * period
        after = width - 1 - width // 2
        first, last = at - window + 1, at + after  # the points the verdict used
        spacing = float(np.median(np.diff(steps[first:last + 1])))
        period_steps = period * spacing
        amplitude, level = float(m.amplitude[0]), float(m.level[0])
        relative = amplitude / abs(level) if level else math.inf
        onset = self._onset(context.values, episode.first, period, amplitude)
        onset_step = int(steps[onset])
        corr, half = float(m.corr[0]), float(m.half[0])
        summary = (f"{self.metric} oscillates with a period of {period_steps:.0f} steps and "
                   f"amplitude {fmt_number(amplitude)} ({100 * relative:.1f}% of its level "
                   f"{fmt_number(level)}) from step {onset_step}: over steps "
                   f"{int(steps[first])}–{int(steps[last])} it correlates {corr:+.2f} with "
                   f"itself one period earlier and {half:+.2f} half a period earlier")
        slope = float(m.slope[0])
        swing = 2 * math.pi * amplitude / period / abs(slope) if slope else math.inf
        resolved = None
        if episode.resolved is not None and episode.resolved + after < len(steps):
            resolved = int(steps[episode.resolved + after])
        return _Report(
            onset_step=onset_step,
            detected_step=int(steps[last]),
            summary=summary,
            evidence={
                "period_points": period,
                "period_steps": period_steps,
                "amplitude": amplitude,
                "level": level,
                "relative_amplitude": relative,
                "corr_one_period": corr,
                "corr_half_period": half,
                "corr_two_periods": float(m.double[0]),
                "trend_per_point": slope,
                "swing_ratio": swing,
                "window_steps": [int(steps[first]), int(steps[last])],
            },
            resolved_step=resolved,
        )

    def _onset(self, values: np.ndarray, first: int, period: int, amplitude: float) -> int:
        """The start of the earliest period, in the first passing window and going back
        from its end without a break, whose swing at ``period`` reaches half
        ``amplitude``."""
        window = self._window(period)
        width = _TREND_PERIODS * period
        before, after = width // 2, width - 1 - width // 2
        lo = max(first - window + 1 - before, 0)
        segment = values[lo:first + after + 1]
        trend = np.convolve(segment, np.ones(width) / width, mode="valid")
        residual = segment[before:before + len(trend)] - trend  # positions lo + before …
        phase = np.exp(-2j * np.pi * np.arange(len(residual)) / period)
        onset = first
        for end in range(len(residual), period - 1, -period):
            chunk = slice(end - period, end)
            swing = 2 / period * abs(np.sum(residual[chunk] * phase[chunk]))
            if swing < amplitude / 2:
                break
            onset = lo + before + end - period
        return max(onset, first - window + 1)


class _Context:
    """What every candidate period shares: the values (finite points from the ``offset``-th
    on), their running sum, the log's resolution and the clip level of residuals."""

    def __init__(self, values: np.ndarray, offset: int = 0, resolution: float | None = None,
                 clip: float | None = None) -> None:
        self.values = values
        self.offset = offset
        self.cumulative = _prefix(values)
        if resolution is None or clip is None:
            resolution, clip = _scale(values)
        self.resolution = resolution
        self.clip = clip


def _scale(values: np.ndarray) -> tuple[float, float]:
    """The log's resolution (the smallest gap between distinct values: what it rounds to, 0
    if constant) and the clip level of residuals (``_CLIP_STEPS`` median steps)."""
    distinct = np.unique(values)
    resolution = float(np.diff(distinct).min()) if len(distinct) > 1 else 0.0
    step = float(np.median(np.abs(np.diff(values)))) if len(values) > 1 else 0.0
    return resolution, (_CLIP_STEPS * step if step > 0 else np.inf)


def _smooth(residual: np.ndarray, width: int) -> np.ndarray:
    """The trailing mean of the last ``width`` residuals (of those there are, early)."""
    if width <= 1:
        return residual
    prefix = _prefix(residual)
    counts = np.minimum(np.arange(1, len(residual) + 1), width)
    lo = np.maximum(np.arange(1, len(residual) + 1) - width, 0)
    return (prefix[1:] - prefix[lo]) / counts


def _gain(period: int, width: int) -> float:
    """How much a trailing mean of ``width`` points shrinks a swing of ``period`` points:
    the swing's amplitude is reported undone of it."""
    if width <= 1:
        return 1.0
    return math.sin(math.pi * width / period) / (width * math.sin(math.pi / period))


def _fit(m: _Measures) -> np.ndarray:
    """How well a period fits: the strength of its three correlations together."""
    return m.corr + m.double - m.half


def _prefix(values: np.ndarray) -> np.ndarray:
    """Running sums with a leading zero: ``prefix[j] - prefix[i]`` is ``sum(values[i:j])``."""
    prefix = np.empty(len(values) + 1)
    prefix[0] = 0.0
    np.cumsum(values, out=prefix[1:])
    return prefix
