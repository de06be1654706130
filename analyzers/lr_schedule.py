"""LR schedule: the logged learning rate is not the one the run's configuration declares."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzers import register
from analyzers.base import Analyzer, RunData
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_number
from analyzers.stats.metric import config_number

# Schedules whose LR falls after warmup; an LR that sits flat there contradicts them.
_DECAYING = frozenset({"linear", "cosine", "cosine_with_restarts", "polynomial", "inverse_sqrt",
                       "cosine_with_min_lr", "cosine_warmup_with_min_lr"})
# Schedules that follow the loss (or another metric), not the step: nothing to rebuild.
_ADAPTIVE = frozenset({"reduce_lr_on_plateau", "greedy"})
# The schedules that need the run's length.
_NEED_TOTAL = frozenset({"linear", "cosine", "cosine_with_restarts", "polynomial",
                         "cosine_with_min_lr", "cosine_warmup_with_min_lr"})
# Deviating points listed in the evidence, at most.
_MAX_EVIDENCE_POINTS = 30


@dataclass(frozen=True)
class _Schedule:
    """A declared schedule. ``peak``/``warmup``/``total`` are None when the config omits them."""

    name: str
    source: str
    peak: float | None = None
    warmup: int | None = None
    total: int | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def rebuildable(self) -> bool:
        if self.name in _ADAPTIVE or self.peak is None or self.warmup is None:
            return False
        if self.name == "warmup_stable_decay":
            return "num_decay_steps" in self.options and (
                self.total is not None or "num_stable_steps" in self.options)
        if self.name == "cosine_with_min_lr" and "min_lr_rate" not in self.options:
            return False
        return self.name not in _NEED_TOTAL or self.total is not None

    def parameters(self) -> dict[str, Any]:
        return {"source": self.source, "type": self.name, "peak_lr": self.peak,
                "warmup_steps": self.warmup, "total_steps": self.total, **self.options}

    def rates(self, steps: np.ndarray) -> np.ndarray:
        """The LR at each step, as Hugging Face's ``get_scheduler`` computes it: the factor
        of ``LambdaLR`` after ``steps`` scheduler steps, times the peak."""
        assert self.peak is not None
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.peak * _FACTORS[self.name](steps.astype(float), self)


@register
class LrSchedule(Analyzer):
    """LR schedule: the logged learning rate leaves the schedule the run's config declares.

    *Signal* (SIGNALS.md ``lr_schedule``; 003 §5.2 case 1: after warmup the LR sat at a
    high constant instead of decaying). The schedule is rebuilt from ``meta["config"]``
    (keys below) and every logged LR after warmup is compared with it. A point is *off*
    when it lies more than ``tolerance`` (relative) outside the schedule's values at the
    steps ``s - step_slack … s + step_slack`` (below ``floor`` of the peak, more than
    ``tolerance * floor`` of the peak); ``patience`` off points in a row fire a
    finding whose onset is the first of them. It resolves after ``resolve_points``
    on-schedule points in a row; a later deviation is a new finding. The expected values
    shown follow the trainer's convention: the shift within ``step_slack`` that puts most
    points on the schedule (``step_offset`` in the evidence; -1 for a log of the LR each
    step used, as transformers 5 writes it).

    When the config declares a decaying schedule (``lr_scheduler_type`` cosine, linear, …)
    but not enough to rebuild it (no peak LR, or no run length), the check is weaker: an
    LR that repeats its value, exactly and at its maximum, for ``flat_points`` logged
    points in a row after warmup (``flat_points + 1`` points at one value) fires, its
    onset the first repeat (a decay changes the LR at every step). With no schedule declared, or an
    adaptive one (``reduce_lr_on_plateau``), the analyzer says nothing.

    Config keys read, first match wins:

    * ``lr_schedule``: runwatch's own block for any training loop, e.g. ``{"type":
      "cosine", "peak_lr": 3e-4, "warmup_steps": 100, "total_steps": 10000,
      "min_lr_ratio": 0.1}``. ``type`` takes Hugging Face's scheduler names; ``peak_lr``
      may be ``lr`` or ``learning_rate``; ``warmup_steps`` below 1 is a ratio (or give
      ``warmup_ratio``); ``total_steps`` may be ``max_steps`` or ``num_training_steps``
      (default: ``meta["total_steps"]``); ``min_lr_ratio``/``min_lr_rate``/``min_lr`` turn
      ``cosine`` into ``cosine_with_min_lr``; other keys are the scheduler's own arguments
      (``num_cycles``, ``power``, ``lr_end``, ``timescale``, ``num_decay_steps``, …).
    * Hugging Face ``TrainingArguments``: ``learning_rate``, ``lr_scheduler_type``,
      ``lr_scheduler_kwargs``, ``warmup_steps`` (a float below 1 is a ratio, as in
      transformers 5) or ``warmup_ratio`` (transformers 4), ``max_steps`` (else
      ``meta["total_steps"]``). Every ``get_scheduler`` type except the adaptive ones is
      rebuilt exactly. A run with a ``deepspeed`` config is skipped: DeepSpeed's own
      scheduler section, when there is one, replaces ``lr_scheduler_type``.

    Parameters
    ----------
    metric : str, default "lr"
        The tag watched.
    tolerance : float, default 0.01
        Relative distance from the schedule that counts as off (0.01 = 1%). Lower also
        flags LRs logged with few significant digits; higher misses small mis-scalings.
    floor : float, default 0.05
        Share of the peak LR below which the distance is measured against ``floor`` times
        the peak instead of the scheduled value. Near the end of a decay the LR is tiny and
        its relative error huge for a schedule built a step or two longer than the logged
        run (seen in real Hugging Face runs); 0 judges the tail strictly, higher ignores
        more of it.
    patience : int, default 3
        Off points in a row before firing. More rides out a one-off logging glitch; fewer
        reports a short LR burst sooner (a burst shorter than this is not reported).
    resolve_points : int, default 3
        On-schedule points in a row that resolve a finding. More avoids flapping on an LR
        that keeps leaving the schedule; fewer resolves sooner.
    step_slack : int, default 1
        Steps either side whose scheduled LR also counts as on schedule. One step absorbs
        the two logging conventions in the wild: Hugging Face logs the LR after the
        scheduler's step up to transformers 4.4x and the LR the step used since. Raise it
        for trainers that skip scheduler steps (fp16 overflow skips delay the schedule by a
        step each); the price is that a deviation smaller than that many steps' change of
        the schedule is missed.
    flat_points : int, default 50
        Without a rebuildable schedule: logged points in a row that must repeat the LR
        before them, at its maximum after warmup, while a decay is declared, before
        firing. Fewer alerts
        sooner; too few can mistake a very long cosine logged as float32 (its first steps
        round to the same value) for a flat LR.

    *False-positive guard*: the warmup is never judged (its steps are excluded, so a
    different warmup convention cannot fire), nor are steps after the declared end;
    ``patience`` asks for a sustained deviation, ``step_slack`` tolerates off-by-one step
    conventions, ``floor`` keeps the tail of a decay from firing on tiny absolute
    differences, and runs without a declared schedule, with an adaptive one, or whose
    scheduler DeepSpeed may own are never judged. The flat rule only fires at the LR's
    running maximum and above zero (a run waiting for its first optimizer step logs 0).

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import RunData
    >>> steps = np.arange(1, 801)  # a 1000-step run, logged up to step 800
    >>> lr = 3e-4 * np.minimum(steps / 100, 0.5 * (1 + np.cos(np.pi * (steps - 100) / 900)))
    >>> lr[steps >= 600] *= 2  # a second scheduler, or a doubled LR, from step 600
    >>> config = {"learning_rate": 3e-4, "lr_scheduler_type": "cosine", "warmup_steps": 100,
    ...           "max_steps": 1000}
    >>> data = RunData.from_series("demo", {"lr": lr}, steps=steps, meta={"config": config})
    >>> [finding] = LrSchedule().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.state
    (600, 602, 'firing')
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    lr left the configured cosine schedule at step 600: 0.000248 logged vs 0.000124 expected
    (2x), more than 1% off for 3 logged steps in a row (steps 600–602)
    """

    signal = "lr_schedule"

    def __init__(self, metric: str = "lr", tolerance: float = 0.01, floor: float = 0.05,
                 patience: int = 3, resolve_points: int = 3, step_slack: int = 1,
                 flat_points: int = 50) -> None:
        check_metric(metric)
        check_real("tolerance", tolerance, 0.0, below=1.0)
        check_real("floor", floor, 0.0, allow_equal=True, below=1.0)
        check_int("patience", patience, 1)
        check_int("resolve_points", resolve_points, 1)
        check_int("step_slack", step_slack, 0)
        check_int("flat_points", flat_points, 2)
        self.metric = metric
        self.tolerance = tolerance
        self.floor = floor
        self.patience = patience
        self.resolve_points = resolve_points
        self.step_slack = step_slack
        self.flat_points = flat_points

    def detect(self, data: RunData) -> list[Finding]:
        series = data.series(self.metric)
        config = data.meta.get("config")
        if series.empty or not isinstance(config, Mapping):
            return []
        schedule = declared_schedule(config, _positive_int(data.meta.get("total_steps")))
        if schedule is None:
            return []
        steps = series.index.to_numpy(dtype=np.int64)
        values = series.to_numpy(dtype=float)
        if schedule.rebuildable:
            return self._deviations(data, schedule, steps, values)
        if schedule.name in _DECAYING:
            return self._flat(data, schedule, steps, values)
        return []

    # ---------------------------------------------------------------- rebuilt schedule
    def _deviations(self, data: RunData, schedule: _Schedule, steps: np.ndarray,
                    values: np.ndarray) -> list[Finding]:
        judged = steps > schedule.warmup
        if schedule.total is not None:
            judged &= steps <= schedule.total
        steps, values = steps[judged], values[judged]
        if not steps.size:
            return []
        offsets = sorted(range(-self.step_slack, self.step_slack + 1), key=abs)
        shifted = {k: schedule.rates(steps + k) for k in offsets}
        assert schedule.peak is not None
        margin = self.tolerance * np.maximum(shifted[0], self.floor * schedule.peak)
        with np.errstate(invalid="ignore"):
            off = (~np.isfinite(values) | (values < np.minimum.reduce(list(shifted.values()))
                                          - margin)
                   | (values > np.maximum.reduce(list(shifted.values())) + margin))
            # The trainer's convention: the shift that puts most points on the schedule
            # (Hugging Face logs the LR a step used, one step behind get_scheduler's count).
            matches = {k: int(np.count_nonzero(np.abs(values - shifted[k]) <= margin))
                       for k in offsets}
        offset = max(offsets, key=lambda k: matches[k])  # ties: the smallest shift
        return [self._deviation_finding(data, schedule, steps, values, shifted[offset], offset,
                                        off, *episode)
                for episode in _episodes(off, self.patience, self.resolve_points)]

    def _deviation_finding(self, data: RunData, schedule: _Schedule, steps: np.ndarray,
                           values: np.ndarray, expected: np.ndarray, offset: int,
                           off: np.ndarray, onset: int, end: int,
                           resolved: int | None) -> Finding:
        fired = onset + self.patience - 1
        shown = onset + np.flatnonzero(off[onset:end])[:_MAX_EVIDENCE_POINTS]
        logged, wanted = float(values[onset]), float(expected[onset])
        ratio = logged / wanted if wanted > 0 and math.isfinite(logged) else None
        how_far = f" ({ratio:.3g}x)" if ratio is not None else ""
        summary = (f"{self.metric} left the configured {schedule.name} schedule at step "
                   f"{int(steps[onset])}: {fmt_number(logged)} logged vs {fmt_number(wanted)} "
                   f"expected{how_far}, more than {100 * self.tolerance:g}% off for "
                   f"{self.patience} logged steps in a row (steps {int(steps[onset])}–"
                   f"{int(steps[fired])})")
        evidence = {
            "schedule": schedule.parameters(),
            "tolerance": self.tolerance,
            "floor": self.floor,
            "step_slack": self.step_slack,
            "step_offset": offset,
            "ratio_at_onset": ratio,
            "off_points": int(np.count_nonzero(off[onset:end])),
            "points": [[int(steps[i]), float(values[i]), float(expected[i])] for i in shown],
        }
        return self.finding(data, onset_step=int(steps[onset]), detected_step=int(steps[fired]),
                            summary=summary, evidence=evidence,
                            resolved_step=None if resolved is None else int(steps[resolved]))

    # ----------------------------------------------------------- declared decay, flat LR
    def _flat(self, data: RunData, schedule: _Schedule, steps: np.ndarray,
              values: np.ndarray) -> list[Finding]:
        finite = np.isfinite(values)
        steps, values = steps[finite], values[finite]
        if schedule.warmup is not None:
            start = int(np.searchsorted(steps, schedule.warmup, side="left"))
        else:  # warmup ends where the LR stops rising
            falls = np.flatnonzero(np.diff(values) <= 0)
            start = int(falls[0]) if falls.size else len(values)
        values, steps = values[start:], steps[start:]
        if len(values) <= self.flat_points:
            return []
        # A repeat of the previous point, at the running maximum and above zero.
        same = np.zeros(len(values), dtype=bool)
        same[1:] = np.abs(values[1:] - values[:-1]) <= _FLAT_RELATIVE * np.abs(values[:-1])
        same &= (values > 0) & (values >= np.maximum.accumulate(values))
        return [self._flat_finding(data, schedule, steps, values, *episode)
                for episode in _episodes(same, self.flat_points, 1)]

    def _flat_finding(self, data: RunData, schedule: _Schedule, steps: np.ndarray,
                      values: np.ndarray, onset: int, end: int,
                      resolved: int | None) -> Finding:
        fired = onset + self.flat_points - 1
        level = float(values[onset])
        summary = (f"{self.metric} has stayed at {fmt_number(level)} for {self.flat_points} "
                   f"logged steps after warmup (steps {int(steps[onset - 1])}–"
                   f"{int(steps[fired])}) although the config declares a {schedule.name} "
                   f"decay")
        shown = range(onset - 1, min(end, onset - 1 + _MAX_EVIDENCE_POINTS))
        evidence = {
            "schedule": schedule.parameters(),
            "flat_value": level,
            "flat_points": end - onset,
            "points": [[int(steps[i]), float(values[i])] for i in shown],
        }
        return self.finding(data, onset_step=int(steps[onset]), detected_step=int(steps[fired]),
                            summary=summary, evidence=evidence,
                            resolved_step=None if resolved is None else int(steps[resolved]))


# Two logged LRs this close (relative) are the same value: float32 logging keeps ~7 digits.
_FLAT_RELATIVE = 1e-6


def _episodes(bad: np.ndarray, patience: int,
              resolve_points: int) -> list[tuple[int, int, int | None]]:
    """``(onset, end, resolved)`` positions of each episode: ``patience`` bad points in a row
    start one, ``resolve_points`` good points in a row end it (``end`` is the first of them,
    ``resolved`` the last; None while it lasts)."""
    if not bad.size:
        return []
    edges = np.flatnonzero(np.diff(bad.astype(np.int8))) + 1
    starts = np.concatenate(([0], edges))
    lengths = np.diff(np.concatenate((starts, [len(bad)])))
    episodes: list[tuple[int, int, int | None]] = []
    onset: int | None = None
    for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
        if bad[start]:
            if onset is None and length >= patience:
                onset = start
        elif onset is not None and length >= resolve_points:
            episodes.append((onset, start, start + resolve_points - 1))
            onset = None
    if onset is not None:
        episodes.append((onset, len(bad), None))
    return episodes


# ------------------------------------------------------------------------- the config
def declared_schedule(config: Mapping[str, Any], total_steps: int | None) -> _Schedule | None:
    """The schedule the config declares (see :class:`LrSchedule` for the keys), or None."""
    block = config.get("lr_schedule")
    if isinstance(block, Mapping):
        return _from_block(block, total_steps)
    if "lr_scheduler_type" in config and not config.get("deepspeed"):
        return _from_training_arguments(config, total_steps)
    return None


def _from_block(block: Mapping[str, Any], total_steps: int | None) -> _Schedule | None:
    name = _scheduler_name(_first(block, "type", "name", "lr_scheduler_type"))
    if name is None:
        return None
    peak = _positive_float(_first(block, "peak_lr", "lr", "learning_rate"))
    total = _positive_int(_first(block, "total_steps", "max_steps", "num_training_steps"))
    total = total or total_steps
    warmup = _warmup(_first(block, "warmup_steps", "warmup"), block.get("warmup_ratio"), total)
    options = {k: v for k, v in block.items() if k in _OPTION_PARSERS}
    ratio = _first(block, "min_lr_ratio", "min_lr_rate")
    if name == "cosine" and (ratio is not None or block.get("min_lr") is not None):
        name = "cosine_with_min_lr"
    if ratio is not None and name in ("cosine_with_min_lr", "cosine_warmup_with_min_lr"):
        options.pop("min_lr_ratio", None)  # the warmup-stable-decay schedule's own name
        options["min_lr_rate"] = ratio
    return _schedule(name, "lr_schedule", peak, warmup, total, options)


def _from_training_arguments(config: Mapping[str, Any],
                             total_steps: int | None) -> _Schedule | None:
    name = _scheduler_name(config.get("lr_scheduler_type"))
    if name is None:
        return None
    total = _positive_int(config.get("max_steps")) or total_steps
    warmup = _warmup(config.get("warmup_steps"), config.get("warmup_ratio"), total)
    options = config.get("lr_scheduler_kwargs") or {}
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except ValueError:
            options = {}
    if not isinstance(options, Mapping):
        options = {}
    return _schedule(name, "training_arguments", _positive_float(config.get("learning_rate")),
                     warmup, total, dict(options))


def _schedule(name: str, source: str, peak: float | None, warmup: int | None,
              total: int | None, raw_options: Mapping[str, Any]) -> _Schedule | None:
    if name not in _FACTORS and name not in _ADAPTIVE:
        return None
    options: dict[str, Any] = {}
    for key, value in raw_options.items():
        parsed = _OPTION_PARSERS[key](value) if key in _OPTION_PARSERS else None
        if parsed is not None:
            options[key] = parsed
    min_lr = options.pop("min_lr", None)
    if min_lr is not None and "min_lr_rate" not in options and peak:
        options["min_lr_rate"] = min_lr / peak
    if name == "warmup_stable_decay" and not {options.get("warmup_type", "linear"),
                                               options.get("decay_type", "cosine")} <= set(_SHAPES):
        return None
    if name == "constant":  # Hugging Face's constant schedule has no warmup
        warmup = 0
    return _Schedule(name, source, peak, warmup, total, options)


def _warmup(steps: Any, ratio: Any, total: int | None) -> int | None:
    """Hugging Face's ``get_warmup_steps``: whole steps, or a ratio of the run's length."""
    count = _non_negative_float(steps) if steps is not None else 0.0
    if count is None:
        return None
    if count >= 1:
        return int(count)
    share = count if count > 0 else (_non_negative_float(ratio) or 0.0)
    if share == 0:
        return 0
    return None if total is None else math.ceil(total * share)


def _first(mapping: Mapping[str, Any], *keys: str) -> Any:
    return next((mapping[k] for k in keys if mapping.get(k) is not None), None)


def _scheduler_name(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    name = value.strip().lower()
    return name.removeprefix("schedulertype.")


def _positive_float(value: Any) -> float | None:
    number = config_number(value)
    return number if number is not None and number > 0 else None


def _non_negative_float(value: Any) -> float | None:
    number = config_number(value)
    return number if number is not None and number >= 0 else None


def _positive_int(value: Any) -> int | None:
    number = config_number(value)
    return int(number) if number is not None and number >= 1 else None


def _non_negative_int(value: Any) -> int | None:
    number = config_number(value)
    return int(number) if number is not None and number >= 0 else None


def _text(value: Any) -> str | None:
    return value.strip().lower() if isinstance(value, str) and value.strip() else None


_OPTION_PARSERS: dict[str, Callable[[Any], Any]] = {
    "num_cycles": config_number, "min_lr": _non_negative_float, "min_lr_rate": _non_negative_float,
    "warmup_lr_rate": _non_negative_float, "lr_end": _non_negative_float, "power": config_number,
    "timescale": _positive_int, "num_decay_steps": _non_negative_int,
    "num_stable_steps": _non_negative_int, "warmup_type": _text, "decay_type": _text,
    "min_lr_ratio": _non_negative_float,
}


# ------------------------------------------------------- the schedules, as in transformers
# Each maps float steps to LambdaLR factors with transformers' own arithmetic
# (transformers/optimization.py), so a rebuilt schedule equals get_scheduler's to the last
# few bits; tests compare them. ``np.where`` evaluates both branches: the warnings of the
# branch not taken are silenced by the caller.
Factors = Callable[[np.ndarray, _Schedule], np.ndarray]
_SHAPES = ("linear", "cosine", "1-sqrt")


def _warm(s: np.ndarray, warmup: int) -> np.ndarray:
    return s / float(max(1, warmup))


def _progress(s: np.ndarray, sch: _Schedule) -> np.ndarray:
    assert sch.warmup is not None and sch.total is not None
    return (s - sch.warmup) / float(max(1, sch.total - sch.warmup))


def _constant(s: np.ndarray, sch: _Schedule) -> np.ndarray:
    return np.ones_like(s)


def _constant_with_warmup(s: np.ndarray, sch: _Schedule) -> np.ndarray:
    assert sch.warmup is not None
    return np.where(s < sch.warmup, s / float(max(1.0, sch.warmup)), 1.0)


def _linear(s: np.ndarray, sch: _Schedule) -> np.ndarray:
    assert sch.warmup is not None and sch.total is not None
    decay = np.maximum(0.0, (sch.total - s) / float(max(1, sch.total - sch.warmup)))
    return np.where(s < sch.warmup, _warm(s, sch.warmup), decay)


def _cosine(s: np.ndarray, sch: _Schedule) -> np.ndarray:
    assert sch.warmup is not None
    cycles = float(sch.options.get("num_cycles", 0.5))
    floor = sch.options.get("min_lr_rate", 0.0)
    factor = 0.5 * (1.0 + np.cos(math.pi * cycles * 2.0 * _progress(s, sch)))
    factor = np.maximum(0.0, factor * (1 - floor) + floor)
    return np.where(s < sch.warmup, _warm(s, sch.warmup), factor)


def _cosine_with_restarts(s: np.ndarray, sch: _Schedule) -> np.ndarray:
    assert sch.warmup is not None
    cycles = float(sch.options.get("num_cycles", 1))
    progress = _progress(s, sch)
    factor = np.maximum(0.0, 0.5 * (1.0 + np.cos(math.pi * ((cycles * progress) % 1.0))))
    return np.where(s < sch.warmup, _warm(s, sch.warmup),
                    np.where(progress >= 1.0, 0.0, factor))


def _cosine_warmup_with_min_lr(s: np.ndarray, sch: _Schedule) -> np.ndarray:
    assert sch.warmup is not None and sch.total is not None
    cycles = float(sch.options.get("num_cycles", 0.5))
    floor = sch.options.get("min_lr_rate", 0.0)
    start = sch.options.get("warmup_lr_rate")
    if start is None:
        warm = (s + 1.0) / max(1.0, float(sch.warmup))
    else:
        warm = start + (1.0 - start) * s / max(1, sch.warmup - 1)
    progress = (s - sch.warmup + 1.0) / max(1.0, float(sch.total) - sch.warmup)
    factor = 0.5 * (1.0 + np.cos(math.pi * cycles * 2.0 * progress))
    return np.where(s < sch.warmup, warm, np.maximum(0.0, factor * (1 - floor) + floor))


def _polynomial(s: np.ndarray, sch: _Schedule) -> np.ndarray:
    assert sch.warmup is not None and sch.total is not None and sch.peak is not None
    end = sch.options.get("lr_end", 1e-7)
    power = sch.options.get("power", 1.0)
    remaining = 1 - (s - sch.warmup) / (sch.total - sch.warmup)
    decay = ((sch.peak - end) * remaining**power + end) / sch.peak
    return np.where(s < sch.warmup, _warm(s, sch.warmup),
                    np.where(s > sch.total, end / sch.peak, decay))


def _inverse_sqrt(s: np.ndarray, sch: _Schedule) -> np.ndarray:
    assert sch.warmup is not None
    timescale = sch.options.get("timescale") or sch.warmup or 10_000
    decay = 1.0 / np.sqrt((s + (timescale - sch.warmup)) / timescale)
    return np.where(s < sch.warmup, _warm(s, sch.warmup), decay)


def _warmup_stable_decay(s: np.ndarray, sch: _Schedule) -> np.ndarray:
    assert sch.warmup is not None
    warmup, options = sch.warmup, sch.options
    floor = options.get("min_lr_ratio", 0.0)
    decay = options["num_decay_steps"]
    stable = options.get("num_stable_steps")
    if stable is None:
        assert sch.total is not None
        stable = sch.total - warmup - decay
    cycles = float(options.get("num_cycles", 0.5))
    rising = s / float(max(1, warmup))
    warmup_type = options.get("warmup_type", "linear")
    if warmup_type == "cosine":
        rising = 0.5 * (1.0 - np.cos(math.pi * rising))
    elif warmup_type == "1-sqrt":
        rising = 1.0 - np.sqrt(1.0 - rising)
    falling = (s - warmup - stable) / float(max(1, decay))
    decay_type = options.get("decay_type", "cosine")
    if decay_type == "linear":
        falling = 1.0 - falling
    elif decay_type == "cosine":
        falling = 0.5 * (1.0 + np.cos(math.pi * cycles * 2.0 * falling))
    else:
        falling = 1.0 - np.sqrt(falling)
    return np.select(
        [s < warmup, s < warmup + stable, s < warmup + stable + decay],
        [np.maximum(0.0, rising * (1.0 - floor) + floor), np.ones_like(s),
         np.maximum(0.0, falling * (1.0 - floor) + floor)],
        default=floor)


_FACTORS: dict[str, Factors] = {
    "constant": _constant,
    "constant_with_warmup": _constant_with_warmup,
    "linear": _linear,
    "cosine": _cosine,
    "cosine_with_restarts": _cosine_with_restarts,
    "cosine_with_min_lr": _cosine,
    "cosine_warmup_with_min_lr": _cosine_warmup_with_min_lr,
    "polynomial": _polynomial,
    "inverse_sqrt": _inverse_sqrt,
    "warmup_stable_decay": _warmup_stable_decay,
}
