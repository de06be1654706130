"""The demo trainer's logs, made once per test session and shared by every analyzer's test.

Each analyzer checks that the demo's healthy run and its fault runs give it what they should;
the runs are the same deterministic 300 steps for all of them, so they are trained once, in
parallel (several seconds each), instead of once per test.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from pathlib import Path

from analyzers import RunData
from connectors.registry import open_source

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ("none", "lr", "bad_batch")


@functools.cache
def demo_logs() -> dict[str, RunData]:
    """The demo trainer's log (300 steps, checkpoints every 50, evaluations every 25) with
    no fault, an LR burst and corrupted batches, read as runwatch reads it."""
    with tempfile.TemporaryDirectory() as base:
        processes = {fault: subprocess.Popen(
            [sys.executable, "-m", "bot.demo.trainer", "--run-dir", str(Path(base) / fault),
             "--steps", "300", "--fault", fault],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for fault in FAULTS}
        logs = {}
        for fault, process in processes.items():
            output, _ = process.communicate(timeout=300)
            assert process.returncode == 0, output
            batch = open_source(str(Path(base) / fault)).discover()[0].read(final=True)
            logs[fault] = RunData(run=f"demo-{fault}", metrics=batch.points,
                                  checkpoints=batch.checkpoints, meta=batch.meta)
    return logs
