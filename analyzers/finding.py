"""A finding: one alert shaped like a Prometheus alert (labels identify it, the rest annotates),
with its fixes, its kind of trouble and the checkpoint to roll back to."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

Severity = Literal["critical", "warning", "info"]


State = Literal["firing", "resolved"]


TroubleKind = Literal["slow", "not_learning", "cant_finish"]


TROUBLE_KINDS: dict[str, str] = {
    "slow": "slow: the run advances but each step takes too long",
    "not_learning": "not learning well: speed is fine but results miss",
    "cant_finish": "can't finish: interruptions, pre-emption, restarting from scratch",
}


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
