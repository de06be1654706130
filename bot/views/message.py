"""The message every view builds and every transport sends: text, Block Kit, and its data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Message:
    """What to send: plain text (the fallback every client shows), Block Kit blocks, and the
    finding or status it was built from (the console draws those itself)."""

    text: str
    blocks: list[dict[str, Any]] | None = None
    kind: str = "alert"
    data: dict[str, Any] = field(default_factory=dict)
    broadcast: bool = False  # a thread reply also shown in the channel (repeats, escalations)
    key: str | None = None  # the outbox row it comes from: finds it again after a crash


def mention(user: str) -> str:
    """A Slack user id as a mention (``<@U123>``); anything else (``cli``, a name) as it is.

    >>> mention("U0123ABC"), mention("cli")
    ('<@U0123ABC>', 'cli')
    """
    return f"<@{user}>" if user[:1] in ("U", "W") and user.isalnum() else user
