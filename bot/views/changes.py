"""The `/run changes` reply: what changed, when, how many variables, and what is missing."""

from __future__ import annotations

from slack_sdk.models.blocks import ContextBlock, HeaderBlock, MarkdownTextObject, SectionBlock

from bot.services.changes import Change, ChangeReport, fmt_setting
from bot.views.message import Message

MAX_LINES = 15


def _title(r: ChangeReport) -> str:
    if r.question == "runs":
        return f"What differs: {r.run} → {r.other}"
    if r.question == "step":
        return f"What changed around step {r.step} of {r.run}"
    return f"What changed in {r.run}"


def _where(c: Change, r: ChangeReport) -> str:
    if r.question == "runs":
        return f"{r.run} → {r.other}"
    where = f"step {c.step}" if c.step is not None else "the start of the attempt"
    if r.question == "step" and c.step is not None and r.step is not None:
        where += " (in force then)" if c.step <= r.step else " (after it)"
    return f"attempt {c.attempt} at {where}" if c.attempt else where


def change_lines(c: Change) -> list[str]:
    lines = [f"`{key}`: {fmt_setting(old)} → {fmt_setting(new)}"
             for key, (old, new) in list(c.changed.items())[:MAX_LINES]]
    if len(c.changed) > MAX_LINES:
        lines.append(f"… and {len(c.changed) - MAX_LINES} more")
    return lines


def changes_message(r: ChangeReport) -> Message:
    blocks = [HeaderBlock(text=_title(r)[:150])]
    text_parts = [_title(r)]
    if not r.changes:
        none = ("no recorded difference" if r.question == "runs" else
                "no change recorded" + (f" up to step {r.step}" if r.step is not None else
                                        " between its attempts"))
        blocks.append(SectionBlock(text=MarkdownTextObject(text=none + ".")))
        text_parts.append(none + ".")
    for c in r.changes:
        n = len(c.variables)
        head = f"*{_where(c, r)}* — {n} variable{'s' if n != 1 else ''} changed"
        body = "\n".join([head, *change_lines(c)])
        blocks.append(SectionBlock(text=MarkdownTextObject(text=body[:3000])))
        text_parts.append(body)
    notes = [f":warning: {w}." for w in r.warnings] + [f"Missing: {m}." for m in r.missing]
    if notes:
        blocks.append(ContextBlock(elements=[MarkdownTextObject(text="\n".join(notes)[:3000])]))
        text_parts.extend(notes)
    return Message(text="\n".join(text_parts), blocks=[b.to_dict() for b in blocks],
                   kind="changes", data={"changes": len(r.changes)})
