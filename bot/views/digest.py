"""The digest as one Block Kit message: the day in counts, the three kinds of trouble, the best
evaluation per active run, and what to look at first."""

from __future__ import annotations

from datetime import UTC, datetime

from slack_sdk.models.blocks import (
    ContextBlock,
    DividerBlock,
    HeaderBlock,
    MarkdownTextObject,
    SectionBlock,
)

from bot.services.changes import change_summary
from bot.services.digest import KINDS, Digest
from bot.views.message import Message

PER_KIND = 5
KIND_EMOJI = {"slow": ":turtle:", "not learning well": ":chart_with_downwards_trend:",
              "keeps stopping": ":octagonal_sign:"}


def _names(runs: list[str]) -> str:
    return ", ".join(runs[:8]) + (f" … +{len(runs) - 8}" if len(runs) > 8 else "") or "none"


def digest_lines(d: Digest) -> list[str]:
    """The digest's facts as lines, shared by Slack's fallback text and the console."""
    lines = [f"*Runs*: {len(d.started)} started, {len(d.finished)} finished, "
             f"{len(d.stopped)} stopped before their end ({_names(d.stopped)})",
             f"*Alerts*: {len(d.opened)} opened, {len(d.resolved)} resolved, "
             f"{len(d.still_open)} still open"]
    if d.look_first:
        lines.append(f"*Look at first*: {d.look_first}")
    return lines


def digest_message(d: Digest) -> Message:
    day = datetime.fromtimestamp(d.now, UTC).strftime("%Y-%m-%d %H:%M UTC")
    blocks = [HeaderBlock(text=f"runwatch digest — {day}"),
              SectionBlock(text=MarkdownTextObject(text="\n".join(digest_lines(d))))]
    kinds = []
    for kind in KINDS:
        items = d.by_kind.get(kind, [])
        body = "\n".join(f"• {line}" for line in items[:PER_KIND]) or "• nothing"
        if len(items) > PER_KIND:
            body += f"\n• … and {len(items) - PER_KIND} more"
        kinds.append(f"{KIND_EMOJI[kind]} *{kind}* ({len(items)})\n{body}")
    blocks += [DividerBlock(), SectionBlock(text=MarkdownTextObject(text="\n".join(kinds)))]
    extra = []
    if d.best_eval:
        extra.append("*Best eval loss*: " + "; ".join(
            f"{run} {value:.4g} at step {step} ({trend})"
            for run, (value, step, trend) in list(d.best_eval.items())[:8]))
    if d.past_stop_loss:
        extra.append(f"*Past their stop-loss*: {_names(sorted(set(d.past_stop_loss)))}")
    if d.changed:
        extra.append("*Settings changed*: " + "; ".join(
            f"{run} at step {c.step}: {change_summary(c, 2)}" for run, c in d.changed[:5]))
    if extra:
        blocks.append(SectionBlock(text=MarkdownTextObject(text="\n".join(extra)[:3000])))
    blocks.append(ContextBlock(elements=[MarkdownTextObject(
        text="Grouped by the three kinds of trouble: slow, not learning well, keeps stopping. "
             "`/run status RUN` for one run.")]))
    text = "\n".join([f"runwatch digest — {day}", *digest_lines(d), *kinds, *extra])
    return Message(text=text, blocks=[b.to_dict() for b in blocks], kind="digest")
