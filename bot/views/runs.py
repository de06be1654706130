"""The `/run list` reply: one line of health per active run."""

from __future__ import annotations

from slack_sdk.models.blocks import ContextBlock, HeaderBlock, MarkdownTextObject, SectionBlock

from analyzers.fmt import fmt_duration
from bot.services.runs import RunHealth, RunList
from bot.services.status import fmt_value
from bot.views.alerts import SEVERITY_ICON
from bot.views.message import Message

STATE_ICON = {"running": ":large_green_circle:", "idle": ":double_vertical_bar:",
              "no data": ":white_circle:", "finished": ":checkered_flag:"}
LINES_PER_SECTION = 10  # a section holds 3,000 characters; ten lines stay well inside
MAX_LINES = 200


def run_line(r: RunHealth) -> str:
    """``exp1`` running · step 1200/3000 (40%) · loss 2.31 · 2 open alerts (critical) · …"""
    parts = [f"*{r.run}* {r.state}" + (f" (attempt {r.attempt})" if r.attempt > 1 else "")]
    if r.step is not None:
        parts.append(f"step {r.step}/{r.total_steps} ({min(1.0, r.step / r.total_steps):.0%})"
                     if r.total_steps else f"step {r.step}")
    if r.loss is not None:
        step, value = r.loss
        parts.append(f"loss {fmt_value(value)}" + (f" (step {step})" if step != r.step else ""))
    if r.open_alerts:
        plural = "s" if r.open_alerts > 1 else ""
        parts.append(f"{r.open_alerts} open alert{plural} (worst {r.worst_severity})")
    else:
        parts.append("no open alerts")
    if r.seconds_since_last_point is not None:
        parts.append(f"last point {fmt_duration(r.seconds_since_last_point)} ago")
    icon = SEVERITY_ICON.get(r.worst_severity or "", "") if r.open_alerts else \
        STATE_ICON.get(r.state, "")
    return f"{icon} " + " · ".join(parts)


def runs_message(runs: RunList) -> Message:
    lines = [run_line(r) for r in runs.active]
    shown = lines[:MAX_LINES]
    title = (f"Active runs: {len(runs.active)}" + (f", {runs.alerting} with open alerts"
                                                   if runs.alerting else ""))
    notes = []
    if len(lines) > len(shown):
        notes.append(f"{len(lines) - len(shown)} more not shown")
    if runs.finished:
        notes.append(f"{runs.finished} finished run{'s' if runs.finished > 1 else ''} not listed")
    notes.append("`/run status RUN` for details, `/run plot RUN` for charts")
    if not lines:
        body = ["No active runs." + (" Check the sources in runwatch.toml."
                                     if not runs.finished else "")]
    else:
        body = shown
    blocks = [HeaderBlock(text=title)]
    for i in range(0, len(body), LINES_PER_SECTION):
        blocks.append(SectionBlock(text=MarkdownTextObject(
            text="\n".join(body[i:i + LINES_PER_SECTION]))))
    blocks.append(ContextBlock(elements=[MarkdownTextObject(text=" · ".join(notes))]))
    text = "\n".join([title, *body, " · ".join(notes)])
    return Message(text=text, blocks=[b.to_dict() for b in blocks], kind="runs",
                   data={"runs": runs})
