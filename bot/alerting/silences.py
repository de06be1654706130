"""Silences and acknowledgements: the service functions the Slack layer and the CLI call.

:func:`silence`, :func:`silence_alert`, :func:`list_silences`, :func:`expire_silence`,
:func:`acknowledge`, :func:`active_alerts` and :func:`alerts_in_message`. Given the
``[alerting]`` configuration they redraw the messages concerned at once (through
:mod:`bot.alerting.pipeline`'s queue); without it they only record, and the next poll redraws.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from analyzers.fmt import fmt_duration
from bot.alerting.lifecycle import DEFAULT_SILENCE_SECONDS, LifecycleError, Matcher, Silence
from bot.alerting.pipeline import (
    UnknownAlert,
    _clock,
    _silence_from_row,
    _silences,
    queue_notifications,
)
from bot.config import AlertingConfig
from bot.store import Store
from bot.views.message import mention

log = logging.getLogger("runwatch.alerts")

# -- services for the Slack layer --------------------------------------------------------------


def silence(store: Store, matchers: Iterable[str | Matcher], *, created_by: str, reason: str,
            duration: float | None = None, starts_at: float | None = None,
            ends_at: float | None = None, now: float | None = None,
            alerting: AlertingConfig | None = None) -> Silence:
    """Create a silence (``run=exp1``, ``signal=~plateau|oscillation``, …) from now (or
    ``starts_at``) for ``duration`` seconds (or until ``ends_at``; default 2 h).

    Raises :class:`bot.alerting.lifecycle.LifecycleError` with a sentence for anything invalid.
    Messages of alerts it mutes are redrawn.
    """
    now = time.time() if now is None else now
    parsed = tuple(m if isinstance(m, Matcher) else Matcher.parse(m) for m in matchers)
    start = now if starts_at is None else starts_at
    end = ends_at if ends_at is not None else start + (duration or DEFAULT_SILENCE_SECONDS)
    candidate = Silence(None, parsed, start, end, created_by, reason.strip())
    candidate.validate(now)
    with store.transaction() as db:
        silence_id = store.add_silence(db, matchers=json.dumps([str(m) for m in parsed]),
                                       starts_at=start, ends_at=end, created_by=created_by,
                                       reason=candidate.reason, now=now)
        if alerting is not None:
            queue_notifications(db, store, now, alerting)
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
        row = store.silence(silence_id)
        if row is None:
            raise LifecycleError(f"no silence {silence_id}; `/run silences` lists them")
        if row["ends_at"] <= now:
            raise LifecycleError(f"silence {silence_id} has already ended")
        store.end_silence(db, silence_id, now=now, by=user)
        if alerting is not None:
            queue_notifications(db, store, now, alerting)
    return _silence_from_row({**row, "ends_at": now})


def acknowledge(store: Store, fingerprint: str, user: str, *, now: float | None = None,
                alerting: AlertingConfig | None = None) -> dict[str, Any]:
    """The alert's "Acknowledge" button: record who, stop repeats and the escalation, and
    redraw the message. ``fingerprint`` may be a unique prefix (6+ characters). Returns the
    alert row with ``acked_by``."""
    now = time.time() if now is None else now
    alert = _alert(store, fingerprint)
    with store.transaction() as db:
        store.acknowledge(db, alert["fingerprint"], user=user, now=now)
        if alerting is not None:
            queue_notifications(db, store, now, alerting, group=alert["group_key"])
    log.info("%s on %s acknowledged by %s", alert["signal"], alert["run"], user)
    return {**alert, "acked_by": user}


def active_alerts(store: Store, run: str | None = None) -> list[dict[str, Any]]:
    """Pending and firing alerts with their finding's summary, muting and acknowledgement,
    for `/run alerts`."""
    return store.open_alerts(run)


def alerts_in_message(store: Store, channel: str, ts: str) -> list[dict[str, Any]]:
    """The alerts a group message shows (a thread question or a button knows the message)."""
    return store.alerts_in_message(channel, ts)


def _alert(store: Store, fingerprint: str) -> dict[str, Any]:
    exact = store.alert(fingerprint)
    rows = [exact] if exact is not None else []
    if not rows and len(fingerprint) >= 6:
        rows = store.alerts_by_prefix(fingerprint, limit=2)
    if len(rows) != 1:
        raise UnknownAlert(f"no alert {fingerprint!r}; `/run alerts` lists them")
    return rows[0]


def describe_silence(s: Silence, now: float) -> str:
    state = ("active" if s.active(now) else "pending" if s.starts_at > now else "expired")
    left = f", {fmt_duration(s.ends_at - now)} left" if s.active(now) else ""
    return (f"#{s.id} {' '.join(map(str, s.matchers))} — {state}{left}, by "
            f"{mention(s.created_by)}: {s.reason}")
