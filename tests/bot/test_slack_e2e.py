"""The whole loop with real parts: a PyTorch training subprocess, the SQLite store, Bolt's
real request verification, and a local server that speaks the Slack Web API."""

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from benchmarks.devslack import (
    LocalSlack,
    signed_headers,
    slash_command_body,
    slash_command_payload,
)
from bot.config import Config, Secrets, Settings, SourceConfig
from bot.serve import Bot

ROOT = Path(__file__).resolve().parents[2]
SECRET = "test-signing-secret"


def settings_for(tmp_path, local, *, app_token=None, backoff=5.0, poll_interval=3600.0):
    config = Config(poll_interval=poll_interval,
                    sources=[SourceConfig(path=str(tmp_path / "runs"))],
                    slack={"channel": "C0ALERTS", "host": "127.0.0.1", "port": 0},
                    outbox={"backoff_seconds": backoff})
    secrets = Secrets(slack_bot_token="xoxb-test", slack_signing_secret=SECRET,
                      slack_app_token=app_token, slack_api_url=local.api_url)
    return Settings(config=config, secrets=secrets, config_path=None,
                    db_path=str(tmp_path / "runwatch.db"))


def write_run(tmp_path, name="exp1", steps=20):
    run = tmp_path / "runs" / name
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "metrics.jsonl", "w") as handle:
        handle.write(json.dumps({"meta": {"total_steps": 100}}) + "\n")
        for step in range(1, steps + 1):
            handle.write(json.dumps({"step": step, "loss": round(3.0 - 0.05 * step, 4),
                                     "learning_rate": 0.001, "time": time.time()}) + "\n")
    (run / "checkpoint-10").mkdir()
    return run


@pytest.fixture
def local():
    with LocalSlack() as server:
        yield server


def post(url, body, headers):
    request = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.slow
def test_signed_slash_command_is_acked_fast_and_answered_with_real_numbers(tmp_path, local):
    write_run(tmp_path)
    with Bot(settings_for(tmp_path, local)).start(poll=False) as bot:
        bot.engine.poll()
        url = f"http://127.0.0.1:{bot.http_port}/slack/events"
        body = slash_command_body(text="status exp1", response_url=local.new_response_url())
        started = time.monotonic()
        status, _ = post(url, body, signed_headers(body, SECRET))
        assert status == 200
        assert time.monotonic() - started < 3.0
        [reply] = local.wait_for("response_url")
        assert "step 20 of 100" in reply.args["text"]
        assert "train loss 2;" in reply.args["text"]  # 3.0 - 0.05 * 20 = 2.0
        assert reply.args["response_type"] == "ephemeral"

        body = slash_command_body(text="status nosuchrun", response_url=local.new_response_url())
        assert post(url, body, signed_headers(body, SECRET))[0] == 200
        replies = local.wait_for("response_url", count=2)
        assert replies[1].args["text"] == "unknown run 'nosuchrun'; known runs: exp1"

        forged = signed_headers(body, "not-the-secret")
        assert post(url, body, forged)[0] == 401
        stale = signed_headers(body, SECRET, timestamp=int(time.time()) - 6 * 60)
        assert post(url, body, stale)[0] == 401
        assert len(local.calls_to("response_url")) == 2


