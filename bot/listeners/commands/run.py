"""`/run …`: acknowledge at once, then answer through the response URL."""

from __future__ import annotations

import logging
from collections.abc import Callable

from slack_bolt import Ack, Respond
from slack_sdk import WebClient

from bot.actions import ActionRequest, Actions
from bot.commands import ActionContext, handle_run_command
from bot.listeners.actions import UserGroups, actor_from, report_when_done
from bot.notify import Message
from bot.store import Store
from bot.views.actions import progress_message

log = logging.getLogger("runwatch.slack")

# Replies the whole channel should see: a request for an action, and what became of it.
IN_CHANNEL_KINDS = ("action",)


def make_run_command(store: Store, actions: Actions) -> Callable[..., None]:
    groups: UserGroups | None = None

    def run_command(ack: Ack, command: dict, respond: Respond, client: WebClient) -> None:
        nonlocal groups
        ack()
        log.info("/run %s from %s in %s", command.get("text", ""), command.get("user_id"),
                 command.get("channel_id"))
        groups = groups or UserGroups(client, actions)
        actor = actor_from(command, groups)

        def run_confirmed(req: ActionRequest) -> Message:
            report_when_done(client, actions, req, actor.channel, req.thread_ts)
            return progress_message(req, actor.mention)

        ctx = ActionContext(actions=actions, actor=actor, run_confirmed=run_confirmed)
        message = handle_run_command(command.get("text", ""), store, ctx)
        respond(text=message.text, blocks=message.blocks,
                response_type="in_channel" if message.kind in IN_CHANNEL_KINDS else "ephemeral")

    return run_command
