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
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console

from benchmarks.devslack import LocalSlack, signed_headers, slash_command_body
from bot.config import ActionsConfig, Config, Secrets, Settings, SourceConfig
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
    status, seconds = _send(url, body.encode(), signed_headers(body, SECRET))
    assert status == 200, status
    return seconds


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


QUESTIONS = ("what changed at step 1000?", "is the loss still falling?",
             "which step is exp1 at now?", "summarize exp1 in one sentence",
             "what is the latest loss?", "has exp1 plateaued?",
             "what should I do about exp1?", "how fast is exp1 training?")
BIG_BODY_BYTES = 5 * 1024 * 1024


def _send(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, float]:
    """An HTTP status and the seconds it took; a refused connection is status 0."""
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError:
        status = 0
    return status, time.perf_counter() - started


def _send_unsigned(port: int, size: int) -> tuple[int, float]:
    """A POST of ``size`` bytes with a forged signature, as an attacker sends it: the server
    may answer (413) and close before the body is all sent, so the answer is read anyway."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    started = time.perf_counter()
    try:
        conn.putrequest("POST", "/slack/events")
        for name, value in (("Content-Type", "application/x-www-form-urlencoded"),
                            ("Content-Length", str(size)),
                            ("X-Slack-Request-Timestamp", str(int(time.time()))),
                            ("X-Slack-Signature", "v0=" + "0" * 64)):
            conn.putheader(name, value)
        conn.endheaders()
        try:
            conn.send(b"x" * size)
        except OSError:
            pass  # refused mid-body: the answer is already there
        response = conn.getresponse()
        response.read()
        return response.status, time.perf_counter() - started
    except OSError:
        return 0, time.perf_counter() - started
    finally:
        conn.close()


def _slash(url: str, local: LocalSlack, text: str) -> tuple[str, int, float]:
    response_url = local.new_response_url()
    body = slash_command_body(text=text, user_id="U1", response_url=response_url)
    return (response_url, *_send(url, body.encode(), signed_headers(body, SECRET)))


def bench_hardening(concurrency: int = 50, rounds: int = 2, questions: int = 8,
                    model: str = "transformers",
                    console: Console | None = None) -> dict[str, Any]:
    """Issue 23's load figure: `concurrency` signed `/run status` at once, `rounds` times,
    while `questions` `/run ask` wait for the bundled model and a 5 MB unsigned POST
    arrives. Every request must be acked (200) and answered on its response URL."""
    from bot.qa.config import ModelConfig

    console = console or Console()
    with tempfile.TemporaryDirectory() as tmp, LocalSlack(signing_secret=SECRET) as local:
        root = Path(tmp)
        _write_runs(root)
        settings = _settings(root, local)
        settings.config.qa = ModelConfig(backend=model)
        with Bot(settings).start(poll=False) as bot:
            bot.engine.poll()
            url = f"http://127.0.0.1:{bot.http_port}/slack/events"
            with ThreadPoolExecutor(max_workers=concurrency + questions + 1) as pool:
                asked = [pool.submit(_slash, url, local, f"ask exp1 {QUESTIONS[i % 8]}")
                         for i in range(questions)]
                asks = [f.result() for f in asked]  # acked: the answers are being generated
                big = pool.submit(_send_unsigned, bot.http_port, BIG_BODY_BYTES)
                statuses = []
                for _ in range(rounds):
                    statuses += pool.map(lambda _: _slash(url, local, "status exp1"),
                                         range(concurrency))
                big_status, big_seconds = big.result()
            answered_at = {}
            deadline = time.monotonic() + 60 + 30 * questions
            wanted = {u for u, _, _ in asks + statuses}
            while time.monotonic() < deadline:
                answered_at = {c.path: c for c in local.calls_to("response_url")
                               if "queued" not in str(c.args.get("text", "")).lower()}
                if all(urlsplit(u).path in answered_at for u in wanted):
                    break
                time.sleep(0.5)
            queued_told = sum(1 for c in local.calls_to("response_url")
                              if "queued" in str(c.args.get("text", "")).lower())
    samples = sorted(seconds for _, _, seconds in statuses)
    p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    result = {
        "status commands": len(samples), "at once": concurrency,
        "questions in flight": questions, "model": model,
        "ack p50 ms": round(statistics.median(samples) * 1000, 1),
        "ack p99 ms": round(p99 * 1000, 1), "ack max ms": round(samples[-1] * 1000, 1),
        "acked 200": sum(status == 200 for _, status, _ in statuses + asks),
        "requests": len(statuses) + len(asks),
        "answered": sum(urlsplit(u).path in answered_at for u, _, _ in statuses + asks),
        "questions told their place in the queue": queued_told,
        "5 MB unsigned POST status": big_status,
        "5 MB unsigned POST ms": round(big_seconds * 1000, 1),
    }
    console.print(f"hardening: ack p99 {result['ack p99 ms']} ms over {len(samples)} status "
                  f"commands ({concurrency} at once) with {questions} questions in flight and "
                  f"a 5 MB unsigned POST ({big_status} in {result['5 MB unsigned POST ms']} "
                  f"ms); answered {result['answered']}/{result['requests']}")
    return result
