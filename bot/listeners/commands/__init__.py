from __future__ import annotations

from slack_bolt import App

from bot.listeners.commands.run import make_run_command
from bot.store import Store


def register(app: App, store: Store) -> None:
    app.command("/run")(make_run_command(store))
