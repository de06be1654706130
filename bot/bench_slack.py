"""`runwatch bench ack`: how fast Slack requests are acknowledged while the bot is busy.

Slack gives an app 3 seconds to acknowledge a slash command or a button; runwatch acks first
and answers afterwards. This measures it with the real parts: Bot in HTTP mode with Bolt's
request verification, a local Slack Web API server, 20 signed `/run status` commands sent at
once, round after round, while a slow job runs (a confirmed stop whose scheduler command
takes several seconds, on the action worker).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console

from bot.config import ActionsConfig, Config, Secrets, Settings, SourceConfig
from bot.devslack import LocalSlack, signed_headers, slash_command_body
from bot.serve import Bot

SECRET = "bench-secret"
SLOW_JOB_S = 8.0


def _settings(root: Path, local: LocalSlack) -> Settings:
    config = Config(
        poll_interval=3600, sources=[SourceConfig(path=str(root / "runs"))],
        slack={"channel": "C0BENCH", "host": "127.0.0.1", "port": 0},
        actions=ActionsConfig(permissions={"stop": {"users": ["U1"]}}, runs=[{
            "run": "slow", "backend": "command",
            "stop": [sys.executable, "-c", f"import time; time.sleep({SLOW_JOB_S})"]}]))
    secrets = Secrets(slack_bot_token="xoxb-bench", slack_signing_secret=SECRET,
                      slack_api_url=local.api_url)
    return Settings(config=config, secrets=secrets, config_path=None,
                    db_path=str(root / "runwatch.db"))


def _write_runs(root: Path) -> None:
    for name in ("exp1", "slow"):
        run = root / "runs" / name
        run.mkdir(parents=True)
        lines = [json.dumps({"step": s, "loss": 2.0 + 1.0 / s, "time": time.time()})
                 for s in range(1, 2001)]
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _post(url: str, local: LocalSlack, text: str, user: str = "U1") -> float:
    body = slash_command_body(text=text, user_id=user, response_url=local.new_response_url())
    request = urllib.request.Request(url, data=body.encode(), method="POST",
                                     headers=signed_headers(body, SECRET))
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        assert response.status == 200
    return time.perf_counter() - started


def bench_ack(concurrency: int = 20, rounds: int = 5,
              console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    with tempfile.TemporaryDirectory() as tmp, LocalSlack(signing_secret=SECRET) as local:
        root = Path(tmp)
        _write_runs(root)
        with Bot(_settings(root, local)).start(poll=False) as bot:
            bot.engine.poll()
            url = f"http://127.0.0.1:{bot.http_port}/slack/events"
            _post(url, local, "stop slow")  # the slow job: asked, then confirmed
            local.wait_for("response_url")
            request_id = bot.store.query("SELECT id FROM action_requests")[0]["id"]
            _post(url, local, f"confirm {request_id}")
            deadline = time.monotonic() + 10
            while bot.actions.get(request_id).state != "running" and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            samples: list[float] = []
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                for _ in range(rounds):
                    samples += pool.map(lambda _: _post(url, local, "status exp1"),
                                        range(concurrency))
            busy = bot.actions.get(request_id).state == "running"
            answered = local.wait_for("response_url", count=2 + len(samples), timeout=60)
    samples.sort()
    p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    result = {"commands": len(samples), "concurrent": concurrency,
              "ack p50 ms": round(statistics.median(samples) * 1000, 1),
              "ack p99 ms": round(p99 * 1000, 1), "ack max ms": round(samples[-1] * 1000, 1),
              "answered": len(answered) - 2,
              "slow job still running at the end": busy}
    console.print(f"ack: p50 {result['ack p50 ms']} ms, p99 {result['ack p99 ms']} ms over "
                  f"{len(samples)} commands, {concurrency} at once, a slow job running")
    return result
