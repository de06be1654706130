"""Questions in Slack: replies in an alert's thread, mentions of the app, and `/run ask`.

The run comes from the alert whose thread the question is in, or from a run named in the
message. Everything is acknowledged first; facts are read on the listeners' own pool and the
answer is generated on the model's device (one generation at a time; a queued question is
told how many are ahead) and posted in the thread as it is checked
(:mod:`bot.slack.stream`): its first checked sentence, redrawn as more pass, and last the
answer with its sources. Nothing here waits for the model, and nothing here can act on a run.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from slack_bolt import App
from slack_sdk import WebClient

from bot.alerting.notify import SlackNotifier
from bot.services.ask import Answerer
from bot.slack.listeners.shared import post
from bot.slack.listeners.work import Work
from bot.slack.stream import PoolClock, StreamedAnswer
from bot.store import Store
from bot.views.answer import DETAILS_BUTTON, details_blocks, parse_details_value
from bot.views.message import Message

log = logging.getLogger("runwatch.slack")

MENTION = re.compile(r"<@[A-Z0-9]+>")


def _question(text: str) -> str:
    return MENTION.sub("", text or "").strip()


def register(app: App, store: Store, answerer: Answerer, work: Work) -> None:
    def in_thread(channel: str, thread_ts: str | None) -> dict[str, Any] | None:
        if not thread_ts:
            return None
        return store.thread(channel, thread_ts)

    def ask_about(client: WebClient, event: dict, run: str, alert: str | None) -> None:
        channel, thread_ts = event["channel"], event.get("thread_ts") or event["ts"]

        def say(message: Message) -> None:
            post(client, channel, message, thread_ts)

        # the model's checked sentences are posted as they come, then the answer's view
        stream = StreamedAnswer(SlackNotifier(client), channel, thread_ts,
                                PoolClock(work.submit))
        answerer.ask(run, _question(event.get("text", "")), channel=channel, alert=alert,
                     say=say, answered=stream.finish, started=stream.started,
                     partial=stream.partial)

    @app.event("message")
    def on_message(event: dict, client: WebClient) -> None:
        """A reply in an alert's thread is a question about that alert's run."""
        if event.get("bot_id") or event.get("subtype") or MENTION.search(event.get("text", "")):
            return  # the bot's own posts, edits and joins; mentions are app_mention's
        work.submit(answer_reply, event, client)

    def answer_reply(event: dict, client: WebClient) -> None:
        thread = in_thread(event.get("channel", ""), event.get("thread_ts"))
        if thread is not None:
            remember(event, thread)
            ask_about(client, event, thread["run"], thread["fingerprint"])

    def remember(event: dict, thread: dict[str, Any]) -> None:
        """What was said in an alert's thread stays with the incident (for "seen before?")."""
        store.add_thread_message(
            channel=event["channel"], thread_ts=event["thread_ts"], ts=event.get("ts", ""),
            fingerprint=thread["fingerprint"], run=thread["run"],
            user=event.get("user", "unknown"), text=_question(event.get("text", "")),
            at=float(event.get("ts") or 0) or time.time())

    @app.event("app_mention")
    def on_mention(event: dict, client: WebClient) -> None:
        work.submit(answer_mention, event, client)

    def answer_mention(event: dict, client: WebClient) -> None:
        from bot.qa import runs_named

        thread = in_thread(event.get("channel", ""), event.get("thread_ts"))
        if thread is not None:
            remember(event, thread)
            ask_about(client, event, thread["run"], thread["fingerprint"])
            return
        named = runs_named(store, event.get("text", ""), answerer.visible(event.get("channel")))
        if not named:
            post(client, event["channel"], Message(
                text="Which run? Name it in the question, e.g. `@runwatch is exp1 overfitting?`"
                     " (`/run list` shows the runs)."), event.get("thread_ts") or event["ts"])
            return
        ask_about(client, event, named[0], None)

    @app.action(DETAILS_BUTTON)
    def on_details(ack: Any, body: dict, respond: Any) -> None:
        """Every fact behind an answer, shown to the one who clicked."""
        ack()
        work.submit(show_details, body, respond)

    def show_details(body: dict, respond: Any) -> None:
        run, question, alert = parse_details_value(body["actions"][0]["value"])
        details = answerer.details(run, question, channel=(body.get("channel") or {}).get("id"),
                                   alert=alert)
        respond(text=details, blocks=details_blocks(details), response_type="ephemeral",
                replace_original=False)
