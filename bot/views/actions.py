"""Messages of the action flow: the buttons on an alert, the confirmation, the outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    ButtonElement,
    ConfirmObject,
    ContextBlock,
    MarkdownTextObject,
    SectionBlock,
)

from bot.actions import ActionRequest
from bot.views.message import Message

ROLLBACK_BUTTON = "rw_rollback"
STOP_BUTTON = "rw_stop"
CONFIRM_BUTTON = "rw_confirm"
CANCEL_BUTTON = "rw_cancel"

STATE_ICON = {"done": ":white_check_mark:", "failed": ":x:", "refused": ":no_entry:",
              "cancelled": ":heavy_multiplication_x:", "expired": ":hourglass:"}


def alert_buttons(finding: dict[str, Any]) -> ActionsBlock:
    """Roll back (when the finding has a target) and Stop, carrying the alert's fingerprint."""
    elements = []
    target = finding.get("rollback_to")
    if target:
        elements.append(ButtonElement(
            text=f"Roll back to {Path(target['path']).name}"[:75], action_id=ROLLBACK_BUTTON,
            value=finding["fingerprint"], style="danger"))
    elements.append(ButtonElement(text="Stop run", action_id=STOP_BUTTON,
                                  value=finding["fingerprint"]))
    return ActionsBlock(block_id=f"actions:{finding['fingerprint']}", elements=elements)


def confirmation_message(req: ActionRequest, asked_by: str) -> Message:
    """The request named in full, with Confirm (behind a dialog naming it again) and Cancel."""
    what = req.describe()
    header = f"{asked_by} asks to {what}." if not req.existing else \
        f"Already asked ({req.state}): {what}."
    verb = "Roll back" if req.action == "rollback" else "Stop"
    dialog = ConfirmObject(
        title=f"{verb} {req.run}?"[:100],
        text=MarkdownTextObject(
            text=f"{what[0].upper()}{what[1:]}. Requested by {asked_by}."[:300]),
        confirm=verb, deny="Not now", style="danger")
    blocks: list[Any] = [SectionBlock(text=MarkdownTextObject(text=f":rewind: {header}"
                                                              if req.action == "rollback"
                                                              else f":octagonal_sign: {header}"))]
    if req.state == "requested":
        blocks.append(ActionsBlock(block_id=f"confirm:{req.id}", elements=[
            ButtonElement(text=f"Confirm: {verb.lower()}", action_id=CONFIRM_BUTTON,
                          value=req.id, style="danger", confirm=dialog),
            ButtonElement(text="Cancel", action_id=CANCEL_BUTTON, value=req.id)]))
    blocks.append(ContextBlock(elements=[MarkdownTextObject(
        text=f"request `{req.id}` · or type `/run confirm {req.id}`")]))
    return Message(text=f"{header} Confirm with /run confirm {req.id}",
                   blocks=[b.to_dict() for b in blocks], kind="action",
                   data={"request": req.id, "describe": what})


def progress_message(req: ActionRequest, by: str) -> Message:
    text = f":hourglass_flowing_sand: {by} confirmed: {req.describe()} (request `{req.id}`)."
    return Message(text=text, blocks=[SectionBlock(text=MarkdownTextObject(text=text)).to_dict()],
                   kind="action")


def result_message(req: ActionRequest) -> Message:
    """The outcome in the thread: what was done, or why not, with the output's tail."""
    result = req.result or {}
    icon = STATE_ICON.get(req.state, ":grey_question:")
    verb = "Rollback of" if req.action == "rollback" else "Stop of"
    dry = " (dry run)" if result.get("dry_run") else ""
    if req.state == "done":
        head = f"{icon} {verb} *{req.run}* done{dry}: {result.get('detail', '')}"
    else:
        head = f"{icon} {verb} *{req.run}* {req.state}: {result.get('detail', '')}"
    blocks: list[Any] = [SectionBlock(text=MarkdownTextObject(text=head[:2900]))]
    if result.get("output_tail"):
        blocks.append(SectionBlock(text=MarkdownTextObject(
            text=f"```{result['output_tail'][-2800:]}```")))
    extra = f" · exit status {result['exit_status']}" if result.get("exit_status") is not None \
        else ""
    blocks.append(ContextBlock(elements=[MarkdownTextObject(
        text=f"request `{req.id}` · backend {req.backend or '-'}{extra} · `runwatch audit "
             f"--run {req.run}`")]))
    return Message(text=head, blocks=[b.to_dict() for b in blocks], kind="action",
                   data={"request": req.id, "state": req.state})


def refusal_message(text: str) -> Message:
    return Message(text=f":no_entry: {text}",
                   blocks=[SectionBlock(text=MarkdownTextObject(text=f":no_entry: {text}"))
                           .to_dict()], kind="error")
