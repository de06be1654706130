"""`runwatch bench chaos`: `runwatch serve` killed with SIGKILL at random moments.

Each bot is killed at a random moment within 1.5 s of taking the database (three polls), the
first once it has read every run, so that no NaN is history it never watched (a finding
that began and ended before runwatch first read its run is kept silently, by design).
While a real PyTorch training process (``bot.demo.trainer`` with a NaN fault) and three other
runs log, NaNs arrive and the Slack stand-in fails for a while (HTTP 500s, then 429s), the
bot is started and killed again and again; a last one runs to the end. Then: every line
logged is stored once (no point lost, none twice), every run keeps one attempt, every NaN
got its critical alert and nothing was posted twice. ``tests/bot/test_chaos.py`` runs it
with 20 cycles; the bench with more and writes the figures to BENCHMARKS.md.
"""

from __future__ import annotations

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmarks.devslack import LocalSlack

WRITERS = ("alpha", "beta", "gamma")  # beta stays healthy
LINES = 160  # per writer run, one every 150 ms: about 24 s of logging
NAN_RUNS = ("alpha", "gamma", "train")
SECRET = "chaos-secret"
SLACK_FAULTS = ((6, 500), (2, 429))  # calls to chat.postMessage that fail, and how


@dataclass
class ChaosResult:
    seed: int
    kills: int = 0
    slack_faults: int = 0
    expected: dict[str, int] = field(default_factory=dict)  # run → lines logged
    stored: dict[str, int] = field(default_factory=dict)  # run → points stored
    attempts: dict[str, int] = field(default_factory=dict)
    alerted: set[str] = field(default_factory=set)  # runs whose NaN was alerted
    posted_twice: list[tuple[Any, ...]] = field(default_factory=list)
    healthy_mentioned: bool = False  # beta named in a post
    last_exit: int | None = None  # the last bot's status after SIGTERM
    log: str = ""

    @property
    def lost(self) -> int:
        return sum(max(n - self.stored.get(run, 0), 0) for run, n in self.expected.items())

    @property
    def doubled(self) -> int:
        return sum(max(self.stored.get(run, 0) - n, 0) for run, n in self.expected.items())

    def figures(self) -> dict[str, Any]:
        return {"SIGKILL cycles": self.kills, "Slack faults injected": self.slack_faults,
                "lines logged": sum(self.expected.values()), "points lost": self.lost,
                "points stored twice": self.doubled,
                "runs with more than one attempt": sum(a > 1 for a in self.attempts.values()),
                "NaN alerts delivered": f"{len(self.alerted)} of {len(NAN_RUNS)}",
                "messages posted twice": len(self.posted_twice),
                "exit status after SIGTERM": self.last_exit, "seed": self.seed}


def _config(root: Path) -> Path:
    path = root / "runwatch.toml"
    path.write_text(
        f'poll_interval = 0.5\ndb = "{root / "rw.db"}"\n'
        f'[[sources]]\npath = "{root / "runs"}"\n'
        '[slack]\nchannel = "C0ALERTS"\nhost = "127.0.0.1"\nport = 0\n'
        '[outbox]\nbackoff_seconds = 0.5\n')
    return path


def _serve(config: Path, log: IO[str], local: LocalSlack | None = None) -> subprocess.Popen:
    """`runwatch serve` on ``config``, on Slack at ``local`` (console mode without one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "RUNWATCH_"))}
    if local is not None:
        env.update(SLACK_BOT_TOKEN="xoxb-chaos", SLACK_SIGNING_SECRET=SECRET,
                   SLACK_API_URL=local.api_url)
    return subprocess.Popen([sys.executable, "-m", "bot.cli", "--config", str(config), "serve"],
                            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)


# The writers log this many steps, then wait until the bot watches every run before they go
# on: a NaN logged before runwatch first read its run is history present at start, which is
# not alerted by design (on a loaded machine the first bot could start after a NaN).
BEFORE_WATCHED = 30


def _write_runs(runs: Path, nan_at: dict[str, int], done: threading.Event,
                watched: threading.Event) -> None:
    """Each writer run logs LINES losses, one every 150 ms, a NaN at its step in ``nan_at``
    (after BEFORE_WATCHED steps and ``watched``)."""
    handles = {}
    for name in WRITERS:
        (runs / name).mkdir(parents=True)
        handles[name] = open(runs / name / "metrics.jsonl", "w")  # noqa: SIM115
    try:
        for step in range(1, LINES + 1):
            if step == BEFORE_WATCHED + 1:
                watched.wait(timeout=300)
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


def _holder(root: Path) -> int | None:
    """The PID in the database's instance lock: the bot that got that far has started."""
    try:
        return int((root / "rw.db.lock").read_text().strip() or 0)
    except (OSError, ValueError):
        return None


