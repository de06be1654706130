"""`runwatch bench alerts`: the alert lifecycle's figures, measured with the real parts.

- Pipeline latency: findings arrive at a steady rate across many watched runs, each with a
  live alert; the time from a finding's arrival to its outbox row being committed
  (reconcile: rule, mute, dedup, plan, in one SQLite transaction), with the once-a-second
  ``tick`` of the time-driven stages in the same loop, so its cost shows as queueing.
- Restarts: a bot is killed and started again on the same SQLite file over and over while
  runs keep failing and recovering, sometimes between deciding and sending, sometimes after
  Slack accepted a message and before runwatch recorded it; every message carries its
  outbox key, so a duplicate post is counted exactly.
"""

from __future__ import annotations

import json
import logging
import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import track
from slack_sdk import WebClient

import analyzers
from analyzers.base import RunData
from analyzers.finding import Finding, Fix
from benchmarks.devslack import LocalSlack
from bot.alerting.notify import SendResult, SlackNotifier
from bot.alerting.outbox import Outbox
from bot.alerting.pipeline import reconcile, tick
from bot.config import AlertingConfig, Config, OutboxConfig, Secrets, Settings, SourceConfig
from bot.engine import Engine
from bot.store import Store


def _finding(run: str, signal: str, onset: int, severity: str = "warning",
             resolved_step: int | None = None) -> Finding:
    return Finding(run=run, signal=signal, severity=severity, metric="train/loss",
                   onset_step=onset, detected_step=onset,
                   summary=f"train/loss {signal} at step {onset}", evidence={"peak": 9.5},
                   fixes=[Fix("Roll back to the last checkpoint", "000 §3.2", "rollback")],
                   kind="not_learning", source="000 §3.2",
                   state="firing" if resolved_step is None else "resolved",
                   resolved_step=resolved_step)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench_pipeline_latency(runs: int = 1000, rate: float = 10.0, seconds: float = 30.0,
                           console: Console | None = None, seed: int = 7) -> dict[str, Any]:
    console = console or Console()
    rng = random.Random(seed)
    alerting = AlertingConfig(oncall="S0ONCALL")
    signals = {"spike", "plateau"}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "runwatch.db"))
        names = [f"run{i:04d}" for i in range(runs)]
        history: dict[str, list[Finding]] = {}
        for name in track(names, description=f"{runs} runs with a live alert",
                          console=console):
            history[name] = [_finding(name, "plateau", 100)]
            reconcile(store, name, 1, history[name], signals=signals, channel="C0BENCH",
                      now=time.time(), alerting=alerting)
        latencies, ticks = [], []
        total = int(rate * seconds)
        started = time.perf_counter()
        next_tick = started + 1.0
        for i in track(range(total), description=f"{rate:g} findings/s", console=console):
            due = started + i / rate
            while (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            if time.perf_counter() >= next_tick:  # the poll's time-driven stages
                t0 = time.perf_counter()
                tick(store, now=time.time(), alerting=alerting)
                ticks.append(time.perf_counter() - t0)
                next_tick += 1.0
            name = rng.choice(names)
            found = history[name]
            last = found[-1]
            step = last.onset_step + 10
            if last.signal == "spike" and last.state == "firing":
                found[-1] = _finding(name, "spike", last.onset_step, "critical", step)
            else:
                found.append(_finding(name, "spike", step, "critical"))
            reconcile(store, name, 1, found, signals=signals, channel="C0BENCH",
                      now=time.time(), alerting=alerting)
            latencies.append(time.perf_counter() - due)
        queued = store.query("SELECT COUNT(*) AS n FROM outbox")[0]["n"]
        store.close()
    return {"runs with a live alert": runs, "findings per second": rate,
            "findings": total, "outbox rows written": queued,
            "finding → outbox median ms": statistics.median(latencies) * 1000,
            "finding → outbox p99 ms": _percentile(latencies, 0.99) * 1000,
            "finding → outbox max ms": max(latencies) * 1000,
            f"tick over {runs} groups median ms": statistics.median(ticks) * 1000}


class _Crash(BaseException):
    """The bot process dies here; nothing after it runs."""


class _Dying:
    """Passes calls to Slack and dies right after the ``after``-th one went through."""

    def __init__(self, notifier: SlackNotifier, after: int) -> None:
        self.notifier = notifier
        self.after = after
        self.calls = 0

    def _count(self) -> None:
        self.calls += 1
        if self.calls == self.after:
            raise _Crash

    def post(self, channel, message, thread_ts=None):  # noqa: ANN001, ANN201
        result = self.notifier.post(channel, message, thread_ts)
        self._count()
        return result

    def update(self, channel, ts, message):  # noqa: ANN001, ANN201
        result = self.notifier.update(channel, ts, message)
        self._count()
        return result

    def find(self, channel, key, *, thread_ts=None):  # noqa: ANN001, ANN201
        return self.notifier.find(channel, key, thread_ts=thread_ts)


def _loss(run: int, step: int) -> float:
    """Healthy loss with faults: a NaN or a 10x spike every ~40 steps, staggered per run,
    and one run broken for 150 steps (a long-firing critical: escalation, repeats)."""
    if run == 4 and 150 <= step < 300:
        return 25.0
    phase = (step + 13 * run) % 40
    if phase == 0:
        return float("nan") if run % 2 else 25.0
    if 0 < phase < 8 and run % 3 == 0:
        return 25.0  # a spike that lasts a while: a long-firing critical
    return round(2.0 + 1.0 / step + 0.01 * ((step * 7919 + run) % 13) / 13, 5)


def _restart_scenario(root: Path, local: LocalSlack, cycles: int, crash: bool,
                      seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    runs, steps_per_cycle = 5, 4
    (root / "runs").mkdir(parents=True)
    alerting = AlertingConfig(repeat_interval=900, escalate_after=600, oncall="S0ONCALL")
    config = Config(sources=[SourceConfig(path=str(root / "runs"))], alerting=alerting,
                    slack={"channel": "C0BENCH"})
    settings = Settings(config=config, secrets=Secrets(), config_path=None,
                        db_path=str(root / "runwatch.db"))
    slack = SlackNotifier(WebClient(base_url=local.api_url, token="xoxb-bench"))
    kills = Counter()
    step = 0
    for cycle in range(cycles):
        for r in range(runs):
            with open(root / "runs" / f"run{r}.jsonl", "a") as handle:
                for s in range(step + 1, step + steps_per_cycle + 1):
                    handle.write(json.dumps({"step": s, "loss": _loss(r, s)}) + "\n")
        step += steps_per_cycle
        now = 1_000_000.0 + 60.0 * cycle
        way = rng.choice(["clean", "before sending", "after Slack accepted"]) if crash \
            else "clean"
        notifier = _Dying(slack, rng.randint(1, 3)) if way == "after Slack accepted" else slack
        engine = Engine(settings, notifier=notifier, clock=lambda now=now: now)
        try:  # a fresh bot's first send settles what the last one left in doubt
            engine.poll(dispatch=way != "before sending")
        except _Crash:
            pass
        kills[way] += 1
        engine.store.close()
    engine = Engine(settings, notifier=slack, clock=lambda: 1_000_000.0 + 60.0 * cycles)
    engine.poll()  # a last, clean start sends what is left
    engine.store.close()
    keys = Counter()
    kinds = Counter()
    for call in local.calls_to("chat.postMessage"):
        meta = call.args.get("metadata") or {}
        keys[(meta.get("event_payload") or {}).get("key")] += 1
        text = call.args.get("text", "")
        kinds["thread reply" if call.args.get("thread_ts") else "message"] += 1
        kinds["repeat" if text.startswith(":repeat:") else "escalation"
              if text.startswith(":sos:") else "other"] += 1
    return {"posts": sum(keys.values()), "duplicates": sum(n - 1 for n in keys.values()),
            "edits": len(local.calls_to("chat.update")), "kills": kills,
            "messages": kinds["message"], "repeats": kinds["repeat"],
            "escalations": kinds["escalation"]}


def bench_restarts(cycles: int = 100, console: Console | None = None,
                   seed: int = 11) -> dict[str, Any]:
    console = console or Console()
    with tempfile.TemporaryDirectory() as tmp:
        with LocalSlack() as local:
            console.print(f"{cycles} forced restarts during active alerting…")
            crashed = _restart_scenario(Path(tmp) / "crashed", local, cycles, True, seed)
        with LocalSlack() as local:
            steady = _restart_scenario(Path(tmp) / "steady", local, cycles, False, seed)
    kills = crashed["kills"]
    return {"forced restarts": cycles,
            "killed after Slack accepted, before recording": kills["after Slack accepted"],
            "killed between deciding and sending": kills["before sending"],
            "posts": crashed["posts"], "duplicate posts": crashed["duplicates"],
            "posts without restarts": steady["posts"],
            "messages / repeats / escalations": f"{crashed['messages']} / "
                                                f"{crashed['repeats']} / "
                                                f"{crashed['escalations']}",
            "chat.update edits": crashed["edits"]}


class _Counting:
    """A transport that counts what would reach Slack: new messages, thread replies, edits."""

    def __init__(self) -> None:
        self.posts = self.replies = self.updates = 0

    def post(self, channel, message, thread_ts=None):  # noqa: ANN001, ANN201
        if thread_ts is None:
            self.posts += 1
        else:
            self.replies += 1
        return SendResult(True, channel=channel, ts=f"{self.posts}.{self.replies}")

    def update(self, channel, ts, message):  # noqa: ANN001, ANN201
        self.updates += 1
        return SendResult(True, channel=channel, ts=ts)

    def find(self, channel, key, *, thread_ts=None):  # noqa: ANN001, ANN201
        return None


def bench_posts_per_incident(seed: int = 0, repeats: int = 1, polls: int = 20,
                             console: Console | None = None) -> dict[str, Any]:
    """Messages a team would see per labelled incident, and on the negative controls.

    Each run of the detection benchmark's synthetic suite is replayed as a live run: its
    history arrives in ``polls`` chunks, each analysed by every analyzer and passed through
    the whole lifecycle (reconcile, tick, outbox) with the default alerting settings and
    time moving one minute per poll.
    """
    from benchmarks.synthetic import synthetic_suite

    console = console or Console()
    cases = synthetic_suite(seed=seed, repeats=repeats)
    detectors = analyzers.build()
    signals = {a.signal for a in detectors}
    alerting = AlertingConfig()
    incidents = incident_posts = incident_messages = 0
    negative_runs = negative_posts = negative_messages = 0
    quiet = logging.getLogger("runwatch.alerts")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # a line per alert of 200 replayed runs says nothing
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(track(cases, description="replaying runs",
                                       console=console)):
            store = Store(str(Path(tmp) / f"case{i}.db"))
            transport = _Counting()
            outbox = Outbox(store, transport, OutboxConfig())
            frame = case.data.metrics
            steps = np.sort(frame["step"].unique())
            now = 1_000_000.0
            for k in range(1, polls + 1):
                cut = steps[min(len(steps) - 1, len(steps) * k // polls - 1)]
                data = RunData(run=case.name, metrics=frame[frame["step"] <= cut],
                               attempt=case.data.attempt, checkpoints=[
                                   c for c in case.data.checkpoints if c.step <= cut],
                               meta=case.data.meta)
                findings = [f for a in detectors for f in a.detect(data)]
                reconcile(store, case.name, data.attempt, findings, signals=signals,
                          channel="C0BENCH", now=now, alerting=alerting)
                tick(store, now=now, alerting=alerting)
                outbox.clock = lambda now=now: now
                outbox.dispatch()
                now += 60.0
            store.close()
            messages = transport.posts + transport.replies
            if case.negative:
                negative_runs += 1
                negative_posts += transport.posts
                negative_messages += messages
            else:
                incidents += len(case.events)
                incident_posts += transport.posts
                incident_messages += messages
    quiet.setLevel(level)
    result = {
        "labelled incidents": incidents,
        "new messages per incident": round(incident_posts / max(incidents, 1), 2),
        "messages per incident (thread replies included)": round(
            incident_messages / max(incidents, 1), 2),
        "negative-control runs": negative_runs,
        "new messages per negative-control run": round(negative_posts / max(negative_runs, 1),
                                                       2),
        "messages per negative-control run": round(negative_messages / max(negative_runs, 1),
                                                   2),
        "polls per run": polls,
    }
    console.print(f"posts: {result['new messages per incident']} new messages per incident, "
                  f"{result['new messages per negative-control run']} per negative-control run")
    return result
