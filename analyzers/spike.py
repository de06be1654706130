"""Loss spikes: a point far above the recent level, or a non-finite value (in the loss or
in any other metric that matters)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from analyzers import register
from analyzers.base import BEFORE_ONSET, Analyzer, RunData
from analyzers.checks import check_int, check_metric, check_real, check_tags
from analyzers.finding import Finding
from analyzers.fmt import fmt_number
from analyzers.stats.robust import (
    MAD_TO_SD,
    clean_start,
    clean_window,
    first_run,
    moving_median,
    row_median,
    sorted_middle,
)
from analyzers.streaming import Streams

# Rows of rolling windows handled at once: bounds memory when ``window`` is large.
_CHUNK_ELEMENTS = 2_000_000
# Points of context shown before the onset, and the cap on evidence points.
_CONTEXT_BEFORE = 5
_MAX_EVIDENCE_POINTS = 30
# Fewest residuals the tail scale is measured on; the quantile it is read at, and that
# quantile of a standard normal.
_MIN_TAIL = 10
_TAIL_QUANTILE = 0.99
_NORMAL_QUANTILE = 2.326
# Other metrics whose non-finite values are a spike: these canonical tags, and any tag
# with one of these words in its name (``act_loss``, ``eval/ppl``, ``rewards/chosen``) but
# not ``scale`` (fp16's ``loss_scale`` is the scaler's, not a loss).
_NONFINITE_TAGS = ("eval/loss", "grad_norm", "reward", "kl")
_NONFINITE_WORDS = frozenset({"loss", "ppl", "perplexity", "reward", "rewards", "kl"})
_NOT_WATCHED_WORDS = frozenset({"scale"})
# Words that make a tag an evaluation metric: its non-finite values say nothing about
# the weights, so its fixes are the catalog's ``eval_fixes`` and nothing is rolled back.
_EVAL_WORDS = frozenset({"eval", "val", "valid", "validation", "test", "dev"})
# A gradient norm's non-finite value must repeat this many points in a row: fp16's loss
# scaler makes a single overflow routine (it skips that update and halves the scale).
_OVERFLOW_POINTS = 2


@dataclass(frozen=True)
class _Episode:
    onset: int  # position in the series
    end: int  # position after the last abnormal point (start of the resolving run)
    resolved: int | None  # position of the last point of the resolving run
    baseline: float | None
    baseline_points: int


@dataclass
class _State:
    """What is settled after a poll: the episodes before ``resume`` (all closed), the series
    position the next poll judges from, and the finite points before it."""

    grace: int = 0  # finite points never judged (the warm-up left in this log)
    resume: int = 0
    finite_before: int = 0
    episodes: list[_Episode] = field(default_factory=list)


@register
class Spike(Analyzer):
    """Loss spike: a point far above its recent level, or a NaN/Inf value.

    *Signal* (SIGNALS.md ``spike``). A non-finite value is a spike at once: no warm-up,
    no persistence, severity ``critical``. A finite value is a spike when it stands far
    above the previous ``window`` finite points: more than ``threshold`` robust standard
    deviations (``1.4826 * MAD``) above their median *and* more than ``min_rel`` times the
    median's magnitude above it (a loss below 0 gets a margin of its size too). The
    deviations are measured around the window's own straight trend, so a loss
    still falling fast (early training, the end of warm-up) does not pass its descent off
    as noise and hide a real jump; when that trend rises, the median is carried forward
    along it, so a steady climb is not a spike at every point. It must also stand
    ``tail_threshold`` deviations above that level against the loss's long history (the
    ``tail_window`` points before it; on a log scale where the window is positive, on a
    linear one elsewhere; see the guard below).
    With a single finite point before it (no noise to measure), only a rise to
    ``critical_ratio`` times that point counts. One finding per episode,
    onset and detection at the first abnormal point. The episode resolves once
    ``resolve_points`` consecutive finite points are back at or below the median at onset
    plus half the smallest rise that would fire there: the larger of ``min_rel`` times the
    median's magnitude and ``threshold`` robust deviations of the window
    (``median_at_onset * (1 + min_rel / 2)`` on a steady positive loss); a later spike is a
    new finding. Points of an episode are left out of the baseline of every later point.

    *Any metric* (SIGNALS.md ``spike (any metric)``): a non-finite value in another metric
    that matters (``nonfinite_tags``: the eval loss, grad norm, reward, KL, perplexity, an
    RL policy or critic loss) is a ``critical`` spike of that metric, at once: an HF run
    whose ``eval_loss`` was NaN at every evaluation while its train loss stayed finite got
    no finding at all, as only ``metric`` was read (issue 22). One finding per episode; it
    resolves after ``resolve_points`` finite points in a row. An evaluation metric's
    finding (a tag named eval/val/valid/test/dev) offers the catalog's ``eval_fixes`` (check
    the eval data and precision) and no rollback: the weights may be fine. A gradient norm
    is the one exception to "at once": fp16's loss scaler makes a single overflow (an
    infinite norm, the update skipped) routine, so it must be non-finite at two points in
    a row, past the warm-up (``grace_period`` points from step 0). One blow-up is said
    once: another metric's non-finite episode is not reported when ``metric`` is
    non-finite between that metric's neighbouring points around its onset, or already
    was at the onset (the loss's finding says it).

    Parameters
    ----------
    metric : str, default "train/loss"
        The tag watched.
    window : int, default 20
        Finite points in the rolling baseline. Longer is steadier but lags a loss that is
        still falling fast; shorter adapts quickly but trusts fewer points.
    threshold : float, default 6.0
        Robust standard deviations above the recent level a spike must reach. Lower
        catches smaller spikes and raises more false alarms on noisy per-batch losses.
    min_rel : float, default 0.5
        Rise over the median a spike must also reach, as a share of the median's magnitude
        (0.5 = +50%). Guards a very steady loss whose MAD is tiny; higher ignores moderate
        jumps. It vanishes for a median near 0, where the noise tests alone judge.
    grace_period : int, default 20
        Finite points at the start of the run that are never judged (warm-up, when the
        loss moves fast), counted from step 0: a log that starts later (an excerpt, a
        resumed attempt starting at step 29 020) is past it and is judged from its second
        point. A run that logs a learning rate which does not warm up (its second value
        not above its first: full LR from the first step, where a jump is the blow-up
        warm-up exists to prevent) has none either. Longer hides an early blow-up;
        non-finite values are reported regardless.
    critical_ratio : float, default 3.0
        A peak at or above this multiple of the median is ``critical``, below it
        ``warning``; whatever the median's sign, a peak ``critical_ratio - 1`` times the
        median's magnitude above it (a median of 0 has none: ``warning``). Lower pages
        people for smaller jumps.
    resolve_points : int, default 5
        Consecutive finite points back near the old level needed to resolve. More avoids
        a resolve/fire flap on a loss that keeps bouncing; fewer resolves sooner.
    recurrence_window : int, default 500
        Finite points before a candidate searched for earlier excursions like it (the
        heavy-tail guard below). Longer remembers a heavy tail for longer, and may also
        swallow a genuine spike that follows others within it.
    recurrences : int, default 3
        Earlier excursions (runs of consecutive points that spiked against their own
        window) at least half as far out, on a log scale, within ``recurrence_window``
        that make a candidate routine rather than a spike. 0 turns the guard off; fewer
        quiets a heavy-tailed loss sooner and risks hiding a run of real spikes.
    tail_window : int, default 500
        Finite points before a candidate whose residuals give the long-history scale.
        Longer is steadier but slower to follow a noise level that changes over the run.
    tail_threshold : float, default 7.0
        Long-history deviations a spike must reach on a log scale; 0 turns the test off.
        It is 7 standard deviations on normal noise and about 9 robust ones on
        Student-t(5) noise. Lower catches a smaller jump on a noisy fine-tune and lets
        more of the noise's own largest excursions through.
    nonfinite_tags : list of str, optional
        Other tags whose non-finite values are a spike. None (the default): ``eval/loss``,
        ``grad_norm``, ``reward``, ``kl`` and every tag whose name holds the word loss,
        ppl, perplexity, reward(s) or kl (not ``loss_scale``); an empty list watches
        ``metric`` alone.

    *False-positive guard*: besides ``grace_period`` and ``min_rel``, a positive series
    must also stand ``threshold`` robust deviations out on a log scale, so per-batch
    losses near zero that swing by orders of magnitude from batch to batch do not fire on
    every hard batch (the price: on such a loss a spike must be large on that scale too);
    and the scale is never below the series' resolution (the smallest gap between
    distinct values in the window), so losses logged with four decimals do not fire on a
    jump of 0.0001 → 0.0002; a window with neither spread nor a median away from 0 gives
    no margin at all, so no finite value spikes against it (an all-zero loss that logs
    1e-12 once). A per-batch loss whose hard batches stand out again and again
    (a memorised fine-tune at 0.001 with single batches at 0.3–1.0) is heavy-tailed, not
    spiking: a candidate preceded within ``recurrence_window`` points by ``recurrences``
    excursions at least half as far out is routine and does not fire (NaN/Inf always
    fires). A 20-point window of autocorrelated, heavy-tailed noise often looks quieter
    than the loss really is (its MAD is itself noisy and the points move together), so a
    noisy fine-tune or small-batch loss would fire on its own largest excursions: a
    candidate must also stand ``tail_threshold`` deviations above its level (log scale)
    where the deviation is read off the upper tail of the residuals (log of each point
    over the median of the ``window`` before it) of the ``tail_window`` points before it,
    episodes left out (on a linear scale, differences for ratios, where the window is not
    all positive, so a loss near or below 0 is guarded as when shifted up): the gap from
    their median to their 99th percentile divided by 2.326, the normal standard deviation
    for normal noise and wider for heavier tails.
    The price: on a loss whose noise alone makes ×1.5–2 single-point jumps (a 3000-step
    fine-tune with 2–5% Student-t noise per point) a spike of that size is not told from
    them; it must be several times the loss's usual largest excursion.

    *Streaming*: judging a point needs only the ``window + max(recurrence_window,
    tail_window)`` points before it, so each poll resumes from the last position with
    that much episode-free history and re-reads only that context and the new points; the
    findings are those of a run analysed at once. The warm-up depends on the first two
    steps and LR values; a poll that learns them anew starts over.

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import Checkpoint, RunData
    >>> rng = np.random.default_rng(0)
    >>> loss = 2.0 + 0.02 * rng.standard_normal(300)
    >>> loss[150] = 7.5
    >>> data = RunData.from_series("demo", {"train/loss": loss},
    ...                            checkpoints=[Checkpoint(100, "ckpt/checkpoint-100")])
    >>> [finding] = Spike().detect(data)
    >>> finding.onset_step, finding.severity, finding.state, finding.resolved_step
    (151, 'critical', 'resolved', 156)
    >>> finding.summary
    'train/loss jumped to 7.50 at step 151 (3.7x its recent median 2.01 over 20 points)'
    >>> finding.rollback_to.step
    100
    """

    signal = "spike"

    def __init__(self, metric: str = "train/loss", window: int = 20, threshold: float = 6.0,
                 min_rel: float = 0.5, grace_period: int = 20, critical_ratio: float = 3.0,
                 resolve_points: int = 5, recurrence_window: int = 500,
                 recurrences: int = 3, tail_window: int = 500,
                 tail_threshold: float = 7.0,
                 nonfinite_tags: list[str] | tuple[str, ...] | None = None) -> None:
        check_metric(metric)
        check_int("window", window, 3)
        check_real("threshold", threshold, 0.0)
        check_real("min_rel", min_rel, 0.0, allow_equal=True)
        check_int("grace_period", grace_period, 0)
        check_real("critical_ratio", critical_ratio, 1.0)
        check_int("resolve_points", resolve_points, 1)
        check_int("recurrence_window", recurrence_window, 1)
        check_int("recurrences", recurrences, 0)
        check_int("tail_window", tail_window, 1)
        check_real("tail_threshold", tail_threshold, 0.0, allow_equal=True)
        check_tags("nonfinite_tags", nonfinite_tags)
        self.metric = metric
        self.window = window
        self.threshold = threshold
        self.min_rel = min_rel
        self.grace_period = grace_period
        self.critical_ratio = critical_ratio
        self.resolve_points = resolve_points
        self.recurrence_window = recurrence_window
        self.recurrences = recurrences
        self.tail_window = tail_window
        self.tail_threshold = tail_threshold
        self.nonfinite_tags = nonfinite_tags
        self._streams: Streams[_State] = Streams()

    def detect(self, data: RunData) -> list[Finding]:
        steps, values, episodes = self._read(data)
        # Loss spikes often come with a grad-norm spike: show it beside the loss.
        grad_norm = data.series("grad_norm") if self.metric != "grad_norm" else None
        findings = [self._finding(data, steps, values, episode, grad_norm)
                    for episode in episodes]
        nonfinite_steps = steps[~np.isfinite(values)]
        for tag in self._other_tags(data):
            findings += self._nonfinite_findings(data, tag, steps, nonfinite_steps)
        return sorted(findings, key=lambda f: (f.onset_step, f.metric))

    def spans(self, data: RunData) -> list[tuple[int, int | None]]:
        """Each episode's first and last abnormal step (None while it is still open),
        oldest first: what :meth:`detect` reports, for an analyzer that defers to it."""
        steps, _, episodes = self._read(data)
        return [(int(steps[e.onset]), None if e.resolved is None else int(steps[e.end - 1]))
                for e in episodes]

    def _read(self, data: RunData) -> tuple[np.ndarray, np.ndarray, list[_Episode]]:
        """The series' steps and values and every episode in it (series positions)."""
        series = data.series(self.metric)
        steps = series.index.to_numpy(dtype=np.int64)
        values = series.to_numpy(dtype=float)
        if series.empty:
            return steps, values, []
        tags = (self.metric,)
        grace = self._warm_up(data, steps)
        state = self._streams.resume(data, tags)
        if state is None or state.grace != grace:  # the LR's first points came in since
            state = _State(grace)
        fresh = self._scan(values, state)
        self._streams.save(data, tags, self._settle(values, state, fresh))
        return steps, values, state.episodes + fresh

    # --- non-finite values in other metrics -------------------------------------

    def _other_tags(self, data: RunData) -> list[str]:
        if self.nonfinite_tags is not None:
            wanted = set(self.nonfinite_tags)
            return [t for t in data.tags() if t in wanted and t != self.metric]
        return [t for t in data.tags() if t != self.metric and _matters(t)]

    def _nonfinite_findings(self, data: RunData, tag: str, loss_steps: np.ndarray,
                            loss_nonfinite: np.ndarray) -> list[Finding]:
        """One critical finding per episode of non-finite values of ``tag`` (see *Any
        metric* above)."""
        series = data.series(tag)
        values = series.to_numpy(dtype=float)
        bad = ~np.isfinite(values)
        if not bad.any():
            return []
        steps = series.index.to_numpy(dtype=np.int64)
        words = _words(tag)
        persist = 1
        if "grad" in words and "norm" in words or tag == "grad_norm":
            persist = _OVERFLOW_POINTS
            bad[:self._grace_points(steps)] = False
        findings = []
        start = 0
        while True:
            runs = np.flatnonzero(bad[start:])
            if not runs.size:
                break
            onset = start + int(runs[0])
            if persist > 1 and not bad[onset:onset + persist].all():
                start = onset + 1
                continue
            resolved = first_run(values, onset + 1, self.resolve_points, np.isfinite)
            if not self._loss_said_it(steps, onset, loss_steps, loss_nonfinite):
                findings.append(self._nonfinite_finding(data, tag, steps, values, onset,
                                                        onset + persist - 1, resolved,
                                                        bool(words & _EVAL_WORDS)))
            if resolved is None:
                break
            start = resolved + 1
        return findings

    def _grace_points(self, steps: np.ndarray) -> int:
        """Points of the warm-up left at the start of this log (``grace_period`` points
        counted from step 0)."""
        if len(steps) < 2 or steps[1] <= steps[0]:
            return self.grace_period
        return max(0, self.grace_period - int(steps[0]) // int(steps[1] - steps[0]) + 1)

    def _loss_said_it(self, steps: np.ndarray, onset: int, loss_steps: np.ndarray,
                      loss_nonfinite: np.ndarray) -> bool:
        """Whether ``metric`` is non-finite between the neighbours of ``onset`` (the same
        blow-up), or its last point at or before the onset is (it began earlier)."""
        if not len(loss_nonfinite):
            return False
        lo = int(steps[onset - 1]) if onset else -1
        hi = int(steps[onset + 1]) if onset + 1 < len(steps) else (
            2 * int(steps[onset]) - lo if onset else int(steps[onset]))
        k = int(np.searchsorted(loss_nonfinite, lo, side="right"))
        if k < len(loss_nonfinite) and loss_nonfinite[k] <= hi:
            return True
        at = int(np.searchsorted(loss_steps, steps[onset], side="right")) - 1
        return at >= 0 and loss_steps[at] in loss_nonfinite

    def _nonfinite_finding(self, data: RunData, tag: str, steps: np.ndarray,
                           values: np.ndarray, onset: int, detected: int,
                           resolved: int | None, eval_only: bool) -> Finding:
        before = values[:onset][np.isfinite(values[:onset])][-self.window:]
        baseline = float(np.median(before)) if before.size else None
        end = len(values) if resolved is None else resolved + 1
        count = int(np.count_nonzero(~np.isfinite(values[onset:end])))
        first = max(0, onset - _CONTEXT_BEFORE)
        shown = range(first, min(end, first + _MAX_EVIDENCE_POINTS))
        recent = ("no earlier finite value" if baseline is None
                  else f"recent median {fmt_number(baseline)}")
        span = (f"non-finite at {count} of the {end - onset} points since" if resolved is None
                else f"finite again from step {int(steps[resolved - self.resolve_points + 1])}")
        summary = (f"{tag} became {_name_nonfinite(float(values[onset]))} at step "
                   f"{int(steps[onset])} ({recent}); {span}")
        if eval_only:
            summary += f"; {self.metric} is finite there: check the eval before the weights"
        return self.finding(
            data, severity="critical", metric=tag, onset_step=int(steps[onset]),
            detected_step=int(steps[detected]), summary=summary,
            evidence={"baseline": baseline, "baseline_points": int(before.size),
                      "peak": float(values[onset]), "peak_step": int(steps[onset]),
                      "ratio": None, "nonfinite_points": count,
                      "points": [[int(steps[i]), float(values[i])] for i in shown]},
            resolved_step=None if resolved is None else int(steps[resolved]),
            rollback_to=None if eval_only else BEFORE_ONSET, eval_only=eval_only)

    # --- streaming ----------------------------------------------------------------
    # Judging a point needs the ``window`` clean points before it and the raw hits of the
    # ``recurrence_window`` points before those: a poll re-reads only that context before
    # the position the last poll settled, so its cost does not grow with the history.

    def _context(self) -> int:
        return self.window + max(self.recurrence_window, self.tail_window)

    def _warm_up(self, data: RunData, steps: np.ndarray) -> int:
        """Finite points at the start of this log that are never judged: what is left of
        ``grace_period`` points counted from the run's step 0 (an excerpt or a resumed
        attempt that starts at step 29 020 is long past its warm-up), and none when the
        run logs a learning rate that does not warm up (full LR from the first step)."""
        if self.grace_period == 0 or len(steps) < 2:
            return self.grace_period
        lr = data.series("lr").to_numpy(dtype=float)[:2] if self.metric != "lr" else []
        if len(lr) == 2 and np.isfinite(lr).all() and 0 < lr[1] <= lr[0]:
            return 0
        gap = int(steps[1] - steps[0])
        logged_before = max(0, int(steps[0]) // gap - 1) if gap > 0 else 0
        return max(0, self.grace_period - logged_before)

    def _scan(self, values: np.ndarray, state: _State) -> list[_Episode]:
        """The episodes from ``state.resume`` on, in positions of the whole series."""
        if state.resume == 0:
            return self._episodes(values, max(state.grace, 1))
        lo = max(0, state.resume - self._context())
        found = self._episodes(values[lo:], state.resume - lo)
        return [replace(e, onset=e.onset + lo, end=e.end + lo,
                        resolved=None if e.resolved is None else e.resolved + lo)
                for e in found]

    def _settle(self, values: np.ndarray, state: _State, fresh: list[_Episode]) -> _State:
        """The latest position a later poll can judge from as if from the start: past
        the warm-up and every closed episode, with a context of finite points free of any
        episode before it. Episodes before it are settled; the others are judged again."""
        episodes = state.episodes + fresh
        finite = np.isfinite(values[state.resume:])
        counted = np.concatenate(([0], np.cumsum(finite)))
        candidates = [len(values)] + [e.onset for e in reversed(fresh)]
        for p in candidates:
            if p <= state.resume:
                break
            before = [e for e in episodes if e.onset < p]
            lo = max(0, p - self._context())
            clean = (not before or (before[-1].resolved is not None
                                    and before[-1].resolved < p and before[-1].end <= lo))
            if not clean or state.finite_before + counted[p - state.resume] < max(
                    state.grace, 1):
                continue
            if lo >= state.resume:
                context_finite = bool(finite[lo - state.resume:p - state.resume].all())
            else:
                context_finite = bool(np.isfinite(values[lo:p]).all())
            if context_finite:
                return _State(state.grace, p, state.finite_before + int(counted[p - state.resume]),
                              before)
        return state

    # --- episodes -----------------------------------------------------------------

    def _episodes(self, values: np.ndarray, first_judged: int) -> list[_Episode]:
        n = len(values)
        finite = np.isfinite(values)
        positions = np.flatnonzero(finite)  # position in the series of each finite point
        finite_values = values[positions]
        nonfinite = np.flatnonzero(~finite)
        median = _median_before(finite_values, self.window)
        with np.errstate(over="ignore", invalid="ignore"):
            linear_residuals = finite_values - median
        raw_hits, raw_excess, raw_out, raw_positive = self._raw_hits(finite_values, median)
        recurring = _Recurrences(raw_hits, raw_excess, self.recurrence_window)
        judged = raw_hits >= first_judged
        raw_hits, raw_excess = raw_hits[judged], raw_excess[judged]
        raw_out, raw_positive = raw_out[judged], raw_positive[judged]
        excluded = np.zeros(len(finite_values), dtype=bool)
        tail = _Tail(_excess(finite_values, median), linear_residuals, excluded,
                     self.tail_window, self.tail_threshold)
        # Finite points below this index have a baseline window that differs from the raw
        # rolling one (partial at the start, or holding excluded points): judged one by one.
        judge_alone_until = self.window
        episodes: list[_Episode] = []
        start = 0
        while start < n:
            next_nonfinite = nonfinite[np.searchsorted(nonfinite, start):][:1]
            onset = int(next_nonfinite[0]) if next_nonfinite.size else n
            k_from = max(int(np.searchsorted(positions, start)), first_judged)
            k_to = int(np.searchsorted(positions, onset))  # finite points before the onset
            hit = self._first_hit_alone(finite_values, excluded, k_from,
                                        min(judge_alone_until, k_to), recurring, tail)
            if hit is None:
                first = int(np.searchsorted(raw_hits, max(k_from, judge_alone_until)))
                last = int(np.searchsorted(raw_hits, k_to))
                for k in range(first, last):
                    at = int(raw_hits[k])
                    if (not recurring(at, float(raw_excess[k]), self.recurrences)
                            and tail.beyond(at, float(raw_out[k]), bool(raw_positive[k]))):
                        hit = at
                        break
            if hit is not None:
                onset = int(positions[hit])
            if onset >= n:
                break
            before = int(np.searchsorted(positions, onset))
            window = clean_window(finite_values, excluded, before, self.window)
            baseline = float(np.median(window)) if window.size else None
            level = math.inf if baseline is None else self._resolve_level(window)
            resolved = first_run(values, onset + 1, self.resolve_points,
                                 lambda v, level=level: np.isfinite(v) & (v <= level))
            end = n if resolved is None else resolved - self.resolve_points + 1
            last_excluded = int(np.searchsorted(positions, end))
            excluded[before:last_excluded] = True
            episodes.append(_Episode(onset, end, resolved, baseline, int(window.size)))
            if resolved is None:
                break
            judge_alone_until = max(judge_alone_until, last_excluded + self.window)
            start = resolved + 1
        return episodes

    def _resolve_level(self, window: np.ndarray) -> float:
        """The level an episode resolves at: the window's median plus half the smallest rise
        that could have fired (the larger of ``min_rel`` of the median's magnitude and
        ``threshold`` robust deviations), so a loss near or below 0 resolves as it does when
        shifted up."""
        with np.errstate(over="ignore", invalid="ignore"):
            median, _, scale, *_ = (float(v[0]) for v in _window_stats(window[None, :]))
            return median + max(self.min_rel * abs(median), self.threshold * scale) / 2

    def _raw_hits(self, finite_values: np.ndarray, median: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Indices of finite points that spike against the plain rolling window (``median``:
        the median of the ``window`` points before each), how far each stands out (log of
        its ratio to the window's median), how far above the window's level (on a log
        scale where the window is positive, see :func:`_out`) and whether it is."""
        empty = np.empty(0, dtype=np.int64)
        if len(finite_values) <= self.window:
            return empty, np.empty(0), np.empty(0), np.empty(0, dtype=bool)
        # The relative rise needs only the median, which pandas rolls cheaply: it screens,
        # and the exact test then runs on the few candidates left.
        before = median[self.window:]
        current = finite_values[self.window:]
        with np.errstate(over="ignore", invalid="ignore"):
            slack = 1e-9 * (np.abs(before) + np.abs(current))
            candidates = np.flatnonzero(
                current > before + self.min_rel * np.abs(before) - slack)
        windows = sliding_window_view(finite_values[:-1], self.window)
        rows = max(1, _CHUNK_ELEMENTS // self.window)
        hits, excess, out, positive = [empty], [np.empty(0)], [np.empty(0)], [np.empty(0, bool)]
        for lo in range(0, len(candidates), rows):
            chunk = candidates[lo:lo + rows]
            stats = _window_stats(windows[chunk])
            spiking = self._is_spike(current[chunk], *stats)
            hits.append(chunk[spiking])
            excess.append(_excess(current[chunk][spiking], stats[0][spiking]))
            out.append(_out(current[chunk][spiking], stats[1][spiking], stats[3][spiking],
                            stats[5][spiking]))
            positive.append(stats[5][spiking])
        return (np.concatenate(hits) + self.window, np.concatenate(excess),
                np.concatenate(out), np.concatenate(positive))

    def _first_hit_alone(self, finite_values: np.ndarray, excluded: np.ndarray,
                         k_from: int, k_to: int, recurring: _Recurrences, tail: _Tail
                         ) -> int | None:
        """First index in [k_from, k_to) that spikes against its own window of clean points,
        stands out of the residuals' tail and does not recur. With a single point before
        it there is no noise to measure: only a rise to ``critical_ratio`` times it counts."""
        if k_from >= k_to:
            return None
        lo = clean_start(excluded, k_from, self.window)
        clean = lo + np.flatnonzero(~excluded[lo:k_to])
        candidates = np.arange(k_from, k_to)
        available = np.searchsorted(clean, candidates)  # clean points before each candidate
        full = available >= self.window
        hits = np.zeros(len(candidates), dtype=bool)
        medians = np.full(len(candidates), np.nan)
        levels = np.full(len(candidates), np.nan)
        log_levels = np.full(len(candidates), np.nan)
        positive = np.zeros(len(candidates), dtype=bool)
        if full.any():
            rows = available[full][:, None] - self.window + np.arange(self.window)
            stats = _window_stats(finite_values[clean[rows]])
            hits[full] = self._is_spike(finite_values[candidates[full]], *stats)
            medians[full], levels[full] = stats[0], stats[1]
            log_levels[full], positive[full] = stats[3], stats[5]
        for i in np.flatnonzero(~full & (available > 1)):
            window = finite_values[clean[:available[i]]]
            stats = _window_stats(window[None, :])
            hits[i] = self._is_spike(finite_values[candidates[i]:candidates[i] + 1], *stats)[0]
            medians[i], levels[i] = stats[0][0], stats[1][0]
            log_levels[i], positive[i] = stats[3][0], stats[5][0]
        for i in np.flatnonzero(available == 1):
            medians[i] = finite_values[clean[0]]
            hits[i] = medians[i] > 0 and finite_values[candidates[i]] >= (
                self.critical_ratio * medians[i])
        for i in np.flatnonzero(hits).tolist():
            k = int(candidates[i])
            excess = float(_excess(finite_values[k:k + 1], medians[i:i + 1])[0])
            out = float(_out(finite_values[k:k + 1], levels[i:i + 1], log_levels[i:i + 1],
                             positive[i:i + 1])[0])
            if (not recurring(k, excess, self.recurrences)
                    and tail.beyond(k, out, bool(positive[i]))):
                return k
        return None

    def _is_spike(self, current: np.ndarray, median: np.ndarray, level: np.ndarray,
                  scale: np.ndarray, log_level: np.ndarray, log_scale: np.ndarray,
                  positive: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            far = current > level + self.threshold * scale
            # min_rel of the median's magnitude: a margin above it whatever its sign.
            relative = current > median + self.min_rel * np.abs(median)
        # A window without spread around a median of 0 has no scale to measure a rise on
        # (a jump from an all-zero loss to 1e-12 is not a spike).
        measurable = (scale > 0) | (median != 0)
        log_current = np.log(np.maximum(current, np.finfo(float).tiny))
        far_on_log_scale = ~positive | (log_current > log_level + self.threshold * log_scale)
        return far & relative & measurable & far_on_log_scale

    def _finding(self, data: RunData, steps: np.ndarray, values: np.ndarray,
                 episode: _Episode, grad_norm: pd.Series | None) -> Finding:
        onset_step = int(steps[episode.onset])
        onset_value = float(values[episode.onset])
        body = values[episode.onset:episode.end]
        nonfinite = np.flatnonzero(~np.isfinite(body))
        if nonfinite.size:
            peak_at = episode.onset + int(nonfinite[0])
        else:
            peak_at = episode.onset + int(np.argmax(body))
        peak = float(values[peak_at])
        baseline = episode.baseline
        positive_baseline = baseline is not None and baseline > 0
        ratio = peak / baseline if positive_baseline and math.isfinite(peak) else None
        critical = not math.isfinite(peak) or (
            baseline is not None and baseline != 0
            and peak >= baseline + (self.critical_ratio - 1) * abs(baseline))
        context_end = len(values) if episode.resolved is None else episode.resolved + 1
        first = max(0, episode.onset - _CONTEXT_BEFORE)
        shown = range(first, min(context_end, first + _MAX_EVIDENCE_POINTS))
        evidence = {
            "baseline": baseline,
            "baseline_points": episode.baseline_points,
            "peak": peak,
            "peak_step": int(steps[peak_at]),
            "ratio": ratio,
            "points": [[int(steps[i]), float(values[i])] for i in shown],
        }
        if grad_norm is not None and len(grad_norm):
            index = grad_norm.index.to_numpy(dtype=np.int64)
            lo, hi = np.searchsorted(index, [steps[shown.start], steps[shown.stop - 1]],
                                     side="left")
            near = grad_norm.iloc[lo:hi + 1]
            common = near[near.index.isin(steps[shown.start:shown.stop])]
            if len(common):
                evidence["grad_norm"] = [[int(s), float(v)] for s, v in common.items()]
        return self.finding(
            data,
            severity="critical" if critical else "warning",
            onset_step=onset_step,
            detected_step=onset_step,
            summary=self._summary(onset_step, onset_value, baseline, episode.baseline_points,
                                  peak, int(steps[peak_at]), peak_at != episode.onset),
            evidence=evidence,
            resolved_step=None if episode.resolved is None else int(steps[episode.resolved]),
        )

    def _summary(self, onset_step: int, onset_value: float, baseline: float | None,
                 baseline_points: int, peak: float, peak_step: int, peak_later: bool) -> str:
        if not math.isfinite(onset_value):
            recent = ("no earlier finite value" if baseline is None
                      else f"recent median {fmt_number(baseline)}")
            return (f"{self.metric} became {_name_nonfinite(onset_value)} at step {onset_step} "
                    f"({recent})")
        ratio = (f"{onset_value / baseline:.1f}x its" if baseline is not None and baseline > 0
                 else "against its")
        text = (f"{self.metric} jumped to {fmt_number(onset_value)} at step {onset_step} ({ratio} "
                f"recent median {fmt_number(baseline)} over {baseline_points} "
                f"point{'' if baseline_points == 1 else 's'})")
        if peak_later and math.isfinite(peak):
            text += f", peaking at {fmt_number(peak)} at step {peak_step}"
        elif peak_later:
            text += f", then {_name_nonfinite(peak)} at step {peak_step}"
        return text


class _Tail:
    """Whether a candidate stands out of the loss's own long history: its height above its
    level (log scale) against the residuals (log of each point over the median of the
    ``window`` before it) of the ``window`` finite points before it, episodes left out. A
    candidate whose window is not positive is judged the same way on a linear scale
    (height and residuals as differences), so a loss near or below 0 is guarded as it is
    when shifted up.

    The scale is read off the residuals' upper tail: the gap from their median to their
    99th percentile, in normal standard deviations (divided by 2.326). For normal noise it
    is the standard deviation; a heavier tail widens it, so a loss that routinely throws
    big single points must throw a bigger one. Not judged (passes) with fewer than
    ``_MIN_TAIL`` residuals."""

    def __init__(self, residuals: np.ndarray, linear_residuals: np.ndarray,
                 excluded: np.ndarray, window: int, threshold: float) -> None:
        self.residuals = residuals
        self.linear_residuals = linear_residuals
        self.excluded = excluded  # shared with the episode loop, filled as episodes come
        self.window = window
        self.threshold = threshold

    def scale(self, k: int, log_scale: bool = True) -> float:
        lo = max(0, k - self.window)
        history = (self.residuals if log_scale else self.linear_residuals)[lo:k]
        history = history[np.isfinite(history) & ~self.excluded[lo:k]]
        if history.size < _MIN_TAIL:
            return 0.0
        with np.errstate(over="ignore", invalid="ignore"):
            middle, high = np.quantile(history, [0.5, _TAIL_QUANTILE])
            return max(0.0, float(high - middle) / _NORMAL_QUANTILE)

    def beyond(self, k: int, out: float, log_scale: bool = True) -> bool:
        """Whether ``out`` (height over the level, on a log scale or a linear one; NaN: not
        judged) clears the tail."""
        if not self.threshold or not math.isfinite(out):
            return True
        return out > self.threshold * self.scale(k, log_scale)


class _Recurrences:
    """Whether a candidate's excursion is routine: ``recurrence_window`` finite points
    before it hold at least ``times`` earlier excursions (runs of consecutive raw hits) that
    stood out at least half as far on a log scale."""

    def __init__(self, hits: np.ndarray, excess: np.ndarray, window: int) -> None:
        self.hits = hits
        self.excess = excess
        self.window = window

    def __call__(self, k: int, excess: float, times: int) -> bool:
        if not times or not math.isfinite(excess):
            return False
        lo = int(np.searchsorted(self.hits, k - self.window))
        hi = int(np.searchsorted(self.hits, k))
        near = self.hits[lo:hi][self.excess[lo:hi] >= excess / 2]
        if near.size < times:
            return False
        return int(near.size - np.count_nonzero(np.diff(near) == 1)) >= times


def _median_before(values: np.ndarray, window: int) -> np.ndarray:
    """The median of the ``window`` values before each index (NaN for the first ones)."""
    median = np.full(len(values), np.nan)
    if len(values) > window:
        rolled = moving_median(values, window)
        median[window:] = rolled[window - 1:-1]
    return median


def _out(current: np.ndarray, level: np.ndarray, log_level: np.ndarray,
         positive: np.ndarray) -> np.ndarray:
    """log(current) - log_level where the window is positive (NaN if current is not),
    current - level elsewhere."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_out = np.where(current > 0, np.log(np.where(current > 0, current, 1.0)) - log_level,
                           np.nan)
        return np.where(positive, log_out, current - level)


def _excess(current: np.ndarray, median: np.ndarray) -> np.ndarray:
    """log(current / median), NaN where either is not positive."""
    with np.errstate(divide="ignore", invalid="ignore"):
        positive = (current > 0) & (median > 0)
        return np.where(positive, np.log(np.where(positive, current / np.where(
            positive, median, 1.0), 1.0)), np.nan)


def _window_stats(windows: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per row: the median, the level a spike is measured from and the noise scale, those
    two again on a log scale, and whether the whole row is positive.

    The level is the median, carried forward along the window's trend when that trend
    rises, so a loss climbing steadily is not a spike at every point.
    """
    ordered = np.sort(windows, axis=1)
    median = sorted_middle(ordered)
    gaps = np.diff(ordered, axis=1)
    resolution = np.where(gaps > 0, gaps, np.inf).min(axis=1, initial=np.inf)
    resolution[np.isinf(resolution)] = 0.0
    level, noise = _trend(windows, median)
    positive = ordered[:, 0] > 0
    logs = np.log(np.where(positive[:, None], windows, 1.0))
    log_level, log_noise = _trend(logs, row_median(logs))
    return median, level, np.maximum(noise, resolution), log_level, log_noise, positive


def _trend(windows: np.ndarray, median: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the median carried forward along a rising trend, and the robust standard
    deviation (1.4826 * MAD) around that trend.

    The trend (the difference of the two halves' medians) is taken out of the noise, so a
    loss that is still falling fast does not pass its descent off as noise.
    """
    width = windows.shape[1]
    half = width // 2
    if half:
        slope = (row_median(windows[:, width - half:])
                 - row_median(windows[:, :half])) / (width - half)
    else:  # a single point has no trend
        slope = np.zeros(len(windows))
    residuals = windows - slope[:, None] * (np.arange(width) - (width - 1) / 2)
    centre = row_median(residuals)
    noise = MAD_TO_SD * row_median(np.abs(residuals - centre[:, None]))
    return median + np.maximum(slope, 0.0) * (width + 1) / 2, noise


def _words(tag: str) -> frozenset[str]:
    return frozenset(w for w in re.split(r"[^a-z0-9]+", tag.lower()) if w)


def _matters(tag: str) -> bool:
    """Whether a non-finite value of ``tag`` is a spike (see ``_NONFINITE_TAGS``)."""
    words = _words(tag)
    return tag in _NONFINITE_TAGS or bool(words & _NONFINITE_WORDS) and not (
        words & _NOT_WATCHED_WORDS)


def _name_nonfinite(value: float) -> str:
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")

