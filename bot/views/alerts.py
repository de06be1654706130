"""Alert and resolved-notice messages for one stored finding."""

from __future__ import annotations

import json
from typing import Any

from slack_sdk.models.blocks import (
    ContextBlock,
    DividerBlock,
    HeaderBlock,
    MarkdownTextObject,
    SectionBlock,
)

from analyzers.finding import TROUBLE_KINDS
from bot.services.status import fmt_value
from bot.views.actions import alert_buttons
from bot.views.message import Message

SEVERITY_ICON = {"critical": ":rotating_light:", "warning": ":warning:",
                 "info": ":information_source:"}


def evidence_value(value: Any) -> str:
    """Evidence as people read it: numbers rounded, non-finite values as NaN/inf."""
    if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf"):
        value = float(value)
    return fmt_value(value) if isinstance(value, float) else str(value)


def finding_data(row: dict[str, Any]) -> dict[str, Any]:
    """A finding as a dict, from a stored row (its ``data`` as JSON text or already parsed)
    or from the finding dict itself."""
    data = row.get("data")
    if isinstance(data, str):
        return json.loads(data)
    return data if isinstance(data, dict) else row


def _evidence_fields(evidence: dict[str, Any]) -> list[str]:
    fields = []
    for key, value in evidence.items():
        if isinstance(value, list) or value is None or key == "changed_before":
            continue  # point lists go to the chart and the JSON output, not the fields
        value = evidence_value(value)
        fields.append(f"*{key.replace('_', ' ')}*\n{value}")
    return fields[:10]


def alert_message(row: dict[str, Any]) -> Message:
    f = finding_data(row)
    icon = SEVERITY_ICON.get(f["severity"], "")
    title = f"{f['severity'].upper()} · {f['run']} · {f['signal']}"
    fixes = f.get("fixes") or []
    fix_lines = [f"{'*' if i == 0 else ''}{i + 1}. {fix['text']}{'*' if i == 0 else ''}"
                 for i, fix in enumerate(fixes)]
    rollback = f.get("rollback_to")
    rollback_text = (f"Roll back to step {rollback['step']} (`{rollback['path']}`): "
                     f"{rollback['reason']}" if rollback
                     else "No checkpoint before the onset to roll back to.")
    blocks = [
        HeaderBlock(text=f"{icon} {title}"[:150]),
        SectionBlock(text=MarkdownTextObject(text=f["summary"])),
    ]
    changed = (f.get("evidence") or {}).get("changed_before")
    if changed:  # what was changed then (issue 26): the change event before the onset
        blocks.append(ContextBlock(elements=[MarkdownTextObject(
            text=f":arrows_counterclockwise: changed since the previous attempt {changed}")]))
    fields = _evidence_fields(f.get("evidence") or {})
    fields.append(f"*onset → detected*\nstep {f['onset_step']} → step {f['detected_step']}")
    blocks.append(SectionBlock(fields=[MarkdownTextObject(text=t) for t in fields[:10]]))
    blocks.append(DividerBlock())
    if fix_lines:
        blocks.append(SectionBlock(text=MarkdownTextObject(
            text="*What to try, in order*\n" + "\n".join(fix_lines))))
    blocks.append(SectionBlock(text=MarkdownTextObject(text=f":rewind: {rollback_text}")))
    blocks.append(alert_buttons(f))
    blocks.append(ContextBlock(elements=[MarkdownTextObject(
        text=f"{TROUBLE_KINDS.get(f['kind'], f['kind'])} · source: {f['source']} · "
             f"attempt {f['attempt']} · fingerprint `{f['fingerprint']}`")]))
    first_fix = f" First fix: {fixes[0]['text']}." if fixes else ""
    text = f"[{f['severity']}] {f['run']}: {f['summary']}{first_fix}"
    return Message(text=text, blocks=[b.to_dict() for b in blocks], kind="alert", data=f)


def resolved_message(row: dict[str, Any], current_attempt: int | None = None) -> Message:
    f = finding_data(row)
    if f.get("resolved_step") is not None and f.get("state") == "resolved":
        where = f" at step {f['resolved_step']}"
    elif current_attempt is not None and current_attempt > f["attempt"]:
        where = f" (the run went back and started attempt {current_attempt})"
    else:
        where = " (no longer detected)"
    text = (f":white_check_mark: Resolved{where}: {f['signal']} on {f['run']} "
            f"(began at step {f['onset_step']}).")
    blocks = [SectionBlock(text=MarkdownTextObject(text=text))]
    return Message(text=text, blocks=[b.to_dict() for b in blocks], kind="resolved", data=f)


def joined_message(row: dict[str, Any]) -> Message:
    """An alert added to its run's message by an edit, said in that message's thread and
    shown in the channel: Slack notifies nobody of an edit."""
    f = finding_data(row)
    fixes = f.get("fixes") or []
    first_fix = f" First fix: {fixes[0]['text']}." if fixes else ""
    text = (f"{SEVERITY_ICON.get(f['severity'], '')} New {f['severity']} on {f['run']}: "
            f"{f['signal']} — {f['summary']}.{first_fix} It is in the alert message above.")
    blocks = [SectionBlock(text=MarkdownTextObject(text=text))]
    return Message(text=text, blocks=[b.to_dict() for b in blocks], kind="joined", data=f,
                   broadcast=True)
