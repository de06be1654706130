"""Answering a question about a run, for Slack, the console and the command line's callers:
which runs the asker may see, the bot's one chat model, and the answer as a message."""

from __future__ import annotations

from typing import Any

from bot.config import Settings
from bot.notify import Message
from bot.services.status import UnknownRun
from bot.services.visibility import visible_runs
from bot.store import Store
from bot.views.actions import refusal_message

ANSWER_TIMEOUT_S = 120.0


class Answerer:
    """One chat model for the bot (None: answers built from the facts alone)."""

    def __init__(self, store: Store, settings: Settings) -> None:
        from bot.qa import warm
        from bot.qa.models import build_chat_model

        self.store = store
        self.settings = settings
        self.model = build_chat_model(settings.config.qa)
        warm(self.model)  # in the background: the first question need not wait for it

    def visible(self, channel: str | None) -> set[str] | None:
        config = self.settings.config
        return visible_runs(self.store, config.alerting, config.slack.channel, channel)

    def answer(self, run: str, question: str, *, channel: str | None,
               alert: str | None = None, queued: Any = None) -> Message:
        """The answer as a message; an unknown or invisible run is one line."""
        from bot.qa import submit

        try:
            job = submit(self.store, run, question, model=self.model,
                         visible_runs=self.visible(channel), alert=alert)
        except UnknownRun as exc:
            return refusal_message(str(exc))
        ahead = job.position()
        if ahead and queued is not None:
            queued(f":hourglass_flowing_sand: {ahead} question{'s' if ahead > 1 else ''} "
                   f"ahead of yours; the answer follows.")
        answer = job.result(ANSWER_TIMEOUT_S)
        text = answer.render()
        return Message(text=text, blocks=[{"type": "section", "text": {
            "type": "mrkdwn", "text": text[:2900]}}], kind="answer",
            data={"run": run, "model": answer.model, "fallback": answer.fallback})
