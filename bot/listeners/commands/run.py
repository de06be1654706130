"""`/run …`: acknowledge at once, then answer through the response URL."""

from __future__ import annotations

import logging
from collections.abc import Callable

from slack_bolt import Ack, Respond

from bot.commands import handle_run_command
from bot.store import Store

log = logging.getLogger("runwatch.slack")


def make_run_command(store: Store) -> Callable[..., None]:
    def run_command(ack: Ack, command: dict, respond: Respond) -> None:
        ack()
        log.info("/run %s from %s in %s", command.get("text", ""), command.get("user_id"),
                 command.get("channel_id"))
        message = handle_run_command(command.get("text", ""), store)
        respond(text=message.text, blocks=message.blocks, response_type="ephemeral")

    return run_command
