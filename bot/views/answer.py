"""The answer to a question, as posted: the short answer and its sources, and a "Details"
button that shows every fact behind it (Block Kit built by pure functions)."""

from __future__ import annotations

import json
from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    ButtonElement,
    ContextBlock,
    MarkdownTextObject,
    SectionBlock,
)

DETAILS_BUTTON = "rw_answer_details"
MAX_SECTION = 2900  # Slack's section text limit is 3000 characters
MAX_VALUE_QUESTION = 1500  # a button value holds at most 2000 characters


def details_value(run: str, question: str, alert: str | None) -> str:
    """What the Details button carries: enough to read the same facts again."""
    return json.dumps({"run": run, "q": question[:MAX_VALUE_QUESTION], "alert": alert})


def parse_details_value(value: str) -> tuple[str, str, str | None]:
    data = json.loads(value)
    return str(data["run"]), str(data["q"]), data.get("alert")


def answer_blocks(text: str, sources: list[str], *, run: str, question: str,
                  alert: str | None = None) -> list[dict[str, Any]]:
    """The short answer, its sources, and the Details button."""
    said = "; ".join(sources) if sources else "none"
    return [
        SectionBlock(text=MarkdownTextObject(text=text[:MAX_SECTION])).to_dict(),
        ContextBlock(elements=[MarkdownTextObject(text=f"Sources: {said}"[:MAX_SECTION])]
                     ).to_dict(),
        ActionsBlock(elements=[ButtonElement(text="Details", action_id=DETAILS_BUTTON,
                                             value=details_value(run, question, alert))]
                     ).to_dict(),
    ]


def details_blocks(details: str) -> list[dict[str, Any]]:
    """Every fact, as the record shows it now."""
    body = f"*Every fact behind the answer (as the record shows it now):*\n{details}"
    return [SectionBlock(text=MarkdownTextObject(text=body[:MAX_SECTION])).to_dict()]
