"""`/run list`: the active runs, one line of health each.

Built on :func:`bot.services.status.run_status`, so a run's state (running, idle, finished,
no data) and its open alerts read the same here as in `/run status`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bot.services.digest import kind_of
from bot.services.status import RunStatus, run_status
from bot.store import Store

SEVERITY_ORDER = ("critical", "warning", "info")
ACTIVE_STATES = ("running", "idle", "no data")


@dataclass(frozen=True)
class RunHealth:
    run: str
    state: str
    attempt: int
    step: int | None
    total_steps: int | None
    loss: tuple[int, float] | None  # (step, value) of the latest train loss
    open_alerts: int
    worst_severity: str | None
    seconds_since_last_point: float | None
    # the open alerts as (kind of trouble, signal, severity, onset step, summary), worst first
    troubles: tuple[tuple[str, str, str, int, str], ...] = ()

    @property
    def rank(self) -> tuple[int, str]:
        """Worst first: critical alerts, then warnings, …, then quiet runs by name."""
        return _severity_rank(self.worst_severity or ""), self.run


def _severity_rank(severity: str) -> int:
    return SEVERITY_ORDER.index(severity) if severity in SEVERITY_ORDER else len(SEVERITY_ORDER)


def health(status: RunStatus) -> RunHealth:
    ordered = sorted(status.open_alerts, key=lambda a: _severity_rank(a["severity"]))
    worst = ordered[0]["severity"] if ordered else None
    loss = status.latest.get("train/loss")
    troubles = tuple((kind_of(a["signal"]), a["signal"], a["severity"], a["onset_step"],
                      a["summary"]) for a in ordered)
    return RunHealth(status.run, status.state, status.attempt, status.step, status.total_steps,
                     loss, len(status.open_alerts), worst, status.seconds_since_last_point,
                     troubles)


@dataclass
class RunList:
    active: list[RunHealth]
    finished: int  # finished runs left out

    @property
    def alerting(self) -> int:
        return sum(1 for r in self.active if r.open_alerts)


def list_runs(store: Store, *, now: float | None = None, include_finished: bool = False
              ) -> RunList:
    """Every run that is running, idle or has no data yet (finished ones only counted),
    the ones with the worst open alerts first."""
    now = time.time() if now is None else now
    active, finished = [], 0
    for name in store.run_names():
        item = health(run_status(store, name, now=now))
        if item.state in ACTIVE_STATES or include_finished:
            active.append(item)
        else:
            finished += 1
    return RunList(sorted(active, key=lambda r: r.rank), finished)


def latest_findings(store: Store, runs: RunList) -> dict[str, dict | None]:
    """Each active run's most recently seen finding (None for a run without one): what App
    Home shows beside the run."""
    latest: dict[str, dict | None] = {}
    for health in runs.active:
        findings = store.findings(health.run)
        latest[health.run] = max(findings, key=lambda f: f["last_seen"] or 0, default=None)
    return latest
