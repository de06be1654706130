"""The durable outbox: what the pipeline queued, sent in order to the transport.

The :class:`Outbox` draws each message from the state at the moment it is sent and retries
recoverable failures with exponential backoff. Right after an alert message is posted it
uploads the alert's chart into its thread (when the transport can upload); a chart that fails
recoverably is queued as a "chart" row and retried without holding back the rest of the
queue, and a chart never delays or drops the alert itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from bot.alerting.notify import Notifier, SendResult, Uploader
from bot.charts import finding_chart
from bot.config import OutboxConfig
from bot.store import Store
from bot.views.alerts import joined_message, resolved_message
from bot.views.lifecycle import (
    escalation_message,
    group_message,
    repeat_message,
)

log = logging.getLogger("runwatch.outbox")

# -- the outbox -----------------------------------------------------------------------------


class Outbox:
    """Sends pending messages in order; a failure is retried only when recoverable."""

    def __init__(self, store: Store, notifier: Notifier, settings: OutboxConfig | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.notifier = notifier
        self.settings = settings or OutboxConfig()
        self.clock = clock
        # the poll and the retry job must not send a row twice; held while a pass sends
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._urgent = threading.Event()

    def urgent(self) -> None:
        """A critical alert was queued: a running pass starts over from the head of the
        queue after the message it is sending, so it does not wait behind the others."""
        self._urgent.set()

    def request_stop(self) -> None:
        """End the running pass after the message it is sending (SIGTERM); what is left
        stays in the outbox for the next start."""
        self._stop.set()

    def dispatch(self) -> int:
        """Send what is due; returns how many messages went out."""
        with self.lock:
            return self._dispatch()

    def _dispatch(self) -> int:
        sent = 0
        if self._stop.is_set() or not self._settle_in_doubt():
            return sent
        self._urgent.clear()
        for row in self._critical_first(self.store.pending_outbox()):
            if self._stop.is_set():
                break
            if self._urgent.is_set():
                return sent + self._dispatch()
            if row["next_attempt_at"] > self.clock():
                if row["attempts"] and row["kind"] != "chart":
                    break  # the head is backing off after a recoverable failure: keep order
                continue  # held back by its group's wait
            message = self._message_row(row)
            if message is None:
                self.store.update_outbox(row["id"], state="failed",
                                         last_error="alert no longer stored")
                continue
            if row["kind"] != "alert" and message["ts"] is None:
                if self._post_pending(message["id"]):
                    continue  # the message goes first; the rest edits it or answers in it
                if row["kind"] == "update":
                    self.store.update_outbox(row["id"], state="failed",
                                             last_error="the message was never posted")
                    continue
            if row["kind"] == "alert" and message["ts"] is not None:
                self.store.update_outbox(row["id"], state="sent", last_error="already posted")
                continue
            if row["kind"] == "update" and not hasattr(self.notifier, "update"):
                self.store.update_outbox(row["id"], state="skipped",
                                         last_error="the transport cannot edit messages")
                continue
            if row["kind"] == "chart" and not hasattr(self.notifier, "upload"):
                self.store.update_outbox(row["id"], state="skipped",
                                         last_error="the transport cannot upload files")
                continue
            # Marked before the call: if runwatch dies before recording the answer, the next
            # start asks the transport whether it arrived instead of sending it twice.
            self.store.update_outbox(row["id"], state="sending")
            try:
                result = self._send(row, message)
            except Exception as exc:  # a bug in one message must not block the queue
                log.exception("%s for run %s could not be sent", row["kind"], row["run"])
                result = SendResult(False, False, f"{type(exc).__name__}: {exc}")
            now = self.clock()
            if result.ok:
                self.store.record_sent(row["id"], channel=result.channel, ts=result.ts,
                                       fingerprint=row["fingerprint"], run=row["run"],
                                       kind=row["kind"], now=now, message_id=message["id"])
                sent += 1
                log.info("sent %s for run %s", row["kind"], row["run"])
                if row["kind"] == "alert" and hasattr(self.notifier, "upload"):
                    self._first_chart(row, message["id"], result)
                continue
            attempts = row["attempts"] + 1
            give_up = not result.recoverable or attempts >= self.settings.max_attempts
            delay = min(self.settings.backoff_seconds * 2 ** (attempts - 1),
                        self.settings.backoff_max_seconds)
            self.store.update_outbox(row["id"], attempts=attempts, last_error=result.reason,
                                     state="failed" if give_up else "pending",
                                     next_attempt_at=now + delay)
            log.warning("%s for run %s not sent (attempt %d): %s%s", row["kind"], row["run"],
                        attempts, result.reason,
                        "; giving up" if give_up else f"; retrying in {delay:.0f}s")
            if result.recoverable and row["kind"] != "chart":
                break  # the transport is down or rate-limited: keep the order, try later
        return sent

    def _critical_first(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The pending rows of messages that show a firing critical alert first, each part
        in its order (a message's rows keep theirs): a NaN's alert never waits behind a
        backlog of warnings."""
        firing = self.store.firing_critical_alerts()
        messages = {r["message_id"] for r in firing if r["message_id"] is not None}
        fingerprints = {r["fingerprint"] for r in firing}
        return sorted(rows, key=lambda row: not (
            row["message_id"] in messages if row.get("message_id") is not None
            else row["fingerprint"] in fingerprints))

    def _settle_in_doubt(self) -> bool:
        """Rows a crash left between sending and recording: recorded if the transport has
        them, queued again if not. False when the transport cannot tell now."""
        for row in self.store.sending_outbox():
            message = self._message_row(row)
            finder = getattr(self.notifier, "find", None)
            if row["kind"] in ("update", "chart") or message is None or finder is None:
                if row["kind"] != "update" and message is not None:
                    log.warning("%s for run %s may have been sent before a crash; this "
                                "transport cannot tell, sending it again", row["kind"],
                                row["run"])
                self.store.update_outbox(row["id"], state="pending")
                continue
            thread_ts = message["ts"] if row["kind"] != "alert" else None
            channel = message["channel"] if thread_ts else row["channel"]
            found = finder(channel, _key(row), thread_ts=thread_ts)
            if found.ok:
                log.info("%s for run %s was sent before a crash; recorded", row["kind"],
                         row["run"])
                self.store.record_sent(row["id"], channel=found.channel, ts=found.ts,
                                       fingerprint=row["fingerprint"], run=row["run"],
                                       kind=row["kind"], now=self.clock(),
                                       message_id=message["id"])
            elif found.recoverable:
                log.warning("cannot check whether %s for run %s was sent: %s", row["kind"],
                            row["run"], found.reason)
                return False
            else:
                self.store.update_outbox(row["id"], state="pending")
        return True

    def _first_chart(self, row: dict[str, Any], message_id: int, posted: SendResult) -> None:
        """The chart of a just-posted alert, into its thread; queued for a retry when the
        transport failed recoverably, logged and left out otherwise."""
        try:
            result = self._upload_chart(row, posted.channel or row["channel"], posted.ts)
        except Exception as exc:  # a chart must never cost the alert or the queue
            log.warning("chart for %s on run %s not drawn: %s: %s", row["fingerprint"],
                        row["run"], type(exc).__name__, exc)
            return
        if result.ok:
            log.info("sent chart for run %s (%s)", row["run"], result.reason)
            return
        log.warning("chart for run %s not sent: %s%s", row["run"], result.reason,
                    "; queued for a retry" if result.recoverable else "")
        if result.recoverable:
            now = self.clock()
            self.store.enqueue_retry(kind="chart", fingerprint=row["fingerprint"],
                                     run=row["run"], channel=row["channel"], now=now,
                                     message_id=message_id,
                                     due=now + self.settings.backoff_seconds,
                                     error=result.reason)

    def _upload_chart(self, row: dict[str, Any], channel: str, thread_ts: str | None
                      ) -> SendResult:
        finding = self.store.finding(row["fingerprint"])
        if finding is None:
            return SendResult(False, False, "finding no longer stored")
        chart = finding_chart(self.store, finding)
        return cast(Uploader, self.notifier).upload(channel, thread_ts, chart.filename,
                                                    chart.png, chart.title, chart.comment)

    def _send(self, row: dict[str, Any], message: dict[str, Any]) -> SendResult:
        if row["kind"] == "chart":
            return self._upload_chart(row, message["channel"], message["ts"])
        if row["kind"] in ("alert", "update"):
            drawn = group_message(self._members(message["id"]), now=self.clock())
            if row["kind"] == "alert":
                drawn.key = _key(row)
                return self.notifier.post(row["channel"], drawn)
            return self.notifier.update(message["channel"], message["ts"],  # type: ignore
                                        drawn)
        finding = self.store.finding(row["fingerprint"])
        if finding is None:
            return SendResult(False, False, "finding no longer stored")
        alert = self.store.alert(row["fingerprint"])
        assert alert is not None, row
        if row["kind"] == "resolved":
            run = self.store.run(row["run"])
            reply = resolved_message(finding, run["attempt"] if run else None)
        elif row["kind"] == "joined":
            reply = joined_message(finding)
        elif row["kind"] == "repeat":
            reply = repeat_message(finding, alert, now=self.clock())
        else:
            reply = escalation_message(finding, alert, self.store.group_oncall(alert["group_key"]),
                                       now=self.clock())
        channel = message["channel"] if message["ts"] else row["channel"]
        reply.key = _key(row)
        return self.notifier.post(channel, reply, thread_ts=message["ts"])

    def _message_row(self, row: dict[str, Any]) -> dict[str, Any] | None:
        message_id = row.get("message_id")
        if message_id is None:  # queued by runwatch before the alert lifecycle
            alert = self.store.alert(row["fingerprint"])
            message_id = alert["message_id"] if alert else None
        if message_id is None:
            return None
        return self.store.alert_message(message_id)

    def _members(self, message_id: int) -> list[dict[str, Any]]:
        return self.store.message_members(message_id)

    def _post_pending(self, message_id: int) -> bool:
        return self.store.post_queued(message_id)


def _key(row: dict[str, Any]) -> str:
    """Unique per outbox row, also across databases (a reset store reuses ids)."""
    return f"{row['id']}-{row['created_at']:.6f}"
