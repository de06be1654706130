from __future__ import annotations

from slack_bolt import App

from bot.actions import Actions
from bot.services.ask import Answerer
from bot.slack.listeners.commands.run import make_run_command
from bot.slack.listeners.work import Work
from bot.store import Store


def register(app: App, store: Store, actions: Actions, answerer: Answerer, work: Work) -> None:
    app.command("/run")(make_run_command(store, actions, answerer, work))
