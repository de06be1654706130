"""Transports: where messages go. Slack through the Web API, or the terminal.

A notifier says whether a failure is recoverable; only recoverable failures are retried by
the outbox. ``post`` sends a message (in a thread with ``thread_ts``); ``update`` redraws a
message already sent, in place; ``upload`` shares a file (an alert's chart) in a thread. A
transport without ``update`` (a webhook, a test recorder) has its redraws skipped; one
without ``upload`` gets no charts.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.views.message import Message

log = logging.getLogger("runwatch.notify")

METADATA_EVENT = "runwatch_notification"  # Slack message metadata carrying Message.key

RETRYABLE_SLACK_ERRORS = {"ratelimited", "internal_error", "fatal_error", "service_unavailable",
                          "request_timeout"}


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


class Editor(Protocol):
    """A notifier that can also redraw a sent message, and find one it sent by its key
    (after a crash between sending and recording: ok, not found, or could not look)."""

    def update(self, channel: str, ts: str, message: Message) -> SendResult:
        ...

    def find(self, channel: str, key: str, *, thread_ts: str | None = None) -> SendResult:
        ...


class Uploader(Protocol):
    """A notifier that can share a file (a PNG chart) in a channel or a thread."""

    def upload(self, channel: str, thread_ts: str | None, filename: str, data: bytes,
               title: str, comment: str | None = None) -> SendResult:
        ...


def default_chart_dir() -> Path:
    """Where the console saves charts: one folder under the system's temp directory."""
    return Path(tempfile.gettempdir()) / "runwatch-charts"


def save_chart(filename: str, data: bytes, folder: Path | None = None) -> Path:
    folder = folder or default_chart_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / Path(filename).name
    path.write_bytes(data)
    return path


def api_failure(exc: SlackApiError) -> SendResult:
    """A Web API error as a failed send: recoverable when Slack is busy or down."""
    status = exc.response.status_code
    error = exc.response.get("error") if isinstance(exc.response.data, dict) else None
    recoverable = status == 429 or status >= 500 or error in RETRYABLE_SLACK_ERRORS
    return SendResult(False, recoverable, f"Slack answered {status}: {error or 'error'}")


class SlackNotifier:
    def __init__(self, client: WebClient) -> None:
        self.client = client

    def post(self, channel: str, message: Message, thread_ts: str | None = None) -> SendResult:
        extra: dict[str, Any] = {"reply_broadcast": True} if thread_ts and message.broadcast \
            else {}
        if message.key:
            extra["metadata"] = {"event_type": METADATA_EVENT,
                                 "event_payload": {"key": message.key}}
        return self._call(self.client.chat_postMessage, channel=channel, text=message.text,
                          blocks=message.blocks, thread_ts=thread_ts, unfurl_links=False,
                          **extra)

    def update(self, channel: str, ts: str, message: Message) -> SendResult:
        return self._call(self.client.chat_update, channel=channel, ts=ts, text=message.text,
                          blocks=message.blocks)

    def find(self, channel: str, key: str, *, thread_ts: str | None = None) -> SendResult:
        """Look for a message posted with ``key`` among the newest of the channel (or the
        thread): the one a crash interrupted was posted moments before."""
        try:
            if thread_ts:
                response = self.client.conversations_replies(
                    channel=channel, ts=thread_ts, include_all_metadata=True, limit=200)
            else:
                response = self.client.conversations_history(
                    channel=channel, include_all_metadata=True, limit=200)
        except SlackApiError as exc:
            return api_failure(exc)
        except OSError as exc:
            return SendResult(False, True, f"could not reach Slack: {exc}")
        for found in response.get("messages") or []:
            meta = found.get("metadata") or {}
            if meta.get("event_type") == METADATA_EVENT and \
                    (meta.get("event_payload") or {}).get("key") == key:
                return SendResult(True, channel=channel, ts=found["ts"])
        return SendResult(False, False, "not found")

    def upload(self, channel: str, thread_ts: str | None, filename: str, data: bytes,
               title: str, comment: str | None = None) -> SendResult:
        """``files_upload_v2`` (files.getUploadURLExternal, the upload, then
        files.completeUploadExternal) into ``channel``, in the thread of ``thread_ts``."""
        try:
            response = self.client.files_upload_v2(
                channel=channel, thread_ts=thread_ts, file=data, filename=filename, title=title,
                alt_txt=title, initial_comment=comment)
        except SlackApiError as exc:
            return api_failure(exc)
        except OSError as exc:
            return SendResult(False, True, f"could not reach Slack: {exc}")
        files = response.get("files") or [{}]
        return SendResult(True, reason=f"file {files[0].get('id')}", channel=channel,
                          ts=thread_ts)

    @staticmethod
    def _call(method: Any, **kwargs: Any) -> SendResult:
        try:
            response = method(**kwargs)
        except SlackApiError as exc:
            return api_failure(exc)
        except OSError as exc:  # connection refused, reset, timeouts (URLError is an OSError)
            return SendResult(False, True, f"could not reach Slack: {exc}")
        return SendResult(True, channel=response["channel"], ts=response["ts"])
