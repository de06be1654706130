"""Slack listeners, one folder per surface, each with a ``register(app, ...)``."""

from __future__ import annotations

from slack_bolt import App

from bot.listeners import commands
from bot.store import Store


def register_listeners(app: App, store: Store) -> None:
    commands.register(app, store)
