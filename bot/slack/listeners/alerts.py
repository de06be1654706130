"""The lifecycle buttons on an alert: Acknowledge (stops repeats and the escalation), Snooze
1 h / 4 h and Silence (this signal on this run, for a day)."""

from __future__ import annotations

import logging

from slack_bolt import Ack, App
from slack_sdk import WebClient

from analyzers.fmt import fmt_duration
from bot.alerting.silences import LifecycleError, acknowledge, silence_alert
from bot.config import AlertingConfig
from bot.slack.listeners.shared import post, thread_of
from bot.slack.listeners.work import Work
from bot.store import Store
from bot.views.actions import refusal_message
from bot.views.lifecycle import (
    ACK_ACTION_ID,
    SILENCE_ACTION_ID,
    SILENCE_BUTTON_SECONDS,
    SNOOZE_ACTION_IDS,
)

log = logging.getLogger("runwatch.slack")


def register(app: App, store: Store, alerting: AlertingConfig, work: Work) -> None:
    def on_lifecycle_button(ack: Ack, body: dict, action: dict, client: WebClient) -> None:
        ack()
        work.submit(record_button, body, action, client)

    def record_button(body: dict, action: dict, client: WebClient) -> None:
        user = (body.get("user") or {}).get("id") or "unknown"
        channel = (body.get("channel") or {}).get("id")
        fingerprint = action.get("value") or ""
        action_id = action["action_id"]
        try:
            if action_id == ACK_ACTION_ID:
                acknowledge(store, fingerprint, user, alerting=alerting)
            else:
                duration = SNOOZE_ACTION_IDS.get(action_id, SILENCE_BUTTON_SECONDS)
                verb = "snoozed" if action_id in SNOOZE_ACTION_IDS else "silenced"
                silence_alert(store, fingerprint, created_by=user, duration=duration,
                              alerting=alerting,
                              reason=f"{verb} for {fmt_duration(duration)} from the alert")
        except (LifecycleError, LookupError) as exc:
            post(client, channel, refusal_message(str(exc)), thread_of(body))

    for action_id in (ACK_ACTION_ID, SILENCE_ACTION_ID, *SNOOZE_ACTION_IDS):
        app.action(action_id)(on_lifecycle_button)
