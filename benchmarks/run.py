"""`runwatch bench`: the speed figures, measured with the real parts, written to BENCHMARKS.md.

- ``latency``: from a spike line being written to the local Slack server receiving the alert
  (poll interval 1 s, the scheduler running as in production).
- ``poll``: one poll cycle over N watched runs with M new points each.
- ``ingest``: full reads per format against the library baseline on the same data.
- ``idle``: a poll that finds nothing new across 1,000 watched files.
- ``alerts``: the alert lifecycle: finding → outbox latency at 1,000 runs and 10 findings/s,
  duplicate posts across 100 forced restarts (``benchmarks/lifecycle.py``).
- ``ack``: Slack acknowledgement time, 20 signed commands at once while a slow job runs
  (``benchmarks/slack.py``).
- ``detect``: detection quality per signal against labelled events (``benchmarks/detect.py``).
- ``real``: detection quality on the labelled real corpus, dev and test half
  (``benchmarks/real.py``).
- ``chart``: the time-aligned chart of a 1M-point run, drawn and loaded from SQLite.
- ``store``: bytes per point before and after the compact store, the WAL, a backfill of
  ``--runs`` × 8,000 points (``benchmarks/store.py``).
- ``scale``: a thousand live runs, a writer appending to each, NaN → alert latency, pass
  time, skipped polls, memory, and the poll cost against history (``benchmarks/scale.py``).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import track

from benchmarks.devslack import LocalSlack
from benchmarks.report import write_section
from bot.config import Config, Secrets, Settings, SourceConfig
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


def run_bench(which: str, *, output: str, console: Console, samples: int = 20,
              runs: int | None = None, points: int = 10, seed: int = 0, repeats: int = 4,
              speed: bool = False, model: str = "smollm2",
              signals: list[str] | None = None, seeds: int = 1,
              outcomes: bool = False, oracle: bool = False, limit: int | None = None,
              train_rows: int = 1_000_000, minutes: float = 5.0,
              max_history: int = 1_000_000) -> int:
    out = Path(output)
    if which == "scale":  # not part of "all": minutes of load on a thousand runs
        from benchmarks.scale import bench_scale

        runs = 1000 if runs is None else runs
        result = bench_scale(runs=runs, minutes=minutes, max_history=max_history,
                             console=console)
        write_section(out, "A thousand live runs (issue 27)",
                       f"runwatch bench scale --runs {runs} --minutes {minutes:g} "
                       f"--max-history {max_history}", result)
        console.print(f"written to {out}")
        return 0
    runs = 100 if runs is None else runs
    if which == "qa":  # not part of "all": it scores answers and loads a model
        from benchmarks.qa import main_qa

        return main_qa(output=output, console=console, model=model, limit=limit)
    if which == "detect":  # not part of "all": it measures detection quality, not speed
        from benchmarks.detect import main_detect

        return main_detect(output=output, console=console, seed=seed, repeats=repeats,
                           speed=speed, signals=signals, seeds=seeds)
    if which == "real":  # not part of "all": detection quality on the labelled real corpus
        from benchmarks.real import main_real

        return main_real(output=output, console=console, outcomes=outcomes, oracle=oracle)
    if which == "leakcheck":  # not part of "all": minutes of hashing a million texts
        from benchmarks.leakcheck import bench_leakcheck

        result = bench_leakcheck(train_rows=train_rows, seed=seed)
        write_section(out, "Leakage check (issue 26)",
                       f"runwatch bench leakcheck --train-rows {train_rows} --seed {seed}",
                       result)
        console.print(f"leakcheck: precision {result['precision']:.3f}, recall "
                      f"{result['recall']:.3f}, {result['check s (reported)']} s, peak "
                      f"{result['peak RSS MB (child process)']} MB for {train_rows:,} train rows")
        return 0
    if which == "versions":  # not part of "all": writes 600 MB of files to time a start
        from benchmarks.versions import bench_versions

        result = bench_versions()
        write_section(out, "Version capture at a training start (issue 26)",
                       "runwatch bench versions", result)
        console.print(f"versions: {result['RunLogger start with versions s (cold)']} s at start")
        return 0
    if which == "chaos":  # not part of "all": minutes of killing and restarting the bot
        from benchmarks.chaos import bench_chaos, bench_sigterm

        result = bench_chaos(cycles=samples, seed=seed, console=console)
        write_section(out, "Chaos: SIGKILL at random moments (issue 23)",
                       f"runwatch bench chaos --samples {samples} --seed {result['seed']}",
                       result)
        result = bench_sigterm(console=console)  # 1,000 runs, as the trial
        write_section(out, "SIGTERM during a long pass (issue 23)", "runwatch bench chaos",
                       result)
        console.print(f"written to {out}")
        return 0
    if which == "store":  # not part of "all": fills a few GB of disk for minutes
        from benchmarks.store import bench_store

        result = bench_store(runs=runs, console=console)
        write_section(out, "Store", f"runwatch bench store --runs {runs}", result)
        console.print(f"written to {out}")
        return 0
    if which == "hardening":  # not part of "all": it loads the bundled model
        from benchmarks.slack import bench_hardening

        result = bench_hardening(model="none" if model == "none" else "transformers",
                                 console=console)
        write_section(out, "Slack under attack and load (issue 23)",
                       "runwatch bench hardening" + (" --model none" if model == "none" else ""),
                       result)
        console.print(f"written to {out}")
        return 0
    if which in ("startup", "all"):
        from benchmarks.startup import bench_startup

        result = bench_startup()
        write_section(out, "Command start time (issue 24)", "runwatch bench startup", result)
        console.print("startup: " + ", ".join(f"{k.removesuffix(' median s')} {v:.2f}s"
                                              for k, v in result.items() if k.endswith(" s")))
    if which in ("latency", "all"):
        result = bench_latency(samples, console)
        write_section(out, "Spike line → Slack alert latency",
                       f"runwatch bench latency --samples {samples}", result)
        console.print(f"latency: median {result['median_s']:.2f}s, p90 {result['p90_s']:.2f}s "
                      f"over {samples} spikes (poll interval 1 s)")
    if which in ("poll", "all"):
        result = bench_poll(runs, points, console=console)
        write_section(out, "One poll cycle", f"runwatch bench poll --runs {runs} "
                                              f"--points {points}", result)
        console.print(f"poll: median {result['median_s']:.3f}s for {runs} runs × {points} new "
                      f"points")
    if which in ("ingest", "all"):
        result = bench_ingest(console=console)
        write_section(out, "Ingest throughput per format", "runwatch bench ingest", result)
        console.print("ingest: " + ", ".join(f"{k} {v:.2f}" for k, v in result.items()
                                             if k.endswith("ratio")))
    if which in ("idle", "all"):
        result = bench_idle()
        write_section(out, "Poll with nothing new", "runwatch bench idle", result)
        console.print(f"idle poll: median {result['median_s'] * 1000:.1f} ms over "
                      f"{result['watched files']} files")
    if which in ("ack", "all"):
        from benchmarks.slack import bench_ack

        result = bench_ack(console=console)
        write_section(out, "Slack acknowledgement under load", "runwatch bench ack", result)
    if which in ("alerts", "all"):
        from benchmarks.lifecycle import (
            bench_pipeline_latency,
            bench_posts_per_incident,
            bench_restarts,
        )

        result = {**bench_pipeline_latency(console=console), **bench_restarts(console=console),
                  **bench_posts_per_incident(console=console)}
        write_section(out, "Alert lifecycle", "runwatch bench alerts", result)
        console.print(f"alerts: finding → outbox p99 {result['finding → outbox p99 ms']:.1f} ms "
                      f"(1,000 runs, 10 findings/s); {result['duplicate posts']} duplicate posts "
                      f"over {result['forced restarts']} forced restarts")
    if which in ("chart", "all"):
        result = bench_chart()
        write_section(out, "Charts", "runwatch bench chart", result)
        console.print(f"chart: {result['points']:,} points drawn in "
                      f"{result['draw (1M points in memory) median s']:.2f}s, from SQLite to "
                      f"PNG in {result['store → PNG median s']:.2f}s")
    console.print(f"written to {out}")
    return 0


def _timed(fn, repeats: int = 3) -> float:
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def _jsonl_baseline(path: Path) -> list[tuple[int, str, float]]:
    points = []
    with open(path) as handle:
        for line in handle:
            record = json.loads(line)
            step = record.pop("step")
            points.extend((step, key, value) for key, value in record.items())
    return points


def bench_ingest(steps: int = 25_000, console: Console | None = None) -> dict[str, Any]:
    """Full reads of the same 4-metric run (``steps`` × 4 points) by runwatch's reader and by
    the library baseline; ratio = runwatch time / baseline time (lower is better)."""
    import pandas as pd

    from connectors.registry import open_source

    console = console or Console()
    keys = ("loss", "learning_rate", "grad_norm", "tokens_per_sec")
    rows = [(s, 2.0 + 1.0 / s, 3e-4, 1.0 + (s % 7) / 7, 1e5 + s % 100)
            for s in range(1, steps + 1)]
    result: dict[str, Any] = {"points": steps * len(keys)}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        jsonl = root / "run.jsonl"
        jsonl.write_text("".join(json.dumps({"step": r[0], **dict(zip(keys, r[1:],
                                                                        strict=True))}) + "\n"
                                 for r in rows))
        csv = root / "run.csv"
        csv.write_text("step," + ",".join(keys) + "\n"
                       + "".join(",".join(map(str, r)) + "\n" for r in rows))

        def ours(uri: str) -> Callable[[], Any]:
            return lambda: open_source(uri).discover()[0].read(final=True)

        def csv_baseline() -> Any:
            return pd.read_csv(csv).melt(id_vars="step")

        cases = [("jsonl", ours(str(jsonl)), lambda: _jsonl_baseline(jsonl), "json.loads loop"),
                 ("csv", ours(str(csv)), csv_baseline, "pandas.read_csv")]
        tb_dir = root / "tb"
        try:
            from tensorboard.backend.event_processing.event_accumulator import (
                EventAccumulator,
            )
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            console.print("tensorboard or torch missing: TensorBoard not measured")
        else:
            writer = SummaryWriter(str(tb_dir))
            for r in rows:
                for key, value in zip(keys, r[1:], strict=True):
                    writer.add_scalar(key, value, r[0])
            writer.close()

            def tb_baseline() -> Any:
                acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
                acc.Reload()
                return [acc.Scalars(tag) for tag in acc.Tags()["scalars"]]

            cases.append(("tensorboard", ours(f"tb://{tb_dir}"), tb_baseline,
                          "EventAccumulator"))
        for name, mine, baseline, label in track(cases, description="ingest",
                                                 console=console):
            ours_s, base_s = _timed(mine), _timed(baseline)
            result[f"{name}: runwatch s"] = ours_s
            result[f"{name}: {label} s"] = base_s
            result[f"{name}: ratio"] = ours_s / base_s
        result.update(_bench_mlflow(root, console))
    return result


def _bench_mlflow(root: Path, console: Console, points: int = 10_000) -> dict[str, Any]:
    try:
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        from benchmarks.devmlflow import SERVER_ENV, MlflowServer
        from connectors.registry import open_source
    except ImportError:
        console.print("mlflow missing (pip install -e '.[test]'): MLflow not measured")
        return {}
    os.environ.update(SERVER_ENV)
    server = MlflowServer(root)
    server.start()
    try:
        client = MlflowClient(server.url)
        experiment = client.create_experiment("bench")
        run = client.create_run(experiment, run_name="bench")
        now = int(time.time() * 1000)
        metrics = [Metric("loss", 2.0 + 1.0 / s, now + s, s) for s in range(1, points + 1)]
        for i in range(0, points, 1000):
            client.log_batch(run.info.run_id, metrics=metrics[i:i + 1000])
        source = open_source(f"mlflow://{server.address}?experiment=bench")
        ours_s = _timed(lambda: source.discover()[0].read(), repeats=2)
        base_s = _timed(lambda: client.get_metric_history(run.info.run_id, "loss"), repeats=2)
    finally:
        server.stop()
    return {"mlflow points": points, "mlflow: runwatch s": ours_s,
            "mlflow: get_metric_history s": base_s, "mlflow: ratio": ours_s / base_s}


def bench_idle(files: int = 1000, repeats: int = 5) -> dict[str, Any]:
    """A poll that finds nothing new across ``files`` watched logs."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "runs").mkdir()
        for i in range(files):
            _append(root / "runs" / f"run{i:04d}.jsonl",
                    "".join(_line(s, _healthy(s)) for s in range(1, 21)))
        settings = Settings(config=Config(sources=[SourceConfig(path=str(root / "runs"))]),
                            secrets=Secrets(), config_path=None,
                            db_path=str(root / "runwatch.db"))
        engine = Engine(settings)
        engine.poll()
        timings = [engine.poll().seconds for _ in range(repeats)]
        engine.store.close()
    return {"watched files": files, "median_s": statistics.median(timings),
            "max_s": max(timings)}


