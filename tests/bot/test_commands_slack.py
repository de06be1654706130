"""Charts and the `list`, `plot` and `compare` sub-commands through real Slack plumbing: signed
slash commands to the bot's HTTP endpoint, answers through the response URL, and files
uploaded with `files_upload_v2` to the local Slack-compatible server."""

import json
import time

import pytest

from benchmarks.devslack import LocalSlack, post_signed, slash_command_body
from bot.config import Config, Secrets, Settings, SourceConfig
from bot.serve import Bot

SECRET = "test-signing-secret"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def settings_for(tmp_path, local):
    config = Config(poll_interval=3600.0, sources=[SourceConfig(path=str(tmp_path / "runs"))],
                    slack={"channel": "C0ALERTS", "host": "127.0.0.1", "port": 0},
                    outbox={"backoff_seconds": 0.01})
    secrets = Secrets(slack_bot_token="xoxb-test", slack_signing_secret=SECRET,
                      slack_api_url=local.api_url)
    return Settings(config=config, secrets=secrets, config_path=None,
                    db_path=str(tmp_path / "runwatch.db"))


def write_run(tmp_path, name, steps, *, config=None, nan_at=None, total=100):
    run = tmp_path / "runs" / name
    run.mkdir(parents=True, exist_ok=True)
    now = time.time()
    meta = {"total_steps": total, **({"config": config} if config else {})}
    lines = [json.dumps({"meta": meta})]
    for step in range(1, steps + 1):
        loss = "NaN" if step == nan_at else round(3.0 - 0.02 * step, 4)
        lines.append(f'{{"step": {step}, "loss": {loss}, "learning_rate": 0.001, '
                     f'"grad_norm": {1.0 + step % 3}, "time": {now - steps + step}}}')
        if step % 10 == 0:
            lines.append(json.dumps({"step": step, "eval_loss": 3.1 - 0.02 * step,
                                     "time": now - steps + step}))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "checkpoint-10").mkdir(exist_ok=True)
    return run


@pytest.fixture
def local():
    with LocalSlack() as server:
        yield server


class Commands:
    """Signed `/run …` commands to a running bot, each answered through its response URL."""

    def __init__(self, bot, local):
        self.url = f"http://127.0.0.1:{bot.http_port}/slack/events"
        self.local = local
        self.sent = 0

    def run(self, text, channel="C123"):
        body = slash_command_body(text=text, channel_id=channel,
                                  response_url=self.local.new_response_url())
        started = time.monotonic()
        status, _ = post_signed(self.url, body, SECRET)
        assert status == 200
        assert time.monotonic() - started < 3.0  # acknowledged before any drawing
        self.sent += 1
        return self.local.wait_for("response_url", count=self.sent, timeout=10)[-1].args


def uploaded_png(local, complete):
    [entry] = complete.args["files"]
    data = local.uploaded(entry["id"])
    assert data[:8] == PNG_SIGNATURE and len(data) > 10_000
    return entry


@pytest.mark.slow
def test_an_alerts_chart_arrives_in_its_thread(tmp_path, local):
    write_run(tmp_path, "exp1", 30, nan_at=30)
    with Bot(settings_for(tmp_path, local)).start(poll=False) as bot:
        bot.engine.poll()
        [alert] = local.wait_for("chat.postMessage")
        [get_url] = local.wait_for("files.getUploadURLExternal")
        [complete] = local.wait_for("files.completeUploadExternal")
        [row] = bot.store.query("SELECT kind, state FROM outbox")
    assert row == {"kind": "alert", "state": "sent"}  # a chart that went out leaves no row
    assert "exp1" in alert.args["text"] and alert.args["channel"] == "C0ALERTS"
    assert get_url.args["filename"].startswith("exp1-spike-step30-")
    assert get_url.args["filename"].endswith(".png")
    assert complete.args["channel_id"] == "C0ALERTS"
    assert complete.args["thread_ts"] == alert.response["ts"]  # in the alert's thread
    assert "spike on exp1" in complete.args["initial_comment"]
    entry = uploaded_png(local, complete)
    assert entry["title"] == "exp1 · attempt 1 · spike from step 30"
    # the upload comes after the alert, which it never delays
    methods = [c.method for c in local.calls if c.method != "auth.test"]
    assert methods.index("chat.postMessage") < methods.index("files.getUploadURLExternal")


@pytest.mark.slow
def test_a_chart_upload_that_fails_never_costs_the_alert_and_is_retried(tmp_path, local):
    write_run(tmp_path, "exp1", 30, nan_at=30)
    local.fail("files.getUploadURLExternal", times=1, status=503)
    with Bot(settings_for(tmp_path, local)).start(poll=False) as bot:
        bot.engine.poll()
        assert len(local.calls_to("chat.postMessage")) == 1
        assert bot.store.query("SELECT kind, state FROM outbox ORDER BY id") == [
            {"kind": "alert", "state": "sent"}, {"kind": "chart", "state": "pending"}]
        time.sleep(0.05)
        assert bot.engine.outbox.dispatch() == 1
        [complete] = local.wait_for("files.completeUploadExternal")
        assert complete.args["thread_ts"] == local.calls_to("chat.postMessage")[0].response["ts"]
    uploaded_png(local, complete)


