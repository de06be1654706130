"""APScheduler (3.x) drives the watch loop: a poll every ``poll_interval`` seconds, and an
outbox pass in between so a retry does not wait for the next poll."""

from __future__ import annotations

import logging
import math
from datetime import datetime

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
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


class _Overruns(logging.Filter):
    """Says in runwatch's words when a pass is skipped because the one before it is still
    running (APScheduler's own warning names the job's repr and reads like a failure; it is
    dropped): the first, the tenth, the hundredth … of each job, with what to do."""

    def __init__(self, intervals: dict[str, float]) -> None:
        super().__init__()
        self.intervals = intervals  # job id → seconds between its passes
        self.skipped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances" not in str(record.msg)

    def __call__(self, event: JobSubmissionEvent) -> None:
        count = self.skipped[event.job_id] = self.skipped.get(event.job_id, 0) + 1
        if count != 10 ** (len(str(count)) - 1):
            return
        advice = ("; if this keeps happening, raise poll_interval in the config"
                  if event.job_id == "poll" else "")
        log.warning("%s: a pass was still running when the next was due (every %gs), so "
                    "that one was skipped (%d skipped so far)%s", event.job_id,
                    self.intervals.get(event.job_id, math.nan), count, advice)


def start_scheduler(engine: Engine, *, first_poll_now: bool = True) -> BackgroundScheduler:
    """Poll on the interval; sending runs as its own job so a slow or unreachable Slack never
    delays reading the runs. A poll that queued messages wakes the sender at once."""
    interval = engine.settings.config.poll_interval
    scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1,
                                                  "misfire_grace_time": None})

    def poll() -> None:
        report = engine.poll(dispatch=False)
        if scheduler.running and engine.outbox is not None and any(
                c.transition != "updated" for c in report.changes):
            scheduler.modify_job("outbox", next_run_time=datetime.now())

    def wake_sender() -> None:  # the fast lane queued a critical alert mid-pass
        if scheduler.running and engine.outbox is not None:
            scheduler.modify_job("outbox", next_run_time=datetime.now())

    engine.on_urgent.append(wake_sender)
    intervals = {"poll": interval, "outbox": min(interval, OUTBOX_INTERVAL_SECONDS)}
    scheduler.add_job(_safe(poll, "poll"), "interval", seconds=interval, id="poll",
                      next_run_time=datetime.now() if first_poll_now else None)
    if engine.outbox is not None:
        scheduler.add_job(_safe(engine.outbox.dispatch, "outbox"), "interval",
                          seconds=intervals["outbox"], id="outbox")
    overruns = _Overruns(intervals)
    aps_log = logging.getLogger("apscheduler.scheduler")
    for earlier in [f for f in aps_log.filters if isinstance(f, _Overruns)]:
        aps_log.removeFilter(earlier)  # one per process: the latest scheduler's
    aps_log.addFilter(overruns)
    scheduler.add_listener(overruns, EVENT_JOB_MAX_INSTANCES)
    scheduler.start()
    log.info("polling every %ss", interval)
    return scheduler
