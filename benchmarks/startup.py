"""``runwatch bench startup``: how long each command takes to start, and which heavy libraries
it imports on the way (pandas, LangChain, torch, transformers, matplotlib, Bolt).

Each command runs in a fresh interpreter, as a user types it; the median of ``repeats`` runs
is reported. ``--help`` and ``config check`` should import none of the heavy libraries: they
are imported where they are used.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HEAVY = ("pandas", "langchain_core", "torch", "transformers", "matplotlib", "slack_bolt",
         "mlflow", "tensorboard", "datasketch", "scipy")

COMMANDS = (["--help"], ["config", "check"], ["status", "--help"], ["inspect", "--help"],
            ["serve", "--help"], ["bench", "--help"])

_PROBE = """
import json, sys
sys.argv = ["runwatch", *json.loads(sys.argv[1])]
from bot.cli import main
try:
    main()
except SystemExit:
    pass
print("HEAVY " + json.dumps(sorted(m for m in {heavy} if m in sys.modules)), file=sys.stderr)
"""


def _once(args: list[str], cwd: Path) -> tuple[float, list[str]]:
    code = _PROBE.replace("{heavy}", repr(HEAVY))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - start
    marks = [line for line in done.stderr.splitlines() if line.startswith("HEAVY ")]
    if done.returncode or not marks:
        raise RuntimeError(f"runwatch {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return seconds, json.loads(marks[-1].removeprefix("HEAVY "))


def bench_startup(repeats: int = 5) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        cwd = Path(folder)  # no runwatch.toml: the embedded default configuration
        for args in COMMANDS:
            timings, heavy = [], []
            for _ in range(repeats):
                seconds, heavy = _once(args, cwd)
                timings.append(seconds)
            name = "runwatch " + " ".join(args)
            result[f"{name} median s"] = statistics.median(timings)
            result[f"{name} heavy imports"] = ", ".join(heavy) or "none"
    return result