@pytest.mark.slow
def test_plot_list_and_compare_through_signed_slash_commands(tmp_path, local):
    write_run(tmp_path, "exp1", 40, config={"optimizer": {"lr": 0.001}, "epochs": 3})
    write_run(tmp_path, "exp2", 30, config={"optimizer": {"lr": 0.003}, "epochs": 3})
    write_run(tmp_path, "exp3", 20, config={"optimizer": {"lr": 0.003}, "epochs": 5,
                                            "warmup": 100})
    with Bot(settings_for(tmp_path, local)).start(poll=False) as bot:
        bot.engine.poll()
        commands = Commands(bot, local)

        reply = commands.run("plot exp1 loss lr")
        assert reply["text"].startswith(":bar_chart: Chart of *exp1 · attempt 1* "
                                        "(train/loss, lr; up to step 40) follows.")
        assert reply["response_type"] == "ephemeral"
        [complete] = local.wait_for("files.completeUploadExternal")
        assert complete.args["channel_id"] == "C123"  # where the command was typed
        assert "thread_ts" not in complete.args
        assert uploaded_png(local, complete)["title"] == "exp1 · attempt 1"

        reply = commands.run("list")
        lines = reply["text"].splitlines()
        assert lines[0] == "Active runs: 3"
        assert [line.split("*")[1] for line in lines[1:4]] == ["exp1", "exp2", "exp3"]
        assert "step 40/100 (40%) · loss 2.2 · no open alerts · last point" in lines[1]

        reply = commands.run("compare exp1 exp2")
        assert reply["text"].startswith("exp1 vs exp2: 1 setting differs.")
        assert "`optimizer.lr`: 0.001 → 0.003" in reply["text"]
        assert "train loss at step 30: 2.4 vs 2.4" in reply["text"]
        assert "lowest eval loss: exp1 2.3 at step 40 (up to step 30: 2.5 at step 30); " \
               "exp2 2.5 at step 30" in reply["text"]
        completes = local.wait_for("files.completeUploadExternal", count=2)
        assert uploaded_png(local, completes[1])["title"] == "exp1 vs exp2"

        reply = commands.run("compare exp1 exp3")
        assert reply["text"].startswith("exp1 vs exp3: :warning: 3 settings differ — change "
                                        "one variable at a time")
        assert "`warmup`: only in the second run (100)" in reply["text"]
        local.wait_for("files.completeUploadExternal", count=3)

        for text, answer in [
                ("plot nosuchrun", "unknown run 'nosuchrun'; known runs: exp1, exp2, exp3"),
                ("plot exp1 bogus", "exp1 has no metric 'bogus'; its metrics: train/loss, "
                                    "eval/loss, lr, grad_norm"),
                ("compare exp1 exp1", "`/run compare` needs two different runs; got exp1 "
                                      "twice"),
                ("compare exp1 nosuchrun", "unknown run 'nosuchrun'; known runs: exp1, exp2, "
                                           "exp3")]:
            assert commands.run(text)["text"] == answer
        assert len(local.calls_to("files.completeUploadExternal")) == 3  # nothing more drawn


@pytest.mark.slow
def test_a_chart_the_bot_cannot_share_is_explained_in_one_line(tmp_path, local):
    write_run(tmp_path, "exp1", 20)
    local.fail("files.completeUploadExternal", times=1, status=200, error="not_in_channel")
    with Bot(settings_for(tmp_path, local)).start(poll=False) as bot:
        bot.engine.poll()
        commands = Commands(bot, local)
        commands.run("plot exp1", channel="C0OTHER")
        replies = local.wait_for("response_url", count=2)
        assert replies[1].args["text"] == ("The chart could not be uploaded (not_in_channel) — "
                                           "invite the bot to this channel "
                                           "(`/invite @runwatch`).")


@pytest.mark.slow
def test_alerts_silence_help_and_unknown_sub_commands_through_slack(tmp_path, local):
    write_run(tmp_path, "exp1", 40, nan_at=40)
    local.signing_secret = SECRET
    with Bot(settings_for(tmp_path, local)).start(poll=False) as bot:
        bot.engine.poll()
        url = f"http://127.0.0.1:{bot.http_port}/slack/events"

        def ask(text, count):
            body = slash_command_body(text=text, response_url=local.new_response_url())
            assert post_signed(url, body, SECRET)[0] == 200
            return local.wait_for("response_url", count=count, timeout=20)[-1].args

        assert "exp1" in ask("alerts", 1)["text"] and "spike" in ask("alerts", 2)["text"]
        silenced = ask("silence run=exp1 signal=spike 2h flaky eval", 3)["text"]
        assert "exp1" in silenced and "2h" in silenced.replace(" ", "")
        assert "flaky eval" in ask("silences", 4)["text"]
        refused = ask("silence 2h no matchers", 5)["text"]
        assert "matcher" in refused.lower()
        assert "/run rollback RUN" in ask("help", 6)["text"]
        unknown = ask("frobnicate exp1", 7)
        assert "Unknown sub-command `frobnicate`" in unknown["text"]
        assert "/run status RUN" in unknown["text"]


@pytest.mark.slow
def test_a_handler_error_shows_an_incident_id_never_a_trace(tmp_path, local, monkeypatch):
    import bot.commands

    write_run(tmp_path, "exp1", 20)
    local.signing_secret = SECRET

    def broken(*args, **kwargs):
        raise RuntimeError("database on fire")

    monkeypatch.setattr(bot.commands, "run_status", broken)
    with Bot(settings_for(tmp_path, local)).start(poll=False) as bot:
        bot.engine.poll()
        url = f"http://127.0.0.1:{bot.http_port}/slack/events"
        body = slash_command_body(text="status exp1", response_url=local.new_response_url())
        assert post_signed(url, body, SECRET)[0] == 200
        [reply] = local.wait_for("response_url", timeout=20)
    assert "Something went wrong (incident " in reply.args["text"]
    assert "database on fire" not in reply.args["text"] and "Traceback" not in reply.args["text"]
