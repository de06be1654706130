"""The `/run` command language, shared by Slack and the console prompt."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from bot.actions import ActionRefused, ActionRequest, Actions, Actor
from bot.charts import (
    NothingToPlot,
    UnknownTag,
    compare_chart,
    parse_step_range,
    run_chart,
)
from bot.commands.lifecycle import COMMANDS as ALERT_COMMANDS
from bot.commands.lifecycle import handle_alert_command
from bot.services import stoploss
from bot.services.changes import what_changed
from bot.services.compare import SameRun, compare_runs
from bot.services.digest import build_digest
from bot.services.runs import list_runs
from bot.services.status import run_status
from bot.store import Store, UnknownRun
from bot.views.actions import confirmation_message, refusal_message, result_message
from bot.views.changes import changes_message
from bot.views.compare import compare_message
from bot.views.digest import digest_message
from bot.views.message import Message
from bot.views.plot import plot_message
from bot.views.runs import runs_message
from bot.views.status import help_message, status_message


@dataclass
class ActionContext:
    """What the action sub-commands need: the service, who asks, and how a confirmed request
    is carried out (at once on the console; on a worker, answering later, in Slack); and how
    a question is answered (``ask(run, question)``), where questions can be asked."""

    actions: Actions
    actor: Actor
    run_confirmed: Callable[[ActionRequest], Message]
    thread_ts: str | None = None
    ask: Callable[[str, str], Message] | None = None


class _UsageError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # never exit the bot on a user's typo
        raise _UsageError(message)


def _action_parser(action: str) -> _Parser:
    parser = _Parser(prog=f"/run {action}", add_help=False)
    parser.add_argument("run")
    if action == "rollback":
        parser.add_argument("step", nargs="?", type=int)
        parser.add_argument("--skip", default=None, metavar="A-B|no")
        parser.add_argument("--lr-scale", type=float, default=None)
    return parser


def _skip(text: str | None) -> bool | tuple[int, int] | None:
    if text is None:
        return None
    if text.lower() in ("no", "none", "false", "0"):
        return False
    if text.lower() in ("yes", "auto", "true"):
        return True
    first, sep, last = text.partition("-")
    if not sep or not first.isdigit() or not last.isdigit():
        raise _UsageError(f"--skip takes a step range A-B (or 'no'), got {text!r}")
    return int(first), int(last)


def _action_command(command: str, args: list[str], ctx: ActionContext | None) -> Message:
    if ctx is None:
        return refusal_message("Actions are not available here.")
    try:
        if command in ("confirm", "cancel"):
            if len(args) != 1:
                raise _UsageError(f"`/run {command}` takes a request id, e.g. "
                                  f"`/run {command} rw-1a2b3c`")
            if command == "cancel":
                req = ctx.actions.cancel(args[0], ctx.actor)
                return result_message(req) if not req.existing else refusal_message(
                    f"Request `{req.id}` is {req.state}; nothing to cancel.")
            req = ctx.actions.confirm(args[0], ctx.actor)
            if req.existing:
                by = f" (confirmed by <@{req.confirmed_by}>)" if req.confirmed_by else ""
                return refusal_message(f"Request `{req.id}` is already {req.state}{by}; it "
                                       f"runs only once.")
            return ctx.run_confirmed(req)
        opts = _action_parser(command).parse_args(args)
        req = ctx.actions.request(
            command, opts.run, ctx.actor, thread_ts=ctx.thread_ts,
            step=getattr(opts, "step", None), skip=_skip(getattr(opts, "skip", None)),
            lr_scale=getattr(opts, "lr_scale", None))
        return confirmation_message(req, ctx.actor.mention)
    except _UsageError as exc:
        return help_message(f"{exc}.")
    except ActionRefused as exc:
        return refusal_message(str(exc))


def _chart_command(command: str, args: list[str], store: Store) -> Message:
    """`/run plot RUN [TAGS…] [A-B]` and `/run compare RUN RUN [TAGS…]`: drawn here, after
    Slack's ack; the reply carries the PNG (kind "upload")."""
    try:
        if command == "plot":
            if not args:
                return help_message("`/run plot` takes a run name, e.g. `/run plot exp1` or "
                                    "`/run plot exp1 loss grad_norm 1000-2000`.")
            ranges = [r for r in map(parse_step_range, args[1:]) if r]
            tags = [a for a in args[1:] if not parse_step_range(a)]
            return plot_message(run_chart(store, args[0], tags,
                                          steps=ranges[-1] if ranges else (None, None)))
        if len(args) < 2:
            return help_message("`/run compare` takes two run names, e.g. "
                                "`/run compare exp1 exp2`.")
        comparison = compare_runs(store, args[0], args[1])
        return compare_message(comparison, compare_chart(store, args[0], args[1], args[2:]))
    except (UnknownRun, UnknownTag, NothingToPlot, SameRun) as exc:
        return Message(text=str(exc), kind="error")


