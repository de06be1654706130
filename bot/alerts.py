"""The alert pipeline: findings → alert lifecycle → durable outbox → transport.

:func:`reconcile` stores the analyzers' view of one run, moves its alerts through the rule
stage (pending → firing → resolved) and plans what their groups need; :func:`tick` does
the time-driven part (silences ending, repeats, escalations) for every active group. Both
write the new state and the outbox rows it calls for in one transaction, before anything
is sent, so a restart neither loses nor repeats a notification. The stages themselves are
the pure functions of :mod:`bot.lifecycle`.

The :class:`Outbox` sends in order, draws each message from the state at the moment it is
sent, and retries recoverable failures with exponential backoff. Right after an alert message
is posted it uploads the alert's chart into its thread (when the transport can upload); a
chart that fails recoverably is queued as a "chart" row and retried without holding back the
rest of the queue, and a chart never delays or drops the alert itself. An alert that joins a
posted message by an edit gets a "chart" row at once, and a "joined" notice in the thread,
shown in the channel, when it is critical or worse than the message was.

The Slack layer calls the service functions at the end: :func:`silence`,
:func:`silence_alert`, :func:`list_silences`, :func:`expire_silence`, :func:`acknowledge`,
:func:`active_alerts` and :func:`alerts_in_message`. Given the ``[alerting]``
configuration they redraw the messages concerned at once; without it they only record,
and the next poll redraws.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, cast

import sqlite_utils

from analyzers.base import Finding
from bot.charts import finding_chart
from bot.config import AlertingConfig, OutboxConfig
from bot.lifecycle import (
    DEFAULT_SILENCE_SECONDS,
    AlertView,
    Entry,
    Lifecycle,
    LifecycleError,
    Matcher,
    MessageView,
    Observation,
    Route,
    Silence,
    advance,
    fmt_duration,
    inhibited_by,
    plan_group,
    route,
    silenced_by,
)
from bot.lifecycle_views import (
    escalation_message,
    group_message,
    repeat_message,
)
from bot.notify import Notifier, SendResult, Uploader
from bot.store import Store
from bot.views.alerts import joined_message, resolved_message

log = logging.getLogger("runwatch.alerts")

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}

@dataclass
class Change:
    fingerprint: str
    run: str
    signal: str
    transition: str  # "pending", "firing", "resolved" or "updated"


class UnknownAlert(LookupError):
    """No alert has that fingerprint; the message says so."""


# -- the rule stage ------------------------------------------------------------------------


def reconcile(store: Store, run: str, attempt: int, findings: list[Finding], *,
              signals: set[str], channel: str, now: float | None = None,
              catching_up: bool = False, alerting: AlertingConfig | None = None,
              ) -> list[Change]:
    """Merge the analyzers' view of one run into the stored findings and alerts.

    A stored alert whose finding is now resolved, or that the analyzers that produced it
    no longer report, resolves (after its ``keep_firing_steps``). A finding first seen
    already resolved began and ended between two polls: it is announced with its
    resolution, unless ``catching_up`` (the history a run had before runwatch started
    watching it), which is kept silently.
    """
    now = time.time() if now is None else now
    alerting = alerting or AlertingConfig()
    changes: list[Change] = []
    with store.transaction() as db:
        known = {r["fingerprint"]: r for r in store.query(
            "SELECT * FROM alerts WHERE run = ?", (run,))}
        step = _current_step(store, run, attempt, findings, alerting)
        labels_extra = run_labels(store, run)
        seen = set()
        for finding in findings:
            seen.add(finding.fingerprint)
            existing = store.finding(finding.fingerprint)
            store.save_finding(db, finding, now, existing)
            prev = known.get(finding.fingerprint)
            moved = []
            if prev is not None or finding.state == "firing" or not (existing or catching_up):
                # (not: history, or a finding that resolved before it ever fired)
                seen_now = Observation(finding.state, finding.detected_step,
                                       finding.resolved_step)
                moved = _advance(db, prev, finding_row(finding, labels_extra), seen_now,
                                 alerting, channel, step, now)
            changes += moved or ([Change(finding.fingerprint, run, finding.signal, "updated")]
                                 if existing is not None else [])
        for row in store.findings(run=run, state="firing"):
            superseded = row["attempt"] < attempt  # the run went back and started again
            if row["fingerprint"] in seen or (row["signal"] not in signals and not superseded):
                continue
            db["findings"].update(row["fingerprint"], {"state": "resolved", "resolved_at": now,
                                                       "last_seen": now})
        for fp, prev in known.items():
            if fp in seen or prev["state"] not in ("pending", "firing"):
                continue
            superseded = prev["attempt"] < attempt
            if prev["signal"] not in signals and not superseded:
                continue
            gone = Observation("superseded" if superseded else "absent", step)
            changes += _advance(db, prev, prev, gone, alerting, channel, step, now)
        _notify(db, store, now, alerting, run=run)
    return changes


def finding_row(finding: Finding, extra: dict[str, str]) -> dict[str, Any]:
    """An alert's identity and labels, from its finding."""
    peak = finding.evidence.get("peak")
    nonfinite = isinstance(peak, float) and not math.isfinite(peak) or \
        isinstance(peak, str) and peak.lower() in ("nan", "inf", "-inf")
    labels = {"run": finding.run, "attempt": str(finding.attempt), "signal": finding.signal,
              "metric": finding.metric, "severity": finding.severity,
              "onset": str(finding.onset_step), "nonfinite": "true" if nonfinite else "false",
              **extra}
    return {"fingerprint": finding.fingerprint, "run": finding.run,
            "attempt": finding.attempt, "signal": finding.signal, "metric": finding.metric,
            "severity": finding.severity, "labels": json.dumps(labels)}


