"""Rollback and stop end to end with real parts: a PyTorch training process, the bot with
APScheduler polls, Bolt's request verification and signed Slack interactions against the
local Slack Web API server."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.devslack import LocalSlack, block_actions_body, post_signed
from bot.config import ActionsConfig, Config, Secrets, Settings, SourceConfig
from bot.serve import Bot
from bot.store import Store
from connectors.training.launcher import launch_dir, read_state

ROOT = Path(__file__).resolve().parents[2]
SECRET = "test-signing-secret"
CHANNEL = "C0ALERTS"
TRAIN = [sys.executable, "-m", "bot.demo.trainer", "--steps", "120", "--checkpoint-every", "10",
         "--fault", "bad_batch", "--fault-step", "40", "--step-delay", "0.08"]


def settings_for(tmp_path, local, **actions):
    actions.setdefault("permissions", {"rollback": {"users": ["U1"]},
                                       "stop": {"users": ["U1"]}})
    config = Config(poll_interval=0.5, sources=[SourceConfig(path=str(tmp_path / "runs"))],
                    slack={"channel": CHANNEL, "host": "127.0.0.1", "port": 0},
                    actions=ActionsConfig(**actions))
    secrets = Secrets(slack_bot_token="xoxb-test", slack_signing_secret=SECRET,
                      slack_api_url=local.api_url)
    return Settings(config=config, secrets=secrets, config_path=None,
                    db_path=str(tmp_path / "runwatch.db"))


def click(bot, local, action_id, value, *, user="U1", message_ts=None, thread_ts=None):
    """A signed ``block_actions`` click, acknowledged within Slack's 3 seconds."""
    body = block_actions_body(action_id, value, user_id=user, channel_id=CHANNEL,
                              message_ts=message_ts, thread_ts=thread_ts,
                              response_url=local.new_response_url())
    started = time.monotonic()
    assert post_signed(f"http://127.0.0.1:{bot.http_port}/slack/events", body, SECRET)[0] == 200
    assert time.monotonic() - started < 3.0


def button(message, action_id):
    for block in message.args.get("blocks") or []:
        for element in block.get("elements", []):
            if element.get("action_id") == action_id:
                return element
    raise AssertionError(f"no {action_id} button in {message.args.get('text')!r}")


def wait_post(local, predicate, timeout=60.0):
    return local.wait_for_post(predicate, timeout)


def audit(tmp_path, run):
    store = Store(str(tmp_path / "runwatch.db"))
    try:
        return [(r["status"], r["actor"]) for r in
                store.query("SELECT * FROM actions WHERE run = ? ORDER BY id", (run,))]
    finally:
        store.close()


def attempt_losses(tmp_path, run, attempt):
    store = Store(str(tmp_path / "runwatch.db"))
    try:
        return [r["value"] for r in store.query(
            "SELECT value FROM metrics WHERE run = ? AND attempt = ? AND tag = 'train/loss'",
            (run, attempt))]
    finally:
        store.close()


def roll_back_from_the_alert(bot, local, run):
    """Click Roll back on the spike alert and confirm it; return (alert, request id)."""
    alert = wait_post(local, lambda c: f"{run}: train/loss jumped" in c.args.get("text", ""))
    rollback = button(alert, "rw_rollback")
    assert rollback["text"]["text"] == "Roll back to checkpoint-30"
    click(bot, local, "rw_rollback", rollback["value"], message_ts=alert.response["ts"])
    ask = wait_post(local, lambda c: "asks to roll back" in c.args.get("text", ""))
    assert ask.args["thread_ts"] == alert.response["ts"]
    confirm = button(ask, "rw_confirm")
    assert "Requested by <@U1>" in confirm["confirm"]["text"]["text"]
    assert "checkpoint-30" in confirm["confirm"]["text"]["text"]
    click(bot, local, "rw_confirm", confirm["value"], message_ts=ask.response["ts"],
          thread_ts=alert.response["ts"])
    return alert, confirm["value"], ask


