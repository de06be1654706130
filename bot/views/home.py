"""App Home: every run at a glance — health, step, the last alert — drawn when opened, grouped
by the three kinds of trouble (seed §1.1: slow, not learning well, keeps stopping) as the
digest groups them, with the runs that have none below."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
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
from bot.services.digest import KINDS
from bot.services.runs import RunHealth, RunList
from bot.views.alerts import SEVERITY_ICON
from bot.views.digest import KIND_EMOJI
from bot.views.runs import run_line

MAX_BLOCKS = 100  # what a Home tab holds
PER_RUN_ALERTS = 3  # alerts of one kind shown under a run
IDLE = "idle"  # a run that stopped logging before its end: it keeps stopping


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


def kinds_of(health: RunHealth) -> list[str]:
    """The kinds of trouble a run is in, in :data:`KINDS` order: those of its open alerts,
    and *keeps stopping* when it went idle before its end."""
    found = {kind for kind, *_ in health.troubles}
    if health.state == IDLE:
        found.add("keeps stopping")
    return [kind for kind in KINDS if kind in found]


def _trouble_line(health: RunHealth, kind: str) -> str:
    lines = [f"{SEVERITY_ICON.get(severity, '')} {signal} at step {onset} — {summary}"[:300]
             for k, signal, severity, onset, summary in health.troubles if k == kind]
    if not lines and kind == "keeps stopping" and health.state == IDLE:
        lines = ["stopped logging before its end (idle)"]
    more = len(lines) - PER_RUN_ALERTS
    return "\n".join(lines[:PER_RUN_ALERTS] + ([f"… {more} more"] if more > 0 else []))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def home_view(runs: RunList, last_alerts: dict[str, dict[str, Any] | None],
              now: float | None = None) -> dict[str, Any]:
    """The Home tab as a ``views.publish`` view: a section per kind of trouble with the runs
    in it (a run in two kinds is under both) and their open alerts of that kind, then the
    runs without trouble with their last alert."""
    now = time.time() if now is None else now
    blocks: list[Any] = [HeaderBlock(text="runwatch · your training runs")]
    if not runs.active:
        blocks.append(SectionBlock(text=MarkdownTextObject(
            text="No runs yet: point runwatch at your logs in `runwatch.toml` ([[sources]]).")))
    footer = 2  # its divider and context
    left_out: set[str] = set()

    def section(title: str, members: list[RunHealth],
                detail: Callable[[RunHealth], str]) -> None:
        """A title and two blocks a run, as far as the tab has room; the rest is counted."""
        if not members:
            return
        if MAX_BLOCKS - footer - len(blocks) < 3:  # not even the title and one run
            left_out.update(r.run for r in members)
            return
        blocks.append(SectionBlock(text=MarkdownTextObject(
            text=f"{title} · {_plural(len(members), 'run')}")))
        for health in members:
            if MAX_BLOCKS - footer - len(blocks) < 2:
                left_out.add(health.run)
                continue
            blocks.append(SectionBlock(text=MarkdownTextObject(text=run_line(health))))
            blocks.append(ContextBlock(elements=[MarkdownTextObject(text=detail(health))]))

    for kind in KINDS:
        section(f"{KIND_EMOJI[kind]} *{kind.capitalize()}*",
                [r for r in runs.active if kind in kinds_of(r)],
                lambda health, kind=kind: _trouble_line(health, kind))
    section(":white_check_mark: *No open trouble*",
            [r for r in runs.active if not kinds_of(r)],
            lambda health: last_alert_line(last_alerts.get(health.run), now))
    notes = []
    if left_out:
        notes.append(f"{len(left_out)} more runs: `/run list`")
    if runs.finished:
        notes.append(f"{runs.finished} finished")
    notes.append(f"updated {time.strftime('%H:%M', time.localtime(now))} · `/run status RUN`, "
                 f"`/run plot RUN`, `/run help`")
    blocks += [DividerBlock(), ContextBlock(elements=[MarkdownTextObject(
        text=" · ".join(notes))])]
    return View(type="home", blocks=blocks).to_dict()