def run_labels(store: Store, run: str) -> dict[str, str]:
    """The run-level labels alerts are routed by, from the run's metadata."""
    info = store.run(run) or {}
    meta = json.loads(info.get("meta") or "{}")
    return {k: str(meta[k]) for k in ("project", "team") if meta.get(k) is not None}


def _current_step(store: Store, run: str, attempt: int, findings: list[Finding],
                  alerting: AlertingConfig) -> int:
    """The run's step now; read from the metrics only when a rule counts steps."""
    reported = max((max(f.detected_step, f.resolved_step or 0) for f in findings), default=0)
    if any(r.pending_steps or r.keep_firing_steps for r in alerting.signals.values()):
        return max(reported, store.last_step(run, attempt) or 0)
    return reported


def _advance(db: sqlite_utils.Database, prev: dict[str, Any] | None, row: dict[str, Any],
             seen: Observation, alerting: AlertingConfig, channel: str, step: int,
             now: float) -> list[Change]:
    before = None if prev is None else Lifecycle(prev["state"], prev["evaluations"],
                                                 prev["pending_since"], prev["fired_at"],
                                                 prev["resolved_at"])
    after = advance(before, seen, alerting.rule(row["signal"]), step=step, now=now)
    if after == before:
        return []
    if after is None:
        db.execute("DELETE FROM alerts WHERE fingerprint = ?", (row["fingerprint"],))
        return []
    values = {"state": after.state, "evaluations": after.evaluations,
              "pending_since": after.pending_since, "fired_at": after.fired_at,
              "resolved_at": after.resolved_at, "updated_at": now}
    if prev is None:
        labels = json.loads(row["labels"])
        default = Route(channel, oncall=alerting.oncall)
        to = route(labels, [r.route() for r in alerting.routes], default)
        db["alerts"].insert({**{k: row[k] for k in ("fingerprint", "run", "attempt", "signal",
                                                   "metric", "severity", "labels")},
                             "channel": to.channel, "group_key": f"{row['run']}|{to.channel}",
                             **values}, replace=True)
        if to.oncall:
            db["alert_groups"].upsert({"key": f"{row['run']}|{to.channel}", "run": row["run"],
                                       "channel": to.channel, "oncall": to.oncall}, pk="key")
    else:
        db["alerts"].update(row["fingerprint"], values)
    was = before.state if before else None
    changes = []
    for state in ("pending", "firing", "resolved"):
        if after.state == state and was != state or \
                state == "firing" and after.state == "resolved" and was in (None, "pending"):
            changes.append(Change(row["fingerprint"], row["run"], row["signal"], state))
    return sorted(changes, key=lambda c: ("pending", "firing", "resolved").index(c.transition))


