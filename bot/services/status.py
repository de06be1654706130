"""`/run status RUN` and `runwatch status RUN`: one service behind both."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from bot.services.stoploss import declared_rule, describe
from bot.store import Store, UnknownRun

STATUS_TAGS = ("train/loss", "eval/loss", "lr", "grad_norm", "throughput", "gpu_mem")
IDLE_AFTER_INTERVALS = 10  # no new step for this many usual step intervals → idle
IDLE_MIN_SECONDS = 120.0


@dataclass
class RunStatus:
    run: str
    state: str  # running, idle, finished, no data
    attempt: int
    step: int | None
    total_steps: int | None
    eta_seconds: float | None
    latest: dict[str, tuple[int, float]]  # tag → (step, value)
    last_checkpoint: dict[str, Any] | None  # step, path, age_seconds
    open_alerts: list[dict[str, Any]]
    malformed_lines: int = 0
    first_malformed_line: int | None = None
    first_malformed_error: str | None = None
    skipped_values: int = 0
    last_notice: str | None = None
    seconds_since_last_point: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def progress(self) -> float | None:
        if self.step is None or not self.total_steps:
            return None
        return min(1.0, self.step / self.total_steps)


def _step_rate(points: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(steps per second, median seconds per step) over the recent points with wall times."""
    timed = [(p["step"], p["wall_time"]) for p in points if p["wall_time"] is not None]
    if len(timed) < 2:
        return None, None
    timed.sort()
    (s0, t0), (s1, t1) = timed[0], timed[-1]
    if t1 <= t0 or s1 <= s0:
        return None, None
    gaps = sorted((b[1] - a[1]) / (b[0] - a[0])
                  for a, b in zip(timed, timed[1:], strict=False) if b[0] > a[0])
    return (s1 - s0) / (t1 - t0), gaps[len(gaps) // 2] if gaps else None


def run_status(store: Store, run: str, now: float | None = None) -> RunStatus:
    now = time.time() if now is None else now
    info = store.run(run)
    if info is None:
        raise UnknownRun(run, store.run_names())
    attempt = info["attempt"]
    latest = {}
    for tag in STATUS_TAGS:
        point = store.latest(run, attempt, tag)
        if point is not None:
            latest[tag] = (point["step"], point["value"])
    recent = store.recent_steps(run, attempt, limit=50)
    step = recent[0]["step"] if recent else None
    rate, seconds_per_step = _step_rate(recent)
    total = info.get("total_steps")
    last_wall = recent[0]["wall_time"] if recent else None
    since = now - last_wall if last_wall is not None else (
        now - info["last_point_at"] if info.get("last_point_at") else None)
    if step is None:
        state = "no data"
    elif total and step >= total:
        state = "finished"
    else:
        idle_after = max(IDLE_MIN_SECONDS, IDLE_AFTER_INTERVALS * (seconds_per_step or 0))
        state = "idle" if since is not None and since > idle_after else "running"
    eta = None
    if state == "running" and total and rate and step is not None:
        eta = (total - step) / rate
    checkpoints = store.checkpoints(run)
    last_checkpoint = None
    if checkpoints:
        cp = checkpoints[-1]
        age = now - cp.wall_time if cp.wall_time is not None else None
        last_checkpoint = {"step": cp.step, "path": cp.path, "age_seconds": age}
    open_alerts = [
        {"signal": f["signal"], "severity": f["severity"], "summary": f["summary"],
         "onset_step": f["onset_step"]}
        for f in store.findings(run=run, state="firing")
    ]
    return RunStatus(
        run=run, state=state, attempt=attempt, step=step, total_steps=total, eta_seconds=eta,
        latest=latest, last_checkpoint=last_checkpoint, open_alerts=open_alerts,
        malformed_lines=info.get("malformed_lines") or 0,
        first_malformed_line=info.get("first_malformed_line"),
        first_malformed_error=info.get("first_malformed_error"),
        skipped_values=info.get("skipped_values") or 0, last_notice=info.get("last_notice"),
        seconds_since_last_point=since, extra=_declared(store, run),
    )


def _declared(store: Store, run: str) -> dict[str, Any]:
    """What the team agreed for the run before it ran, shown beside its state."""

    rule, _ = declared_rule(store, run)
    return {"stop-loss": describe(rule)} if rule else {}


def fmt_value(value: float) -> str:
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e5:
        return f"{value:.3g}"
    return f"{value:.4g}"


def progress_bar(fraction: float, width: int = 20) -> str:
    filled = int(round(fraction * width))
    return "█" * filled + "░" * (width - filled)
