"""The `/run` command language, shared by Slack and the console prompt."""

from __future__ import annotations

import shlex

from bot.notify import Message
from bot.services.status import UnknownRun, run_status
from bot.store import Store
from bot.views.status import help_message, status_message


def handle_run_command(text: str, store: Store) -> Message:
    """Answer the text after ``/run``; never raises for anything a user can type."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    if not words or words[0] == "help":
        return help_message()
    command, args = words[0].lower(), words[1:]
    if command == "status":
        if len(args) != 1:
            return help_message("`/run status` takes one run name, e.g. `/run status exp1`.")
        try:
            return status_message(run_status(store, args[0]))
        except UnknownRun as exc:
            return Message(text=str(exc), kind="error")
    return help_message(f"Unknown sub-command `{command}`.")