def trainer(run_dir, *args):
    cmd = [sys.executable, "-m", "bot.demo.trainer", "--run-dir", str(run_dir), "--steps", "120",
           "--checkpoint-every", "10", "--fault", "bad_batch", "--fault-step", "40", *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def spike_written_at(log, step):
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if record.get("step") == step and "loss" in record:
            return record["time"]
    raise AssertionError(f"no loss at step {step}")


@pytest.mark.slow
def test_a_watched_training_run_alerts_once_within_a_poll_and_resolves_once(tmp_path, local):
    """The bot runs as in production (APScheduler, 1 s polls) while a PyTorch process trains."""
    run_dir = tmp_path / "runs" / "demo"
    settings = settings_for(tmp_path, local, poll_interval=1.0)

    with Bot(settings).start():
        first = trainer(run_dir, "--stop-at", "45", "--step-delay", "0.05")
        [alert] = local.wait_for("chat.postMessage", timeout=60)
        assert first.wait(timeout=60) == 0
        time.sleep(2.5)  # two more polls: nothing else to say while the episode goes on
    assert len(local.calls_to("chat.postMessage")) == 1
    assert alert.args["channel"] == "C0ALERTS"
    assert "demo: train/loss jumped to" in alert.args["text"]
    assert "at step 40" in alert.args["text"]
    assert "Roll back to step 30" in json.dumps(alert.args["blocks"])
    written = spike_written_at(run_dir / "metrics.jsonl", 40)
    # within one poll: the next 1 s poll takes it in and wakes the sender (2 s of slack for
    # a loaded machine; the median is measured by `runwatch bench latency`)
    assert alert.at - written < 1.0 + 2.0

    with Bot(settings).start():  # a restart posts nothing again
        time.sleep(2.5)
    assert len(local.calls_to("chat.postMessage")) == 1

    with Bot(settings).start():
        second = trainer(run_dir, "--resume-from", str(run_dir / "checkpoint-45"))
        posts = local.wait_for("chat.postMessage", count=2, timeout=60)
        assert second.wait(timeout=60) == 0
        time.sleep(2.5)
    assert len(local.calls_to("chat.postMessage")) == 2
    assert posts[1].args["thread_ts"] == alert.response["ts"]
    assert posts[1].args["text"].startswith(":white_check_mark: Resolved at step")


@pytest.mark.slow
def test_outbox_retries_a_failed_send_after_a_restart(tmp_path, local):
    run = write_run(tmp_path)
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 21, "loss": NaN}\n')
    settings = settings_for(tmp_path, local, backoff=0.01)
    local.fail("chat.postMessage", times=1, status=500)
    with Bot(settings).start(poll=False) as bot:
        assert bot.engine.poll().sent == 0
        [row] = bot.store.query("SELECT * FROM outbox")
        assert (row["state"], row["attempts"]) == ("pending", 1)
        assert "500" in row["last_error"]
    time.sleep(0.05)
    with Bot(settings).start(poll=False) as bot:
        assert bot.engine.outbox.dispatch() == 1
        [row] = bot.store.query("SELECT * FROM outbox")
        assert row["state"] == "sent"
    ok = [c for c in local.calls_to("chat.postMessage") if not c.failed]
    assert len(ok) == 1 and "NaN" in ok[0].args["text"]


@pytest.mark.slow
def test_socket_mode_answers_a_slash_command(tmp_path):
    write_run(tmp_path)
    with LocalSlack(socket_mode=True) as local:
        settings = settings_for(tmp_path, local, app_token="xapp-test")
        with Bot(settings).start(poll=False) as bot:
            assert bot.mode == "socket"
            bot.engine.poll()
            local.wait_for_connection()
            payload = slash_command_payload(text="status exp1",
                                            response_url=local.new_response_url())
            envelope = local.send_envelope("slash_commands", payload)
            local.wait_for_ack(envelope)
            [reply] = local.wait_for("response_url")
            assert "step 20 of 100" in reply.args["text"]
        assert local.calls_to("apps.connections.open")


@pytest.mark.slow
def test_a_rate_limited_alert_is_sent_after_retry_after(tmp_path, local):
    run = write_run(tmp_path)
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 21, "loss": NaN}\n')
    local.fail("chat.postMessage", times=1, status=429, retry_after=1)
    with Bot(settings_for(tmp_path, local)).start(poll=False) as bot:
        started = time.monotonic()
        assert bot.engine.poll().sent >= 1  # slack_sdk's handler waited and sent it again
        waited = time.monotonic() - started
    calls = local.calls_to("chat.postMessage")
    assert [c.failed for c in calls[:2]] == [True, False]
    assert calls[1].at - calls[0].at >= 0.9 and waited >= 0.9  # it honoured Retry-After
