"""`runwatch bench`: the speed figures, measured with the real parts, written to BENCHMARKS.md.

- ``latency``: from a spike line being written to the local Slack server receiving the alert
  (poll interval 1 s, the scheduler running as in production).
- ``poll``: one poll cycle over N watched runs with M new points each.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import track

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.devslack import LocalSlack
from bot.engine import Engine
from bot.serve import Bot
from bot.store import Store

WARMUP_POINTS = 40


def _line(step: int, loss: float) -> str:
    return json.dumps({"step": step, "loss": loss, "time": time.time()}) + "\n"


def _healthy(step: int) -> float:
    return round(2.0 + 1.0 / step + 0.01 * ((step * 7919) % 13) / 13, 5)


def _append(path: Path, text: str) -> None:
    with open(path, "a") as handle:
        handle.write(text)
        handle.flush()


def bench_latency(samples: int = 20, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    with tempfile.TemporaryDirectory() as tmp, LocalSlack() as local:
        root = Path(tmp)
        (root / "runs").mkdir()
        config = Config(poll_interval=1.0, sources=[SourceConfig(path=str(root / "runs"))],
                        slack={"channel": "C0BENCH", "host": "127.0.0.1", "port": 0})
        secrets = Secrets(slack_bot_token="xoxb-bench", slack_signing_secret="bench",
                          slack_api_url=local.api_url)
        settings = Settings(config=config, secrets=secrets, config_path=None,
                            db_path=str(root / "runwatch.db"))
        latencies = []
        with Bot(settings, console=console).start():
            for i in track(range(samples), description="spike → Slack", console=console):
                log = root / "runs" / f"lat{i:02d}.jsonl"
                _append(log, "".join(_line(s, _healthy(s)) for s in range(1, WARMUP_POINTS)))
                time.sleep(1.5)  # let a poll take the healthy history in
                written = time.time()
                _append(log, _line(WARMUP_POINTS, 25.0))
                call = local.wait_for("chat.postMessage", count=i + 1, timeout=30)[i]
                latencies.append(call.at - written)
    return {
        "samples": samples, "poll_interval_s": 1.0,
        "median_s": statistics.median(latencies),
        "p90_s": sorted(latencies)[int(0.9 * (len(latencies) - 1))],
        "max_s": max(latencies), "min_s": min(latencies),
    }


def bench_poll(runs: int = 100, points: int = 10, history: int = 500, repeats: int = 5,
               console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        logs = []
        for r in range(runs):
            run_dir = root / "runs" / f"run{r:03d}"
            run_dir.mkdir(parents=True)
            logs.append(run_dir / "metrics.jsonl")
            _append(logs[-1], "".join(_line(s, _healthy(s)) for s in range(1, history + 1)))
        settings = Settings(config=Config(sources=[SourceConfig(path=str(root / "runs"))]),
                            secrets=Secrets(), config_path=None,
                            db_path=str(root / "runwatch.db"))
        engine = Engine(settings, store=Store(settings.db_path))
        engine.poll()
        timings = []
        step = history
        for _ in track(range(repeats), description=f"poll {runs} runs", console=console):
            for log in logs:
                _append(log, "".join(_line(s, _healthy(s))
                                     for s in range(step + 1, step + points + 1)))
            step += points
            report = engine.poll()
            assert len(report.analysed) == runs, report.analysed
            timings.append(report.seconds)
        engine.store.close()
    return {"runs": runs, "new_points_per_run": points, "history_points_per_run": history,
            "repeats": repeats, "median_s": statistics.median(timings), "max_s": max(timings)}


def _write_section(path: Path, name: str, command: str, result: dict[str, Any]) -> None:
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


def run_bench(which: str, *, output: str, console: Console, samples: int = 20,
              runs: int = 100, points: int = 10) -> int:
    out = Path(output)
    if which in ("latency", "all"):
        result = bench_latency(samples, console)
        _write_section(out, "Spike line → Slack alert latency",
                       f"runwatch bench latency --samples {samples}", result)
        console.print(f"latency: median {result['median_s']:.2f}s, p90 {result['p90_s']:.2f}s "
                      f"over {samples} spikes (poll interval 1 s)")
    if which in ("poll", "all"):
        result = bench_poll(runs, points, console=console)
        _write_section(out, "One poll cycle", f"runwatch bench poll --runs {runs} "
                                              f"--points {points}", result)
        console.print(f"poll: median {result['median_s']:.3f}s for {runs} runs × {points} new "
                      f"points")
    console.print(f"written to {out}")
    return 0