def bench_chart(repeats: int = 3) -> dict[str, Any]:
    """`/run plot` on a 1M-point run (250k steps of loss, LR and grad norm, 125k of throughput
    and memory, an eval every 100 steps, a NaN and a spike): the pure drawing from arrays, and
    the whole path from SQLite to PNG bytes."""
    import numpy as np
    import pandas as pd

    from bot.charts import Chart, Line, draw, load_series, run_chart

    steps = 250_000
    s = np.arange(1, steps + 1)
    loss = 2.0 + 1.0 / np.sqrt(s) + 0.01 * np.sin(s / 37.0)
    loss[180_000], loss[200_000] = 40.0, math.nan
    series = {"train/loss": (s, loss), "lr": (s, np.full(steps, 3e-4)),
              "grad_norm": (s, 1.0 + 0.2 * np.cos(s / 11.0)),
              "throughput": (s[::2], np.full(steps // 2, 1e5)),
              "gpu_mem": (s[::2], np.full(steps // 2, 40.0)),
              "eval/loss": (s[::100], loss[::100] + 0.1)}
    points = sum(len(x) for x, _ in series.values())
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "runwatch.db"))
        store.ingest(run="big", source="bench", log_path="-", cursor_key="big", cursor={},
                     points=pd.DataFrame(columns=["step", "tag", "value", "wall_time"]),
                     checkpoints=[], meta={}, malformed=[], skipped_values=0, notices=[])
        with store.transaction() as db:
            for tag, (x, y) in series.items():
                db.conn.executemany(
                    "INSERT INTO metrics (run, attempt, tag, step, value, wall_time) "
                    "VALUES ('big', 1, ?, ?, ?, NULL)",
                    ((tag, int(a), None if math.isnan(b) else float(b))
                     for a, b in zip(x, y, strict=True)))
            db.conn.executemany("INSERT INTO checkpoints (run, step, path) VALUES (?, ?, ?)",
                                (("big", c, f"ckpt-{c}") for c in range(1000, steps, 1000)))
        full = Chart("big · attempt 1", [Line(tag, x, y, tag, "#1f77b4")
                                          for tag, (x, y) in series.items()],
                     range(1000, steps, 1000))
        draw(full)  # the first draw imports matplotlib and loads fonts
        draws = [_timed(lambda: draw(full), repeats=1) for _ in range(repeats)]
        loads = [_timed(lambda: load_series(store, "big"), repeats=1) for _ in range(repeats)]
        whole = [_timed(lambda: run_chart(store, "big"), repeats=1) for _ in range(repeats)]
        png = run_chart(store, "big").png
        reduced = sum(len(x) for by_tag in load_series(store, "big").series.values()
                      for x, _ in by_tag.values())
        store.close()
    return {"points": points, "panels": len(series) - 1, "checkpoints": len(full.checkpoints),
            "draw (1M points in memory) median s": statistics.median(draws),
            "draw max s": max(draws),
            "SQLite load, reduced in SQL, median s": statistics.median(loads),
            "points after the SQL envelope": reduced,
            "store → PNG median s": statistics.median(whole), "PNG bytes": len(png)}
