"""The store's action concern: requests to stop or roll back a run (``action_requests``, one
row per request with its state) and the append-only audit log (``actions``, one row per
transition).

:class:`AuditStore` is a mixin of :class:`bot.store.Store` and of
:class:`bot.pgstore.PgStore` (SQL both engines accept). Each write is one transaction of
its own; a request moves on only from the states the caller names, so of two people
confirming at once one wins.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import sqlite_utils


class AuditStore:
    db: sqlite_utils.Database  # these four are the store's (bot.store.Store)
    lock: threading.RLock
    query: Callable[..., list[dict[str, Any]]]
    transaction: Callable[[], AbstractContextManager[sqlite_utils.Database]]

    # the audit log ------------------------------------------------------------------------
    def record_action(self, *, at: float, run: str, action: str, actor: str, status: str,
                      detail: str = "", request_id: str | None = None,
                      exit_status: int | None = None, output_tail: str | None = None) -> None:
        """Append one transition of an action to the audit log."""
        with self.transaction() as db:
            db["actions"].insert({"at": at, "run": run, "action": action, "actor": actor,
                                  "status": status, "detail": detail, "request_id": request_id,
                                  "exit_status": exit_status, "output_tail": output_tail})

    def audit_log(self, run: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """The last ``limit`` audit rows (of one run, or all), oldest first."""
        where, params = ("WHERE run = ?", (run,)) if run else ("", ())
        return self.query(f"SELECT * FROM actions {where} ORDER BY id DESC LIMIT ?",
                          (*params, limit))[::-1]

    def run_actions(self, run: str) -> list[dict[str, Any]]:
        """A run's audit rows (``id, at, run, action, actor, status, detail``) in time order."""
        return self.query("SELECT id, at, run, action, actor, status, detail FROM actions "
                          "WHERE run = ? ORDER BY at, id", (run,))

    # requests -----------------------------------------------------------------------------
    def action_request(self, request_id: str) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM action_requests WHERE id = ?", (request_id,))
        return rows[0] if rows else None

    def action_requests_in(self, run: str, action: str,
                           states: tuple[str, ...]) -> list[dict[str, Any]]:
        """The run's requests for ``action`` in one of ``states``, newest first."""
        return self.query(
            "SELECT * FROM action_requests WHERE run = ? AND action = ? AND state IN "
            f"({', '.join('?' * len(states))}) ORDER BY created_at DESC",
            (run, action, *states))

    def add_action_request(self, *, request_id: str, run: str, action: str,
                           params: dict[str, Any], requested_by: str, channel: str | None,
                           thread_ts: str | None, fingerprint: str | None,
                           now: float) -> None:
        """A new request, in state ``requested``."""
        with self.transaction() as db:
            db["action_requests"].insert({
                "id": request_id, "run": run, "action": action, "params": json.dumps(params),
                "state": "requested", "requested_by": requested_by, "channel": channel,
                "thread_ts": thread_ts, "fingerprint": fingerprint, "created_at": now,
                "updated_at": now})

    def move_action_request(self, request_id: str, from_states: tuple[str, ...], to: str, *,
                            now: float, **values: Any) -> bool:
        """Move a request to ``to`` (setting ``values`` too) only from ``from_states``;
        False when it was in none of them (someone else got there first)."""
        sets = ", ".join(f"{k} = ?" for k in ("state", "updated_at", *values))
        with self.transaction() as db:
            cursor = db.execute(
                f"UPDATE action_requests SET {sets} WHERE id = ? AND state IN "
                f"({', '.join('?' * len(from_states))})",
                (to, now, *values.values(), request_id, *from_states))
            return cursor.rowcount == 1

    def rollbacks_awaiting_followup(self) -> list[dict[str, Any]]:
        """Rollbacks done for an alert whose outcome has not been said yet."""
        return self.query(
            "SELECT * FROM action_requests WHERE action = 'rollback' AND state = 'done' "
            "AND followup IS NULL AND fingerprint IS NOT NULL")

    def set_followup(self, request_id: str, kind: str) -> None:
        """Record the outcome said of a rollback (``recovered``, ``again``)."""
        with self.transaction() as db:
            db.execute("UPDATE action_requests SET followup = ? WHERE id = ?",
                       (kind, request_id))
