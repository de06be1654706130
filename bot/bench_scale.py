"""`runwatch bench scale`: many live runs on one machine (issue 27).

A folder of N watched JSONL runs (``step, loss, learning_rate, grad_norm,
tokens_per_second, time``; H lines of history each) and a writer that appends K lines to every
run each interval; the figures are the poll pass time, NaN → alert latency, skipped polls,
per-run pass cost against history length, backfill time and the bot's memory over time.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

FIELDS = ("step", "loss", "learning_rate", "grad_norm", "tokens_per_second", "time")


def line(run: int, step: int, *, wall: float | None = None, nan: bool = False) -> str:
    """One healthy JSONL line of run ``run`` at ``step`` (deterministic but for ``time``);
    ``nan``: the loss is NaN."""
    wobble = ((step * 7919 + run * 104729) % 13) / 13
    loss = math.nan if nan else round(2.0 + 1.0 / step + 0.01 * wobble, 5)
    return json.dumps({"step": step, "loss": loss,
                       "learning_rate": round(3e-4 * (1 - step / 2e6), 8),
                       "grad_norm": round(0.8 + 0.05 * wobble, 4),
                       "tokens_per_second": round(50_000 + 500 * wobble, 1),
                       "time": time.time() if wall is None else wall}) + "\n"


def run_path(folder: Path, run: int) -> Path:
    return folder / f"run{run:04d}.jsonl"


def make_runs(folder: Path, runs: int, history: int, *, start: float | None = None) -> None:
    """Write ``runs`` runs of ``history`` lines each, one line a second up to now."""
    folder.mkdir(parents=True, exist_ok=True)
    start = time.time() - history if start is None else start
    for r in range(runs):
        with open(run_path(folder, r), "w") as handle:
            handle.writelines(line(r, s, wall=start + s) for s in range(1, history + 1))


def append_points(folder: Path, runs: int, first_step: int, points: int, *,
                  nan_runs: frozenset[int] = frozenset()) -> None:
    """Append ``points`` lines from ``first_step`` on to every run; the runs in
    ``nan_runs`` log a NaN loss as their last new line."""
    for r in range(runs):
        with open(run_path(folder, r), "a") as handle:
            handle.writelines(
                line(r, s, nan=r in nan_runs and s == first_step + points - 1)
                for s in range(first_step, first_step + points))