@pytest.mark.slow
def test_process_backend_rolls_back_from_a_slack_click_and_the_run_recovers(tmp_path):
    run_dir = tmp_path / "runs" / "demo"
    with LocalSlack(signing_secret=SECRET) as local, \
            Bot(settings_for(tmp_path, local)).start() as bot:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "launch", "--run", "demo", "--run-dir",
             str(run_dir), "--resume-args", "--resume-from {checkpoint}",
             "--skip-args", "--skip-batches {skip_first}-{skip_last}",
             "--lr-args", "--lr-scale {lr_scale}", "--grace", "10", "--",
             *TRAIN, "--run-dir", str(run_dir)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            alert, request_id, ask = roll_back_from_the_alert(bot, local, "demo")
            done = wait_post(local, lambda c: "Rollback of *demo* done" in c.args["text"])
            assert done.args["thread_ts"] == alert.response["ts"]
            assert "relaunched as pid" in done.args["text"]
            assert local.calls_to("chat.update")[0].args["ts"] == ask.response["ts"]

            # A replayed confirmation (a retry, a double click) runs nothing twice.
            click(bot, local, "rw_confirm", request_id, message_ts=ask.response["ts"],
                  thread_ts=alert.response["ts"])
            wait_post(local, lambda c: "it runs only once" in c.args["text"])
            # Someone outside the allow-list asks for a stop: refused, in the thread.
            click(bot, local, "rw_stop", button(alert, "rw_stop")["value"], user="U9",
                  message_ts=alert.response["ts"])
            wait_post(local, lambda c: "not allowed to stop" in c.args["text"])

            assert launcher.wait(timeout=90) == 0  # the relaunched training finished
            recovered = wait_post(local, lambda c: "Recovered: demo passed step" in
                                  c.args["text"])
            resolved = wait_post(local, lambda c: c.args["text"].startswith(
                ":white_check_mark: Resolved") and "spike on demo" in c.args["text"])
        finally:
            if launcher.poll() is None:
                launcher.kill()
    assert recovered.args["thread_ts"] == resolved.args["thread_ts"] == alert.response["ts"]
    output = (launch_dir(run_dir) / "output.log").read_text()
    assert output.count("--- runwatch launch") == 2  # started once, relaunched once
    assert "--resume-from" in output and "--skip-batches 31-" in output
    assert read_state(run_dir)["finished"]
    # The resumed attempt skipped the bad batches: its loss stays far below the spike.
    spike = max(attempt_losses(tmp_path, "demo", 1))
    resumed = attempt_losses(tmp_path, "demo", 2)
    assert len(resumed) > 50 and max(resumed) < spike / 3
    # the denied stop is its own row, recorded whenever U9 clicked (before or after the
    # recovery follow-up): the rollback's own rows are in order
    rows = audit(tmp_path, "demo")
    assert ("denied", "U9") in rows
    assert [r for r in rows if r != ("denied", "U9")] == [
        ("requested", "U1"), ("confirmed", "U1"), ("running", "U1"), ("done", "U1"),
        ("recovered", "runwatch")]


@pytest.mark.slow
def test_control_backend_rolls_back_a_plain_pytorch_loop_in_process(tmp_path):
    """No launcher: the training loop itself reads the request between steps (RunLogger)."""
    run_dir = tmp_path / "runs" / "demo"
    with LocalSlack(signing_secret=SECRET) as local, \
            Bot(settings_for(tmp_path, local)).start() as bot:
        trainer = subprocess.Popen([*TRAIN, "--run-dir", str(run_dir)], cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            alert, request_id, _ = roll_back_from_the_alert(bot, local, "demo")
            done = wait_post(local, lambda c: "Rollback of *demo* done" in c.args["text"])
            assert "rolled back in-process to step 30" in done.args["text"]
            assert "skipping batches 31–" in done.args["text"]
            assert trainer.wait(timeout=90) == 0
            wait_post(local, lambda c: "Recovered: demo passed step" in c.args["text"])
        finally:
            if trainer.poll() is None:
                trainer.kill()
    resumed = attempt_losses(tmp_path, "demo", 2)
    assert len(resumed) > 50 and max(resumed) < max(attempt_losses(tmp_path, "demo", 1)) / 3
    assert [s for s, _ in audit(tmp_path, "demo")] == ["requested", "confirmed", "running",
                                                       "done", "recovered"]


@pytest.mark.slow
def test_acknowledge_and_silence_buttons_record_who_clicked(tmp_path):
    run_dir = tmp_path / "runs" / "exp1"
    run_dir.mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 2.0 + 1.0 / s}) for s in range(1, 30)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 30, "loss": NaN}\n')
    with LocalSlack(signing_secret=SECRET) as local, \
            Bot(settings_for(tmp_path, local)).start(poll=False) as bot:
        bot.engine.poll()
        alert = wait_post(local, lambda c: "exp1" in c.args.get("text", ""))
        acknowledge = button(alert, "alert_acknowledge")
        click(bot, local, "alert_acknowledge", acknowledge["value"], user="U5",
              message_ts=alert.response["ts"])
        click(bot, local, "alert_silence", button(alert, "alert_silence")["value"], user="U6",
              message_ts=alert.response["ts"])
        click(bot, local, "alert_snooze_4h", button(alert, "alert_snooze_4h")["value"],
              user="U7", message_ts=alert.response["ts"])
        click(bot, local, "alert_acknowledge", "nosuchalert", user="U5",
              message_ts=alert.response["ts"])
        wait_post(local, lambda c: "no alert 'nosuchalert'" in c.args.get("text", ""))
        deadline = time.monotonic() + 10  # each click is handled on its own thread after ack
        while time.monotonic() < deadline and (
                len(bot.store.query("SELECT * FROM silences")) < 2
                or not bot.store.query("SELECT * FROM acknowledgements")):
            time.sleep(0.05)
        acks = bot.store.query("SELECT * FROM acknowledgements")
        silences = bot.store.query("SELECT * FROM silences ORDER BY created_by")
    assert [(a["fingerprint"], a["user"]) for a in acks] == [(acknowledge["value"], "U5")]
    assert [s["created_by"] for s in silences] == ["U6", "U7"]
    assert "exp1" in silences[0]["matchers"]
    lengths = [s["ends_at"] - s["starts_at"] for s in silences]
    assert lengths == [pytest.approx(24 * 3600), pytest.approx(4 * 3600)]