# -- mute, dedup and plan, per group ------------------------------------------------------------


def tick(store: Store, *, now: float | None = None,
         alerting: AlertingConfig | None = None) -> None:
    """The time-driven part, for every group with something live: a silence that ended,
    a repeat that is due, an escalation. Each poll runs it once."""
    now = time.time() if now is None else now
    with store.transaction() as db:
        _notify(db, store, now, alerting or AlertingConfig())


def _notify(db: sqlite_utils.Database, store: Store, now: float, alerting: AlertingConfig,
            run: str | None = None, group: str | None = None) -> None:
    sql = ("SELECT * FROM alerts WHERE (state = 'firing' OR (state = 'resolved' AND "
           "(notified = 'firing' OR (notified IS NULL AND fired_at = resolved_at))))")
    params: tuple = ()
    if run is not None:
        sql, params = sql + " AND run = ?", (run,)
    elif group is not None:
        sql, params = sql + " AND group_key = ?", (group,)
    rows = store.query(sql + " ORDER BY fired_at, fingerprint", params)
    if not rows:
        return
    for row in rows:
        row["labels"] = json.loads(row["labels"])
    silences = _silences(store, active_at=now)
    acks = _acks(store, [r["fingerprint"] for r in rows])
    firing_by_run: dict[str, dict[str, dict[str, str]]] = defaultdict(dict)
    for row in rows:
        if row["state"] == "firing":
            firing_by_run[row["run"]][row["fingerprint"]] = row["labels"]
    rules = alerting.inhibit_rules()
    lowest = SEVERITY_RANK[alerting.min_severity]
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        muted = None
        row["flash"] = row["state"] == "resolved" and row["notified"] is None
        if row["state"] == "firing" or row["flash"]:
            source = inhibited_by(row["fingerprint"], row["labels"], firing_by_run[row["run"]],
                                  rules)
            silenced = None if source else silenced_by(row["labels"], silences, now)
            if SEVERITY_RANK[row["severity"]] < lowest:
                # Kept for /run status, App Home and answers: a healthy run's stop-loss
                # hint is not channel news (issue 22: a quiet channel).
                muted = (f"not posted: {row['severity']} is below the channel's "
                         f"min_severity ({alerting.min_severity})")
            elif source:
                labels = firing_by_run[row["run"]][source]
                muted = f"inhibited by {labels['signal']} (step {labels['onset']})"
            elif silenced:
                muted = (f"silenced by {_who(silenced.created_by)} until "
                         f"{_clock(silenced.ends_at)}: {silenced.reason}")
        if muted != row["muted"]:
            db["alerts"].update(row["fingerprint"], {"muted": muted})
            row["muted"] = muted
        by_group[row["group_key"]].append(row)
    groups = {g["key"]: g for g in store.query(
        f"SELECT * FROM alert_groups WHERE key IN ({','.join('?' * len(by_group))})",
        tuple(by_group))}
    for key, members in by_group.items():
        _plan_and_queue(db, store, key, members, groups.get(key), acks, alerting, now)


