"""Transports: where messages go. Slack through the Web API, or the terminal.

A notifier says whether a failure is recoverable; only recoverable failures are retried by
the outbox.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.console import Console
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

log = logging.getLogger("runwatch.notify")

RETRYABLE_SLACK_ERRORS = {"ratelimited", "internal_error", "fatal_error", "service_unavailable",
                          "request_timeout"}


@dataclass
class Message:
    """What to send: plain text (the fallback every client shows), Block Kit blocks, and the
    finding or status it was built from (the console draws those itself)."""

    text: str
    blocks: list[dict[str, Any]] | None = None
    kind: str = "alert"
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class SendResult:
    ok: bool
    recoverable: bool = False
    reason: str = ""
    channel: str | None = None
    ts: str | None = None


class Notifier(Protocol):
    def post(self, channel: str, message: Message, thread_ts: str | None = None) -> SendResult:
        ...


class SlackNotifier:
    def __init__(self, client: WebClient) -> None:
        self.client = client

    def post(self, channel: str, message: Message, thread_ts: str | None = None) -> SendResult:
        try:
            response = self.client.chat_postMessage(channel=channel, text=message.text,
                                                    blocks=message.blocks, thread_ts=thread_ts,
                                                    unfurl_links=False)
        except SlackApiError as exc:
            status = exc.response.status_code
            error = exc.response.get("error") if isinstance(exc.response.data, dict) else None
            recoverable = status == 429 or status >= 500 or error in RETRYABLE_SLACK_ERRORS
            return SendResult(False, recoverable, f"Slack answered {status}: {error or 'error'}")
        except OSError as exc:  # connection refused, reset, timeouts (URLError is an OSError)
            return SendResult(False, True, f"could not reach Slack: {exc}")
        return SendResult(True, channel=response["channel"], ts=response["ts"])


class ConsoleNotifier:
    """Prints alerts and notices in the terminal with rich; used when no Slack token is set."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self._ids = itertools.count(1)

    def post(self, channel: str, message: Message, thread_ts: str | None = None) -> SendResult:
        from bot.console import render_message

        self.console.print(render_message(message, reply_to=thread_ts))
        return SendResult(True, channel="console", ts=f"console.{next(self._ids)}")