HF_TRAIN = '''
import sys, time
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from connectors.training.hf_callback import RunwatchCallback, train

VOCAB, SEQ = 64, 16

class Tokens(Dataset):
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        t = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(i % 8))
        return {"input_ids": t, "labels": t}

class SpikyGPT2(GPT2LMHeadModel):
    """A loss ten times too large while ``bad`` is set (the batches of steps 40-42)."""
    bad = False
    def forward(self, input_ids=None, labels=None, **kwargs):
        out = super().forward(input_ids=input_ids, labels=labels, **kwargs)
        if self.training and self.bad:
            out.loss = out.loss * 10
        return out

class BadBatches(TrainerCallback):
    """Marks the data positions of steps 40-42 as bad, as a corrupted shard would be."""
    def on_step_begin(self, args, state, control, model=None, **kwargs):
        model.bad = 40 <= state.global_step + 1 <= 42
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.1)

torch.manual_seed(0)
config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=SEQ,
                    bos_token_id=0, eos_token_id=0)
args = TrainingArguments(output_dir=sys.argv[1], max_steps=90, logging_steps=1, save_steps=10,
                         per_device_train_batch_size=8, learning_rate=3e-3, report_to=[],
                         use_cpu=True, disable_tqdm=True, lr_scheduler_type="constant")
trainer = Trainer(model=SpikyGPT2(config), args=args, train_dataset=Tokens(),
                  callbacks=[BadBatches(), RunwatchCallback()])
train(trainer)
'''


@pytest.mark.slow
def test_control_backend_rolls_back_an_hf_trainer_in_process(tmp_path):
    """The same click, obeyed by HF's Trainer through runwatch's callback."""
    run_dir = tmp_path / "runs" / "hf"
    script = tmp_path / "train_hf.py"
    script.write_text(HF_TRAIN)
    with LocalSlack(signing_secret=SECRET) as local, \
            Bot(settings_for(tmp_path, local)).start() as bot:
        trainer = subprocess.Popen([sys.executable, str(script), str(run_dir)], cwd=ROOT,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            alert, _, _ = roll_back_from_the_alert(bot, local, "hf")
            done = wait_post(local, lambda c: "Rollback of *hf* done" in c.args["text"])
            assert "rolled back in-process to checkpoint-30" in done.args["text"]
            assert trainer.wait(timeout=120) == 0, trainer.stderr.read()[-2000:]
            wait_post(local, lambda c: "Recovered: hf passed step" in c.args["text"])
        finally:
            if trainer.poll() is None:
                trainer.kill()
    resumed = attempt_losses(tmp_path, "hf", 2)
    assert resumed and max(resumed) < max(attempt_losses(tmp_path, "hf", 1)) / 3
    assert [s for s, _ in audit(tmp_path, "hf")] == ["requested", "confirmed", "running",
                                                     "done", "recovered"]
