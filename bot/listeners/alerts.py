"""The lifecycle buttons on an alert: Acknowledge (stops repeats and the escalation) and
Silence (this signal on this run, for the default silence duration)."""

from __future__ import annotations

import logging

from slack_bolt import Ack, App
from slack_sdk import WebClient

from bot.alerts import LifecycleError, acknowledge, silence_alert
from bot.config import AlertingConfig
from bot.lifecycle_views import ACK_ACTION_ID, SILENCE_ACTION_ID
from bot.listeners.actions import post, thread_of
from bot.store import Store
from bot.views.actions import refusal_message

log = logging.getLogger("runwatch.slack")


def register(app: App, store: Store, alerting: AlertingConfig) -> None:
    def on_lifecycle_button(ack: Ack, body: dict, action: dict, client: WebClient) -> None:
        ack()
        user = (body.get("user") or {}).get("id") or "unknown"
        channel = (body.get("channel") or {}).get("id")
        fingerprint = action.get("value") or ""
        try:
            if action["action_id"] == ACK_ACTION_ID:
                acknowledge(store, fingerprint, user, alerting=alerting)
            else:
                silence_alert(store, fingerprint, created_by=user, alerting=alerting)
        except (LifecycleError, LookupError) as exc:
            post(client, channel, refusal_message(str(exc)), thread_of(body))

    app.action(ACK_ACTION_ID)(on_lifecycle_button)
    app.action(SILENCE_ACTION_ID)(on_lifecycle_button)
