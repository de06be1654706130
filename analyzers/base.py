"""The analyzer contract: a run's data in, findings shaped like Prometheus alerts out.

Analyzers are pure: ``detect(data)`` reads a :class:`RunData` and returns every finding
(firing or already resolved) that the current attempt's history supports. They never
touch the store, Slack or a process; a fix is a *request* that only ``connectors`` can
carry out after a person confirms.
"""

from __future__ import annotations

import hashlib
import json
import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from numbers import Integral, Real
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd

Severity = Literal["critical", "warning", "info"]
State = Literal["firing", "resolved"]
TroubleKind = Literal["slow", "not_learning", "cant_finish"]

METRIC_COLUMNS = ["step", "tag", "value", "wall_time"]

TROUBLE_KINDS: dict[str, str] = {
    "slow": "slow: the run advances but each step takes too long",
    "not_learning": "not learning well: speed is fine but results miss",
    "cant_finish": "can't finish: interruptions, pre-emption, restarting from scratch",
}


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str
    wall_time: float | None = None


@dataclass(frozen=True)
class Fix:
    """One recommended fix. ``request`` names an action a connector can carry out."""

    text: str
    source: str
    request: Literal["rollback", "stop"] | None = None


@dataclass(frozen=True)
class RollbackTarget:
    step: int
    path: str
    reason: str


