"""The terminal: rich rendering of alerts, notices and status, the `/run` prompt, and the
:class:`ConsoleNotifier` transport used when no Slack token is set."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.emoji import Emoji
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from analyzers.finding import TROUBLE_KINDS
from bot.alerting.notify import SendResult, save_chart
from bot.views.alerts import evidence_value
from bot.views.message import Message

SEVERITY_STYLE = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}


def _alert(f: dict[str, Any]) -> RenderableType:
    style = SEVERITY_STYLE.get(f["severity"], "bold")
    evidence = Table.grid(padding=(0, 2))
    for key, value in (f.get("evidence") or {}).items():
        if isinstance(value, list) or value is None:
            continue
        evidence.add_row(Text(key.replace("_", " "), style="dim"), evidence_value(value))
    evidence.add_row(Text("onset → detected", style="dim"),
                     f"step {f['onset_step']} → step {f['detected_step']}")
    fixes = Text()
    for i, fix in enumerate(f.get("fixes") or []):
        fixes.append(f"{i + 1}. {fix['text']}  ", style="bold" if i == 0 else "")
        fixes.append(f"[{fix['source']}]\n", style="dim")
    rollback = f.get("rollback_to")
    rollback_text = (Text(f"⏪ roll back to step {rollback['step']} ({rollback['path']}): "
                          f"{rollback['reason']}", style="green") if rollback
                     else Text("no checkpoint before the onset to roll back to", style="dim"))
    body = Group(Text(f["summary"], style="bold"), evidence, Text("What to try, in order:"),
                 fixes, rollback_text,
                 Text(f"{TROUBLE_KINDS.get(f['kind'], f['kind'])}", style="dim"))
    return Panel(body, title=f"[{style}]{f['severity'].upper()}[/] {f['run']} · {f['signal']}",
                 border_style=style.split()[-1])


def _status(message: Message) -> RenderableType:
    from bot.views.status import status_lines

    status = message.data["status"]
    table = Table(show_header=False, box=None, padding=(0, 2))
    for key, value in status_lines(status).items():
        table.add_row(Text(key, style="dim"), Text(value.replace("`", "")))
    return Panel(table, title=f"{status.run}: {status.state}", border_style="blue")


def _upload(message: Message) -> RenderableType:
    """A chart reply: the text, then the PNG saved to a file and its path."""
    path = save_chart(message.data["filename"], message.data["png"])
    plain = Emoji.replace(message.text.replace("*", "").replace("`", ""))
    return Group(Text(plain), Text(f"chart saved to {path}", style="green"))


def render_message(message: Message, reply_to: str | None = None) -> RenderableType:
    if message.kind == "upload" and "png" in message.data:
        return _upload(message)
    if message.kind == "alert":
        return _alert(message.data)
    if message.kind == "status" and "status" in message.data:
        return _status(message)
    style = {"resolved": "green", "error": "red"}.get(message.kind, "")
    prefix = "  ↳ " if reply_to else ""
    plain = Emoji.replace(message.text.replace("*", "").replace("`", ""))
    return Text(prefix + plain, style=style)


class ConsoleNotifier:
    """Prints alerts and notices in the terminal with rich; used when no Slack token is set."""

    def __init__(self, console: Console | None = None, chart_dir: Path | None = None) -> None:
        self.console = console or Console()
        self.chart_dir = chart_dir
        self._ids = itertools.count(1)

    def post(self, channel: str, message: Message, thread_ts: str | None = None) -> SendResult:
        self.console.print(render_message(message, reply_to=thread_ts))
        return SendResult(True, channel="console", ts=f"console.{next(self._ids)}")

    def update(self, channel: str, ts: str, message: Message) -> SendResult:
        first = message.text.splitlines()[0] if message.text else ""
        self.console.print(Text(f"  ↻ updated: {first}", style="dim"))
        return SendResult(True, channel=channel, ts=ts)

    def upload(self, channel: str, thread_ts: str | None, filename: str, data: bytes,
               title: str, comment: str | None = None) -> SendResult:
        """Saves the file (a chart) and prints where."""
        path = save_chart(filename, data, self.chart_dir)
        prefix = "  ↳ " if thread_ts else ""
        self.console.print(Text(f"{prefix}chart: {title} → {path}", style="dim"))
        return SendResult(True, reason=str(path), channel=channel, ts=thread_ts)
