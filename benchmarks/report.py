"""BENCHMARKS.md: one section per suite, replaced in place when the suite runs again."""

from __future__ import annotations

import os
import platform
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def write_section(path: Path, name: str, command: str, result: dict[str, Any]) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n\nMeasured with the real " \
        "parts (SQLite file, local Slack Web API server, APScheduler).\n"
    rows = "\n".join(f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |"
                     for k, v in result.items())
    section = (f"## {name}\n\n`{command}` — {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
               f"{platform.machine()}, {os.cpu_count()} cores, Python "
               f"{platform.python_version()}\n\n| figure | value |\n|---|---|\n{rows}\n")
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section + "\n", text) if pattern.search(text) else \
        text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
