"""Overfitting: the evaluation loss rises above its best while the training loss does not."""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from analyzers import register
from analyzers.base import Analyzer, RunData, checkpoint_at_or_before
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding, Fix
from analyzers.fmt import fmt_number
from analyzers.stats.robust import evaluation_noise, finite, median_se, moving_median, row_sd
from analyzers.stats.trend import run_lengths
from analyzers.streaming import FiniteIndex, Streams

# The train loss may account for at most this share of the eval loss's relative rise: when
# both rise together the run is getting worse as a whole (a divergence), not overfitting.
_TRAIN_SHARE = 0.5
# Evaluations that estimate the eval loss's noise: the last _NOISE_WINDOW up to the one
# judged (one window per block of half of it), and no estimate (no noise guard) from fewer
# than _MIN_NOISE_EVALUATIONS: an estimate from a few dozen points is itself uncertain by a
# quarter; a hundred narrow that down.
_NOISE_WINDOW = 100
# Evaluations beyond ``patience`` whose own wobble is also weighed (see _recent_noise).
_RECENT_EXTRA = 4
_MIN_NOISE_EVALUATIONS = 6
# Train points (at or before an evaluation) whose median is the train loss in phase with it.
_PHASE_WINDOWS = (1, 4)
# ... and its rise must exceed _PHASE_Z noise deviations, the noise of one train point taken
# from the last _POINT_NOISE_WINDOW points logged up to the evaluation.
_PHASE_Z = 1.0
_POINT_NOISE_WINDOW = 200
# The train points' noise is read from their changes, corrected for a lag-1 autocorrelation
# of at most this (at most doubled): a train loss that swings slowly is smooth from point to
# point too, and its swing must not pass for persistent noise.
_MAX_AUTOCORRELATION = 0.75
# The gap (log eval - log train level) widens when the slope of its last 4, 8 or 16
# evaluations lies _GAP_Z standard errors above zero (its noise: the MAD of its changes over
# the last _NOISE_WINDOW evaluations), from _MIN_GAP_EVALUATIONS evaluations on.
_GAP_WINDOWS = (4, 8, 16)
_GAP_Z = 4.0
_MIN_GAP_EVALUATIONS = 8
# An eval loss that has stalled (no new best for ``patience`` evaluations, ``min_delta`` not
# needed) fires when the gap has started to widen: the change of its slope at some point in
# the last _CHANGE_BACK evaluations (fitted with the _CHANGE_PRE before that point, at least
# _MIN_CHANGE_PRE up to and including it) lies _STALL_GAP_Z standard errors above zero, and
# so does its slope since then; and the recent median clears the best by _STALL_MARGIN noise
# deviations.
_STALL_GAP_Z = 4.0
_STALL_MARGIN = 1.25
_CHANGE_BACK = 24
_CHANGE_PRE = 16
_MIN_CHANGE_PRE = 4
# Evaluations over which the gap's tests look back (_CHANGE_BACK + _CHANGE_PRE): across
# them at least ``train_window`` train points must have been logged per evaluation.
_GAP_REACH = _CHANGE_BACK + _CHANGE_PRE
# A fitted line's residual scatter counts as the gap's noise only beyond chance: its lower
# confidence bound at _FIT_Z standard normal deviations (one-sided 0.1%).
_FIT_Z = 3.09
# Evaluations within _CONTENDER_Z noise deviations of the best sit at its level (its luck).
_CONTENDER_Z = 3.0
# The eval loss is improving again when the slope of its last _FALL_WINDOW evaluations
# (since the best) lies _FALL_Z standard errors below zero and has won back ``min_delta``.
_FALL_WINDOW = 3
_FALL_Z = 2.0
# The in-phase train explains the gap when its offset from the train level has risen by
# _OFFSET_Z noise deviations of that offset (and by half the gap's widening).
_OFFSET_Z = 2.0
# ... its noise the larger of the long-run estimate and that of the last _RECENT_OFFSETS.
_RECENT_OFFSETS = 10
# Evaluations shown in the evidence: the best one and the last ones up to the detection.
_MAX_EVIDENCE_POINTS = 30


@dataclass
class _State:
    """What one poll leaves for the next: the train loss's non-finite positions, the
    evaluations below ``settled`` (judged for good: a candidate's verdict needs nothing
    logged after its step) and, of those, the candidates that fire, with the train level
    at the best and at the candidate."""

    index: FiniteIndex = field(default_factory=FiniteIndex)
    settled: int = 0
    firing: list[tuple[int, float, float]] = field(default_factory=list)


