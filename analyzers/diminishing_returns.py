"""Diminishing returns: the stop-loss rule "stop after N evaluations that improve less than X"."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
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
from analyzers.stats import finite, theil_sen_slope

MODES = ("min", "max")
# The run's own stop-loss rule: a dict (or a JSON object string, as MLflow stores params)
# under this key of the run's config, with any of these parameters.
CONFIG_KEY = "runwatch_stop_loss"
RULE_PARAMETERS = ("metric", "mode", "min_improvement", "evaluations", "grace_period")
# The same quantity under another tag, used when the watched one is not logged at all.
_FALLBACK_METRICS = {"eval/loss": "eval/perplexity"}
# Stalled evaluations shown in the evidence: the last ones.
_MAX_EVIDENCE_POINTS = 30


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
    ``metric``) in Keras/Lightning ``EarlyStopping`` fashion. An evaluation *improves*
    when it beats the reference, the last evaluation that improved, by at least
    ``min_improvement`` relative to it (``mode="max"``: higher is better); it then becomes
    the reference. So an evaluation that only bounces back after a bad one, or dips by
    noise, is not progress, while slow steady progress adds up against the reference and
    still counts. Once ``evaluations`` evaluations in a row have not improved, and the
    robust (Theil-Sen) trend of the last ``2 * evaluations`` evaluations confirms it (it
    projects less than ``min_improvement`` over ``evaluations`` evaluations), the
    finding fires; its onset is the first evaluation that did not improve, and its first
    fix is a ``stop`` request. It resolves once the metric beats the reference by
    ``evaluations * min_improvement`` (the progress the rule asks of N evaluations:
    returns are back); a later stall is a new finding. Non-finite values are skipped.

    The rule is per evaluation, as teams agree it, so choose ``min_improvement`` with the
    evaluation interval in mind. The finding also gives the improvement per 1,000 steps
    since the reference.

    *Per-run rule*: a run may carry its own stop-loss rule, agreed before the run, in its
    config under ``runwatch_stop_loss``: a dict (or a JSON object string, as MLflow stores
    params) with any of ``metric``, ``mode``, ``min_improvement``, ``evaluations`` and
    ``grace_period``, e.g. ``{"evaluations": 3, "min_improvement": 0.01}``, or
    ``{"enabled": false}`` to opt the run out. Its values replace the analyzer's for that
    run; a value that fails the parameter's check is ignored and named in the evidence.
    A run's own rule being met is a ``warning`` (the team agreed to stop there); the
    default rule's is ``info`` (a stop recommendation, not trouble).

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
        Relative improvement on the reference that counts as progress (0.005 = 0.5%), the
        rule's X. Higher stops runs that still improve slowly; lower waits until they are
        flat.
    evaluations : int, default 5
        Evaluations in a row without progress, the rule's N. More rides out a temporary
        stall (e.g. before a learning-rate decay lowers the loss again); fewer saves
        compute sooner.
    grace_period : int, default 3
        Evaluations at the start that are never judged (warm-up). Longer avoids judging
        the warm-up; shorter can stop a run that converges within a few evaluations.

    *False-positive guard*: ``grace_period`` skips the warm-up, and nothing is judged
    until the metric has improved at least once (returns must exist before they can
    diminish: a run that never learns is ``plateau``'s business, not a converged one).
    ``evaluations`` asks for a sustained stall, never one evaluation; the trend test
    keeps quiet while a run whose last evaluations sit just under the threshold is still
    clearly descending (a long run with many evaluations, a warmup-stable-decay schedule,
    a reference set by a lucky evaluation), at the price of firing an evaluation or two
    later on a stall that follows a steep descent; and the resolve level (``evaluations
    * min_improvement``) is wider than the firing one, so a run that crawls along the
    threshold does not flap.

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
    (3000, 3500, 'info', 'firing')
    >>> finding.fixes[0].request
    'stop'
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    eval/loss has not improved by 0.5% on 1.21 (step 2900) over 6 evaluations (steps
    3000–3500; best since 1.20, -0.31%); stop-loss rule: stop after 5 evaluations that
    improve less than 0.5%

    A run can agree a rule of its own before it starts:

    >>> data.meta["config"] = {"runwatch_stop_loss": {"evaluations": 3,
    ...                                               "min_improvement": 0.01}}
    >>> [finding] = DiminishingReturns().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.severity
    (2600, 2800, 'warning')
    """

    signal = "diminishing_returns"

    def __init__(self, metric: str = "eval/loss", mode: str = "min",
                 min_improvement: float = 0.005, evaluations: int = 5,
                 grace_period: int = 3) -> None:
        _check(metric=metric, mode=mode, min_improvement=min_improvement,
               evaluations=evaluations, grace_period=grace_period)
        self.metric = metric
        self.mode = mode
        self.min_improvement = min_improvement
        self.evaluations = evaluations
        self.grace_period = grace_period

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
        return [self._finding(data, rule, metric, steps, values, stall)
                for stall in _stalls(values, rule)]

    def _rule(self, meta: dict[str, Any]) -> _Rule | None:
        """The analyzer's rule with the run's own overrides applied (None: opted out)."""
        config = meta.get("config") if isinstance(meta, dict) else None
        raw = config.get(CONFIG_KEY) if isinstance(config, dict) else None
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
        whose = "the run's stop-loss rule" if rule.from_run else "stop-loss rule"
        summary = (f"{metric} has not improved by {threshold} on {fmt_number(reference)} "
                   f"(step {int(steps[stall.reference])}) over {len(stalled)} evaluations "
                   f"(steps {int(steps[stall.onset])}–{int(steps[stall.fired])}; best since "
                   f"{fmt_number(best_since)}, {_percent(total, rule.mode)}); {whose}: stop "
                   f"after {rule.evaluations} evaluations that improve less than {threshold}")
        evidence: dict[str, Any] = {
            "rule": {"evaluations": rule.evaluations, "min_improvement": rule.min_improvement,
                     "mode": rule.mode, "grace_period": rule.grace_period,
                     "set_by": "run config" if rule.from_run else "analyzer"},
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
            severity="warning" if rule.from_run else "info",
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


def _stalls(values: np.ndarray, rule: _Rule) -> list[_Stall]:
    """Every stall, in ``EarlyStopping`` fashion: the reference moves only to an evaluation
    that beats it by ``min_improvement``, so slow, steady progress adds up and counts."""
    stalls = []
    reference = 0
    waited = 0
    onset = fired = None
    first_judged = max(rule.grace_period, 1)
    for i, value in enumerate(values.tolist()):
        if i == 0:
            continue
        gain = _gain(float(values[reference]), value, rule.mode)
        if fired is not None:
            if gain >= rule.evaluations * rule.min_improvement:
                stalls.append(_Stall(reference, onset, fired, i))
                reference, waited, fired = i, 0, None
            continue
        if gain >= rule.min_improvement:
            reference, waited = i, 0
            continue
        # Judged only after the warm-up, and once the reference has moved off the first
        # evaluation: returns must have existed before they can diminish.
        if i < first_judged or reference == 0:
            continue
        waited += 1
        onset = i if waited == 1 else onset
        recent = values[max(0, i + 1 - 2 * rule.evaluations):i + 1]
        if waited >= rule.evaluations and _trend_gain(recent, rule) < rule.min_improvement:
            fired = i
    if fired is not None:
        stalls.append(_Stall(reference, onset, fired, None))
    return stalls


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


def _trend_gain(window: np.ndarray, rule: _Rule) -> float:
    """Relative improvement over ``evaluations`` evaluations that the robust (Theil-Sen)
    trend of ``window`` projects."""
    slope = theil_sen_slope(window)  # window holds at least two evaluations
    level = float(np.median(window))
    return _gain(level, level + slope * rule.evaluations, rule.mode)


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
