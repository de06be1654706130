"""Chaos (issue 23): `runwatch serve` killed with SIGKILL at random moments while a real
PyTorch training process and three other runs log, NaNs arrive and the Slack stand-in fails
for a while. Every point is stored once, every run keeps one attempt, every NaN is alerted,
and nothing is posted twice.

The cycle count is ``RUNWATCH_CHAOS_CYCLES`` (default 20); the seed is printed on failure
and can be fixed with ``RUNWATCH_CHAOS_SEED``.
"""

import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from bot.devslack import LocalSlack

ROOT = Path(__file__).resolve().parents[2]
CYCLES = int(os.environ.get("RUNWATCH_CHAOS_CYCLES", "20"))
WRITERS = ("alpha", "beta", "gamma")
LINES = 240  # per writer run, one every 150 ms: about 36 s of logging


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "runwatch.toml"
    path.write_text(
        f'poll_interval = 0.5\ndb = "{tmp_path / "rw.db"}"\n'
        f'[[sources]]\npath = "{tmp_path / "runs"}"\n'
        '[slack]\nchannel = "C0ALERTS"\nhost = "127.0.0.1"\nport = 0\n'
        '[outbox]\nbackoff_seconds = 0.5\n')
    return path


def _serve(config: Path, local: LocalSlack, log) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "RUNWATCH_"))}
    env.update(SLACK_BOT_TOKEN="xoxb-chaos", SLACK_SIGNING_SECRET="chaos-secret",
               SLACK_API_URL=local.api_url)
    return subprocess.Popen([sys.executable, "-m", "bot.cli", "--config", str(config), "serve"],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)


def _write_runs(runs: Path, nan_at: dict[str, int], done: threading.Event) -> None:
    """Each writer run logs LINES losses, one every 150 ms, a NaN at its step in ``nan_at``."""
    handles = {}
    for name in WRITERS:
        (runs / name).mkdir(parents=True)
        handles[name] = open(runs / name / "metrics.jsonl", "w")  # noqa: SIM115
    try:
        for step in range(1, LINES + 1):
            for name, handle in handles.items():
                loss = math.nan if step == nan_at.get(name) else 3.0 - step / 200
                handle.write(json.dumps({"step": step, "loss": loss, "time": time.time()})
                             + "\n")
                handle.flush()
            time.sleep(0.15)
    finally:
        for handle in handles.values():
            handle.close()
        done.set()


def _stored(db: Path) -> dict[str, int]:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return dict(conn.execute("SELECT run, count(*) FROM metrics "
                                     "WHERE tag = 'train/loss' GROUP BY run").fetchall())
    except sqlite3.OperationalError:
        return {}


def _lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines()
               if line.startswith('{"step"') and '"loss"' in line)


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_and_posts_nothing_twice(tmp_path):
    seed = int(os.environ.get("RUNWATCH_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    runs = tmp_path / "runs"
    runs.mkdir()
    config = _config(tmp_path)
    nan_at = {"alpha": rng.randrange(60, 200), "gamma": rng.randrange(60, 200)}  # beta: healthy
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115
    kills = 0
    with LocalSlack(signing_secret="chaos-secret") as local:
        trainer = subprocess.Popen(
            [sys.executable, "-m", "bot.demo_train", "--run-dir", str(runs / "train"),
             "--steps", "200", "--step-delay", "0.1", "--checkpoint-every", "20",
             "--fault", "nan", "--fault-step", "120"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        written = threading.Event()
        writer = threading.Thread(target=_write_runs, args=(runs, nan_at, written), daemon=True)
        writer.start()
        bot = None
        try:
            for cycle in range(CYCLES):
                if cycle == CYCLES // 3:  # Slack down for a while: 500s, then rate limits
                    local.fail("chat.postMessage", times=6, status=500)
                    local.fail("chat.postMessage", times=2, status=429, retry_after=1)
                bot = _serve(config, local, log)
                time.sleep(rng.uniform(1.0, 3.5))  # from before the first poll to mid-pass
                bot.send_signal(signal.SIGKILL)
                bot.wait(timeout=10)
                kills += 1
            assert trainer.wait(timeout=300) == 0
            assert written.wait(timeout=120)
            expected = {name: LINES for name in WRITERS}
            expected["train"] = _lines(runs / "train" / "metrics.jsonl")
            bot = _serve(config, local, log)  # the last one runs to the end
            end = time.monotonic() + 120
            while time.monotonic() < end and _stored(tmp_path / "rw.db") != expected:
                time.sleep(0.5)
            def alerted() -> set[str]:  # runs with a critical alert delivered
                texts = [c.args.get("text", "") for method in ("chat.postMessage", "chat.update")
                         for c in local.calls_to(method) if not c.failed]
                return {r for r in ("alpha", "gamma", "train")
                        if any(f"{r}:" in t and "[critical]" in t for t in texts)}

            while time.monotonic() < end and alerted() != {"alpha", "gamma", "train"}:
                time.sleep(0.5)
            time.sleep(2)  # a few more polls: nothing more to send
            bot.send_signal(signal.SIGTERM)
            assert bot.wait(timeout=30) == 0
        finally:
            for proc in (bot, trainer):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            log.close()
        context = f"seed {seed}, {kills} kills; log: {tmp_path / 'serve.log'}"
        assert _stored(tmp_path / "rw.db") == expected, context  # nothing lost, nothing twice
        with sqlite3.connect(tmp_path / "rw.db") as conn:
            attempts = dict(conn.execute("SELECT name, attempt FROM runs").fetchall())
        assert attempts == {name: 1 for name in expected}, context
        assert alerted() == {"alpha", "gamma", "train"}, context  # no missed alert
        sent = Counter((c.args.get("channel"), c.args.get("thread_ts"), c.args.get("text"))
                       for c in local.calls_to("chat.postMessage") if not c.failed)
        twice = [key for key, n in sent.items() if n > 1]
        assert not twice, f"posted twice: {twice} ({context})"
        assert "beta" not in json.dumps([k[2] for k in sent]), context  # the healthy run
    assert kills == CYCLES