@register
class Overfit(Analyzer):
    """Overfitting: train loss keeps improving while the eval loss rises; the gap widens.

    *Signal* (SIGNALS.md ``overfit``, a cross-metric signal). Judged at the evaluations
    (the points of ``metric``), in Lightning ``EarlyStopping`` terms: an evaluation is
    *worse* when it lies at least ``min_delta`` (relative) above the best evaluation
    before it. The finding fires at the first evaluation where the eval loss has risen or
    stalled, it is not improving again, and the train loss does not explain it:

    - *risen*: ``patience`` evaluations in a row are worse, and their median clears the
      best by ``threshold`` noise standard deviations plus the best's luck (the lowest of
      ``m`` noisy evaluations at one level typically lies ``sqrt(2 ln m)`` deviations
      below it; ``m`` counts the evaluations within 3 deviations of the best, before or
      after it: one where the curve was still falling steeply, many on a flat stretch).
      Evidence accumulated by the gap stands in for the ``threshold`` deviations: when
      ``log(eval) - log(train level)`` has been widening steadily (the least-squares slope
      of its last 4, 8 or 16 evaluations at least 4 standard errors above zero, its noise
      the robust spread of its changes, or the scatter the fitted line leaves where that
      is larger beyond chance, see below), clearing the best's luck is enough;
    - *or stalled* (SIGNALS.md: "val loss stalls or rises; the gap widens"): no new best
      for ``patience`` evaluations, their median 1.25 noise deviations above the best
      (``min_delta`` not needed), and the gap has *started* to widen: fitted as a line
      that bends at some evaluation of the last 24 (with up to 16 before it), both the
      bend and the slope after it lie at least 4 standard errors above zero. An eval loss
      turns up from its minimum slowly (its rise grows with the square of the evaluations
      since then) while the gap of an overfitting run widens from the start; a gap that
      has widened at one pace all along (a fine-tune whose train loss falls faster than
      its eval loss) has no bend. A gap the fitted line does not describe proves
      nothing: a held spike of the train loss lifts the train level and lets it fall
      back, and a line through that jump bends by dozens of standard errors measured
      against the gap's own noise; the gap's tests weigh their slopes against the fit's
      residual scatter instead where its lower confidence bound (one-sided 0.1%, the
      residual variance being noise times chi-square over its degrees of freedom) lies
      above the gap's noise;
    - *not improving again*: the slope of the last 3 evaluations since the best is not 2
      standard errors below zero having won back ``min_delta``. An eval loss that jumps
      and then works the jump off has shifted level (a changed eval set, an oscillation's
      phase sampled at the evaluations), not overfitted;
    - the training loss has not risen along, so the gap has widened: its level at an
      evaluation is the median of the last ``train_window`` points of ``train_metric``
      logged at or before it, and its relative change since the best evaluation is at
      most half the relative rise of that eval median, or within the noise of that level
      (one deviation of the difference of two medians of ``train_window`` points: a noisy
      per-batch loss moves its median by chance). The same holds *in phase*: the
      train loss at the very evaluations compared (the median of the last 1 and of the
      last 4 points logged at or before each, over the same ``patience`` evaluations)
      must not have risen by half the eval's rise and by more than one noise deviation
      (the smaller of a train point's, from its point-to-point changes, which a fast
      swing inflates, corrected for their lag-1 autocorrelation up to a doubling: a
      per-batch loss whose noise persists over a few points changes less from point to
      point than its points scatter; and that of the in-phase train from evaluation to
      evaluation); nor
      may its offset from the train level have risen by half the gap's widening and by
      two deviations of that offset. An eval loss computed at single steps samples a
      train loss that swings (``oscillation``) at some phase of its swing; a long train
      median averages the swing away, the train points at the same steps do not.

    The onset is the first worse evaluation (for a stall, the first after the best); the
    best one is named in the summary and the evidence, and the rollback target is the
    latest checkpoint at or before it (the checkpoint with the best validation). The
    finding resolves at a new best, or once the median of the last ``patience``
    evaluations has been back within ``min_delta / 2`` of the best for ``patience``
    evaluations in a row (on a noisy eval loss at its best's level the median comes that
    close now and then by noise alone); a stall, which never rose that far, only once that
    median is a new best by ``min_delta / 2`` (one lucky evaluation under the best does not
    end it); a later rise is a new finding. The gap's tests (the
    widening that waives ``threshold``, the bend of a stall) take its values at successive
    evaluations as independent, so they stand aside where fewer than ``train_window``
    train points are logged per evaluation (neighbouring train levels share points, as
    when both losses are logged once an epoch). Non-finite values are skipped (they are
    ``spike``'s job); a run without ``train_metric`` gives no finding.

    Parameters
    ----------
    metric : str, default "eval/loss"
        The evaluation loss watched (an ``eval/<suite>/loss`` works too).
    train_metric : str, default "train/loss"
        The training loss it is compared with.
    min_delta : float, default 0.005
        Relative rise above the best evaluation that makes an evaluation worse (0.005 =
        0.5%). Higher ignores mild overfitting and sees a slow one (0.3% per evaluation)
        only after many evaluations; lower leans harder on the noise guard below to tell
        the wobble of a converged eval loss from a rise.
    patience : int, default 3
        Worse evaluations in a row before firing (evaluations without a new best, for a
        stall with a widening gap). More waits out an eval loss that bumps and comes back;
        fewer alerts sooner, after fewer wasted evaluations.
    threshold : float, default 2.0
        Noise standard deviations by which the recent median must clear the best, beyond
        the best's luck. The noise of one evaluation is estimated from the second
        differences of the last 100 evaluations (the window ends every 50 on a long run),
        so the run's own trend is not taken for noise: their standard deviation, those
        beyond three robust deviations set aside (:func:`analyzers.stats.robust.evaluation_noise`).
        Higher waits out a noisy eval loss longer; lower fires sooner on a
        small eval set whose loss jumps from evaluation to evaluation.
    train_window : int, default 20
        Train points whose median stands for the train loss at an evaluation. More smooths
        a noisy per-batch loss but lags it; fewer follows it closely.

    *False-positive guard*: ``patience`` asks for a sustained rise, never one evaluation;
    ``min_delta`` is relative to the best; ``threshold`` weighs the rise against the eval
    loss's own noise (the larger of its long-run estimate and the wobble of the last
    ``patience + 4`` evaluations: a steady rise has no curvature, while an eval loss that
    swings, such as an oscillating train loss sampled at the evaluations, does; the
    in-phase train comparison above explains the rest of such swings) and the luck of
    its best, which the widening-gap evidence never waives (an eval loss on a small set
    that swings 15% from epoch to epoch while still trending down is not overfitting; the
    noise needs six evaluations to estimate, and before that the last ``patience``
    evaluations must instead rise steadily, each at or above the one before). A stall
    fires only when the gap has bent upwards beyond doubt and the median has left the
    best (a gap that widens at one pace, as a healthy fine-tune's train loss falls faster
    than its eval loss, is no bend; nor is the jump of a train loss coming back from a
    held spike, which the broken line fits no better than its residuals' scatter). An
    eval loss that works off a jump is a level shift, not a rise. And the training loss
    must not explain the rise (a run whose train loss climbs with its eval loss is
    diverging, which ``spike`` and ``plateau`` judge, so that stays quiet here until the
    train loss comes back down).
    Levels are medians, so single bad batches or evaluations cannot flip a verdict. An
    evaluation before which no training loss was logged cannot be judged and never
    counts. The resolve level (``min_delta / 2``, on a median) is tighter than the firing
    one, so an eval loss hovering at the edge does not flap.

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> from analyzers import Checkpoint, RunData
    >>> rng = np.random.default_rng(0)
    >>> steps = np.arange(1, 3001)
    >>> train = 0.3 + 2.0 * np.exp(-steps / 400) + 0.02 * rng.standard_normal(3000)
    >>> evals = np.arange(200, 3001, 200)  # best at 1200, then +1e-4 a step
    >>> eval_loss = (0.6 + np.exp(-evals / 300) + 1e-4 * (evals - 1200).clip(0)
    ...              + 0.003 * rng.standard_normal(len(evals)))
    >>> data = RunData.from_series(
    ...     "demo", {"train/loss": train, "eval/loss": pd.Series(eval_loss, index=evals)},
    ...     steps=steps, checkpoints=[Checkpoint(s, f"ckpt/checkpoint-{s}")
    ...                               for s in range(400, 3001, 400)])
    >>> [finding] = Overfit().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.state
    (1400, 1800, 'firing')
    >>> finding.evidence["best_step"], finding.rollback_to.step
    (1200, 1200)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    eval/loss 0.613 at step 1200 (best) → 0.667 at step 1800, +8.8%, 0.5% or more above
    its best for 3 evaluations in a row, while train/loss fell 0.398 → 0.321 (-19.4%)
    """

    signal = "overfit"

    def __init__(self, metric: str = "eval/loss", train_metric: str = "train/loss",
                 min_delta: float = 0.005, patience: int = 3, threshold: float = 2.0,
                 train_window: int = 20) -> None:
        check_metric(metric)
        check_metric(train_metric)
        check_real("min_delta", min_delta, 0.0)
        check_int("patience", patience, 1)
        check_real("threshold", threshold, 0.0, allow_equal=True)
        check_int("train_window", train_window, 1)
        self.metric = metric
        self.train_metric = train_metric
        self.min_delta = min_delta
        self.patience = patience
        self.threshold = threshold
        self.train_window = train_window
        # Per run and attempt: the verdicts of the settled candidates, so a poll judges
        # only the new ones (and the latest, not settled yet).
        self._streams: Streams[_State] = Streams()
        self._per_set: dict[str, Overfit] = {}

    def detect(self, data: RunData) -> list[Finding]:
        if data.series(self.metric).empty:
            return self._eval_sets(data)
        return self._detect(data)

    def _eval_sets(self, data: RunData) -> list[Finding]:
        """A run that logs no ``metric`` but several eval sets (HF ``eval_<set>_loss``):
        each judged alone; one finding per episode, on the set whose loss turned first (the
        others that turned with it named in its summary and evidence)."""
        found: list[tuple[str, Finding]] = []
        for tag in sorted(t for t in data.tags() if _is_eval_loss(t)):
            rule = self._per_set.get(tag)
            if rule is None:
                rule = self._per_set[tag] = copy.copy(self)
                rule.metric, rule._streams, rule._per_set = tag, Streams(), {}
            found += [(tag, f) for f in rule._detect(data)]
        kept: list[Finding] = []
        for tag, finding in sorted(found, key=lambda x: (x[1].onset_step, x[0])):
            same = next((k for k in kept if k.onset_step <= finding.onset_step and (
                k.resolved_step is None or k.resolved_step >= finding.onset_step)), None)
            if same is None:
                kept.append(finding)
            else:
                also = same.evidence.setdefault("also_on", [])
                also.append(tag)
        for finding in kept:
            if finding.evidence.get("also_on"):
                finding.summary += f" (also on {', '.join(finding.evidence['also_on'])})"
        return kept

    def _detect(self, data: RunData) -> list[Finding]:
        evals = finite(data.series(self.metric))
        logged_train = data.series(self.train_metric)
        if len(evals) <= self.patience or logged_train.empty:
            return []
        tags = (self.metric, self.train_metric)
        state = self._streams.resume(data, tags) or _State()
        train = _Train(logged_train, state.index)
        self._streams.save(data, tags, state)
        if not train.count:
            return []
        steps = evals.index.to_numpy(dtype=np.int64)
        values = evals.to_numpy(dtype=float)
        best_before, best_at = _best_before(values)
        # Strictly above: with a best of 0 (or noise of 0) a tie must not count as worse.
        worse = ((values > best_before)
                 & (values >= best_before + self.min_delta * np.abs(best_before)))
        worse[0] = False
        run_length = run_lengths(worse)
        stalled = values >= best_before  # no new best
        stall_length = run_lengths(stalled)
        candidates = np.flatnonzero(stall_length >= self.patience)
        if not candidates.size:
            return []
        recent = moving_median(values, self.patience, min_count=1)
        # A candidate's verdict depends on the evaluations up to it and the train points
        # logged up to its step: settled for good once a train point comes after it.
        known = int(np.searchsorted(steps, train.last_step()))
        todo = candidates[candidates >= state.settled]
        firing = list(state.firing)
        for j, (fires, train_best, train_now) in zip(
                todo.tolist(), self._judge(steps, values, recent, best_at, todo, train,
                                           run_length, stall_length),
                strict=True):
            if fires:
                firing.append((j, train_best, train_now))
                if j < known:
                    state.firing.append((j, train_best, train_now))
        state.settled = max(state.settled, known)
        train_level = _TrainLevels(train, self.train_window)
        findings = []
        position = 0  # the first evaluation a new episode may use
        for j, train_best, train_now in firing:
            # The first worse evaluation; for a stall, the first after the best.
            run = run_length[j] if run_length[j] >= self.patience else stall_length[j]
            onset = max(j - int(run) + 1, position)
            if j - onset + 1 < self.patience:
                continue
            b = int(best_at[j])
            after = slice(j + 1, None)
            # A rise resolves at a new best, or once the eval loss is back near its best
            # for ``patience`` evaluations in a row; a stall (it fired without a rise of
            # ``min_delta``) only once the median of the last ``patience`` evaluations is
            # a new best by ``min_delta / 2``: on a flat eval loss one evaluation that dips
            # under the best by noise alone would resolve it, and the stall would fire
            # again (a finding that flaps).
            if run_length[j] >= self.patience:  # it rose
                # Back near the best for ``patience`` evaluations in a row (as many as it
                # took to fire): on a noisy eval loss at its best's level a median of
                # ``patience`` comes within ``min_delta / 2`` now and then by noise alone.
                near = recent[after] <= values[b] + self.min_delta / 2 * abs(values[b])
                over = (values[after] < values[b]) | (run_lengths(near) >= self.patience)
            else:
                over = recent[after] < values[b] - self.min_delta / 2 * abs(values[b])
            back = np.flatnonzero(over)[:1]
            resolved = j + 1 + int(back[0]) if back.size else None
            findings.append(self._finding(data, steps, values, recent, train_level, b, onset, j,
                                          resolved, train_best, train_now))
            if resolved is None:
                break
            position = resolved + 1
        return findings

    def _judge(self, steps: np.ndarray, values: np.ndarray, recent: np.ndarray,
               best_at: np.ndarray, candidates: np.ndarray, train: _Train,
               run_length: np.ndarray, stall_length: np.ndarray
               ) -> list[tuple[bool, float, float]]:
        """Per candidate (an evaluation ``patience`` in a row above the best): whether it
        fires (see the class docstring), with the train level at the best and now."""
        out = [(False, math.nan, math.nan)] * len(candidates)
        if not candidates.size:
            return out
        best = values[best_at[candidates]]
        level = recent[candidates]
        long_noise = evaluation_noise(values, candidates, window=_NOISE_WINDOW,
                                      min_points=_MIN_NOISE_EVALUATIONS,
                                      stride=_NOISE_WINDOW // 2)
        noise = np.maximum(long_noise, _recent_noise(values, candidates,
                                                     self.patience + _RECENT_EXTRA))
        # The lowest of m noisy evaluations at one level lies about sqrt(2 ln m) deviations
        # below it; m counts the evaluations that sit at the best's level (within
        # _CONTENDER_Z deviations of it, before or after it): one on a curve still falling
        # steeply, many on a flat stretch.
        luck = np.sqrt(2 * np.log(_contenders(values, best_at[candidates], candidates,
                                              long_noise)))
        # Too few evaluations to measure the noise: the rise must at least be steady.
        unmeasured = candidates < _MIN_NOISE_EVALUATIONS - 1
        # The gap's trend looks back ``_NOISE_WINDOW`` evaluations: the train level is
        # needed from there.
        train_level = _TrainLevels(train, self.train_window)
        lo = max(0, int(candidates.min()) - max(_NOISE_WINDOW, self.patience) + 1)
        levels = np.full(len(values), np.nan)
        levels[lo:] = train_level.at(steps[lo:])
        with np.errstate(divide="ignore", invalid="ignore"):
            gap = np.log(values) - np.log(levels)
        gap[~np.isfinite(gap)] = np.nan
        gap_noise = _gap_noise(gap, candidates)
        # The gap's tests take its values at successive evaluations as independent: they
        # are not when the train levels of neighbouring evaluations share points (fewer
        # than ``train_window`` train points logged per evaluation, as when both are
        # logged once an epoch). Its noise from one evaluation to the next then reads low
        # and any trend looks sure, so the gap is no evidence there.
        reach = np.maximum(candidates - _GAP_REACH, 0)
        logged = train.ends(steps[candidates]) - train.ends(steps[reach])
        gap_noise[logged < self.train_window * (candidates - reach)] = np.nan
        gap_t = _gap_t(gap, candidates, gap_noise)
        # Worse by ``min_delta`` for ``patience`` evaluations, clearing the best by
        # ``threshold`` deviations and its luck (or only its luck with a widening gap).
        rises = level - best >= (self.threshold + luck) * noise
        rises |= (gap_t >= _GAP_Z) & (level - best >= luck * noise)
        steady = _rises_steadily(values, candidates[unmeasured], self.patience)
        rises[unmeasured] &= steady
        rises &= run_length[candidates] >= self.patience
        # Or: no new best for ``patience`` evaluations, a level above the best by
        # _STALL_MARGIN deviations, and a gap widening beyond doubt (_STALL_GAP_Z).
        stalls = (level - best >= _STALL_MARGIN * long_noise) & ~unmeasured & ~rises
        stalls[stalls] = _gap_change_t(gap, candidates[stalls], gap_noise[stalls]) >= _STALL_GAP_Z
        # Either way the eval loss must not be improving again: over the last _FALL_WINDOW
        # evaluations since the best, a slope _FALL_Z standard errors below zero that has
        # won back ``min_delta`` (a jump that is then worked off is a level shift, such as
        # an oscillation's phase sampled at the evaluations, not a rise).
        first = np.maximum(candidates - stall_length[candidates] + 1,
                           candidates - _FALL_WINDOW + 1)
        slope, slope_t = _slope(values, first, candidates, long_noise)
        falling = ((slope_t < -_FALL_Z)
                   & (-slope * (candidates - first) >= self.min_delta * np.abs(best)))
        kept = np.flatnonzero((rises | stalls) & ~falling)
        candidates, best, level = candidates[kept], best[kept], level[kept]
        train_now = train_level.at(steps[candidates])
        train_at_best = train_level.at(steps[best_at[candidates]])
        eval_rise = _relative_change(best, level)
        train_rise = _relative_change(train_at_best, train_now)
        # A train level that rose counts only beyond its noise (two medians of
        # ``train_window`` points): a noisy per-batch loss moves its median by chance.
        point_noise = _train_point_noise(train, steps[candidates])
        level_spread = point_noise * np.sqrt(2) * median_se(self.train_window)
        gap_widened = ~np.isnan(train_rise) & ~(  # False without a train level
            (train_rise > _TRAIN_SHARE * eval_rise) & (train_rise > _PHASE_Z * level_spread))
        # The same comparison in phase: the train loss just at the evaluations it is
        # compared with. An eval loss sampled from a train loss that swings explains its
        # rise by the swing's phase, which a long train median averages away.
        # Only a rise beyond the train's own noise counts: a single noisy batch loss must
        # not veto a real overfit. That noise is the smaller of what the train points
        # show (their changes from point to point, which a fast swing inflates) and what
        # the train at the evaluations shows (its curvature from evaluation to evaluation).
        for window in _PHASE_WINDOWS:
            if window >= self.train_window:
                continue
            short = _TrainLevels(train, window)
            recent_train = _recent_levels(short, steps, candidates, self.patience)
            short_rise = _relative_change(short.at(steps[best_at[candidates]]), recent_train)
            # A median of w points (of `patience` evaluations) vs. one: their difference.
            spread = point_noise * median_se(window) * np.sqrt(1 + 1 / self.patience)
            sampled = np.full(len(values), np.nan)
            sampled[lo:] = short.at(steps[lo:])
            with np.errstate(divide="ignore", invalid="ignore"):
                at_evaluations = _series_noise(np.log(sampled), candidates)
            spread = np.fmin(spread, at_evaluations * np.sqrt(1 + np.pi / 2 / self.patience))
            gap_widened &= ~((short_rise > _TRAIN_SHARE * eval_rise)
                             & (short_rise > _PHASE_Z * spread))
            # The train at the evaluations against its own level: a swing sampled at
            # one phase lifts it above its level for good, and that explains the gap.
            # The offset's noise is its own from evaluation to evaluation.
            with np.errstate(divide="ignore", invalid="ignore"):
                offsets = np.log(sampled) - np.log(levels)
            rows = np.clip(candidates[:, None] - np.arange(self.patience)[::-1], 0, None)
            best_steps = steps[best_at[candidates]]
            with np.errstate(divide="ignore", invalid="ignore"):
                at_best = np.log(short.at(best_steps)) - np.log(train_level.at(best_steps))
            offset_rise = np.median(offsets[rows], axis=1) - at_best
            offset_noise = np.fmax(_series_noise(offsets, candidates),
                                   _series_noise(offsets, candidates, _RECENT_OFFSETS))
            offset_noise *= np.sqrt(1 + np.pi / 2 / self.patience)
            with np.errstate(divide="ignore", invalid="ignore"):
                widened = np.log1p(eval_rise) - np.log1p(train_rise)
            gap_widened &= ~((offset_rise > _TRAIN_SHARE * widened)
                             & (offset_rise > _OFFSET_Z * offset_noise))
        for k, i in enumerate(kept.tolist()):
            out[i] = (bool(gap_widened[k]), float(train_at_best[k]), float(train_now[k]))
        return out

    def _finding(self, data: RunData, steps: np.ndarray, values: np.ndarray,
                 recent: np.ndarray, train_level: _TrainLevels, best: int, onset: int,
                 fired: int, resolved: int | None, train_best: float,
                 train_now: float) -> Finding:
        best_step, fired_step = int(steps[best]), int(steps[fired])
        eval_best, eval_now = float(values[best]), float(values[fired])
        eval_change = float(_relative_change(np.array([eval_best]), np.array([eval_now]))[0])
        train_change = float(_relative_change(np.array([train_best]), np.array([train_now]))[0])
        shown = np.concatenate(([best], np.arange(max(best + 1, fired + 2 - _MAX_EVIDENCE_POINTS),
                                                  fired + 1)))
        shown_train = train_level.at(steps[shown])
        worse_for = fired - onset + 1
        # A rise: every evaluation since the onset min_delta above the best. A stall (the
        # gap bent upwards first): no new best, only some of them that far above it.
        worse = int(np.sum(values[onset:fired + 1]
                           >= eval_best + self.min_delta * abs(eval_best)))
        above = f"{100 * self.min_delta:g}% or more above its best"
        how_long = (f"{above} for {worse_for} evaluations in a row" if worse == worse_for
                    else f"no better than its best for {worse_for} evaluations ({worse} of "
                         f"them {above})")
        summary = (f"{self.metric} {fmt_number(eval_best)} at step {best_step} (best) → "
                   f"{fmt_number(eval_now)} at step {fired_step}, {_percent(eval_change)}, "
                   f"{how_long}, while {self.train_metric} "
                   f"{_went(train_best, train_now, train_change)}")
        finding = self.finding(
            data,
            onset_step=int(steps[onset]),
            detected_step=fired_step,
            summary=summary,
            evidence={
                "best_step": best_step,
                "best_value": eval_best,
                "eval_value": eval_now,
                "eval_change": eval_change,
                "recent_median": float(recent[fired]),
                "train_metric": self.train_metric,
                "train_at_best": train_best,
                "train_now": train_now,
                "train_change": train_change,
                "evaluations_since_onset": worse_for,
                "worse_evaluations": worse,
                "min_delta": self.min_delta,
                "evaluations": [[int(steps[i]), float(values[i]), float(t)]
                                for i, t in zip(shown, shown_train, strict=True)],
            },
            rollback_to=checkpoint_at_or_before(
                data.checkpoints, best_step,
                f"checkpoint with the best validation: the latest at or before step "
                f"{best_step}, where {self.metric} was at its best ({fmt_number(eval_best)})"),
            resolved_step=None if resolved is None else int(steps[resolved]),
        )
        return with_leakcheck(finding, data.meta.get("leakcheck"))


def with_leakcheck(finding: Finding, result: object) -> Finding:
    """Seed §3.3 puts the cross-set duplicate check first: the first fix says what the check
    at the run's start found (``meta["leakcheck"]``, written by runwatch's training-side
    helpers); when it never ran, the catalog's first fix says how to run it."""
    source = finding.fixes[0].source if finding.fixes else "000 §3.3"
    if isinstance(result, dict) and isinstance(result.get("overlap_rate"), (int, float)):
        found = int(result.get("eval_exact", 0)) + int(result.get("eval_near", 0))
        finding.evidence["leakcheck"] = (f"{found} of {result.get('eval_rows', '?')} eval rows "
                                         f"in train ({result['overlap_rate']:.1%})")
        bound = "" if result.get("complete", True) else " (time budget spent: at least)"
        if found:
            text = (f"Remove the {found} eval rows that are also in train "
                    f"({result['overlap_rate']:.1%} of eval{bound}, leakage check at start), "
                    f"then evaluate again")
        else:
            text = (f"The leakage check at start found no eval row in train"
                    f"{bound}: look at preprocessing next")
    else:  # never run: the catalog's first fix already says to run it
        return finding
    finding.fixes = [Fix(text, source), *finding.fixes[1:]]
    return finding


class _Train:
    """The train loss's finite points, read in place through the positions of the logged
    series (NaN/Inf points are skipped; a long history is not copied on every poll)."""

    def __init__(self, series: pd.Series, index: FiniteIndex) -> None:
        self.steps = series.index.to_numpy(dtype=np.int64)
        self.values = series.to_numpy(dtype=float)
        self.index = index
        self.count = index.extend(self.values)

    def ends(self, steps: np.ndarray) -> np.ndarray:
        """How many finite points were logged at or before each step."""
        return self.index.finite_before(np.searchsorted(self.steps, steps, side="right"))

    def take(self, k: np.ndarray) -> np.ndarray:
        """The values of the finite points numbered ``k`` (any shape)."""
        return self.values[self.index.position_of(k)]

    def last_step(self) -> int:
        return int(self.steps[self.index.position_of(np.array([self.count - 1]))[0]])


class _TrainLevels:
    """The median of the last ``window`` train points logged at or before a step."""

    def __init__(self, train: _Train, window: int) -> None:
        self.train = train
        self.window = window

    def at(self, steps: np.ndarray) -> np.ndarray:
        ends = self.train.ends(steps)
        levels = np.full(len(steps), np.nan)
        full = ends >= self.window
        if full.any():
            rows = ends[full][:, None] - self.window + np.arange(self.window)
            levels[full] = np.median(self.train.take(rows), axis=1)
        for end in np.unique(ends[~full & (ends > 0)]):  # early: the points there are
            levels[ends == end] = np.median(self.train.take(np.arange(end)))
        return levels


def _series_noise(series: np.ndarray, positions: np.ndarray,
                  count: int = _NOISE_WINDOW) -> np.ndarray:
    """The noise of one value of a series sampled at the evaluations: the robust spread
    of its second differences over the last ``count`` evaluations up to each position,
    divided by sqrt(6) (NaN with fewer than _MIN_NOISE_EVALUATIONS finite)."""
    return _difference_noise(series, positions, count, 2, _MIN_NOISE_EVALUATIONS)


def _difference_noise(series: np.ndarray, positions: np.ndarray, count: int, order: int,
                      minimum: int) -> np.ndarray:
    """The robust spread of the ``order``-th differences of the finite values among the
    last ``count`` up to each position, scaled to one value's noise (the differences of
    independent values have sqrt(C(2 order, order)) times it); NaN with fewer than
    ``minimum`` finite values."""
    out = np.full(len(positions), np.nan)
    scale = math.sqrt(math.comb(2 * order, order))
    # Whole, finite windows at once; the rest (early, or with missing values) one by one.
    whole = positions >= count - 1
    if whole.any() and len(series) >= count:
        rows = sliding_window_view(series, count)[positions[whole] - count + 1]
        finite_rows = np.isfinite(rows).all(axis=1)
        out[np.flatnonzero(whole)[finite_rows]] = (
            row_sd(np.diff(rows[finite_rows], order, axis=1)) / scale)
    for k in np.flatnonzero(np.isnan(out)).tolist():
        i = int(positions[k])
        window = series[max(0, i + 1 - count):i + 1]
        window = window[np.isfinite(window)]
        if len(window) >= minimum:
            out[k] = row_sd(np.diff(window, order)[None, :])[0] / scale
    return out


def _contenders(values: np.ndarray, best_at: np.ndarray, ends: np.ndarray,
                noise: np.ndarray) -> np.ndarray:
    """How many evaluations sit at the best's level: those within _CONTENDER_Z noise
    deviations of the best, from ``_NOISE_WINDOW`` evaluations before it up to each end
    (at least 1, the best itself)."""
    out = np.ones(len(best_at))
    for k, (b, e) in enumerate(zip(best_at.tolist(), ends.tolist(), strict=True)):
        window = values[max(0, b + 1 - _NOISE_WINDOW):e + 1]
        out[k] = max(1, int(np.sum(window <= values[b] + _CONTENDER_Z * noise[k])))
    return out


def _slope(values: np.ndarray, starts: np.ndarray, ends: np.ndarray,
           noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares slope of ``values[start:end + 1]`` for each pair and its t
    statistic, one evaluation's noise given (NaN under three points or without a noise)."""
    slope = np.full(len(ends), np.nan)
    t = np.full(len(ends), np.nan)
    for k, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        y = values[a:b + 1]
        if len(y) < 3 or not noise[k] > 0:
            continue
        x = np.arange(len(y)) - (len(y) - 1) / 2
        sxx = float(x @ x)
        slope[k] = float(x @ y) / sxx
        t[k] = slope[k] / (noise[k] / np.sqrt(sxx))
    return slope, t


def _gap_noise(gap: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The noise per evaluation of the gap between the eval loss and the train level
    (``log(eval) - log(train level)``) up to each position: the robust spread of its
    changes over the last ``_NOISE_WINDOW`` evaluations, divided by sqrt(2) (NaN with
    fewer than _MIN_GAP_EVALUATIONS finite values), so a gap that wanders as much as it
    widens stays unproven."""
    return _difference_noise(gap, positions, _NOISE_WINDOW, 1, _MIN_GAP_EVALUATIONS)


def _gap_t(gap: np.ndarray, positions: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """How steadily the gap widens up to each position: the largest t statistic of its
    least-squares slope over the last 4, 8 or 16 evaluations, ``spread`` its noise per
    evaluation at each position (-inf where it cannot be measured)."""
    best = np.full(len(positions), -np.inf)
    measured = spread > 0  # False where the noise is unmeasured (NaN)
    for window in _GAP_WINDOWS:
        usable = np.flatnonzero(measured & (positions + 1 >= window))
        if not usable.size:
            continue
        recent = sliding_window_view(gap, window)[positions[usable] + 1 - window]
        centred = np.arange(window) - (window - 1) / 2
        sxx = float(centred @ centred)
        slope = recent @ centred / sxx
        residuals = recent - recent.mean(axis=1, keepdims=True) - slope[:, None] * centred
        noise = _fit_noise(spread[usable], residuals.T, 2)
        with np.errstate(invalid="ignore"):
            t = slope / (noise / np.sqrt(sxx))
        t = np.where(np.isfinite(recent).all(axis=1), t, -np.inf)
        best[usable] = np.maximum(best[usable], t)
    return best


def _gap_change_t(gap: np.ndarray, positions: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """How surely the gap has started to widen faster than it did before, up to each
    position ``i``: over change points ``c`` from _CHANGE_BACK evaluations back to two
    before ``i``, the least-squares fit of ``level + drift * x + change * max(0, x - c)``
    to the gap from _CHANGE_PRE evaluations before ``c`` on; the smaller of the t
    statistics of ``change`` and of the slope after ``c`` (``drift + change``), the
    largest over ``c`` (-inf where it cannot be measured); ``spread`` is the gap's noise
    per evaluation (:func:`_gap_noise`). A gap that has widened steadily all along (a
    healthy fine-tune whose train loss falls faster than its eval loss) shows no change;
    one that stops closing, no widening."""
    best = np.full(len(positions), -np.inf)
    measured = spread > 0
    for distance in range(2, _CHANGE_BACK + 1):  # i - c
        change_at = positions - distance
        usable = measured & (change_at >= _MIN_CHANGE_PRE - 1)
        # A full fit window (_CHANGE_PRE before the bend) for all positions at once.
        full = usable & (change_at >= _CHANGE_PRE)
        width = _CHANGE_PRE + distance + 1
        if full.any():
            windows = sliding_window_view(gap, width)[change_at[full] - _CHANGE_PRE]
            estimate, change_se, after_se, residual = _bend_fit(_CHANGE_PRE, distance)
            change, after = estimate @ windows.T
            noise = _fit_noise(spread[full], residual @ windows.T)
            with np.errstate(invalid="ignore"):
                t = np.minimum(change / (noise * change_se), after / (noise * after_se))
            t = np.where(np.isfinite(windows).all(axis=1), t, -np.inf)
            best[full] = np.maximum(best[full], t)
        for k in np.flatnonzero(usable & ~full).tolist():  # the first evaluations
            c, i = int(change_at[k]), int(positions[k])
            y = gap[:i + 1]
            if not np.isfinite(y).all():
                continue
            estimate, change_se, after_se, residual = _bend_fit(c, distance)
            change, after = estimate @ y
            noise = _fit_noise(spread[k:k + 1], (residual @ y)[:, None])[0]
            best[k] = max(best[k], min(change / (noise * change_se), after / (noise * after_se)))
    return best


@functools.cache
def _bend_fit(before: int, after: int) -> tuple[np.ndarray, float, float, np.ndarray]:
    """The least-squares fit of ``level + drift * x + change * max(0, x)`` to the points
    ``x = -before .. after``, which depends only on the two lengths: the rows that turn the
    points into ``change`` and into ``drift + change`` (the slope after the bend), their
    standard errors for a unit noise, and the rows that turn them into the fit's residuals
    (``I - H``, one row per point)."""
    x = np.arange(-before, after + 1, dtype=float)
    design = np.column_stack((np.ones_like(x), x, np.maximum(x, 0.0)))
    inverse = np.linalg.inv(design.T @ design)
    rows = np.array([[0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    estimate = rows @ inverse @ design.T
    change_var, after_var = np.einsum("ij,jk,ik->i", rows, inverse, rows)
    residual = np.eye(len(x)) - design @ inverse @ design.T
    estimate.setflags(write=False)
    residual.setflags(write=False)
    return estimate, float(np.sqrt(change_var)), float(np.sqrt(after_var)), residual


def _fit_noise(spread: np.ndarray, residuals: np.ndarray, fitted: int = 3) -> np.ndarray:
    """The noise per evaluation that a fit's t statistics use: the gap's own ``spread``,
    or, where it is larger, what the scatter of the fit's ``residuals`` (one column per
    fit, ``fitted`` parameters fitted) shows at the least: its lower _FIT_Z-sigma confidence
    bound (the residual variance over ``d`` degrees of freedom is ``noise^2 chi2_d / d``;
    its upper quantile by Wilson and Hilferty). A gap that the fitted line does not
    describe, as when a held loss spike lifts the train level and then lets it fall back
    inside the window, is no evidence of the line's slopes, however far they lie from
    zero; a line that fits leaves a scatter within chance of the noise and keeps it."""
    dof = residuals.shape[0] - fitted
    scatter = np.sqrt(np.sum(residuals**2, axis=0) / dof)
    h = 2 / (9 * dof)
    chance = (1 - h + _FIT_Z * math.sqrt(h)) ** 1.5  # sqrt of chi2_d's quantile over d
    return np.maximum(spread, scatter / chance)  # NaN where the noise is unmeasured


def _train_point_noise(train: _Train, at: np.ndarray) -> np.ndarray:
    """The relative noise of one train point at each step in ``at``: the robust spread of
    the relative changes between the last ``_POINT_NOISE_WINDOW`` points logged up to it,
    divided by ``sqrt(2 (1 - rho))`` (0 where fewer than three exist).

    ``rho`` is the points' lag-1 autocorrelation, read from the changes over two points
    against those over one (for AR(1) noise their variances are ``2 s^2 (1 - rho^2)`` and
    ``2 s^2 (1 - rho)``, a ratio of ``1 + rho``), at least 0 and at most
    _MAX_AUTOCORRELATION. A per-batch loss whose noise persists over a few points (data
    order, a slow optimizer state) changes little from one point to the next, yet its
    points lie as far from their level as independent ones of ``s``: taken from the
    changes alone, its noise reads low by ``sqrt(1 - rho)``."""
    ends = train.ends(at)
    noise = np.zeros(len(at))
    for end in np.unique(ends):
        window = train.take(np.arange(max(0, end - _POINT_NOISE_WINDOW), end))
        if len(window) < 3:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            change = np.diff(window) / np.abs(window[:-1])
            change_2 = (window[2:] - window[:-2]) / np.abs(window[:-2])
        change = change[np.isfinite(change)]
        change_2 = change_2[np.isfinite(change_2)]
        if change.size < 2:
            continue
        spread = row_sd(change[None, :])[0]
        rho = 0.0
        if change_2.size >= 2 and spread > 0:
            ratio = (row_sd(change_2[None, :])[0] / spread) ** 2
            rho = min(max(ratio - 1, 0.0), _MAX_AUTOCORRELATION)
        noise[ends == end] = spread / np.sqrt(2 * (1 - rho))
    return noise


def _recent_levels(levels: _TrainLevels, steps: np.ndarray, positions: np.ndarray,
                   count: int) -> np.ndarray:
    """The median of the train levels at the last ``count`` evaluations up to each position
    (the train counterpart of the eval's recent median)."""
    rows = positions[:, None] - np.arange(count)[::-1]
    at = levels.at(steps[np.clip(rows, 0, None)].ravel()).reshape(rows.shape)
    return np.median(at, axis=1)


def _best_before(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each position: the lowest earlier value and its position (inf and 0 at the first)."""
    running = np.minimum.accumulate(values)
    best_before = np.concatenate(([np.inf], running[:-1]))
    is_new_best = np.concatenate(([True], values[1:] < running[:-1]))
    best_index = np.maximum.accumulate(np.where(is_new_best, np.arange(len(values)), 0))
    best_at = np.concatenate(([0], best_index[:-1]))
    return best_before, best_at


def _recent_noise(values: np.ndarray, positions: np.ndarray, count: int) -> np.ndarray:
    """The noise of one evaluation as the last ``count`` evaluations up to each position
    show it (the MAD of second differences; 0 where fewer exist). A steady rise has no
    curvature; an eval loss that swings (an oscillation of the train loss sampled at the
    evaluations) has much, and its swings are not a rise."""
    noise = np.zeros(len(positions))
    full = positions >= count - 1
    if full.any():
        rows = positions[full][:, None] - count + 1 + np.arange(count)
        noise[full] = row_sd(np.diff(values[rows], 2, axis=1))
    return noise / np.sqrt(6)


def _rises_steadily(values: np.ndarray, ends: np.ndarray, count: int) -> np.ndarray:
    """Whether each of the ``count`` evaluations up to each end is at or above the one
    before it."""
    if not ends.size:
        return np.zeros(0, dtype=bool)
    rows = ends[:, None] - np.arange(count)[::-1]
    window = values[rows]
    return np.all(np.diff(window, axis=1) >= 0, axis=1)



def _relative_change(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        change = (after - before) / np.abs(before)
    from_zero = np.where(after == before, 0.0, np.copysign(np.inf, after - before))
    return np.where(before != 0, change, from_zero)


def _percent(change: float) -> str:
    return f"{100 * change:+.1f}%" if math.isfinite(change) else "up from zero"


def _went(before: float, after: float, change: float) -> str:
    verb = "fell" if after < before else ("rose" if after > before else "stayed at")
    if after == before:
        return f"{verb} {fmt_number(after)}"
    return f"{verb} {fmt_number(before)} → {fmt_number(after)} ({_percent(change)})"



def _is_eval_loss(tag: str) -> bool:
    """An eval set's loss as HF Trainer names it with several eval datasets
    (``eval_<set>_loss``), or ``eval/<set>/loss``."""
    low = tag.lower()
    return (low.startswith("eval_") and low.endswith("_loss")) or (
        low.startswith("eval/") and low.endswith("/loss"))