def _stoploss_command(args: list[str], store: Store, user: str) -> Message:
    """`/run stoploss RUN` shows the run's rule; `/run stoploss RUN "RULE"` declares it."""
    if not args:
        return help_message(f"`/run stoploss` takes a run and a rule, e.g. `/run stoploss exp1 "
                            f"{stoploss.EXAMPLE}`, or just the run to see its rule.")
    try:
        if len(args) == 1:
            rule, by = stoploss.declared_rule(store, args[0])
            who = f" (declared by {by['by']})" if by.get("by") else ""
            return Message(text=f"Stop-loss for {args[0]}: {stoploss.describe(rule)}{who}.",
                           kind="stoploss")
        rule = stoploss.declare(store, args[0], " ".join(args[1:]), user)
    except UnknownRun as exc:
        return Message(text=str(exc), kind="error")
    except stoploss.RuleError as exc:
        return help_message(f"{exc}.")
    return Message(text=f"Stop-loss for {args[0]} declared: {stoploss.describe(rule)}. "
                        f"runwatch warns in the channel when it is met.", kind="stoploss")


def handle_run_command(text: str, store: Store, ctx: ActionContext | None = None) -> Message:
    """Answer the text after ``/run``; never raises for anything a user can type."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    if not words or words[0] == "help":
        return help_message()
    command, args = words[0].lower(), words[1:]
    if command == "ask":
        if len(args) < 2:
            return help_message("`/run ask` takes a run and a question, e.g. "
                                "`/run ask exp1 what changed at step 2000?`")
        if ctx is None or ctx.ask is None:
            return refusal_message("Questions are not available here.")
        return ctx.ask(args[0], " ".join(args[1:]))
    if command in ("rollback", "stop", "confirm", "cancel"):
        return _action_command(command, args, ctx)
    if command in ALERT_COMMANDS:
        return handle_alert_command(command, args, store,
                                    user=ctx.actor.user if ctx else "console")
    if command == "list":
        return runs_message(list_runs(store))
    if command in ("plot", "compare"):
        return _chart_command(command, args, store)
    if command == "changes":
        if not 1 <= len(args) <= 2:
            return help_message("`/run changes` takes a run and a step or a second run, e.g. "
                                "`/run changes exp1 2000` or `/run changes exp1 exp2`.")
        try:
            return changes_message(what_changed(store, *args))
        except UnknownRun as exc:
            return Message(text=str(exc), kind="error")
    if command == "digest":
        return digest_message(build_digest(store))
    if command == "stoploss":
        return _stoploss_command(args, store, ctx.actor.user if ctx else "console")
    if command == "status":
        if len(args) != 1:
            return help_message("`/run status` takes one run name, e.g. `/run status exp1`.")
        try:
            return status_message(run_status(store, args[0]))
        except UnknownRun as exc:
            return Message(text=str(exc), kind="error")
    return help_message(f"Unknown sub-command `{command}`.")
