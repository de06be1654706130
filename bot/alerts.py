"""The alert pipeline, first version: findings → stored state → outbox → transport.

A finding is stored, and the outbox row that announces it written, in one transaction
before anything is sent. The outbox survives restarts and retries recoverable failures
with exponential backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from analyzers.base import Finding
from bot.config import OutboxConfig
from bot.notify import Message, Notifier, SendResult
from bot.store import Store
from bot.views.alerts import alert_message, resolved_message

log = logging.getLogger("runwatch.alerts")


@dataclass
class Change:
    fingerprint: str
    run: str
    signal: str
    transition: str  # "firing", "resolved" or "updated"


def reconcile(store: Store, run: str, attempt: int, findings: list[Finding], *,
              signals: set[str], channel: str, now: float | None = None,
              catching_up: bool = False) -> list[Change]:
    """Merge the analyzers' view of one run into the stored findings.

    New firing findings are announced once; a stored firing finding that is now resolved,
    or that the analyzers that produced it no longer report, gets a resolved notice. A
    finding first seen already resolved began and ended between two polls: it is announced
    with its resolution, unless ``catching_up`` (the history a run had before runwatch
    started watching it), which is kept silently.
    """
    now = time.time() if now is None else now
    changes: list[Change] = []
    seen = {f.fingerprint for f in findings}
    with store.transaction() as db:
        for finding in findings:
            existing = store.finding(finding.fingerprint)
            was_firing = bool(existing and existing["state"] == "firing")
            if finding.state == "firing" and not was_firing:
                store.save_finding(db, finding, now, existing)
                store.enqueue(db, kind="alert", fingerprint=finding.fingerprint, run=run,
                              channel=channel, now=now)
                changes.append(Change(finding.fingerprint, run, finding.signal, "firing"))
            elif finding.state == "resolved" and existing is None and not catching_up:
                store.save_finding(db, finding, now, existing)
                for kind in ("alert", "resolved"):
                    store.enqueue(db, kind=kind, fingerprint=finding.fingerprint, run=run,
                                  channel=channel, now=now)
                changes.append(Change(finding.fingerprint, run, finding.signal, "firing"))
                changes.append(Change(finding.fingerprint, run, finding.signal, "resolved"))
            elif finding.state == "resolved" and was_firing:
                store.save_finding(db, finding, now, existing)
                store.enqueue(db, kind="resolved", fingerprint=finding.fingerprint, run=run,
                              channel=channel, now=now)
                changes.append(Change(finding.fingerprint, run, finding.signal, "resolved"))
            else:
                store.save_finding(db, finding, now, existing)
                if existing is not None:
                    changes.append(Change(finding.fingerprint, run, finding.signal, "updated"))
        for row in store.findings(run=run, state="firing"):
            superseded = row["attempt"] < attempt  # the run went back and started again
            if row["fingerprint"] in seen or (row["signal"] not in signals and not superseded):
                continue
            db["findings"].update(row["fingerprint"], {"state": "resolved", "resolved_at": now,
                                                       "last_seen": now})
            store.enqueue(db, kind="resolved", fingerprint=row["fingerprint"], run=run,
                          channel=channel, now=now)
            changes.append(Change(row["fingerprint"], run, row["signal"], "resolved"))
    return changes


class Outbox:
    """Sends pending messages in order; a failure is retried only when recoverable."""

    def __init__(self, store: Store, notifier: Notifier, settings: OutboxConfig | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.notifier = notifier
        self.settings = settings or OutboxConfig()
        self.clock = clock
        self._lock = threading.Lock()  # the poll and the retry job must not send a row twice

    def dispatch(self) -> int:
        """Send what is due; returns how many messages went out."""
        with self._lock:
            return self._dispatch()

    def _dispatch(self) -> int:
        sent = 0
        for row in self.store.pending_outbox():
            if row["next_attempt_at"] > self.clock():
                break  # the head is backing off after a recoverable failure: keep the order
            finding = self.store.finding(row["fingerprint"])
            if finding is None:
                self.store.update_outbox(row["id"], state="failed",
                                         last_error="finding no longer stored")
                continue
            thread_ts = None
            if row["kind"] == "resolved":
                thread = self.store.alert_thread(row["fingerprint"])
                if thread is None and self._alert_pending(row["fingerprint"]):
                    continue  # the alert itself goes first; the notice answers in its thread
                thread_ts = thread["ts"] if thread else None
            try:
                result = self.notifier.post(row["channel"], self._message(row, finding),
                                            thread_ts=thread_ts)
            except Exception as exc:  # a bug in one message must not block the queue
                log.exception("%s for run %s could not be sent", row["kind"], row["run"])
                result = SendResult(False, False, f"{type(exc).__name__}: {exc}")
            now = self.clock()
            if result.ok:
                self.store.record_sent(row["id"], channel=result.channel, ts=result.ts,
                                       fingerprint=row["fingerprint"], run=row["run"],
                                       kind=row["kind"], now=now)
                sent += 1
                log.info("sent %s for run %s step %s (%s)", row["kind"], row["run"],
                         finding["detected_step"], finding["signal"])
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
            if result.recoverable:
                break  # the transport is down or rate-limited: keep the order, try later
        return sent

    def _message(self, row: dict, finding: dict) -> Message:
        if row["kind"] == "resolved":
            run = self.store.run(row["run"])
            return resolved_message(finding, run["attempt"] if run else None)
        return alert_message(finding)

    def _alert_pending(self, fingerprint: str) -> bool:
        return bool(self.store.query(
            "SELECT 1 FROM outbox WHERE fingerprint = ? AND kind = 'alert' AND state = 'pending'",
            (fingerprint,)))