def _plan_and_queue(db: sqlite_utils.Database, store: Store, key: str,
                    members: list[dict[str, Any]], group: dict[str, Any] | None,
                    acks: dict[str, str], alerting: AlertingConfig, now: float) -> None:
    timing = alerting.timing()
    entry = None
    if group and group.get("notified_at") is not None:
        entry = Entry(group["notified_at"], frozenset(json.loads(group["firing"] or "[]")),
                      frozenset(json.loads(group["resolved"] or "[]")))
    message = None
    if group and group.get("message_id") is not None:
        [m] = store.query("SELECT * FROM alert_messages WHERE id = ?", (group["message_id"],))
        message = MessageView(m["id"], m["created_at"])
    views = [AlertView(r["fingerprint"], r["severity"], r["state"], r["fired_at"],
                       r["message_id"], r["notified"], r["muted"], acks.get(r["fingerprint"]),
                       r["escalated_at"] is not None, r["shown"], r["flash"])
             for r in members]
    oncall = (group or {}).get("oncall") or alerting.oncall
    if oncall is None:
        timing = replace(timing, escalate_after=None)
    plan = plan_group(views, entry, message, timing, now)
    by_fp = {r["fingerprint"]: r for r in members}
    first = members[0]
    group_row: dict[str, Any] = {"key": key, "run": first["run"], "channel": first["channel"]}
    if plan.post:
        message_id = db["alert_messages"].insert({
            "group_key": key, "run": first["run"], "channel": first["channel"],
            "created_at": now}).last_pk
        for fp in plan.post:
            by_fp[fp]["message_id"] = message_id
        store.enqueue(db, kind="alert", fingerprint=plan.post[0], run=first["run"],
                      channel=first["channel"], now=now, message_id=message_id,
                      due=plan.post_at)
        group_row["message_id"] = message_id
    for fp in plan.join:
        by_fp[fp]["message_id"] = plan.message
    for fp in [*plan.post, *plan.join]:
        db["alerts"].update(fp, {"message_id": by_fp[fp]["message_id"], "notified": "firing"})
    for kind, fps in (("resolved", plan.resolved), ("repeat", plan.repeat),
                      ("escalate", plan.escalate)):
        for fp in fps:
            row = by_fp[fp]
            store.enqueue(db, kind=kind, fingerprint=fp, run=row["run"],
                          channel=row["channel"], now=now, message_id=row["message_id"])
    for fp in plan.resolved:
        db["alerts"].update(fp, {"notified": "resolved"})
    for row in members:
        if row["flash"] and row["fingerprint"] not in plan.resolved:
            db["alerts"].update(row["fingerprint"], {"notified": "never"})  # muted: kept quiet
    for fp in plan.escalate:
        db["alerts"].update(fp, {"escalated_at": now})
    for message_id in plan.update:
        _queue_redraw(db, store, message_id, now)
    if plan.join:
        _queue_join_notices(db, store, plan.message, [by_fp[fp] for fp in plan.join], now)
    for view in views:
        status = view.status
        if by_fp[view.fingerprint]["message_id"] is not None and view.shown != status:
            db["alerts"].update(view.fingerprint, {"shown": status})
    notified = plan.entry is not entry and plan.entry is not None
    if notified:  # the notification log: what this group was last told, and when
        group_row.update(notified_at=plan.entry.at, firing=json.dumps(sorted(plan.entry.firing)),
                         resolved=json.dumps(sorted(plan.entry.resolved)))
    if notified or plan.post:
        db["alert_groups"].upsert(group_row, pk="key")


def _queue_join_notices(db: sqlite_utils.Database, store: Store, message_id: int,
                        joining: list[dict[str, Any]], now: float) -> None:
    """What alerts joining a message by an edit need besides the redraw. An edit notifies
    nobody: a new critical, or one worse than anything the message showed firing (muted or
    not: its header shows the worst), is also said in its thread and shown in the channel.
    And each gets its chart in the thread, as the alert that opened the message did. Queued
    with the join, in its transaction: sent once, retried like any row. A message whose
    post is still queued will show them when it is posted, which notifies: no notice."""
    [message] = store.query("SELECT * FROM alert_messages WHERE id = ?", (message_id,))
    new = [row["fingerprint"] for row in joining]
    showing = store.query(f"SELECT severity FROM alerts WHERE message_id = ? AND state = "
                          f"'firing' AND fingerprint NOT IN ({','.join('?' * len(new))})",
                          (message_id, *new))
    worst = max((SEVERITY_RANK[r["severity"]] for r in showing), default=-1)
    for row in joining:
        if message["ts"] is not None and (row["severity"] == "critical"
                                          or SEVERITY_RANK[row["severity"]] > worst):
            store.enqueue(db, kind="joined", fingerprint=row["fingerprint"], run=row["run"],
                          channel=row["channel"], now=now, message_id=message_id)
        store.enqueue(db, kind="chart", fingerprint=row["fingerprint"], run=row["run"],
                      channel=row["channel"], now=now, message_id=message_id)


