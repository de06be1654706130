"""The daily digest (issue 26 part 6): one message per channel, readable in 20 seconds, grouped
by the three kinds of trouble of seed §1.1 — *slow*, *not learning well*, *keeps stopping* —
so "the platform is bad" becomes a specific kind with its path.

Owns :func:`build_digest` (facts from the store, a pure function of the store and ``now``; the
settings changed come from :mod:`bot.services.changes`, as ``/run changes`` lists them) and
:func:`schedule_digest` (an APScheduler cron job that posts it at the configured time through
the bot's notifier); ``/run digest`` shows the same facts on demand.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from analyzers.catalog import CATALOG
from bot.services.changes import Change, changes_since
from bot.services.status import run_status
from bot.store import Store

log = logging.getLogger("runwatch.digest")

KINDS = ("slow", "not learning well", "keeps stopping")
# the catalog's kinds of trouble (analyzers/catalog.py) in the digest's words
KIND_LABELS = {"slow": "slow", "not_learning": "not learning well",
               "cant_finish": "keeps stopping"}
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
DAY_S = 24 * 3600.0


def kind_of(signal: str) -> str:
    """The kind of trouble a signal is.

    >>> [kind_of(s) for s in ("throughput_drop", "stalled", "overfit")]
    ['slow', 'keeps stopping', 'not learning well']
    """
    spec = CATALOG.get(signal)
    return KIND_LABELS[spec.kind] if spec else "not learning well"


@dataclass
class Digest:
    since: float
    now: float
    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)  # idle before their last step
    opened: list[dict[str, Any]] = field(default_factory=list)
    resolved: list[dict[str, Any]] = field(default_factory=list)
    still_open: list[dict[str, Any]] = field(default_factory=list)
    best_eval: dict[str, tuple[float, int, str]] = field(default_factory=dict)  # run → best
    past_stop_loss: list[str] = field(default_factory=list)
    changed: list[tuple[str, Change]] = field(default_factory=list)  # run, its change
    by_kind: dict[str, list[str]] = field(default_factory=dict)  # kind → lines
    look_first: str | None = None


def _finding_line(f: dict[str, Any]) -> str:
    return f"{f['run']}: {f['summary']}"


def _trend(values: list[float]) -> str:
    if len(values) < 2:
        return "one evaluation"
    before, last = values[-min(len(values), 4)], values[-1]
    if before == 0:
        return "flat"
    change = (last - before) / abs(before)
    return "flat" if abs(change) < 0.005 else ("improving" if change < 0 else "worsening")


def build_digest(store: Store, now: float | None = None, period_s: float = DAY_S) -> Digest:
    now = time.time() if now is None else now
    since = now - period_s
    digest = Digest(since=since, now=now)
    digest.by_kind = {kind: [] for kind in KINDS}
    for name in store.run_names():
        info = store.run(name) or {}
        status = run_status(store, name, now=now)
        if (info.get("created_at") or 0) >= since:
            digest.started.append(name)
        if status.state == "finished" and (info.get("last_point_at") or 0) >= since:
            digest.finished.append(name)
        if status.state == "idle":
            digest.stopped.append(name)
            digest.by_kind["keeps stopping"].append(
                f"{name}: no new step for a while at step {status.step}"
                + (f" of {status.total_steps}" if status.total_steps else ""))
        if status.attempt > 1:
            digest.by_kind["keeps stopping"].append(f"{name}: on attempt {status.attempt}")
        if status.state in ("running", "idle"):
            evals = store.logged_values(name, status.attempt, "eval/loss")
            if evals:
                best = min(evals)
                step = store.first_step_with(name, status.attempt, "eval/loss", best)
                digest.best_eval[name] = (best, step, _trend(evals))
        digest.changed += [(name, c) for c in changes_since(store, name, since)]
    for f in store.findings():
        if (f.get("first_seen") or 0) >= since:
            digest.opened.append(f)
        if f["state"] == "resolved" and (f.get("resolved_at") or 0) >= since:
            digest.resolved.append(f)
        if f["state"] in ("firing", "pending"):
            digest.still_open.append(f)
            if f["signal"] == "diminishing_returns":
                digest.past_stop_loss.append(f["run"])
            else:
                digest.by_kind[kind_of(f["signal"])].append(_finding_line(f))
    worst = sorted(digest.still_open, key=lambda f: (SEVERITY_RANK.get(f["severity"], 3),
                                                    -(f.get("last_seen") or 0)))
    if worst:
        digest.look_first = f"{_finding_line(worst[0])} ({kind_of(worst[0]['signal'])})"
    elif digest.stopped:
        digest.look_first = f"{digest.stopped[0]} has stopped logging (keeps stopping)"
    return digest


def schedule_digest(scheduler: Any, cron: str, post: Callable[[], None],
                    timezone: str = "UTC") -> None:
    """Post the digest at ``cron`` (crontab fields: ``"0 9 * * *"`` is 09:00 every day)."""
    from apscheduler.triggers.cron import CronTrigger

    def run() -> None:
        try:
            post()
        except Exception:  # one failed digest must not stop the scheduler's other jobs
            log.exception("the daily digest failed; the next one runs as scheduled")

    scheduler.add_job(run, CronTrigger.from_crontab(cron, timezone=timezone), id="digest",
                      replace_existing=True)
    log.info("daily digest at %r (%s)", cron, timezone)
