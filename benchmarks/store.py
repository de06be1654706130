"""`runwatch bench store`: what the store costs on disk and how fast it fills (issue 27).

- bytes per point of one 1M-point run with 5 tags (200k steps), in the layout before the
  compact store (the released migrations up to it, the points written as the old ingest wrote
  them) and in the current one (through :meth:`Store.ingest`), with the WAL's largest size;
- a backfill: ``runs`` runs × 2,000 lines × 4 metrics (1,000 runs: the issue's 8M points),
  each run's file stored in one :meth:`Store.ingest` call as a first read delivers it (only
  the store is measured: the lines are already parsed into frames);
- failover on PostgreSQL: two instances (``bot.shared_watch``, each its own process) share
  ``2 × runs`` JSONL runs on a local server; a NaN line is written to every run and one
  instance is SIGKILLed at once, mid-pass: the time until the other holds every lease,
  until everything written is stored and alerted, and the points lost and posts doubled.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import sqlite_utils
from rich.console import Console

from benchmarks.processes import stop
from bot.store import MIGRATIONS, Store

TAGS_1M = ("train/loss", "lr", "grad_norm", "throughput", "gpu_mem")
TAGS_BACKFILL = ("train/loss", "lr", "grad_norm", "throughput")
LINES_PER_CALL = 2_000


def synthetic_run(steps: int, tags: tuple[str, ...], seed: int, start: int = 0) -> pd.DataFrame:
    """A run's points in file order: per step one line with every tag and its wall time;
    values are noisy floats (a loss, a cosine LR, …), as real logs carry, not round numbers."""
    rng = np.random.default_rng(seed)
    step = np.arange(start, start + steps, dtype=np.int64)
    wall = 1.7e9 + step * 0.37 + rng.random(steps) * 0.05
    columns = {
        "train/loss": 3.0 * np.exp(-step / 50_000) + rng.normal(0, 0.05, steps),
        "lr": 3e-4 * 0.5 * (1 + np.cos(np.pi * step / max(step[-1], 1))),
        "grad_norm": np.abs(rng.normal(1.0, 0.2, steps)),
        "throughput": rng.normal(12_000.0, 300.0, steps),
        "gpu_mem": rng.normal(40.0, 0.5, steps),
    }
    frame = pd.DataFrame({"step": np.repeat(step, len(tags)),
                          "tag": np.tile(np.array(tags, dtype=object), steps),
                          "value": np.column_stack([columns[t] for t in tags]).ravel(),
                          "wall_time": np.repeat(wall, len(tags))})
    return frame


def _sizes(path: Path) -> tuple[int, int]:
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size, wal.stat().st_size if wal.exists() else 0


def _ingest(store: Store, run: str, points: pd.DataFrame) -> None:
    store.ingest(run=run, source="bench", log_path=run, cursor_key=run, cursor={},
                 points=points, checkpoints=[], meta={}, malformed=[], skipped_values=0,
                 notices=[])


def bytes_before(folder: Path, points: pd.DataFrame) -> dict[str, float]:
    """The 1M-point run in the layout before the compact store, written in 2,000-line
    transactions like the old ingest (one row per point with run and tag names)."""
    path = folder / "before.db"
    version = [m.__name__ for m in MIGRATIONS].index("_compact_points")
    db = sqlite_utils.Database(str(path))
    db.enable_wal()
    for migration in MIGRATIONS[:version]:
        migration(db)
    db.execute(f"PRAGMA user_version = {version}")
    db["runs"].insert({"name": "one-million", "source": "bench", "log_path": "-", "attempt": 1})
    empty, _ = _sizes(path)
    largest_wal = 0
    chunk = LINES_PER_CALL * len(TAGS_1M)
    for lo in range(0, len(points), chunk):
        part = points.iloc[lo:lo + chunk]
        with db.conn:
            db.conn.executemany(
                "INSERT OR REPLACE INTO metrics (run, attempt, tag, step, value, wall_time) "
                "VALUES ('one-million', 1, ?, ?, ?, ?)",
                part[["tag", "step", "value", "wall_time"]].itertuples(index=False))
        largest_wal = max(largest_wal, _sizes(path)[1])
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size, _ = _sizes(path)
    db.close()
    return {"before: bytes per point": (size - empty) / len(points),
            "before: database MB": size / 1e6, "before: largest WAL MB": largest_wal / 1e6}


def bytes_after(folder: Path, points: pd.DataFrame) -> dict[str, float]:
    path = folder / "after.db"
    store = Store(str(path))
    empty, _ = _sizes(path)
    largest_wal = 0
    chunk = LINES_PER_CALL * len(TAGS_1M)
    for lo in range(0, len(points), chunk):
        _ingest(store, "one-million", points.iloc[lo:lo + chunk])
        largest_wal = max(largest_wal, _sizes(path)[1])
    store.checkpoint(every=0)
    size, _ = _sizes(path)
    read = store.run_data("one-million").metrics
    store.close()
    assert len(read) == len(points), (len(read), len(points))
    return {"after: bytes per point": (size - empty) / len(points),
            "after: database MB": size / 1e6, "after: largest WAL MB": largest_wal / 1e6}


def backfill(folder: Path, runs: int, console: Console) -> dict[str, float]:
    path = folder / "backfill.db"
    store = Store(str(path))
    empty, _ = _sizes(path)
    files = [synthetic_run(LINES_PER_CALL, TAGS_BACKFILL, seed=i) for i in range(min(runs, 20))]
    largest_wal, stored, spent, cpu = 0, 0, 0.0, 0.0
    for i in range(runs):
        points = files[i % len(files)]
        began, began_cpu = time.perf_counter(), time.process_time()
        _ingest(store, f"run-{i:05d}", points)
        spent += time.perf_counter() - began
        cpu += time.process_time() - began_cpu
        stored += len(points)
        largest_wal = max(largest_wal, _sizes(path)[1])
        if i % 100 == 99:
            console.print(f"backfill: {i + 1} runs, {stored:,} points, {spent:.1f} s")
    began, began_cpu = time.perf_counter(), time.process_time()
    store.checkpoint(every=0)
    spent += time.perf_counter() - began
    cpu += time.process_time() - began_cpu
    size, _ = _sizes(path)
    [count] = store.query("SELECT COUNT(*) AS n FROM points")
    store.close()
    assert count["n"] == stored, (count, stored)
    return {"backfill: runs": runs, "backfill: points": stored, "backfill: seconds": spent,
            "backfill: points per second": stored / spent,
            "backfill: seconds scaled to 8M points": spent * 8_000_000 / stored,
            "backfill: CPU seconds (not counting other load)": cpu,
            "backfill: CPU seconds scaled to 8M points": cpu * 8_000_000 / stored,
            "backfill: bytes per point": (size - empty) / stored,
            "backfill: largest WAL MB": largest_wal / 1e6}


def _append(folder: Path, runs: list[str], start: int, stop: int, nan_at: int | None) -> None:
    for run in runs:
        with open(folder / f"{run}.jsonl", "a") as f:
            f.writelines(json.dumps({"step": s, "loss": math.nan if s == nan_at else 3 - s / 1e3,
                                     "learning_rate": 1e-3, "grad_norm": 1.0,
                                     "time": 1.7e9 + s}) + "\n" for s in range(start, stop))


def _instance(url: str, folder: Path, name: str, interval: float, receiver: str,
              log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bot.shared_watch", "--store", url, "--folder", str(folder),
             "--instance", name, "--interval", str(interval), "--post-url", receiver],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})


def _wait(what: str, done: Any, timeout: float, log: Path) -> float:
    began = time.monotonic()
    while not done():
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"failover bench: {what} not reached in {timeout:.0f} s; "
                               f"see {log}")
        time.sleep(0.1)
    return time.monotonic() - began


def failover(runs: int, console: Console, interval: float = 5.0) -> dict[str, Any]:
    """Two instances on a local PostgreSQL server; one SIGKILLed while a NaN is being read."""
    from benchmarks.devpostgres import start_postgres
    from bot.pgstore import PgStore
    from bot.shared_watch import Receiver

    server = start_postgres()
    receiver = Receiver()
    folder = Path(tempfile.mkdtemp(prefix="runwatch-failover-"))
    names = [f"run-{i:05d}" for i in range(runs)]
    lines = 20
    _append(folder, names, 1, lines + 1, None)
    url = server.create_database("failover")
    store = PgStore(url)
    a = _instance(url, folder, "a", interval, receiver.url, folder / "a.log")
    b = _instance(url, folder, "b", interval, receiver.url, folder / "b.log")

    def stored() -> int:
        return store.query("SELECT COUNT(*) AS n FROM points")[0]["n"]

    try:
        _wait("both instances holding runs and the history stored",
              lambda: set(store.lease_owners().values()) == {"a", "b"}
              and stored() == runs * lines * 3, 600, folder / "b.log")
        console.print(f"failover: {runs} runs shared by two instances; killing one")
        _append(folder, names, lines + 1, 2 * lines + 1, nan_at=lines + 5)
        time.sleep(interval / 2)  # the next passes have begun on the NaN lines
        held = sum(1 for o in store.lease_owners().values() if o == "a")
        a.send_signal(signal.SIGKILL)
        a.wait()
        taken = _wait("the other instance holding every lease",
                      lambda: set(store.lease_owners().values()) == {"b"}
                      and len(store.lease_owners()) == runs, 600, folder / "b.log")
        recovered = _wait(
            "every point stored and every alert sent",
            lambda: stored() == runs * 2 * lines * 3 and len(receiver.posts) >= runs
            and not store.query("SELECT id FROM outbox WHERE state <> 'sent'"),
            600, folder / "b.log") + taken
        time.sleep(2 * interval)  # a late duplicate would arrive now
        posts = [p["run"] for p in receiver.posts]
        result = {"failover: runs": runs, "failover: poll interval s": interval,
                  "failover: runs the killed instance held": held,
                  "failover: kill → survivor holds every lease, s": taken,
                  "failover: kill → all stored and alerted, s": recovered,
                  "failover: points lost": runs * 2 * lines * 3 - stored(),
                  "failover: duplicate posts": len(posts) - len(set(posts)),
                  "failover: runs never alerted": runs - len(set(posts))}
        shutil.rmtree(folder, ignore_errors=True)  # kept, with the logs, when it failed
    finally:
        for process in (a, b):
            stop(process, 30)
        store.close()
        receiver.shutdown()
        server.stop()
    return result


def bench_store(*, runs: int, console: Console, points: int = 1_000_000) -> dict[str, Any]:
    steps = points // len(TAGS_1M)
    one_million = synthetic_run(steps, TAGS_1M, seed=0)
    result: dict[str, Any] = {"points in the one run": len(one_million)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        result.update(bytes_before(folder, one_million))
        console.print(f"before: {result['before: bytes per point']:.1f} bytes per point")
        result.update(bytes_after(folder, one_million))
        console.print(f"after: {result['after: bytes per point']:.1f} bytes per point")
        result["ratio before/after"] = (result["before: bytes per point"]
                                        / result["after: bytes per point"])
        result.update(backfill(folder, runs, console))
    result.update(failover(2 * runs, console))
    result["cores"] = os.cpu_count() or 0
    return {k: (round(v, 3) if isinstance(v, float) and math.isfinite(v) else v)
            for k, v in result.items()}