def _queue_redraw(db: sqlite_utils.Database, store: Store, message_id: int, now: float) -> None:
    """One pending redraw per message is enough: it draws the state at send time. A message
    whose post is still queued needs none."""
    waiting = store.query("SELECT kind FROM outbox WHERE message_id = ? AND state = 'pending' "
                          "AND kind IN ('alert', 'update')", (message_id,))
    if waiting:
        return
    [message] = store.query("SELECT * FROM alert_messages WHERE id = ?", (message_id,))
    store.enqueue(db, kind="update", fingerprint="", run=message["run"],
                  channel=message["channel"], now=now, message_id=message_id)


# -- services for the Slack layer --------------------------------------------------------------


def silence(store: Store, matchers: Iterable[str | Matcher], *, created_by: str, reason: str,
            duration: float | None = None, starts_at: float | None = None,
            ends_at: float | None = None, now: float | None = None,
            alerting: AlertingConfig | None = None) -> Silence:
    """Create a silence (``run=exp1``, ``signal=~plateau|oscillation``, …) from now (or
    ``starts_at``) for ``duration`` seconds (or until ``ends_at``; default 2 h).

    Raises :class:`bot.lifecycle.LifecycleError` with a sentence for anything invalid.
    Messages of alerts it mutes are redrawn.
    """
    now = time.time() if now is None else now
    parsed = tuple(m if isinstance(m, Matcher) else Matcher.parse(m) for m in matchers)
    start = now if starts_at is None else starts_at
    end = ends_at if ends_at is not None else start + (duration or DEFAULT_SILENCE_SECONDS)
    candidate = Silence(None, parsed, start, end, created_by, reason.strip())
    candidate.validate(now)
    with store.transaction() as db:
        silence_id = db["silences"].insert({
            "matchers": json.dumps([str(m) for m in parsed]), "starts_at": start,
            "ends_at": end, "created_by": created_by, "reason": candidate.reason,
            "created_at": now}).last_pk
        if alerting is not None:
            _notify(db, store, now, alerting)
    log.info("silence %s by %s: %s until %s (%s)", silence_id, created_by,
             " ".join(map(str, parsed)), _clock(end), candidate.reason)
    return Silence(silence_id, parsed, start, end, created_by, candidate.reason)


def silence_alert(store: Store, fingerprint: str, *, created_by: str,
                  duration: float = DEFAULT_SILENCE_SECONDS, reason: str | None = None,
                  now: float | None = None, alerting: AlertingConfig | None = None) -> Silence:
    """The alert's "Silence" button: silence this signal on this run."""
    alert = _alert(store, fingerprint)
    return silence(store, [Matcher("run", "=", alert["run"]),
                           Matcher("signal", "=", alert["signal"])],
                   created_by=created_by, duration=duration, now=now, alerting=alerting,
                   reason=reason or f"silenced from the {alert['signal']} alert")


def list_silences(store: Store, *, now: float | None = None,
                  include_expired: bool = False) -> list[Silence]:
    """Active and pending silences (and, with ``include_expired``, ended ones), newest
    first."""
    now = time.time() if now is None else now
    return [s for s in reversed(_silences(store)) if include_expired or s.ends_at > now]


