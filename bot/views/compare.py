"""The `/run compare` reply: settings that differ, metrics at equal steps, and the overlay."""

from __future__ import annotations

import json
from typing import Any

from slack_sdk.models.blocks import ContextBlock, HeaderBlock, MarkdownTextObject, SectionBlock

from bot.charts import ChartFile
from bot.services.compare import Comparison, SettingChange
from bot.services.status import fmt_value
from bot.views.message import Message
from bot.views.plot import UPLOAD_KIND, upload_data
from bot.views.status import TAG_LABELS

MAX_SETTINGS = 20
ONE_VARIABLE = ("change one variable at a time (000 §5(2)): with more than one setting "
                "changed, this comparison cannot say which change made the difference")


def _setting(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "…"


def change_line(c: SettingChange) -> str:
    if c.kind == "changed":
        return f"`{c.key}`: {_setting(c.first)} → {_setting(c.second)}"
    if c.kind == "added":
        return f"`{c.key}`: only in the second run ({_setting(c.second)})"
    return f"`{c.key}`: only in the first run ({_setting(c.first)})"


def verdict(c: Comparison) -> str:
    missing = [run for run, known in zip((c.first, c.second), c.configs, strict=True)
               if not known]
    n = c.changed_count
    count = f"{n} setting{'s' if n != 1 else ''} differ{'s' if n == 1 else ''}"
    if n == 0:
        count = "no setting differs"
    note = ""
    if missing:
        note = (f" (no config recorded for {' and '.join(missing)}: only what was recorded is "
                f"compared)")
    if n > 1:
        return f":warning: {count}{note} — {ONE_VARIABLE}."
    return f"{count}{note}."


def _pct(change: float | None) -> str:
    return f" ({change:+.1%})" if change is not None else ""


def metric_lines(c: Comparison) -> list[str]:
    lines = []
    for p in c.at_steps:
        label = TAG_LABELS.get(p.tag, p.tag)
        lines.append(f"{label} at step {p.step}: {fmt_value(p.first)} vs "
                     f"{fmt_value(p.second)}{_pct(p.change)}")
    if not c.at_steps:
        lines.append("no metric logged at a common step")
    best = []
    for run in (c.first, c.second):
        b = c.best_eval.get(run)
        if b is None:
            continue
        text = f"{run} {fmt_value(b.value)} at step {b.step}"
        within = c.best_eval_common.get(run)
        if c.common_step is not None and within is not None and within != b:
            text += f" (up to step {c.common_step}: {fmt_value(within.value)} at step " \
                    f"{within.step})"
        best.append(text)
    if best:
        lines.append("lowest eval loss: " + "; ".join(best))
    return lines


def _section(text: str) -> SectionBlock:
    return SectionBlock(text=MarkdownTextObject(text=text if len(text) <= 3000
                                                else text[:2999] + "…"))


def compare_message(c: Comparison, chart: ChartFile | None) -> Message:
    title = f"{c.first} vs {c.second}"
    attempts = f"attempt {c.first_attempt} vs attempt {c.second_attempt}"
    settings = [change_line(s) for s in c.changes[:MAX_SETTINGS]]
    if c.changed_count > MAX_SETTINGS:
        settings.append(f"… and {c.changed_count - MAX_SETTINGS} more")
    metrics = metric_lines(c)
    suites = [f":warning: {s.line}" for s in c.suite_changes]
    head = verdict(c)
    blocks = [HeaderBlock(text=title[:150]),
              SectionBlock(text=MarkdownTextObject(text=f"*{head}*" if c.changed_count > 1
                                                   else head))]
    if settings:
        blocks.append(_section("*Settings* (first → second)\n" + "\n".join(settings)))
    if suites:
        blocks.append(_section("*Eval suites*\n" + "\n".join(suites)))
    blocks.append(_section("*At equal steps*\n" + "\n".join(metrics)))
    footer = attempts + (" · the overlay chart follows" if chart else "")
    blocks.append(ContextBlock(elements=[MarkdownTextObject(text=footer)]))
    text = "\n".join([f"{title}: {head}", *settings, *suites, *metrics, footer])
    data: dict[str, Any] = {"comparison": c}
    if chart is not None:
        data.update(upload_data(chart), comment=f"{title}: {head}")
    return Message(text=text, blocks=[b.to_dict() for b in blocks],
                   kind=UPLOAD_KIND if chart else "compare", data=data)
