"""Slack listeners, one module per surface, each with a ``register(app, ...)``.

Every listener acknowledges and returns at once; what takes time runs on one
:class:`~bot.slack.listeners.work.Work` pool shared by all of them (see there why).
"""

from __future__ import annotations

from slack_bolt import App

from bot.actions import Actions
from bot.config import AlertingConfig
from bot.services.ask import Answerer
from bot.slack.listeners import actions as action_buttons
from bot.slack.listeners import alerts as alert_buttons
from bot.slack.listeners import ask, commands, home
from bot.slack.listeners.shared import UserGroups
from bot.slack.listeners.work import Work
from bot.store import Store


def register_listeners(app: App, store: Store, actions: Actions, alerting: AlertingConfig,
                       answerer: Answerer, work: Work) -> None:
    groups = UserGroups(app.client, actions)  # one cache of user groups for every surface
    commands.register(app, store, actions, answerer, groups, work)
    ask.register(app, store, answerer, work)
    action_buttons.register(app, store, actions, groups, work)
    alert_buttons.register(app, store, alerting, work)
    home.register(app, store, work)
