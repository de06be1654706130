"""Replies that carry a chart to upload (`/run plot`, `/run compare`).

A message of kind ``upload`` says in ``text`` that the chart is coming and carries the PNG
in ``data``: ``png``, ``filename``, ``title`` and ``comment``. Slack's listener answers with
the text, then uploads the file to the channel; the console saves it and prints the path.
"""

from __future__ import annotations

from typing import Any

from slack_sdk.models.blocks import MarkdownTextObject, SectionBlock

from bot.charts import ChartFile
from bot.views.message import Message

UPLOAD_KIND = "upload"


def upload_data(chart: ChartFile) -> dict[str, Any]:
    return {"png": chart.png, "filename": chart.filename, "title": chart.title,
            "comment": chart.comment}


def plot_message(chart: ChartFile) -> Message:
    tags = ", ".join(chart.extra.get("tags", []))
    text = (f":bar_chart: Chart of *{chart.title}* ({tags}; up to step "
            f"{chart.extra.get('step')}) follows.")
    return Message(text=text, blocks=[SectionBlock(text=MarkdownTextObject(text=text)).to_dict()],
                   kind=UPLOAD_KIND, data=upload_data(chart))
