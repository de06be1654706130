"""Block Kit for the alert lifecycle: a group's message as it stands now, the replies in its
thread (repeat, escalation), and the `/run alerts` and `/run silences` listings.

A group of one alert is drawn exactly as :func:`bot.views.alerts.alert_message` draws it,
with its status (acknowledged, silenced, inhibited, resolved) and the Acknowledge and
Silence buttons; a group of several lists them one under the other.
"""

from __future__ import annotations

import time
from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    ButtonElement,
    ContextBlock,
    DividerBlock,
    HeaderBlock,
    MarkdownTextObject,
    SectionBlock,
)

from analyzers.fmt import fmt_duration
from bot.views.actions import alert_buttons
from bot.views.alerts import SEVERITY_ICON, alert_message, finding_data
from bot.views.message import Message, mention

ACK_ACTION_ID = "alert_acknowledge"
"""Button action id; its value is the alert's fingerprint → ``silences.acknowledge``."""
SILENCE_ACTION_ID = "alert_silence"
"""Button action id; its value is the alert's fingerprint → ``silences.silence_alert``."""
SNOOZE_ACTION_IDS = {"alert_snooze_1h": 3600.0, "alert_snooze_4h": 4 * 3600.0}
"""Snooze buttons → a silence of this signal on this run for that long."""
SILENCE_BUTTON_SECONDS = 24 * 3600.0  # "Silence this signal for this run": a day
MAX_LISTED = 10  # alerts drawn in full in one group message (Slack allows 50 blocks)


def status_line(member: dict[str, Any]) -> str | None:
    """What happened to the alert since it was posted, in one line (None: just firing)."""
    f = finding_data(member)
    parts = []
    if member["state"] == "resolved":
        where = f" at step {f['resolved_step']}" if f.get("resolved_step") is not None else ""
        parts.append(f":white_check_mark: Resolved{where}")
    elif member.get("muted"):
        parts.append(f":no_bell: {member['muted'][0].upper()}{member['muted'][1:]}")
    if member.get("acked_by"):
        parts.append(f":eyes: Acknowledged by {mention(member['acked_by'])}")
    return " · ".join(parts) or None


def buttons(fingerprint: str) -> list[ButtonElement]:
    return [ButtonElement(text="Acknowledge", action_id=ACK_ACTION_ID, value=fingerprint),
            *(ButtonElement(text=f"Snooze {action_id.rsplit('_', 1)[1]}", action_id=action_id,
                            value=fingerprint) for action_id in SNOOZE_ACTION_IDS),
            ButtonElement(text="Silence this signal (1 day)", action_id=SILENCE_ACTION_ID,
                          value=fingerprint)]


def _open(member: dict[str, Any]) -> bool:
    return member["state"] != "resolved" and not member.get("acked_by")


def group_message(members: list[dict[str, Any]], *, now: float | None = None) -> Message:
    """The group message drawn from its alerts' current state."""
    if len(members) == 1:
        return _single(members[0])
    first = finding_data(members[0])
    firing = sum(m["state"] != "resolved" for m in members)
    worst = next((s for s in ("critical", "warning", "info")
                  if any(finding_data(m)["severity"] == s and m["state"] != "resolved"
                         for m in members)), None)
    icon = SEVERITY_ICON.get(worst or "", ":white_check_mark:")
    blocks: list[Any] = [HeaderBlock(
        text=f"{icon} {first['run']} · {len(members)} alerts, {firing} firing"[:150])]
    lines = []
    for member in members[:MAX_LISTED]:
        f = finding_data(member)
        fixes = f.get("fixes") or []
        first_fix = f"\nFirst fix: {fixes[0]['text']}" if fixes else ""
        blocks.append(SectionBlock(text=MarkdownTextObject(
            text=f"*{f['severity'].upper()} · {f['signal']}* — {f['summary']}{first_fix}"[:3000])))
        status = status_line(member)
        blocks.append(ContextBlock(elements=[MarkdownTextObject(
            text=(f"{status} · " if status else "")
            + f"onset step {f['onset_step']} · fingerprint `{f['fingerprint']}`")]))
        if _open(member):  # roll back / stop, then acknowledge / silence
            blocks.append(ActionsBlock(elements=[*alert_buttons(f).elements,
                                                 *buttons(f["fingerprint"])]))
        blocks.append(DividerBlock())
        lines.append(f"[{'resolved' if member['state'] == 'resolved' else f['severity']}] "
                     f"{f['signal']}: {f['summary']}")
    if len(members) > MAX_LISTED:
        more = len(members) - MAX_LISTED
        blocks.append(SectionBlock(text=MarkdownTextObject(
            text=f"…and {more} more; `/run alerts {first['run']}` lists them all.")))
    text = f"{first['run']}: {len(members)} alerts — " + "; ".join(lines)
    return Message(text=text[:3000], blocks=[b.to_dict() for b in blocks], kind="alert",
                   data=first)


