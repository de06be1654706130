"""The daily digest: built from a real store, grouped by the three kinds of trouble, posted by
the real APScheduler job to the local Slack server, and shown on demand by `/run digest`."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from benchmarks.devslack import LocalSlack
from bot.commands import handle_run_command
from bot.config import Config, Secrets, Settings, SourceConfig
from bot.serve import Bot
from bot.services.digest import build_digest, kind_of


def _write_runs(root) -> None:
    now = time.time()
    spiky = [json.dumps({"meta": {"total_steps": 100,
                                  "changes": [{"step": 20, "at": now, "attempt": 2,
                                               "changes": {"config.lr": [3e-4, 6e-4]}}]}})]
    for step in range(1, 61):
        loss = 40.0 if step == 60 else 2.0 + 1.0 / step
        spiky.append(json.dumps({"step": step, "loss": loss, "time": now - 60 + step}))
        if step % 10 == 0:
            spiky.append(json.dumps({"step": step, "eval_loss": 2.5 - 0.01 * step,
                                     "time": now - 60 + step}))
    (root / "spiky").mkdir(parents=True)
    (root / "spiky" / "metrics.jsonl").write_text("\n".join(spiky) + "\n")
    quiet = [json.dumps({"meta": {"total_steps": 1000}})]
    quiet += [json.dumps({"step": s, "loss": 2.0, "time": now - 7200 + s}) for s in range(1, 30)]
    (root / "quiet").mkdir()
    (root / "quiet" / "metrics.jsonl").write_text("\n".join(quiet) + "\n")


def _settings(tmp_path, api_url: str, cron: str | None) -> Settings:
    config = Config(poll_interval=3600.0, sources=[SourceConfig(path=str(tmp_path / "runs"))],
                    slack={"channel": "C0DIGEST", "host": "127.0.0.1", "port": 0,
                           "digest_cron": cron})
    return Settings(config=config, secrets=Secrets(slack_bot_token="xoxb-t",
                                                   slack_signing_secret="s",
                                                   slack_api_url=api_url),
                    config_path=None, db_path=str(tmp_path / "rw.db"))


@pytest.mark.slow
def test_the_digest_is_posted_by_its_cron_job_to_the_channel(tmp_path):
    _write_runs(tmp_path / "runs")
    with LocalSlack() as local:
        bot = Bot(_settings(tmp_path, local.api_url, "0 9 * * *")).start()
        try:
            bot.engine.poll()
            job = bot.scheduler.get_job("digest")
            assert (job.next_run_time.hour, job.next_run_time.minute) == (9, 0)
            job.modify(next_run_time=datetime.now(job.next_run_time.tzinfo))  # 09:00 is now
            post = local.wait_for_post(lambda c: "runwatch digest" in (c.args.get("text") or ""),
                                       timeout=30)
        finally:
            bot.stop()
    assert post.args["channel"] == "C0DIGEST"
    text = post.args["text"]
    assert "2 started" in text and "still open" in text
    assert "*not learning well* (1)" in text and "spiky" in text  # the spike
    assert "*keeps stopping* (1)" in text and "quiet: no new step" in text
    assert "spiky at step 20: lr 0.0003 → 0.0006" in text
    assert "*Look at first*: spiky" in text
    blocks = json.loads(post.args["blocks"]) if isinstance(post.args["blocks"], str) \
        else post.args["blocks"]
    assert blocks[0]["type"] == "header"


def test_digest_on_demand_and_the_kinds(tmp_path):
    _write_runs(tmp_path / "runs")
    settings = _settings(tmp_path, "http://127.0.0.1:9/api/", None)
    from bot.engine import Engine

    engine = Engine(settings)
    engine.poll()
    reply = handle_run_command("digest", engine.store)
    assert reply.kind == "digest" and "*slow* (0)" in reply.text
    digest = build_digest(engine.store, now=time.time() + 3 * 86400)  # three days later
    assert digest.started == [] and digest.changed == []
    assert [kind_of(s) for s in ("memory", "throughput_drop", "spike", "no_such_signal")] == [
        "keeps stopping", "slow", "not learning well", "not learning well"]


def test_a_crontab_that_does_not_parse_is_a_config_error():
    with pytest.raises(ValueError, match="digest_cron 'at nine' is not a crontab"):
        Config(slack={"digest_cron": "at nine"})
