"""App Home: the overview is drawn afresh each time someone opens the tab (on the
listeners' pool: with many runs it reads every run's findings)."""

from __future__ import annotations

import logging

from slack_bolt import App
from slack_sdk import WebClient

from bot.services.runs import latest_findings, list_runs
from bot.slack.listeners.work import Work
from bot.store import Store
from bot.views.home import home_view

log = logging.getLogger("runwatch.slack")


def register(app: App, store: Store, work: Work) -> None:
    @app.event("app_home_opened")
    def on_home_opened(event: dict, client: WebClient) -> None:
        if event.get("tab", "home") == "home":
            work.submit(publish_home, event, client)

    def publish_home(event: dict, client: WebClient) -> None:
        runs = list_runs(store, include_finished=True)
        client.views_publish(user_id=event["user"],
                             view=home_view(runs, latest_findings(store, runs)))
