"""App Home: every run at a glance — health, step, the last alert — drawn when opened."""

from __future__ import annotations

import json
import time
from typing import Any

from slack_sdk.models.blocks import (
    ContextBlock,
    DividerBlock,
    HeaderBlock,
    MarkdownTextObject,
    SectionBlock,
)
from slack_sdk.models.views import View

from analyzers.fmt import fmt_duration
from bot.services.runs import RunList
from bot.views.alerts import SEVERITY_ICON
from bot.views.runs import run_line

MAX_RUNS = 40  # two blocks a run; a Home tab holds 100 blocks


def last_alert_line(finding: dict[str, Any] | None, now: float) -> str:
    if finding is None:
        return "no alerts yet"
    data = json.loads(finding["data"]) if isinstance(finding.get("data"), str) else finding
    state = "resolved" if finding["state"] == "resolved" else "firing"
    when = fmt_duration(max(0.0, now - (finding.get("last_seen") or now)))
    icon = ":white_check_mark:" if state == "resolved" else SEVERITY_ICON.get(
        data["severity"], "")
    return (f"last alert: {icon} {data['signal']} at step {data['onset_step']} ({state}, "
            f"{when} ago) — {data['summary']}")[:1500]


def home_view(runs: RunList, last_alerts: dict[str, dict[str, Any] | None],
              now: float | None = None) -> dict[str, Any]:
    """The Home tab as a ``views.publish`` view."""
    now = time.time() if now is None else now
    blocks: list[Any] = [HeaderBlock(text="runwatch · your training runs")]
    listed = runs.active[:MAX_RUNS]
    if not listed:
        blocks.append(SectionBlock(text=MarkdownTextObject(
            text="No runs yet: point runwatch at your logs in `runwatch.toml` ([[sources]]).")))
    for health in listed:
        blocks.append(SectionBlock(text=MarkdownTextObject(text=run_line(health))))
        blocks.append(ContextBlock(elements=[MarkdownTextObject(
            text=last_alert_line(last_alerts.get(health.run), now))]))
    notes = []
    if len(runs.active) > len(listed):
        notes.append(f"{len(runs.active) - len(listed)} more runs: `/run list`")
    if runs.finished:
        notes.append(f"{runs.finished} finished")
    notes.append(f"updated {time.strftime('%H:%M', time.localtime(now))} · `/run status RUN`, "
                 f"`/run plot RUN`, `/run help`")
    blocks += [DividerBlock(), ContextBlock(elements=[MarkdownTextObject(
        text=" · ".join(notes))])]
    return View(type="home", blocks=blocks).to_dict()