def expire_silence(store: Store, silence_id: int, *, user: str, now: float | None = None,
                   alerting: AlertingConfig | None = None) -> Silence:
    """End a silence now; the alerts it muted are announced if still firing."""
    now = time.time() if now is None else now
    with store.transaction() as db:
        rows = store.query("SELECT * FROM silences WHERE id = ?", (silence_id,))
        if not rows:
            raise LifecycleError(f"no silence {silence_id}; `/run silences` lists them")
        if rows[0]["ends_at"] <= now:
            raise LifecycleError(f"silence {silence_id} has already ended")
        db["silences"].update(silence_id, {"ends_at": now, "expired_by": user})
        if alerting is not None:
            _notify(db, store, now, alerting)
    return _silence_from_row({**rows[0], "ends_at": now})


def acknowledge(store: Store, fingerprint: str, user: str, *, now: float | None = None,
                alerting: AlertingConfig | None = None) -> dict[str, Any]:
    """The alert's "Acknowledge" button: record who, stop repeats and the escalation, and
    redraw the message. ``fingerprint`` may be a unique prefix (6+ characters). Returns the
    alert row with ``acked_by``."""
    now = time.time() if now is None else now
    alert = _alert(store, fingerprint)
    with store.transaction() as db:
        db["acknowledgements"].insert({"fingerprint": alert["fingerprint"], "user": user,
                                       "at": now}, replace=True)
        if alerting is not None:
            _notify(db, store, now, alerting, group=alert["group_key"])
    log.info("%s on %s acknowledged by %s", alert["signal"], alert["run"], user)
    return {**alert, "acked_by": user}


def active_alerts(store: Store, run: str | None = None) -> list[dict[str, Any]]:
    """Pending and firing alerts with their finding's summary, muting and acknowledgement,
    for `/run alerts`."""
    sql = ("SELECT a.*, f.summary, f.onset_step, k.user AS acked_by FROM alerts a "
           "JOIN findings f USING (fingerprint) LEFT JOIN acknowledgements k "
           "USING (fingerprint) WHERE a.state IN ('pending', 'firing')")
    params: tuple = ()
    if run is not None:
        sql, params = sql + " AND a.run = ?", (run,)
    return store.query(sql + " ORDER BY a.severity = 'critical' DESC, a.fired_at", params)


def alerts_in_message(store: Store, channel: str, ts: str) -> list[dict[str, Any]]:
    """The alerts a group message shows (a thread question or a button knows the message)."""
    return store.query("SELECT a.* FROM alerts a JOIN alert_messages m ON a.message_id = m.id "
                       "WHERE m.channel = ? AND m.ts = ? ORDER BY a.fired_at", (channel, ts))


def _alert(store: Store, fingerprint: str) -> dict[str, Any]:
    rows = store.query("SELECT * FROM alerts WHERE fingerprint = ?", (fingerprint,))
    if not rows and len(fingerprint) >= 6:
        rows = store.query("SELECT * FROM alerts WHERE fingerprint LIKE ? LIMIT 2",
                           (fingerprint + "%",))
    if len(rows) != 1:
        raise UnknownAlert(f"no alert {fingerprint!r}; `/run alerts` lists them")
    return rows[0]


def _silences(store: Store, active_at: float | None = None) -> list[Silence]:
    if active_at is None:
        rows = store.query("SELECT * FROM silences ORDER BY id")
    else:
        rows = store.query("SELECT * FROM silences WHERE starts_at <= ? AND ends_at > ? "
                           "ORDER BY id", (active_at, active_at))
    return [_silence_from_row(r) for r in rows]


def _silence_from_row(row: dict[str, Any]) -> Silence:
    return Silence(row["id"], tuple(Matcher.parse(m) for m in json.loads(row["matchers"])),
                   row["starts_at"], row["ends_at"], row["created_by"], row["reason"])


def _acks(store: Store, fingerprints: list[str]) -> dict[str, str]:
    if not fingerprints:
        return {}
    rows = store.query(f"SELECT fingerprint, user FROM acknowledgements WHERE fingerprint IN "
                       f"({','.join('?' * len(fingerprints))})", tuple(fingerprints))
    return {r["fingerprint"]: r["user"] for r in rows}


