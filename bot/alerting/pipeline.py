"""The alert pipeline: findings → alert lifecycle → durable outbox → transport.

:func:`reconcile` stores the analyzers' view of one run, moves its alerts through the rule
stage (pending → firing → resolved) and plans what their groups need; :func:`tick` does
the time-driven part (silences ending, repeats, escalations) for every active group. Both
write the new state and the outbox rows it calls for in one transaction, before anything
is sent, so a restart neither loses nor repeats a notification. The stages themselves are
the pure functions of :mod:`bot.alerting.lifecycle`.

What the queue holds is sent by :class:`bot.alerting.outbox.Outbox`; the service functions
that silence and acknowledge alerts (:mod:`bot.alerting.silences`) redraw through
:func:`queue_notifications`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from analyzers.finding import Finding
from bot.alerting.lifecycle import (
    AlertView,
    Entry,
    Lifecycle,
    Matcher,
    MessageView,
    Observation,
    Route,
    Silence,
    advance,
    inhibited_by,
    plan_group,
    route,
    silenced_by,
)
from bot.config import AlertingConfig
from bot.store import Store, Transaction
from bot.views.message import mention

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
        known = {r["fingerprint"]: r for r in store.run_alerts(run)}
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
                moved = _advance(db, store, prev, finding_row(finding, labels_extra), seen_now,
                                 alerting, channel, step, now)
            changes += moved or ([Change(finding.fingerprint, run, finding.signal, "updated")]
                                 if existing is not None else [])
        for row in store.findings(run=run, state="firing"):
            superseded = row["attempt"] < attempt  # the run went back and started again
            if row["fingerprint"] in seen or (row["signal"] not in signals and not superseded):
                continue
            store.resolve_finding(db, row["fingerprint"], now)
        for fp, prev in known.items():
            if fp in seen or prev["state"] not in ("pending", "firing"):
                continue
            superseded = prev["attempt"] < attempt
            if prev["signal"] not in signals and not superseded:
                continue
            gone = Observation("superseded" if superseded else "absent", step)
            changes += _advance(db, store, prev, prev, gone, alerting, channel, step, now)
        queue_notifications(db, store, now, alerting, run=run)
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


def _advance(db: Transaction, store: Store, prev: dict[str, Any] | None,
             row: dict[str, Any], seen: Observation, alerting: AlertingConfig, channel: str,
             step: int, now: float) -> list[Change]:
    before = None if prev is None else Lifecycle(prev["state"], prev["evaluations"],
                                                 prev["pending_since"], prev["fired_at"],
                                                 prev["resolved_at"])
    after = advance(before, seen, alerting.rule(row["signal"]), step=step, now=now)
    if after == before:
        return []
    if after is None:
        store.delete_alert(db, row["fingerprint"])
        return []
    values = {"state": after.state, "evaluations": after.evaluations,
              "pending_since": after.pending_since, "fired_at": after.fired_at,
              "resolved_at": after.resolved_at, "updated_at": now}
    if prev is None:
        labels = json.loads(row["labels"])
        default = Route(channel, oncall=alerting.oncall)
        to = route(labels, [r.route() for r in alerting.routes], default)
        store.save_alert(db, {**{k: row[k] for k in ("fingerprint", "run", "attempt",
                                                      "signal", "metric", "severity", "labels")},
                              "channel": to.channel, "group_key": f"{row['run']}|{to.channel}",
                              **values})
        if to.oncall:
            store.save_alert_group(db, {"key": f"{row['run']}|{to.channel}", "run": row["run"],
                                        "channel": to.channel, "oncall": to.oncall})
    else:
        store.update_alert(db, row["fingerprint"], **values)
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
        queue_notifications(db, store, now, alerting or AlertingConfig())


def queue_notifications(db: Transaction, store: Store, now: float,
                        alerting: AlertingConfig, run: str | None = None,
                        group: str | None = None) -> None:
    rows = store.alerts_to_notify(run=run, group=group)
    if not rows:
        return
    for row in rows:
        row["labels"] = json.loads(row["labels"])
    silences = _silences(store, active_at=now)
    acks = store.acknowledged_by([r["fingerprint"] for r in rows])
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
                muted = (f"silenced by {mention(silenced.created_by)} until "
                         f"{_clock(silenced.ends_at)}: {silenced.reason}")
        if muted != row["muted"]:
            store.update_alert(db, row["fingerprint"], muted=muted)
            row["muted"] = muted
        by_group[row["group_key"]].append(row)
    groups = store.alert_groups(list(by_group))
    for key, members in by_group.items():
        _plan_and_queue(db, store, key, members, groups.get(key), acks, alerting, now)


def _plan_and_queue(db: Transaction, store: Store, key: str,
                    members: list[dict[str, Any]], group: dict[str, Any] | None,
                    acks: dict[str, str], alerting: AlertingConfig, now: float) -> None:
    timing = alerting.timing()
    entry = None
    if group and group.get("notified_at") is not None:
        entry = Entry(group["notified_at"], frozenset(json.loads(group["firing"] or "[]")),
                      frozenset(json.loads(group["resolved"] or "[]")))
    message = None
    if group and group.get("message_id") is not None:
        m = store.alert_message(group["message_id"])
        assert m is not None, group
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
        message_id = store.add_alert_message(db, group_key=key, run=first["run"],
                                             channel=first["channel"], now=now)
        for fp in plan.post:
            by_fp[fp]["message_id"] = message_id
        store.enqueue(db, kind="alert", fingerprint=plan.post[0], run=first["run"],
                      channel=first["channel"], now=now, message_id=message_id,
                      due=plan.post_at)
        group_row["message_id"] = message_id
    for fp in plan.join:
        by_fp[fp]["message_id"] = plan.message
    for fp in [*plan.post, *plan.join]:
        store.update_alert(db, fp, message_id=by_fp[fp]["message_id"], notified="firing")
    for kind, fps in (("resolved", plan.resolved), ("repeat", plan.repeat),
                      ("escalate", plan.escalate)):
        for fp in fps:
            row = by_fp[fp]
            store.enqueue(db, kind=kind, fingerprint=fp, run=row["run"],
                          channel=row["channel"], now=now, message_id=row["message_id"])
    for fp in plan.resolved:
        store.update_alert(db, fp, notified="resolved")
    for row in members:
        if row["flash"] and row["fingerprint"] not in plan.resolved:
            store.update_alert(db, row["fingerprint"], notified="never")  # muted: kept quiet
    for fp in plan.escalate:
        store.update_alert(db, fp, escalated_at=now)
    for message_id in plan.update:
        _queue_redraw(db, store, message_id, now)
    if plan.join:
        _queue_join_notices(db, store, plan.message, [by_fp[fp] for fp in plan.join], now)
    for view in views:
        status = view.status
        if by_fp[view.fingerprint]["message_id"] is not None and view.shown != status:
            store.update_alert(db, view.fingerprint, shown=status)
    notified = plan.entry is not entry and plan.entry is not None
    if notified:  # the notification log: what this group was last told, and when
        group_row.update(notified_at=plan.entry.at, firing=json.dumps(sorted(plan.entry.firing)),
                         resolved=json.dumps(sorted(plan.entry.resolved)))
    if notified or plan.post:
        store.save_alert_group(db, group_row)


def _queue_join_notices(db: Transaction, store: Store, message_id: int,
                        joining: list[dict[str, Any]], now: float) -> None:
    """What alerts joining a message by an edit need besides the redraw. An edit notifies
    nobody: a new critical, or one worse than anything the message showed firing (muted or
    not: its header shows the worst), is also said in its thread and shown in the channel.
    And each gets its chart in the thread, as the alert that opened the message did. Queued
    with the join, in its transaction: sent once, retried like any row. A message whose
    post is still queued will show them when it is posted, which notifies: no notice."""
    message = store.alert_message(message_id)
    assert message is not None, message_id
    showing = store.firing_severities(message_id, [row["fingerprint"] for row in joining])
    worst = max((SEVERITY_RANK[severity] for severity in showing), default=-1)
    for row in joining:
        if message["ts"] is not None and (row["severity"] == "critical"
                                          or SEVERITY_RANK[row["severity"]] > worst):
            store.enqueue(db, kind="joined", fingerprint=row["fingerprint"], run=row["run"],
                          channel=row["channel"], now=now, message_id=message_id)
        store.enqueue(db, kind="chart", fingerprint=row["fingerprint"], run=row["run"],
                      channel=row["channel"], now=now, message_id=message_id)


def _queue_redraw(db: Transaction, store: Store, message_id: int, now: float) -> None:
    """One pending redraw per message is enough: it draws the state at send time. A message
    whose post is still queued needs none."""
    if store.redraw_queued(message_id):
        return
    message = store.alert_message(message_id)
    assert message is not None, message_id
    store.enqueue(db, kind="update", fingerprint="", run=message["run"],
                  channel=message["channel"], now=now, message_id=message_id)


# -- what the stages read of silences and acknowledgements -------------------------


def _silences(store: Store, active_at: float | None = None) -> list[Silence]:
    rows = store.silences() if active_at is None else store.silences_active(active_at)
    return [_silence_from_row(r) for r in rows]


def _silence_from_row(row: dict[str, Any]) -> Silence:
    return Silence(row["id"], tuple(Matcher.parse(m) for m in json.loads(row["matchers"])),
                   row["starts_at"], row["ends_at"], row["created_by"], row["reason"])


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
