"""The store's alert concern: findings, alerts, their groups and group messages, silences,
acknowledgements (the tables of ``_alert_lifecycle``) and what is said in alert threads.

:class:`AlertStore` is a mixin of :class:`bot.store.Store` and of
:class:`bot.pgstore.PgStore`: its SQL is what both engines accept (``"user"`` quoted, no
``IN ()``, NULLs placed where SQLite puts them). Methods whose first parameter is ``db``
write inside the caller's transaction (``with store.transaction() as db``), so that the
alert pipeline's state and the outbox rows it queues commit together; the others read, or
write in one statement.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import sqlite_utils

from analyzers.finding import Finding


class AlertStore:
    db: sqlite_utils.Database  # these four are the store's (bot.store.Store)
    lock: threading.RLock
    query: Callable[..., list[dict[str, Any]]]
    transaction: Callable[[], AbstractContextManager[sqlite_utils.Database]]

    # findings -----------------------------------------------------------------------------
    def finding(self, fingerprint: str) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM findings WHERE fingerprint = ?", (fingerprint,))
        return rows[0] if rows else None

    def findings(self, run: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        sql, params = "SELECT * FROM findings WHERE 1=1", []
        if run is not None:
            sql += " AND run = ?"
            params.append(run)
        if state is not None:
            sql += " AND state = ?"
            params.append(state)
        return self.query(sql + " ORDER BY first_seen, onset_step", tuple(params))

    def save_finding(self, db: sqlite_utils.Database, finding: Finding, now: float,
                     existing: dict[str, Any] | None) -> None:
        row = {
            "fingerprint": finding.fingerprint, "run": finding.run, "attempt": finding.attempt,
            "signal": finding.signal, "metric": finding.metric, "severity": finding.severity,
            "state": finding.state, "onset_step": finding.onset_step,
            "detected_step": finding.detected_step, "resolved_step": finding.resolved_step,
            "summary": finding.summary, "data": json.dumps(finding.to_dict()),
            "first_seen": existing["first_seen"] if existing else now, "last_seen": now,
            "resolved_at": (existing or {}).get("resolved_at")
            or (now if finding.state == "resolved" else None),
        }
        db["findings"].insert(row, replace=True)

    def resolve_finding(self, db: sqlite_utils.Database, fingerprint: str, now: float) -> None:
        """A firing finding the analyzers no longer report, or that its attempt outlived."""
        db["findings"].update(fingerprint, {"state": "resolved", "resolved_at": now,
                                            "last_seen": now})

    # alerts -------------------------------------------------------------------------------
    def alert(self, fingerprint: str) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM alerts WHERE fingerprint = ?", (fingerprint,))
        return rows[0] if rows else None

    def alerts_by_prefix(self, prefix: str, limit: int = 2) -> list[dict[str, Any]]:
        """Alerts whose fingerprint begins with ``prefix`` (at most ``limit``)."""
        return self.query("SELECT * FROM alerts WHERE fingerprint LIKE ? LIMIT ?",
                          (prefix + "%", limit))

    def run_alerts(self, run: str) -> list[dict[str, Any]]:
        """Every stored alert of a run, whatever its state."""
        return self.query("SELECT * FROM alerts WHERE run = ?", (run,))

    def alert_states(self, fingerprints: list[str]) -> set[str]:
        """The states the given alerts are in (those stored)."""
        if not fingerprints:  # `IN ()` is SQLite's alone
            return set()
        marks = ", ".join("?" * len(fingerprints))
        return {r["state"] for r in self.query(
            f"SELECT state FROM alerts WHERE fingerprint IN ({marks})", tuple(fingerprints))}

    def alerts_to_notify(self, *, run: str | None = None,
                         group: str | None = None) -> list[dict[str, Any]]:
        """Alerts a group message may still have to show: firing ones, and resolved ones
        whose firing was announced or that fired and resolved at once (not yet said);
        of one run or one group, or all, oldest first."""
        sql = ("SELECT * FROM alerts WHERE (state = 'firing' OR (state = 'resolved' AND "
               "(notified = 'firing' OR (notified IS NULL AND fired_at = resolved_at))))")
        params: tuple = ()
        if run is not None:
            sql, params = sql + " AND run = ?", (run,)
        elif group is not None:
            sql, params = sql + " AND group_key = ?", (group,)
        return self.query(sql + " ORDER BY fired_at NULLS FIRST, fingerprint", params)

    def open_alerts(self, run: str | None = None) -> list[dict[str, Any]]:
        """Pending and firing alerts with their finding's ``summary`` and ``onset_step`` and
        who acknowledged them (``acked_by``), criticals first, then by when they fired."""
        sql = ("SELECT a.*, f.summary, f.onset_step, k.\"user\" AS acked_by FROM alerts a "
               "JOIN findings f USING (fingerprint) LEFT JOIN acknowledgements k "
               "USING (fingerprint) WHERE a.state IN ('pending', 'firing')")
        params: tuple = ()
        if run is not None:
            sql, params = sql + " AND a.run = ?", (run,)
        return self.query(sql + " ORDER BY a.severity = 'critical' DESC, "
                                     "a.fired_at NULLS FIRST", params)

    def firing_critical_alerts(self) -> list[dict[str, Any]]:
        """``fingerprint`` and ``message_id`` of every firing critical alert."""
        return self.query("SELECT fingerprint, message_id FROM alerts WHERE "
                          "severity = 'critical' AND state = 'firing'")

    def save_alert(self, db: sqlite_utils.Database, row: dict[str, Any]) -> None:
        """A new alert (one by the same fingerprint is replaced)."""
        db["alerts"].insert(row, replace=True)

    def update_alert(self, db: sqlite_utils.Database, fingerprint: str, **values: Any) -> None:
        db["alerts"].update(fingerprint, values)

    def delete_alert(self, db: sqlite_utils.Database, fingerprint: str) -> None:
        db.execute("DELETE FROM alerts WHERE fingerprint = ?", (fingerprint,))

    # groups and their messages ------------------------------------------------------------
    def alert_groups(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        """The stored groups among ``keys``, by key."""
        if not keys:
            return {}
        return {g["key"]: g for g in self.query(
            f"SELECT * FROM alert_groups WHERE key IN ({','.join('?' * len(keys))})",
            tuple(keys))}

    def group_oncall(self, key: str) -> str | None:
        rows = self.query("SELECT oncall FROM alert_groups WHERE key = ?", (key,))
        return rows[0]["oncall"] if rows else None

    def save_alert_group(self, db: sqlite_utils.Database, row: dict[str, Any]) -> None:
        """Create the group ``row["key"]`` or update the columns ``row`` names."""
        db["alert_groups"].upsert(row, pk="key")

    def alert_message(self, message_id: int) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM alert_messages WHERE id = ?", (message_id,))
        return rows[0] if rows else None

    def add_alert_message(self, db: sqlite_utils.Database, *, group_key: str, run: str,
                          channel: str, now: float) -> int:
        """A group message to be posted; returns its id."""
        return db["alert_messages"].insert({"group_key": group_key, "run": run,
                                            "channel": channel, "created_at": now}).last_pk

    def alerts_in_message(self, channel: str, ts: str) -> list[dict[str, Any]]:
        """The alerts the group message posted as ``ts`` in ``channel`` shows."""
        return self.query("SELECT a.* FROM alerts a JOIN alert_messages m ON a.message_id = "
                          "m.id WHERE m.channel = ? AND m.ts = ? ORDER BY a.fired_at NULLS FIRST",
                          (channel, ts))

    def message_members(self, message_id: int) -> list[dict[str, Any]]:
        """What a group message draws of each of its alerts: state, muting, times, the
        finding's ``data`` and the acknowledgement (``acked_by``, ``acked_at``)."""
        return self.query(
            "SELECT a.fingerprint, a.state, a.muted, a.fired_at, a.resolved_at, f.data, "
            "k.\"user\" AS acked_by, k.at AS acked_at FROM alerts a JOIN findings f "
            "USING (fingerprint) LEFT JOIN acknowledgements k USING (fingerprint) "
            "WHERE a.message_id = ? ORDER BY a.fired_at NULLS FIRST, a.fingerprint", (message_id,))

    def firing_severities(self, message_id: int, excluding: list[str]) -> list[str]:
        """The severities of the firing alerts a message shows, but those of ``excluding``."""
        sql = "SELECT severity FROM alerts WHERE message_id = ? AND state = 'firing'"
        if excluding:
            sql += f" AND fingerprint NOT IN ({','.join('?' * len(excluding))})"
        return [r["severity"] for r in self.query(sql, (message_id, *excluding))]

    def post_queued(self, message_id: int) -> bool:
        """Whether the message's first post is still waiting in the outbox."""
        return bool(self.query("SELECT 1 FROM outbox WHERE message_id = ? AND kind = 'alert' "
                               "AND state = 'pending'", (message_id,)))

    def redraw_queued(self, message_id: int) -> bool:
        """Whether a post or a redraw of the message is waiting in the outbox (either
        draws the state at send time)."""
        return bool(self.query("SELECT kind FROM outbox WHERE message_id = ? AND state = "
                               "'pending' AND kind IN ('alert', 'update')", (message_id,)))

    def record_sent(self, outbox_id: int, *, channel: str | None, ts: str | None,
                    fingerprint: str, run: str, kind: str, now: float,
                    message_id: int | None = None) -> None:
        """An outbox row was sent; a posted alert's ``ts`` becomes its group message's and
        starts an alert thread."""
        with self.transaction() as db:
            db["outbox"].update(outbox_id, {"state": "sent", "sent_at": now,
                                            "response": json.dumps({"channel": channel,
                                                                    "ts": ts})})
            if kind == "alert" and message_id is not None:
                db["alert_messages"].update(message_id, {"ts": ts, "posted_at": now,
                                                         "channel": channel})
            if kind == "alert" and channel and ts:
                db["threads"].insert({"channel": channel, "ts": ts, "run": run,
                                      "fingerprint": fingerprint, "created_at": now},
                                     replace=True)

    # silences -----------------------------------------------------------------------------
    def silences(self) -> list[dict[str, Any]]:
        """Every silence, ended ones too, oldest first."""
        return self.query("SELECT * FROM silences ORDER BY id")

    def silences_active(self, now: float) -> list[dict[str, Any]]:
        """The silences in force at ``now``, oldest first."""
        return self.query("SELECT * FROM silences WHERE starts_at <= ? AND ends_at > ? "
                          "ORDER BY id", (now, now))

    def silence(self, silence_id: int) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM silences WHERE id = ?", (silence_id,))
        return rows[0] if rows else None

    def add_silence(self, db: sqlite_utils.Database, *, matchers: str, starts_at: float,
                    ends_at: float, created_by: str, reason: str, now: float) -> int:
        """A silence (``matchers``: their JSON list); returns its id."""
        return db["silences"].insert({
            "matchers": matchers, "starts_at": starts_at, "ends_at": ends_at,
            "created_by": created_by, "reason": reason, "created_at": now}).last_pk

    def end_silence(self, db: sqlite_utils.Database, silence_id: int, *, now: float,
                    by: str) -> None:
        db["silences"].update(silence_id, {"ends_at": now, "expired_by": by})

    # acknowledgements ---------------------------------------------------------------------
    def acknowledge(self, db: sqlite_utils.Database, fingerprint: str, *, user: str,
                    now: float) -> None:
        """Record who acknowledged an alert (a later acknowledgement replaces it)."""
        db["acknowledgements"].insert({"fingerprint": fingerprint, "user": user, "at": now},
                                      replace=True)

    def acknowledged_by(self, fingerprints: list[str]) -> dict[str, str]:
        """Who acknowledged each of the acknowledged alerts among ``fingerprints``."""
        if not fingerprints:
            return {}
        rows = self.query('SELECT fingerprint, "user" FROM acknowledgements WHERE fingerprint '
                          f"IN ({','.join('?' * len(fingerprints))})", tuple(fingerprints))
        return {r["fingerprint"]: r["user"] for r in rows}

    # alert threads ------------------------------------------------------------------------
    def add_thread_message(self, *, channel: str, thread_ts: str, ts: str, fingerprint: str,
                           run: str, user: str, text: str, at: float) -> None:
        """Keep a message said in an alert's thread (a redelivered event is kept once)."""
        with self.transaction() as db:
            db["thread_messages"].insert({"channel": channel, "thread_ts": thread_ts, "ts": ts,
                                          "fingerprint": fingerprint, "run": run, "user": user,
                                          "text": text[:4000], "at": at}, ignore=True)

    def thread(self, channel: str, ts: str) -> dict[str, Any] | None:
        """The alert thread a Slack message starts (its run and fingerprint), if it is one."""
        rows = self.query("SELECT * FROM threads WHERE channel = ? AND ts = ?", (channel, ts))
        return rows[0] if rows else None

    def thread_messages(self, fingerprint: str) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM thread_messages WHERE fingerprint = ? ORDER BY at, id",
                          (fingerprint,))

    def alert_thread(self, fingerprint: str) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM threads WHERE fingerprint = ? ORDER BY created_at "
                          "NULLS FIRST LIMIT 1", (fingerprint,))
        return rows[0] if rows else None