def _wait_until(ready, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not ready() and time.monotonic() < end:
        time.sleep(0.05)


def _alerted(local: LocalSlack) -> set[str]:
    """Runs whose NaN was told, as a message or as an edit of its group's (firing, or
    already resolved when a NaN came and went while no bot was running)."""
    texts = [c.args.get("text", "") for method in ("chat.postMessage", "chat.update")
             for c in local.calls_to(method) if not c.failed]
    return {r for r in NAN_RUNS if any(f"{r}:" in t and "NaN" in t for t in texts)}


def run_chaos(root: Path, cycles: int = 20, seed: int | None = None) -> ChaosResult:
    """Run the chaos in ``root`` (an empty folder); the bot's output goes to ``serve.log``."""
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    result = ChaosResult(seed=seed, log=str(root / "serve.log"))
    runs = root / "runs"
    runs.mkdir()
    config = _config(root)
    nan_at = {"alpha": rng.randrange(40, 140), "gamma": rng.randrange(40, 140)}
    with LocalSlack(signing_secret=SECRET) as local, open(result.log, "w") as log:
        trainer = subprocess.Popen(
            [sys.executable, "-m", "bot.demo.trainer", "--run-dir", str(runs / "train"),
             "--steps", "140", "--step-delay", "0.1", "--checkpoint-every", "20",
             "--fault", "nan", "--fault-step", "90"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        written, watched = threading.Event(), threading.Event()
        threading.Thread(target=_write_runs, args=(runs, nan_at, written, watched),
                         daemon=True).start()
        bot = None
        try:
            for cycle in range(cycles):
                if cycle == cycles // 3:  # Slack down for a while: 500s, then rate limits
                    for times, status in SLACK_FAULTS:
                        local.fail("chat.postMessage", times=times, status=status,
                                   retry_after=1 if status == 429 else None)
                        result.slack_faults += times
                bot = _serve(config, log, local)
                _wait_until(lambda proc=bot: _holder(root) == proc.pid or proc.poll() is not None)
                if cycle == 0:  # watching every run before any NaN: none is history
                    _wait_until(lambda: len(_stored(root / "rw.db")) == len(WRITERS) + 1)
                    watched.set()
                time.sleep(rng.uniform(0.0, 1.5))  # a poll every 0.5 s: any moment of three
                bot.send_signal(signal.SIGKILL)
                bot.wait(timeout=10)
                result.kills += 1
            trainer.wait(timeout=300)
            written.wait(timeout=120)
            result.expected = {name: LINES for name in WRITERS}
            result.expected["train"] = _lines(runs / "train" / "metrics.jsonl")
            bot = _serve(config, log, local)  # the last one runs to the end
            _wait_until(lambda proc=bot: _holder(root) == proc.pid or proc.poll() is not None)
            end = time.monotonic() + 120
            while time.monotonic() < end and (_stored(root / "rw.db") != result.expected
                                              or _alerted(local) != set(NAN_RUNS)):
                time.sleep(0.5)
            time.sleep(2)  # a few more polls: nothing more to send
            bot.send_signal(signal.SIGTERM)
            result.last_exit = bot.wait(timeout=30)
        finally:
            for proc in (bot, trainer):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
        result.stored = _stored(root / "rw.db")
        with sqlite3.connect(root / "rw.db") as conn:
            result.attempts = dict(conn.execute("SELECT name, attempt FROM runs").fetchall())
        result.alerted = _alerted(local)
        sent = Counter((c.args.get("channel"), c.args.get("thread_ts"), c.args.get("text"))
                       for c in local.calls_to("chat.postMessage") if not c.failed)
        result.posted_twice = [key for key, n in sent.items() if n > 1]
        result.healthy_mentioned = "beta" in json.dumps([key[2] for key in sent])
    return result


def bench_chaos(cycles: int = 50, seed: int | None = None, console=None) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = run_chaos(Path(tmp), cycles=cycles, seed=seed)
    figures = result.figures()
    if console is not None:
        console.print(f"chaos: {result.kills} SIGKILLs, {result.slack_faults} Slack faults; "
                      f"{result.lost} points lost, {result.doubled} doubled, "
                      f"{len(result.posted_twice)} messages twice, NaN alerts "
                      f"{figures['NaN alerts delivered']}")
    return figures


def bench_sigterm(runs: int = 1000, lines: int = 200, after: tuple[float, ...] = (5, 15, 30),
                  console=None) -> dict[str, Any]:
    """SIGTERM during the first pass over ``runs`` runs (a backfill: the longest pass there
    is): seconds from the signal to the exit, for a signal ``after`` seconds into each start;
    then a last start reads to the end, and every line must be stored once."""
    import tempfile

    waits: list[float] = []
    statuses: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = root / "runs"
        folder.mkdir()
        for i in range(runs):
            (folder / f"run{i:04d}.jsonl").write_text("".join(
                f'{{"step": {s}, "loss": {2.0 + 1.0 / s:.6f}, "learning_rate": 0.0003}}\n'
                for s in range(1, lines + 1)))
        config = root / "runwatch.toml"
        config.write_text(f'poll_interval = 3600\ndb = "{root / "rw.db"}"\n'
                          f'[[sources]]\npath = "{folder}"\n')
        with open(root / "serve.log", "w") as log:
            for seconds in after:
                proc = _serve(config, log)
                time.sleep(seconds)
                sent = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                try:
                    statuses.append(proc.wait(timeout=120))
                finally:
                    if proc.poll() is None:
                        proc.kill()
                waits.append(time.monotonic() - sent)
            proc = _serve(config, log)
            expected = runs * lines
            end = time.monotonic() + 900
            stored = 0
            while time.monotonic() < end and stored < expected:
                time.sleep(2)
                try:
                    with sqlite3.connect(root / "rw.db", timeout=5) as conn:
                        stored = conn.execute("SELECT count(*) FROM metrics WHERE tag = "
                                              "'train/loss'").fetchone()[0]
                except sqlite3.OperationalError:
                    pass
            proc.send_signal(signal.SIGTERM)
            statuses.append(proc.wait(timeout=120))
    result = {"runs": runs, "lines per run": lines,
              "SIGTERM after (s)": ", ".join(f"{s:g}" for s in after),
              "exit after SIGTERM, max s": round(max(waits), 2),
              "exit after SIGTERM, each s": ", ".join(f"{w:.2f}" for w in waits),
              "exit statuses": ", ".join(map(str, statuses)),
              "lines stored at the end": f"{stored} of {expected}"}
    if console is not None:
        console.print(f"sigterm: exited {result['exit after SIGTERM, each s']} s after the "
                      f"signal during a {runs}-run pass; {result['lines stored at the end']} "
                      f"lines stored at the end")
    return result
