"""`/run …`: acknowledge at once, then answer through the response URL from the listeners'
own pool (a chart takes seconds to draw; a question is answered when its model is done)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slack_bolt import Ack, App, Respond
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.actions import ActionRequest, Actions
from bot.commands import ActionContext, handle_run_command
from bot.services.ask import Answerer
from bot.slack.listeners.shared import UserGroups, actor_from, report_when_done
from bot.slack.listeners.work import Work
from bot.store import Store
from bot.views.actions import progress_message
from bot.views.message import Message

log = logging.getLogger("runwatch.slack")

# Replies the whole channel should see: a request for an action, and what became of it.
IN_CHANNEL_KINDS = ("action", "answer")


# What `ask` returns once the question is on its way: everything is said through `respond`.
ASKED = Message(text="", kind="asked")


def make_run_command(store: Store, actions: Actions, answerer: Answerer | None,
                     groups: UserGroups, work: Work) -> Callable[..., None]:

    def run_command(ack: Ack, command: dict, respond: Respond, client: WebClient) -> None:
        ack()
        log.info("/run %s from %s in %s", command.get("text", ""), command.get("user_id"),
                 command.get("channel_id"))
        work.submit(answer_command, command, respond, client,
                    failed=lambda text: respond(text=text, response_type="ephemeral"))

    def answer_command(command: dict, respond: Respond, client: WebClient) -> None:
        actor = actor_from(command, groups)

        def reply(message: Message) -> None:
            respond(text=message.text, blocks=message.blocks, replace_original=False,
                    response_type="in_channel" if message.kind in IN_CHANNEL_KINDS
                    else "ephemeral")

        def run_confirmed(req: ActionRequest) -> Message:
            report_when_done(client, actions, req, actor.channel, req.thread_ts)
            return progress_message(req, actor.mention)

        def ask(run: str, question: str) -> Message:
            answerer.ask(run, question, channel=actor.channel, say=reply,
                         answered=lambda message: work.submit(reply, message))
            return ASKED

        ctx = ActionContext(actions=actions, actor=actor, run_confirmed=run_confirmed,
                            ask=ask if answerer is not None else None)
        message = handle_run_command(command.get("text", ""), store, ctx)
        if message is not ASKED:
            reply(message)
        if message.kind == "upload":  # a chart (`plot`, `compare`), drawn after the ack
            upload_chart(client, respond, command.get("channel_id"), message.data)

    return run_command


def upload_chart(client: WebClient, respond: Respond, channel: str | None,
                 data: dict[str, Any]) -> None:
    """Share the chart in the channel the command came from; a failure (the bot is not in
    that channel, say) is answered in one line to the person who asked."""
    try:
        client.files_upload_v2(channel=channel, file=data["png"], filename=data["filename"],
                               title=data["title"], alt_txt=data["title"],
                               initial_comment=data.get("comment"))
    except SlackApiError as exc:
        error = exc.response.get("error") if isinstance(exc.response.data, dict) else None
        log.warning("chart upload to %s failed: %s", channel, error or exc)
        hint = " — invite the bot to this channel (`/invite @runwatch`)" if error in (
            "not_in_channel", "channel_not_found") else ""
        respond(text=f"The chart could not be uploaded ({error or 'Slack error'}){hint}.",
                response_type="ephemeral", replace_original=False)


def register(app: App, store: Store, actions: Actions, answerer: Answerer, groups: UserGroups,
             work: Work) -> None:
    app.command("/run")(make_run_command(store, actions, answerer, groups, work))
