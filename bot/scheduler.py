"""APScheduler (3.x) drives the watch loop: a poll every ``poll_interval`` seconds, and an
outbox pass in between so a retry does not wait for the next poll."""

from __future__ import annotations

import logging
from datetime import datetime

from apscheduler.schedulers.background import BackgroundScheduler

from bot.engine import Engine

log = logging.getLogger("runwatch.scheduler")

OUTBOX_INTERVAL_SECONDS = 5.0


def _safe(job, name: str):
    def run() -> None:
        try:
            job()
        except Exception:  # the scheduler must keep polling whatever one pass hits
            log.exception("%s failed; the next pass runs as scheduled", name)

    return run


def start_scheduler(engine: Engine, *, first_poll_now: bool = True) -> BackgroundScheduler:
    """Poll on the interval; sending runs as its own job so a slow or unreachable Slack never
    delays reading the runs. A poll that queued messages wakes the sender at once."""
    interval = engine.settings.config.poll_interval
    scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1,
                                                  "misfire_grace_time": None})

    def poll() -> None:
        report = engine.poll(dispatch=False)
        if engine.outbox is not None and any(c.transition != "updated"
                                             for c in report.changes):
            scheduler.modify_job("outbox", next_run_time=datetime.now())

    scheduler.add_job(_safe(poll, "poll"), "interval", seconds=interval, id="poll",
                      next_run_time=datetime.now() if first_poll_now else None)
    if engine.outbox is not None:
        scheduler.add_job(_safe(engine.outbox.dispatch, "outbox"), "interval",
                          seconds=min(interval, OUTBOX_INTERVAL_SECONDS), id="outbox")
    scheduler.start()
    log.info("polling every %ss", interval)
    return scheduler