def _single(member: dict[str, Any]) -> Message:
    drawn = alert_message(finding_data(member))
    blocks = list(drawn.blocks or [])
    text = drawn.text
    if member["state"] == "resolved" and blocks and blocks[0].get("type") == "header":
        header = blocks[0]["text"]["text"]
        blocks[0] = {**blocks[0], "text": {**blocks[0]["text"],
                                           "text": f":white_check_mark: RESOLVED · "
                                                   f"{header.split(' ', 1)[-1]}"[:150]}}
        text = f"[resolved] {text}"
    status = status_line(member)
    if status:
        blocks.append(ContextBlock(elements=[MarkdownTextObject(text=status)]).to_dict())
    if _open(member):
        extra = [b.to_dict() for b in buttons(drawn.data["fingerprint"])]
        actions = next((b for b in blocks if b.get("type") == "actions"), None)
        if actions is not None and len(actions["elements"]) + len(extra) <= 25:
            actions["elements"] = [*actions["elements"], *extra]
        else:
            blocks.append({"type": "actions", "elements": extra})
    return Message(text=text, blocks=blocks, kind="alert", data=drawn.data)


def repeat_message(finding: dict[str, Any], alert: dict[str, Any], *, now: float) -> Message:
    f = finding_data(finding)
    lasted = fmt_duration(now - alert["fired_at"]) if alert.get("fired_at") else "a while"
    text = (f":repeat: Still firing after {lasted}: {f['signal']} on {f['run']} — "
            f"{f['summary']}. Acknowledge it to stop these reminders.")
    return Message(text=text, blocks=[SectionBlock(text=MarkdownTextObject(text=text)).to_dict()],
                   kind="repeat", data=f, broadcast=True)


def escalation_message(finding: dict[str, Any], alert: dict[str, Any], oncall: str | None, *,
                       now: float) -> Message:
    f = finding_data(finding)
    waited = fmt_duration(now - alert["fired_at"]) if alert.get("fired_at") else "a while"
    who = f"<!subteam^{oncall}>" if oncall else "on-call"
    text = (f":sos: {who}: critical {f['signal']} on {f['run']} has not been acknowledged "
            f"for {waited} — {f['summary']}")
    return Message(text=text, blocks=[SectionBlock(text=MarkdownTextObject(text=text)).to_dict()],
                   kind="escalate", data=f, broadcast=True)


def alerts_listing(alerts: list[dict[str, Any]], *, now: float | None = None) -> Message:
    """`/run alerts`: what is pending or firing, with muting and acknowledgement."""
    now = time.time() if now is None else now
    if not alerts:
        return Message(text="No alerts are pending or firing.", kind="alerts")
    lines = []
    for a in alerts:
        since = a["fired_at"] if a["state"] == "firing" else a["pending_since"]
        age = f" for {fmt_duration(now - since)}" if since else ""
        notes = [n for n in (a.get("muted"), a.get("acked_by")
                             and f"acknowledged by {mention(a['acked_by'])}") if n]
        lines.append(f"• {SEVERITY_ICON.get(a['severity'], '')} *{a['run']}* {a['signal']} — "
                     f"{a['state']}{age}: {a['summary']}"
                     + (f" _({'; '.join(notes)})_" if notes else "")
                     + f" `{a['fingerprint'][:8]}`")
    text = f"{len(alerts)} alert{'s' if len(alerts) != 1 else ''}:\n" + "\n".join(lines)
    return Message(text=text, blocks=[SectionBlock(text=MarkdownTextObject(
        text=text[:3000])).to_dict()], kind="alerts")


def silences_listing(lines: list[str]) -> Message:
    """`/run silences`: one line per silence."""
    if not lines:
        return Message(text="No silences. `/run silence run=exp1 signal=plateau 2h why` "
                            "creates one.", kind="silences")
    text = "Silences:\n" + "\n".join(f"• {line}" for line in lines)
    return Message(text=text, blocks=[SectionBlock(text=MarkdownTextObject(
        text=text[:3000])).to_dict()], kind="silences")
