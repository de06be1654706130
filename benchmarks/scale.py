"""`runwatch bench scale`: many live runs on one machine (issue 27).

A folder of N watched JSONL runs (``step, loss, learning_rate, grad_norm,
tokens_per_second, time``; H lines of history each) and a writer that appends K lines to every
run each interval; the figures are the poll pass time, NaN → alert latency, skipped polls,
per-run pass cost against history length, backfill time and the bot's memory over time.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.devslack import LocalSlack
from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine, PollReport
from bot.scheduler import _Overruns
from bot.serve import Bot

FIELDS = ("step", "loss", "learning_rate", "grad_norm", "tokens_per_second", "time")


def line(run: int, step: int, *, wall: float | None = None, nan: bool = False) -> str:
    """One healthy JSONL line of run ``run`` at ``step`` (deterministic but for ``time``);
    ``nan``: the loss is NaN. Healthy: no analyzer fires on it over the first 10k steps."""
    wobble = ((step * 7919 + run * 104729) % 13) / 13
    # 1% lower every 100 steps, with 1% noise: a run that learns (a flatter one is a plateau)
    loss = math.nan if nan else float(f"{3.0 * 0.9999 ** step * (1 + 0.01 * wobble):.6g}")
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


def _rss_mb() -> float:
    """This process's resident memory in MB (Linux)."""
    for row in Path("/proc/self/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    return math.nan


def _settings(root: Path, interval: float, api_url: str | None = None) -> Settings:
    config = Config(poll_interval=interval, sources=[SourceConfig(path=str(root / "runs"))],
                    slack={"channel": "C0SCALE", "host": "127.0.0.1", "port": 0})
    secrets = (Secrets(slack_bot_token="xoxb-scale", slack_signing_secret="scale",
                       slack_api_url=api_url) if api_url else Secrets())
    return Settings(config=config, secrets=secrets, config_path=None,
                    db_path=str(root / "runwatch.db"))


def history_cost(histories: tuple[int, ...] = (1_000, 100_000, 1_000_000), points: int = 10,
                 polls: int = 6) -> dict[str, Any]:
    """CPU seconds of one poll with ``points`` new lines on one run whose history is each of
    ``histories`` lines long (the median after two warm polls), and the time to read that
    history the first time (backfill, in points stored per second)."""
    figures: dict[str, Any] = {}
    for history in histories:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_runs(root / "runs", 1, history)
            engine = Engine(_settings(root, 5.0))
            started = time.perf_counter()
            engine.ingest()
            stored = time.perf_counter() - started
            engine.poll()
            step, costs = history + 1, []
            for _ in range(polls + 2):
                append_points(root / "runs", 1, step, points)
                step += points
                cpu = time.process_time()
                engine.poll()
                costs.append(time.process_time() - cpu)
            engine.store.close()
        label = f"{history:,}"
        figures[f"poll CPU ms, 1 run, history {label}"] = 1000 * statistics.median(costs[2:])
        figures[f"backfill points/s, history {label}"] = round(
            history * (len(FIELDS) - 2) / stored)
    costs = [v for k, v in figures.items() if k.startswith("poll CPU")]
    figures["poll cost ratio, longest / shortest history"] = costs[-1] / costs[0]
    return figures


@dataclass
class _Load:
    """What the writer did: per NaN written, its run and when."""

    nans: dict[int, float] = field(default_factory=dict)
    intervals: int = 0
    late: int = 0  # intervals the writer itself could not keep


def _write(folder: Path, runs: int, history: int, points: int, interval: float,
           until: float, load: _Load, stop: threading.Event, seed: int) -> None:
    """Append ``points`` lines to every run each ``interval``; each interval one run not
    yet used logs a NaN as its last new line."""
    rng = random.Random(seed)
    fresh = list(range(runs))
    rng.shuffle(fresh)
    step = history + 1
    due = time.monotonic()
    while time.monotonic() < until and not stop.is_set():
        nan_run = fresh.pop() if fresh else None
        append_points(folder, runs, step, points,
                      nan_runs=frozenset() if nan_run is None else frozenset({nan_run}))
        if nan_run is not None:
            load.nans[nan_run] = time.time()  # the whole interval's lines are written by now
        step += points
        load.intervals += 1
        due += interval
        if due < time.monotonic():
            load.late += 1
            due = time.monotonic()
        stop.wait(max(due - time.monotonic(), 0.0))


def live_load(runs: int = 1000, minutes: float = 5.0, history: int = 2000, points: int = 10,
              interval: float = 5.0, seed: int = 0,
              console: Console | None = None) -> dict[str, Any]:
    """The bot (scheduler, outbox, local Slack) watching ``runs`` runs of ``history`` lines
    while a writer appends ``points`` lines to each every ``interval`` s for ``minutes``."""
    console = console or Console()
    with tempfile.TemporaryDirectory() as tmp, LocalSlack(signing_secret="scale") as local:
        root = Path(tmp)
        make_runs(root / "runs", runs, history)
        settings = _settings(root, interval, local.api_url)
        passes: list[tuple[float, float, int, int]] = []  # (at, seconds, analysed, deferred)
        with Bot(settings, console=console) as bot:
            engine = bot.engine
            poll = engine.poll

            def timed_poll(**kwargs: Any) -> PollReport:
                report = poll(**kwargs)
                passes.append((time.monotonic(), report.seconds, len(report.analysed),
                               report.deferred))
                return report

            engine.poll = timed_poll  # type: ignore[method-assign]
            started = time.monotonic()
            bot.start()
            overruns = next(f for f in logging.getLogger("apscheduler.scheduler").filters
                            if isinstance(f, _Overruns))
            while not passes:
                time.sleep(0.2)
            stored = passes[0][1]
            console.print(f"scale: {runs} runs read and stored in {stored:.0f} s; writing "
                          f"for {minutes:g} min")
            skipped_before = overruns.skipped.get("poll", 0)
            steady = len(passes)
            load, stop = _Load(), threading.Event()
            rss: list[float] = [_rss_mb()]
            judged_at = math.nan
            writer = threading.Thread(target=_write, args=(
                root / "runs", runs, history, points, interval,
                time.monotonic() + 60 * minutes, load, stop, seed), daemon=True)
            writer.start()
            while writer.is_alive():
                writer.join(timeout=interval)
                rss.append(_rss_mb())
                if math.isnan(judged_at) and not engine.store.unjudged():
                    judged_at = time.monotonic()
            time.sleep(2 * interval)  # the last NaNs' polls
            load_average = os.getloadavg()[1]
            latencies, missed = _nan_latencies(local, load)
            skipped = overruns.skipped.get("poll", 0) - skipped_before
            steady_passes = passes[steady:]
    seconds = [s for _, s, _, _ in steady_passes] or [math.nan]
    judged = statistics.median([n for _, _, n, _ in steady_passes] or [0])
    return {
        "runs": runs, "history lines per run": history, "new lines per run per interval": points,
        "poll interval s": interval, "minutes of load": minutes,
        "backfill: first pass s (every run read and stored)": stored,
        "backfill: every run judged once, s after start (nan: not within the load)":
            judged_at - started,
        "pass s, median": statistics.median(seconds), "pass s, max": max(seconds),
        "pass share of interval, median": statistics.median(seconds) / interval,
        "passes": len(steady_passes), "polls skipped": skipped,
        "runs judged per pass (heavy analysis), median": judged,
        "heavy analysis of a run every ~s": runs / judged * statistics.median(seconds)
        if judged else math.inf,
        "runs deferred to the next pass, median": statistics.median(
            [d for *_, d in steady_passes] or [0]),
        "NaN → alert s, median": statistics.median(latencies) if latencies else math.nan,
        "NaN → alert s, max": max(latencies) if latencies else math.nan,
        "NaNs written / alerted": f"{len(load.nans)} / {len(load.nans) - missed}",
        "writer intervals late": load.late,
        "RSS MB at start of load / end / max": f"{rss[0]:.0f} / {rss[-1]:.0f} / {max(rss):.0f}",
        "machine load average (5 min) at the end, cores": f"{load_average:.1f}, "
                                                         f"{os.cpu_count()}",
    }


def _nan_latencies(local: LocalSlack, load: _Load) -> tuple[list[float], int]:
    """Seconds from each NaN written to the first message naming its run and a NaN."""
    calls = [c for method in ("chat.postMessage", "chat.update")
             for c in local.calls_to(method) if not c.failed]
    latencies, missed = [], 0
    for run, written in load.nans.items():
        name = run_path(Path(), run).stem
        times = [c.at for c in calls if f"{name}:" in c.args.get("text", "")
                 and "NaN" in c.args.get("text", "") and c.at >= written - 60]
        if times:
            latencies.append(min(times) - written)
        else:
            missed += 1
    return latencies, missed


def bench_scale(runs: int = 1000, minutes: float = 5.0, max_history: int = 1_000_000,
                console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    figures = live_load(runs=runs, minutes=minutes, console=console)
    histories = tuple(h for h in (1_000, 100_000, 1_000_000) if h <= max_history)
    figures.update(history_cost(histories))
    console.print(f"scale: pass median {figures['pass s, median']:.2f} s at {runs} runs, "
                  f"NaN → alert median {figures['NaN → alert s, median']:.1f} s, "
                  f"{figures['polls skipped']} polls skipped; history cost ratio "
                  f"{figures['poll cost ratio, longest / shortest history']:.2f}")
    return figures
