"""Slack listeners, one folder per surface, each with a ``register(app, ...)``."""

from __future__ import annotations

from slack_bolt import App

from bot.actions import Actions
from bot.config import AlertingConfig
from bot.listeners import actions as action_buttons
from bot.listeners import alerts as alert_buttons
from bot.listeners import ask, commands, home
from bot.services.ask import Answerer
from bot.store import Store


def register_listeners(app: App, store: Store, actions: Actions, alerting: AlertingConfig,
                       answerer: Answerer) -> None:
    commands.register(app, store, actions, answerer)
    ask.register(app, store, answerer)
    action_buttons.register(app, store, actions)
    alert_buttons.register(app, store, alerting)
    home.register(app, store)
