"""`/run alerts`, `/run silence …`, `/run silences` and `/run ack …`: the alert lifecycle's
sub-commands, parsed here and answered by the services in :mod:`bot.alerting.pipeline`."""

from __future__ import annotations

import time

from analyzers.fmt import fmt_duration
from bot.alerting.lifecycle import MATCH_OPS, LifecycleError, Matcher, is_duration, parse_duration
from bot.alerting.pipeline import UnknownAlert
from bot.alerting.silences import (
    acknowledge,
    active_alerts,
    describe_silence,
    expire_silence,
    list_silences,
    silence,
)
from bot.config import AlertingConfig
from bot.store import Store
from bot.views.lifecycle import alerts_listing, silences_listing
from bot.views.message import Message

COMMANDS = ("alerts", "silence", "silences", "ack")
SILENCE_USAGE = ("`/run silence run=exp1 signal=plateau 2h eval suite is flaky` (matchers on "
                 "run, signal, severity, metric with = != =~ !~; a bare first word is the "
                 "run; then a duration, default 2h; then why), or `/run silence expire ID`.")


def parse_silence(words: list[str]) -> tuple[list[Matcher], float | None, str]:
    """Matchers, duration (None: the default) and reason from the words after `silence`."""
    matchers: list[Matcher] = []
    duration: float | None = None
    rest = list(words)
    while rest and any(op in rest[0] for op in MATCH_OPS):
        matchers.append(Matcher.parse(rest.pop(0)))
    if rest and not matchers and not is_duration(rest[0]):
        matchers.append(Matcher("run", "=", rest.pop(0)))
    if rest and is_duration(rest[0]):
        duration = parse_duration(rest.pop(0))
    return matchers, duration, " ".join(rest)


def handle_alert_command(command: str, args: list[str], store: Store, *, user: str,
                         now: float | None = None,
                         alerting: AlertingConfig | None = None) -> Message:
    """Answer one of :data:`COMMANDS`; never raises for anything a user can type."""
    now = time.time() if now is None else now
    try:
        if command == "alerts":
            return alerts_listing(active_alerts(store, args[0] if args else None), now=now)
        if command == "silences":
            return silences_listing([describe_silence(s, now)
                                     for s in list_silences(store, now=now)])
        if command == "ack":
            if len(args) != 1:
                return _error("`/run ack` takes an alert's fingerprint (from `/run alerts`).")
            alert = acknowledge(store, args[0], user, now=now, alerting=alerting)
            return Message(text=f":eyes: {alert['signal']} on {alert['run']} acknowledged; "
                                f"no more reminders.", kind="ack")
        if args[:1] == ["expire"]:
            if len(args) != 2 or not args[1].lstrip("#").isdigit():
                return _error("`/run silence expire ID` takes a silence id from "
                              "`/run silences`.")
            ended = expire_silence(store, int(args[1].lstrip("#")), user=user, now=now,
                                   alerting=alerting)
            return Message(text=f":bell: Silence #{ended.id} ended.", kind="silence")
        if not args:
            return _error(f"Usage: {SILENCE_USAGE}")
        matchers, duration, reason = parse_silence(args)
        created = silence(store, matchers, created_by=user, reason=reason, duration=duration,
                          now=now, alerting=alerting)
        return Message(text=f":no_bell: Silence #{created.id} "
                            f"{' '.join(map(str, created.matchers))} for "
                            f"{fmt_duration(created.ends_at - created.starts_at)}: "
                            f"{created.reason}. `/run silence expire {created.id}` ends it.",
                       kind="silence")
    except (LifecycleError, UnknownAlert) as exc:
        return _error(f"{exc}." if command != "silence" else f"{exc}. Usage: {SILENCE_USAGE}")


def _error(text: str) -> Message:
    return Message(text=text, kind="error")