@dataclass
class RunData:
    """The current attempt of one run, as the store hands it to analyzers.

    ``metrics`` is the normalised long frame (``step, tag, value, wall_time``) of this
    attempt only; non-finite values are kept, they are a signal.
    """

    run: str
    metrics: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=METRIC_COLUMNS))
    attempt: int = 1
    checkpoints: list[Checkpoint] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    _series: dict[str, pd.Series] = field(default_factory=dict, init=False, repr=False,
                                          compare=False)

    @classmethod
    def from_series(
        cls,
        run: str,
        series: dict[str, list[float] | np.ndarray | pd.Series],
        *,
        steps: list[int] | np.ndarray | None = None,
        checkpoints: list[Checkpoint] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> RunData:
        """Build run data from plain sequences; steps default to 1, 2, 3, …"""
        frames = []
        for tag, values in series.items():
            if isinstance(values, pd.Series):
                frames.append(pd.DataFrame({"step": values.index, "tag": tag,
                                            "value": values.to_numpy(dtype=float)}))
                continue
            values = np.asarray(values, dtype=float)
            idx = (np.arange(1, len(values) + 1) if steps is None
                   else np.asarray(steps)[: len(values)])
            frames.append(pd.DataFrame({"step": idx, "tag": tag, "value": values}))
        frame = (pd.concat(frames, ignore_index=True) if frames
                 else pd.DataFrame(columns=METRIC_COLUMNS))
        frame["wall_time"] = np.nan
        return cls(run=run, metrics=frame[METRIC_COLUMNS], checkpoints=checkpoints or [],
                   meta=meta or {})

    def tags(self) -> list[str]:
        return sorted(self.metrics["tag"].unique().tolist()) if len(self.metrics) else []

    def series(self, tag: str) -> pd.Series:
        """Values of one tag indexed by step, ascending; a repeated step keeps its last value.

        Run data is read-only once built, so each tag is extracted once (numpy, not pandas
        filtering: several analyzers ask for the same tags on every poll).
        """
        cached = self._series.get(tag)
        if cached is not None:
            return cached
        mask = self.metrics["tag"].to_numpy() == tag
        steps = self.metrics["step"].to_numpy()[mask].astype("int64")
        values = self.metrics["value"].to_numpy()[mask].astype(float)
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
        last = np.ones(len(steps), dtype=bool)
        last[:-1] = steps[1:] != steps[:-1]
        series = pd.Series(values[last], index=pd.Index(steps[last], dtype="int64", name="step"),
                           dtype=float)
        self._series[tag] = series
        return series

    def last_step(self) -> int | None:
        return int(self.metrics["step"].max()) if len(self.metrics) else None


def rollback_target(checkpoints: list[Checkpoint], onset_step: int,
                    margin: int = 1) -> RollbackTarget | None:
    """The latest checkpoint strictly before ``onset_step - margin``.

    The loss logged at step ``s`` was computed with the weights that the update of step
    ``s - 1`` produced, so with the default margin of one step neither the checkpoint at
    the onset nor the one just before it (which may hold the update that caused the
    trouble, e.g. a too-large learning rate) is offered.

    >>> cps = [Checkpoint(100, "ckpt/checkpoint-100"), Checkpoint(200, "ckpt/checkpoint-200")]
    >>> rollback_target(cps, 250).step
    200
    >>> rollback_target(cps, 201).step
    100
    >>> rollback_target(cps, 101) is None
    True
    """
    limit = onset_step - margin
    before = [c for c in checkpoints if c.step < limit]
    if not before:
        return None
    best = max(before, key=lambda c: c.step)
    return RollbackTarget(
        step=best.step,
        path=best.path,
        reason=(f"latest checkpoint at least {margin + 1} steps before the onset at step "
                f"{onset_step}" if margin else
                f"latest checkpoint before the onset at step {onset_step}"),
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (np.floating, np.integer)):
        return _jsonable(value.item())
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


@dataclass
class Finding:
    """One alert. Labels (run, attempt, signal, metric, onset) identify it; the rest annotates."""

    run: str
    signal: str
    severity: Severity
    metric: str
    onset_step: int
    detected_step: int
    summary: str
    evidence: dict[str, Any]
    fixes: list[Fix]
    kind: TroubleKind
    source: str
    rollback_to: RollbackTarget | None = None
    state: State = "firing"
    resolved_step: int | None = None
    attempt: int = 1

    @property
    def labels(self) -> dict[str, str]:
        return {"run": self.run, "attempt": str(self.attempt), "signal": self.signal,
                "metric": self.metric, "onset": str(self.onset_step)}

    @property
    def fingerprint(self) -> str:
        text = json.dumps(self.labels, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fingerprint"] = self.fingerprint
        return _jsonable(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["fixes"] = [Fix(**f) for f in data.get("fixes", [])]
        if data.get("rollback_to"):
            data["rollback_to"] = RollbackTarget(**data["rollback_to"])
        return cls(**data)


def fmt_number(value: float) -> str:
    """A metric value for a summary sentence: two decimals from 1 up, three digits below."""
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def check_metric(metric: object) -> None:
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"metric must be a non-empty tag name, got {metric!r}")


def check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_real(name: str, value: object, minimum: float, *, allow_equal: bool = False,
               below: float | None = None) -> None:
    """A finite number above ``minimum`` (or equal, when allowed) and under ``below``."""
    ok = (not isinstance(value, bool) and isinstance(value, Real) and math.isfinite(value)
          and (value >= minimum if allow_equal else value > minimum)
          and (below is None or value < below))
    if not ok:
        relation = ">=" if allow_equal else ">"
        bound = f" and < {below}" if below is not None else ""
        raise ValueError(f"{name} must be a finite number {relation} {minimum}{bound}, "
                         f"got {value!r}")


BEFORE_ONSET = object()  # Analyzer.finding's default: roll back to before the onset


class Analyzer(ABC):
    """Base class: subclasses set ``signal`` and implement :meth:`detect`.

    Constructor parameters are stored unchanged under their own names; bad values raise
    ``ValueError`` at construction, naming the parameter.
    """

    signal: ClassVar[str]
    metric: str

    @abstractmethod
    def detect(self, data: RunData) -> list[Finding]:
        """Every finding the current attempt supports, firing or resolved, oldest first."""

    def finding(self, data: RunData, *, onset_step: int, detected_step: int, summary: str,
                evidence: dict[str, Any], resolved_step: int | None = None,
                severity: Severity = "warning", metric: str | None = None,
                rollback_to: RollbackTarget | None | object = BEFORE_ONSET) -> Finding:
        """A finding of this signal: identity from the run, fixes, kind and source from the
        catalog, state from ``resolved_step``; the rollback target defaults to the latest
        checkpoint before the onset (pass ``None`` where rolling back would not help)."""
        from analyzers.catalog import CATALOG  # the catalog builds on this module

        spec = CATALOG[self.signal]
        return Finding(
            run=data.run, attempt=data.attempt, signal=self.signal, severity=severity,
            metric=metric or self.metric, onset_step=onset_step, detected_step=detected_step,
            summary=summary, evidence=evidence, fixes=list(spec.fixes), kind=spec.kind,
            source=spec.source,
            rollback_to=(rollback_target(data.checkpoints, onset_step)
                         if rollback_to is BEFORE_ONSET else rollback_to),
            state="firing" if resolved_step is None else "resolved",
            resolved_step=resolved_step)

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}