def _who(user: str) -> str:
    return f"<@{user}>" if user[:1] in ("U", "W") and user.isalnum() else user


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def describe_silence(s: Silence, now: float) -> str:
    state = ("active" if s.active(now) else "pending" if s.starts_at > now else "expired")
    left = f", {fmt_duration(s.ends_at - now)} left" if s.active(now) else ""
    return (f"#{s.id} {' '.join(map(str, s.matchers))} — {state}{left}, by "
            f"{_who(s.created_by)}: {s.reason}")


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
        firing = self.store.query("SELECT fingerprint, message_id FROM alerts WHERE "
                                  "severity = 'critical' AND state = 'firing'")
        messages = {r["message_id"] for r in firing if r["message_id"] is not None}
        fingerprints = {r["fingerprint"] for r in firing}
        return sorted(rows, key=lambda row: not (
            row["message_id"] in messages if row.get("message_id") is not None
            else row["fingerprint"] in fingerprints))

    def _settle_in_doubt(self) -> bool:
        """Rows a crash left between sending and recording: recorded if the transport has
        them, queued again if not. False when the transport cannot tell now."""
        for row in self.store.query("SELECT * FROM outbox WHERE state = 'sending' ORDER BY id"):
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
            with self.store.transaction() as db:
                chart_id = self.store.enqueue(db, kind="chart", fingerprint=row["fingerprint"],
                                              run=row["run"], channel=row["channel"], now=now,
                                              message_id=message_id,
                                              due=now + self.settings.backoff_seconds)
                db["outbox"].update(chart_id, {"attempts": 1, "last_error": result.reason})

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
        alert = self.store.query("SELECT * FROM alerts WHERE fingerprint = ?",
                                 (row["fingerprint"],))[0]
        if row["kind"] == "resolved":
            run = self.store.run(row["run"])
            reply = resolved_message(finding, run["attempt"] if run else None)
        elif row["kind"] == "joined":
            reply = joined_message(finding)
        elif row["kind"] == "repeat":
            reply = repeat_message(finding, alert, now=self.clock())
        else:
            group = self.store.query("SELECT oncall FROM alert_groups WHERE key = ?",
                                     (alert["group_key"],))
            reply = escalation_message(finding, alert, group[0]["oncall"] if group else None,
                                       now=self.clock())
        channel = message["channel"] if message["ts"] else row["channel"]
        reply.key = _key(row)
        return self.notifier.post(channel, reply, thread_ts=message["ts"])

    def _message_row(self, row: dict[str, Any]) -> dict[str, Any] | None:
        message_id = row.get("message_id")
        if message_id is None:  # queued by runwatch before the alert lifecycle
            alert = self.store.query("SELECT message_id FROM alerts WHERE fingerprint = ?",
                                     (row["fingerprint"],))
            message_id = alert[0]["message_id"] if alert else None
        if message_id is None:
            return None
        rows = self.store.query("SELECT * FROM alert_messages WHERE id = ?", (message_id,))
        return rows[0] if rows else None

    def _members(self, message_id: int) -> list[dict[str, Any]]:
        return self.store.query(
            "SELECT a.fingerprint, a.state, a.muted, a.fired_at, a.resolved_at, f.data, "
            "k.user AS acked_by, k.at AS acked_at FROM alerts a JOIN findings f "
            "USING (fingerprint) LEFT JOIN acknowledgements k USING (fingerprint) "
            "WHERE a.message_id = ? ORDER BY a.fired_at, a.fingerprint", (message_id,))

    def _post_pending(self, message_id: int) -> bool:
        return bool(self.store.query(
            "SELECT 1 FROM outbox WHERE message_id = ? AND kind = 'alert' AND state = 'pending'",
            (message_id,)))


def _key(row: dict[str, Any]) -> str:
    """Unique per outbox row, also across databases (a reset store reuses ids)."""
    return f"{row['id']}-{row['created_at']:.6f}"
