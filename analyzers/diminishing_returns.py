"""Diminishing returns: the stop-loss rule "stop after N evaluations that improve less than X"."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from analyzers import register
from analyzers.base import Analyzer, RunData
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_number
from analyzers.stats.robust import evaluation_noise, finite
from analyzers.stats.trend import theil_sen_slope
from analyzers.streaming import Streams

MODES = ("min", "max")
# The run's own stop-loss rule: a dict (or a JSON object string, as MLflow stores params)
# under this key of the run's config, with any of these parameters.
CONFIG_KEY = "runwatch_stop_loss"
RULE_PARAMETERS = ("metric", "mode", "min_improvement", "evaluations", "grace_period")
# The same quantity under another tag, used when the watched one is not logged at all.
_FALLBACK_METRICS = {"eval/loss": "eval/perplexity"}
# Stalled evaluations shown in the evidence: the last ones.
_MAX_EVIDENCE_POINTS = 30
# The break test: the pace of the last N evaluations against that of the 2 N before them.
BREAK_SHARE = 0.25  # a break: the pace fell under this share of its earlier level
BREAK_PERSISTENCE = 2  # evaluations in a row the break must hold
FLAT_SHARE = 0.5  # the flat test: the trend under this share of the one before it
FLAT_MARGIN = 0.5  # ... and under the rule by this many of its standard errors
NOISE_Z = 2.0  # standard errors (from the evaluation noise) a fall of the pace must exceed
LR_METRIC = "lr"  # the learning rate: a pace that falls with it is the schedule's doing


@dataclass(frozen=True)
class _Rule:
    metric: str
    mode: str
    min_improvement: float
    evaluations: int
    grace_period: int
    from_run: bool  # the run's config set it: the team agreed to it before the run
    ignored: dict[str, str]  # overrides that were not applied, and why


@register
class DiminishingReturns(Analyzer):
    """Diminishing returns: the agreed stop-loss rule is met; the run has converged.

    *Signal* (SIGNALS.md ``diminishing_returns``): the stop-loss rule "stop after N
    evaluations that improve less than X", judged at the evaluations (the points of
    ``metric``) by two tests; the first to fire opens the finding.

    - *Flat* (Keras/Lightning ``EarlyStopping`` fashion): an evaluation *improves* when it
      beats the reference, the last evaluation that improved, by at least
      ``min_improvement`` relative to it (``mode="max"``: higher is better); it then becomes
      the reference. So an evaluation that only bounces back after a bad one, or dips by
      noise, is not progress, while slow steady progress adds up against the reference and
      still counts. Once ``evaluations`` evaluations in a row have not improved, the robust
      (Theil-Sen) trend of the last ``2 N`` evaluations must confirm it (it projects less
      than ``min_improvement`` over N evaluations, by half a standard error from the
      evaluation noise) and be under half the trend of the
      ``2 N`` before them, relative to the run's own earlier improvement (unless those were
      as flat); its onset is the first evaluation that did not improve.
    - *Break*: the returns per evaluation of the last N evaluations (a Theil-Sen line,
      relative to the level, per the median interval between them: per unit of compute)
      are under ``min_improvement`` by one standard error, not below zero by two (a
      metric that got worse beyond the noise went back, it did not slow down), and under a
      quarter (``BREAK_SHARE``) of the pace of the ``2 N`` evaluations before them, below
      it by more than two standard errors
      (``NOISE_Z``, from the evaluation noise: second differences of the evaluations so
      far), at two evaluations in a row, and fires at one that did not itself improve
      (one that beat the reference by ``min_improvement`` is progress by the rule's own
      reading: not a place to stop). It catches a run whose pace collapses within N
      evaluations or so, where the flat test waits until the last ``2 N`` are flat; its
      onset is the first evaluation of the slowed window.

    The finding's first fix is a ``stop`` request. It resolves once two evaluations in a
    row beat the stall's best up to N evaluations before the first of them (from the
    reference on) by ``evaluations * min_improvement`` and by more than twice the noise of
    their difference, with the pace of the last N back at ``min_improvement`` (returns are
    back); a later stall is a new finding. Non-finite values are skipped.

    The rule is per evaluation, as teams agree it, so choose ``min_improvement`` with the
    evaluation interval in mind. The finding also gives the improvement per 1,000 steps
    since the reference, and which test fired (``evidence["test"]``).

    *Per-run rule*: a run may carry its own stop-loss rule, agreed before the run, in its config
    under ``runwatch_stop_loss``: a dict (or a JSON object string, as MLflow stores params) with any
    of ``metric``, ``mode``, ``min_improvement``, ``evaluations`` and ``grace_period``, e.g.
    ``{"evaluations": 5, "min_improvement": 0.01}``, or ``{"enabled": false}`` to opt the run out;
    or in its metadata under the same key, as ``/run stoploss RUN "5 evals < 1% on eval/loss"``
    stores it. Its values replace the analyzer's for that run (both tests use its N and X); a value
    that fails the parameter's check is ignored and named in the evidence. A declared rule being met
    is a ``warning`` (the team agreed to stop there): the run's own, or the analyzer's when
    ``declared`` says the team agreed it for every run (in ``[analyzers.diminishing_returns]``).
    Otherwise the rule is only runwatch's default and its finding is ``info``, a stop hint that is
    kept (status, App Home, answers) but not posted under the default ``[alerting] min_severity``: a
    healthy fine-tune converging slowly meets "3 evaluations under 0.5%" again and again (issue 22:
    10 of 16 synthetic healthy fine-tunes), and that is not channel news.

    *Metric*: ``eval/loss`` falls back to ``eval/perplexity`` when a run logs no eval loss
    at all (DeepSpeed-Chat logs only perplexity). There is no fallback to the training
    loss: a per-batch loss's noise makes "no new best" say little, and a flat training
    loss is ``plateau``'s signal.

    Parameters
    ----------
    metric : str, default "eval/loss"
        The evaluation metric watched (an ``eval/<suite>/<metric>`` works too).
    mode : {"min", "max"}, default "min"
        Whether lower (a loss) or higher (an accuracy, a pass rate) is better.
    min_improvement : float, default 0.005
        Relative improvement per evaluation that counts as progress (0.005 = 0.5%), the
        rule's X. Higher stops runs that still improve slowly; lower waits until they are
        flat.
    evaluations : int, default 3
        The rule's N: evaluations in a row without progress (flat test), and the window
        whose pace the break test judges. More rides out a temporary stall (e.g. before a
        learning-rate decay lowers the loss again) and a noisy suite; fewer saves compute
        sooner (the suite's median delay is about N - 1 evaluations).
    grace_period : int, default 3
        Evaluations at the start that are never judged (warm-up). Longer avoids judging
        the warm-up; shorter can stop a run that converges within a few evaluations.
    declared : bool, default False
        Whether the team agreed this rule before its runs (set it where the rule's values
        are set): its findings are then warnings and posted, as a run's own rule's are.

    *False-positive guard*: ``grace_period`` skips the warm-up, and nothing is judged
    until the metric has improved at least once (returns must exist before they can
    diminish: a run that never learns is ``plateau``'s business, not a converged one).
    Both tests ask for a sustained stall, never one evaluation. The flat test's trend
    keeps quiet while a run whose last evaluations sit just under the threshold is still
    clearly descending, and its comparison with the trend before keeps a run that still
    progresses at its own steady pace (frequent evaluations, each gaining little) quiet.
    The break test needs its fall to exceed the evaluation noise, holds at two evaluations
    in a row, never fires at an evaluation that just improved by the rule, ignores a
    window in which the metric got worse beyond the noise (an eval loss that samples an
    oscillating train loss swings back up: it went back, it did not slow down; the flat
    test still stops it if it stays there), and ignores a slowdown that the logged
    learning rate (``lr``) explains: one whose mean fell under a quarter of its earlier
    level meanwhile (the end of a cosine or linear decay). The resolve level
    (``evaluations * min_improvement``, at two evaluations, beyond the noise) is wider
    than the firing one, and is measured from the
    stall's best, which moves on with the run, not from the fixed reference: a run that
    crawls on below the threshold never gets that far past its best of N evaluations
    before (it would get that far past the reference in the end), and a noisy suite's
    lucky evaluation does not resolve, so neither flaps.

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> from analyzers import RunData
    >>> rng = np.random.default_rng(0)
    >>> steps = np.arange(100, 4001, 100)
    >>> eval_loss = 1.2 + np.exp(-steps / 600) + 0.002 * rng.standard_normal(len(steps))
    >>> data = RunData.from_series("demo", {"eval/loss": pd.Series(eval_loss, index=steps)})
    >>> [finding] = DiminishingReturns().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.severity, finding.state
    (3000, 3200, 'info', 'firing')
    >>> finding.fixes[0].request
    'stop'
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    eval/loss has not improved by 0.5% on 1.21 (step 2900) over 3 evaluations (steps
    3000–3200; best since 1.20, -0.28%); stop-loss rule: stop after 3 evaluations that
    improve less than 0.5%

    A run can agree a rule of its own before it starts:

    >>> data.meta["config"] = {"runwatch_stop_loss": {"evaluations": 5,
    ...                                               "min_improvement": 0.01}}
    >>> [finding] = DiminishingReturns().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.severity
    (2900, 3300, 'warning')
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    eval/loss improves 0.07% per evaluation over the last 5 evaluations (steps 2800–3300),
    under 25% of its pace of 0.33% per evaluation over the 10 before; the run's stop-loss
    rule: stop after 5 evaluations that improve less than 1%
    """

    signal = "diminishing_returns"

    def __init__(self, metric: str = "eval/loss", mode: str = "min",
                 min_improvement: float = 0.005, evaluations: int = 3,
                 grace_period: int = 3, declared: bool = False) -> None:
        _check(metric=metric, mode=mode, min_improvement=min_improvement,
               evaluations=evaluations, grace_period=grace_period)
        if not isinstance(declared, bool):
            raise ValueError(f"declared must be true or false, got {declared!r}")
        self.metric = metric
        self.mode = mode
        self.min_improvement = min_improvement
        self.evaluations = evaluations
        self.grace_period = grace_period
        self.declared = declared
        self._streams: Streams[_State] = Streams()

    def detect(self, data: RunData) -> list[Finding]:
        rule = self._rule(data.meta)
        if rule is None:
            return []
        metric = rule.metric
        series = data.series(metric)
        if not np.isfinite(series.to_numpy(dtype=float)).any() and metric in _FALLBACK_METRICS:
            metric = _FALLBACK_METRICS[metric]
            series = data.series(metric)
        series = finite(series)
        if len(series) <= max(rule.grace_period, 1) + rule.evaluations - 1:
            return []
        steps = series.index.to_numpy(dtype=np.int64)
        values = series.to_numpy(dtype=float)
        lr = data.series(LR_METRIC)
        tags = (metric, LR_METRIC)
        state = self._streams.resume(data, tags)
        if (state is None or state.rule != rule or state.metric != metric
                or not state.valid(steps, lr)):
            state = _State(rule, metric, len(lr))
        # Judged for good: the evaluations before the run's last step (a watcher reads a
        # later point of any tag at or after it). A learning rate that still lands among
        # them, read some other way, sends the next poll back to the start (``valid``).
        last = data.last_step()
        settled = int(np.searchsorted(steps, last, side="left")) if last is not None else 0
        # The tests at an evaluation weigh the noise up to 2 N evaluations before it.
        start = max(0, state.scan.next - 2 * rule.evaluations)
        noise = np.zeros(len(values))
        noise[start:] = evaluation_noise(values, np.arange(start, len(values)))
        state.scan.run(steps, values, noise, rule, lr, settled)
        state.lr_read = len(lr)
        self._streams.save(data, tags, state)
        latest = replace(state.scan, stalls=list(state.scan.stalls))
        latest.run(steps, values, noise, rule, lr, len(values))
        return [self._finding(data, rule, metric, steps, values, stall)
                for stall in latest.result()]

    def _rule(self, meta: dict[str, Any]) -> _Rule | None:
        """The analyzer's rule with the run's own overrides applied (None: opted out)."""
        config = meta.get("config") if isinstance(meta, dict) else None
        raw = config.get(CONFIG_KEY) if isinstance(config, dict) else None
        if isinstance(meta, dict) and meta.get(CONFIG_KEY) is not None:
            raw = meta[CONFIG_KEY]  # declared with `/run stoploss`, after the run's config
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                pass
        params = {name: getattr(self, name) for name in RULE_PARAMETERS}
        ignored: dict[str, str] = {}
        if raw is not None and not isinstance(raw, dict):
            ignored[CONFIG_KEY] = f"not a dict or a JSON object: {raw!r}"
            raw = {}
        for name, value in (raw or {}).items():
            if name == "enabled":
                if value is False or str(value).strip().lower() in ("false", "0", "no"):
                    return None
                continue
            if name not in RULE_PARAMETERS:
                ignored[str(name)] = "unknown parameter"
                continue
            value = _number(value) if name in ("min_improvement", "evaluations",
                                               "grace_period") else value
            try:
                _check(**{name: value})
            except ValueError as exc:
                ignored[name] = str(exc)
                continue
            params[name] = value
        applied = bool(raw) and len(raw) > len(ignored)
        return _Rule(**params, from_run=applied, ignored=ignored)

    def _finding(self, data: RunData, rule: _Rule, metric: str, steps: np.ndarray,
                 values: np.ndarray, stall: _Stall) -> Finding:
        reference = float(values[stall.reference])
        stalled = values[stall.onset:stall.fired + 1]
        best_since = float(stalled.min() if rule.mode == "min" else stalled.max())
        gains = [_gain(reference, float(v), rule.mode) for v in stalled]
        total = _gain(reference, best_since, rule.mode)
        span = int(steps[stall.fired] - steps[stall.reference])  # the steps they cost
        threshold = f"{100 * rule.min_improvement:g}%"
        whose = ("the run's stop-loss rule" if rule.from_run else
                 "the team's stop-loss rule" if self.declared else "stop-loss rule")
        summary = (f"{metric} has not improved by {threshold} on {fmt_number(reference)} "
                   f"(step {int(steps[stall.reference])}) over {len(stalled)} evaluations "
                   f"(steps {int(steps[stall.onset])}–{int(steps[stall.fired])}; best since "
                   f"{fmt_number(best_since)}, {_percent(total, rule.mode)}); {whose}: stop "
                   f"after {rule.evaluations} evaluations that improve less than {threshold}")
        if stall.kind == "break":
            n, i = rule.evaluations, stall.fired
            lo = max(max(rule.grace_period, 1), i - 3 * n)
            noise = evaluation_noise(values, np.array([i]))
            padded = np.zeros(len(values))
            padded[i] = noise[0]
            recent, _ = _pace(steps, values, padded, i - n, i, rule)
            before, _ = _pace(steps, values, padded, lo, i - n, rule)
            summary = (f"{metric} improves {100 * recent:.2f}% per evaluation over the last "
                       f"{n} evaluations (steps {int(steps[i - n])}–{int(steps[i])}), under "
                       f"{100 * BREAK_SHARE:g}% of its pace of {100 * before:.2f}% per "
                       f"evaluation over the {i - n - lo} before; {whose}: stop after "
                       f"{rule.evaluations} evaluations that improve less than {threshold}")
        evidence: dict[str, Any] = {
            "test": stall.kind,
            "rule": {"evaluations": rule.evaluations, "min_improvement": rule.min_improvement,
                     "mode": rule.mode, "grace_period": rule.grace_period,
                     "set_by": ("run config" if rule.from_run else
                                "team config" if self.declared else "analyzer")},
            "reference_step": int(steps[stall.reference]),
            "reference": reference,
            "best_since": best_since,
            "improvement": total,
            "improvement_per_1k_steps": total * 1000 / span if span > 0 else None,
            "evaluations": [[int(steps[stall.onset + i]), float(v), g]
                            for i, (v, g) in enumerate(zip(stalled, gains, strict=True))
                            ][-_MAX_EVIDENCE_POINTS:],
        }
        if rule.ignored:
            evidence["ignored_overrides"] = dict(rule.ignored)
        return self.finding(
            data,
            severity="warning" if rule.from_run or self.declared else "info",
            metric=metric,
            onset_step=int(steps[stall.onset]),
            detected_step=int(steps[stall.fired]),
            summary=summary,
            evidence=evidence,
            rollback_to=None,
            resolved_step=None if stall.resolved is None else int(steps[stall.resolved]),
        )


@dataclass(frozen=True)
class _Stall:
    """Positions: the reference the stalled evaluations failed to beat, the first and last
    of them, and the evaluation that resolved the stall (None while it lasts)."""

    reference: int
    onset: int
    fired: int
    resolved: int | None
    kind: str = "flat"


@dataclass
class _Scan:
    """The stall scan over the evaluations (see the class docstring): a *flat* stall,
    counted in ``EarlyStopping`` fashion (the reference moves only to an evaluation that
    beats it by ``min_improvement``, so slow, steady progress adds up and counts), or a
    *break* in the run's pace. Judges the evaluations one at a time and can stop anywhere
    and go on later: ``next`` is the first not judged yet."""

    next: int = 1
    reference: int = 0
    best: int = 0  # while a stall fires: its best evaluation up to N before the last two
    waited: int = 0
    streak: int = 0
    onset: int | None = None
    fired: int | None = None
    kind: str = "flat"
    stalls: list[_Stall] = field(default_factory=list)

    def run(self, steps: np.ndarray, values: np.ndarray, noise: np.ndarray, rule: _Rule,
            lr: pd.Series, stop: int) -> None:
        """Judge the evaluations from ``next`` up to (not including) ``stop``."""
        first_judged = max(rule.grace_period, 1)
        n = rule.evaluations
        for i in range(self.next, stop):
            value = float(values[i])
            gain = _gain(float(values[self.reference]), value, rule.mode)
            if self.fired is not None:
                # Returns are back once two evaluations in a row beat the stall's best up to
                # N evaluations before them by the progress of N evaluations, and by more
                # than the evaluation noise. Not the reference: a run crawling on below the
                # threshold gets that far past it in the end, but never that far past its
                # own best of N evaluations before.
                if _gain(float(values[self.best]), float(values[i - 1 - n]), rule.mode) > 0:
                    self.best = i - 1 - n
                best = float(values[self.best])
                gain = min(_gain(best, value, rule.mode),
                           _gain(best, float(values[i - 1]), rule.mode))
                scale = abs(best) or 1.0
                needed = max(n * rule.min_improvement,
                             NOISE_Z * math.sqrt(2) * float(noise[i]) / scale)
                if gain >= needed and (
                        _pace(steps, values, noise, i - n, i, rule)[0] >= rule.min_improvement):
                    self.stalls.append(_Stall(self.reference, self.onset, self.fired, i,
                                              self.kind))
                    self.reference, self.waited, self.streak, self.fired = i, 0, 0, None
                continue
            improved = gain >= rule.min_improvement
            if improved:
                self.reference, self.waited = i, 0
            elif i >= first_judged and self.reference != 0:
                self.waited += 1
                self.onset = i if self.waited == 1 else self.onset
                if self.waited >= n and _flat(steps, values, noise, i, first_judged, rule):
                    self.fired, self.kind = i, "flat"
                    self.best = _best(values, self.reference, i - n, rule.mode)
                    continue
            # A break holds at two evaluations in a row and fires at one that did not
            # improve: an evaluation that beat the reference by the rule is progress (a
            # pace that only reads slow in a noisy window is not met yet).
            broke = _broke(steps, values, noise, lr, i, first_judged, rule)
            self.streak = self.streak + 1 if broke else 0
            if self.streak >= BREAK_PERSISTENCE and not improved:
                self.reference, self.onset, self.fired, self.kind = i - n, i - n + 1, i, "break"
                self.best = self.reference
        self.next = max(self.next, stop)

    def result(self) -> list[_Stall]:
        """Every stall so far, the last one open while it lasts."""
        if self.fired is None:
            return list(self.stalls)
        return [*self.stalls, _Stall(self.reference, self.onset, self.fired, None, self.kind)]


@dataclass
class _State:
    """What one poll leaves for the next: the scan over the evaluations judged for good,
    with the rule and metric it used, and how many learning-rate points had been read."""

    rule: _Rule
    metric: str
    lr_read: int
    scan: _Scan = field(default_factory=_Scan)

    def valid(self, steps: np.ndarray, lr: pd.Series) -> bool:
        """No learning rate logged since lands among the evaluations judged for good (a
        learning rate first logged now, at earlier steps, would change their verdicts)."""
        if self.scan.next <= 1 or len(lr) <= self.lr_read:
            return True
        return bool(lr.index[self.lr_read] > steps[self.scan.next - 1])


def _best(values: np.ndarray, lo: int, hi: int, mode: str) -> int:
    """The position of the best of evaluations ``lo`` to ``hi``."""
    stretch = values[lo:hi + 1]
    return lo + int(np.argmin(stretch) if mode == "min" else np.argmax(stretch))


def _flat(steps: np.ndarray, values: np.ndarray, noise: np.ndarray, i: int,
          first_judged: int, rule: _Rule) -> bool:
    """The flat test's confirmation at evaluation ``i``: the trend of the last ``2 N``
    evaluations projects less than ``min_improvement`` over N evaluations, by
    ``FLAT_MARGIN`` of its standard errors (from the evaluation noise), and it is under
    ``FLAT_SHARE`` of the trend of the ``2 N`` before them (unless those were flat too)."""
    n = rule.evaluations
    lo = max(0, i - 2 * n)
    recent, recent_se = _pace(steps, values, noise, lo, i, rule)
    # Under the rule by half a standard error: an eval whose lows only just miss the
    # reference (an oscillation sampled at the evaluations, a lucky reference) reads a
    # trend that scatters about the rule; the estimate alone stops it by chance.
    if (recent + FLAT_MARGIN * recent_se) * n >= rule.min_improvement:
        return False
    earlier_lo = max(first_judged, lo - 2 * n)
    if lo - earlier_lo < 2:
        return True
    earlier, _ = _pace(steps, values, noise, earlier_lo, lo, rule)
    return recent < FLAT_SHARE * earlier or earlier * n < rule.min_improvement


def _broke(steps: np.ndarray, values: np.ndarray, noise: np.ndarray, lr: pd.Series,
           i: int, first_judged: int, rule: _Rule) -> bool:
    """The break test at evaluation ``i``: the pace of the last N evaluations is under
    ``min_improvement`` by a standard error (a noisy suite whose pace only reads under the
    rule must not stop a run that still meets it) and not below zero by ``NOISE_Z`` of them
    (a metric that got worse beyond the noise, an oscillation's swing or a regression,
    has not slowed down: it went back, which is ``overfit``'s or ``oscillation``'s signal,
    and the flat test still judges it), under ``BREAK_SHARE`` of the pace of the ``2 N``
    before them, and below it by more than ``NOISE_Z`` standard errors; and the learning
    rate did not fall
    under ``BREAK_SHARE`` of its level meanwhile (an annealing schedule slows the loss by
    design)."""
    n = rule.evaluations
    mid = i - n
    if mid - 2 < first_judged:
        return False
    lo = max(first_judged, mid - 2 * n)
    recent, recent_se = _pace(steps, values, noise, mid, i, rule)
    # Under the rule by a standard error, and no worse beyond the noise: a metric that
    # went back (a swing, a regression) has not slowed down; that is another signal's.
    if (recent + recent_se >= rule.min_improvement
            or recent < -NOISE_Z * recent_se):
        return False
    earlier, earlier_se = _pace(steps, values, noise, lo, mid, rule)
    return (earlier > 0 and recent < BREAK_SHARE * earlier
            and earlier - recent > NOISE_Z * math.hypot(recent_se, earlier_se)
            and _lr_ratio(lr, steps, lo, mid, i) >= BREAK_SHARE)


def _lr_ratio(lr: pd.Series, steps: np.ndarray, lo: int, mid: int, hi: int) -> float:
    """The mean logged learning rate (its positive, finite values) over steps ``(mid,
    hi]`` relative to that over ``(lo, mid]`` (1 where it is not logged there)."""
    if not len(lr):
        return 1.0
    ends = np.searchsorted(lr.index.to_numpy(), steps[[lo, mid, hi]], side="right")
    rates = lr.to_numpy(dtype=float)
    earlier, recent = rates[ends[0]:ends[1]], rates[ends[1]:ends[2]]
    earlier = earlier[np.isfinite(earlier) & (earlier > 0)]
    recent = recent[np.isfinite(recent) & (recent > 0)]
    if not (earlier.size and recent.size):
        return 1.0
    return float(recent.mean() / earlier.mean())


def _pace(steps: np.ndarray, values: np.ndarray, noise: np.ndarray, lo: int, hi: int,
          rule: _Rule) -> tuple[float, float]:
    """The improvement per evaluation (relative to the level) of the robust (Theil-Sen)
    line through evaluations ``lo..hi``, and its standard error from the evaluation noise
    (the least-squares one, a close enough guide for a few points)."""
    x = steps[lo:hi + 1].astype(float)
    y = values[lo:hi + 1]
    interval = float(np.median(np.diff(x))) if len(x) > 1 else 1.0
    x = x - x.mean()
    sxx = float(x @ x)
    level = abs(float(y.mean())) or 1.0
    if sxx <= 0:
        return 0.0, math.inf
    slope = theil_sen_slope(y, x)
    sign = -1.0 if rule.mode == "min" else 1.0
    return (sign * slope * interval / level,
            float(noise[hi]) / math.sqrt(sxx) * interval / level)


def _check(**params: Any) -> None:
    """Validate rule parameters, whether given to the analyzer or by a run's config."""
    if "metric" in params:
        check_metric(params["metric"])
    if "mode" in params and params["mode"] not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {params['mode']!r}")
    if "min_improvement" in params:
        check_real("min_improvement", params["min_improvement"], 0.0, below=1.0)
    if "evaluations" in params:
        check_int("evaluations", params["evaluations"], 1)
    if "grace_period" in params:
        check_int("grace_period", params["grace_period"], 0)


def _number(value: Any) -> Any:
    """A number given as text (MLflow stores params as strings) as int or float."""
    if not isinstance(value, str):
        return value
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if number.is_integer() and "." not in value else number


def _gain(reference: float, value: float, mode: str) -> float:
    """Relative improvement of ``value`` on ``reference`` (positive: better)."""
    change = reference - value if mode == "min" else value - reference
    if reference == 0:
        return 0.0 if change == 0 else math.copysign(math.inf, change)
    return change / abs(reference)


def _percent(gain: float, mode: str) -> str:
    """An improvement as the change of the value: a loss that improved fell."""
    change = -gain if mode == "min" else gain
    return f"{100 * change:+.2f}%" if math.isfinite(change) else "from zero"
