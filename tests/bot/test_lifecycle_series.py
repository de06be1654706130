"""Behaviour of the whole alert lifecycle, written like Prometheus rule tests: a compact
series goes through the real pieces (a JSONL log, the engine, the analyzers, SQLite, the
lifecycle and the outbox) ``every`` steps per poll, one step every ``seconds`` of injected
time, and the notifications are checked at the step of the poll that sent them."""

import json

from benchmarks.lifecycle_series import expand_series
from bot.alerting.notify import SendResult
from bot.alerting.silences import acknowledge, silence
from bot.config import AlertingConfig, Config, Secrets, Settings, SourceConfig
from bot.engine import Engine

TAGS = {"train/loss": "loss", "grad_norm": "grad_norm"}


class Slack:
    """A transport that notes each post and edit with the step of the poll that sent it."""

    def __init__(self):
        self.step = 0
        self.sent = []
        self.texts = []

    def post(self, channel, message, thread_ts=None):
        self.sent.append((self.step, message.kind))
        self.texts.append(message.text)
        return SendResult(True, channel=channel, ts=f"1.{len(self.sent)}")

    def update(self, channel, ts, message):
        self.sent.append((self.step, "update"))
        self.texts.append(message.text)
        return SendResult(True, channel=channel, ts=ts)


def replay(tmp_path, series, *, every=5, seconds=1.0, alerting=None, at=None):
    """Feed ``series`` ({tag: notation}) to a watched run; ``at`` maps a step to a callable
    run (with the engine and the time) before the poll that reads that step."""
    values = {tag: expand_series(text) for tag, text in series.items()}
    steps = max(len(v) for v in values.values())
    config = Config(sources=[SourceConfig(path=str(tmp_path / "runs"))],
                    alerting=alerting or AlertingConfig())
    now = [0.0]
    slack = Slack()
    engine = Engine(Settings(config=config, secrets=Secrets(), config_path=None,
                             db_path=str(tmp_path / "rw.db")),
                    notifier=slack, clock=lambda: now[0])
    engine.poll()  # runwatch was watching before the run began: its alerts are news
    log = tmp_path / "runs" / "exp1.jsonl"
    log.parent.mkdir(exist_ok=True)
    hooks = dict(at or {})
    for first in range(1, steps + 1, every):
        last = min(first + every - 1, steps)
        with open(log, "a") as handle:
            for step in range(first, last + 1):
                record = {TAGS[tag]: v[step - 1] for tag, v in values.items()
                          if step <= len(v) and v[step - 1] is not None}
                handle.write(json.dumps({"step": step, **record}) + "\n")
        now[0] = last * seconds
        slack.step = last
        for step in sorted(s for s in hooks if s <= last):
            hooks.pop(step)(engine, now[0])
        engine.poll()
    return slack


def test_a_nan_is_posted_at_once_and_resolved_in_its_thread(tmp_path):
    slack = replay(tmp_path, {"train/loss": "2.4-0.01x40 NaN 2-0.01x20"})
    assert slack.sent == [(45, "alert"), (50, "resolved"), (50, "update")]
    assert "became NaN at step 42" in slack.texts[0]
    assert slack.texts[2].startswith("[resolved]")


def test_a_long_firing_critical_escalates_then_repeats(tmp_path):
    alerting = AlertingConfig(repeat_interval=1800, escalate_after=1200, oncall="S0ONCALL")
    slack = replay(tmp_path, {"train/loss": "2.1-0.01x200 9.5 2.0x50"}, every=10, seconds=60,
                   alerting=alerting)
    assert slack.sent == [(210, "alert"), (230, "escalate"), (240, "repeat")]
    assert "jumped to 9.50 at step 202" in slack.texts[0]
    assert slack.texts[1].startswith(":sos: <!subteam^S0ONCALL>")


def test_a_warning_does_not_nag(tmp_path):
    alerting = AlertingConfig(repeat_interval=60, escalate_after=60, oncall="S0ONCALL")
    slack = replay(tmp_path, {"train/loss": "2.4-0.01x40 3.5 3.5x30"}, seconds=60,
                   alerting=alerting)
    assert slack.sent == [(45, "alert")]
    assert slack.texts[0].startswith("[warning]")


def test_acknowledging_stops_the_repeat_and_the_escalation(tmp_path):
    alerting = AlertingConfig(repeat_interval=1800, escalate_after=1200, oncall="S0ONCALL")

    def ack(engine, now):
        [alert] = engine.store.query("SELECT fingerprint FROM alerts")
        acknowledge(engine.store, alert["fingerprint"], "U0ALICE", now=now, alerting=alerting)

    slack = replay(tmp_path, {"train/loss": "2.1-0.01x200 9.5 2.0x50"}, every=10, seconds=60,
                   alerting=alerting, at={215: ack})
    assert slack.sent == [(210, "alert"), (220, "update")]
    assert "Acknowledged" not in slack.texts[0]


def test_a_silenced_alert_is_posted_when_its_silence_ends_if_still_firing(tmp_path):
    def mute(engine, now):
        silence(engine.store, ["run=exp1", "signal=spike"], created_by="U0BOB",
                reason="known bad shard", duration=1200, now=now)

    slack = replay(tmp_path, {"train/loss": "2.1-0.01x200 9.5 2.0x50"}, every=10, seconds=60,
                   at={205: mute})
    assert slack.sent == [(230, "alert")]  # the silence ended at step 225


def test_a_second_episode_within_the_group_interval_joins_the_message(tmp_path):
    slack = replay(tmp_path, {"train/loss": "2.4-0.01x40 NaN 2-0.01x10 NaN 1.9-0.01x20"})
    # the second NaN is drawn into the message and, an edit being silent, said in its thread
    assert slack.sent == [(45, "alert"), (50, "resolved"), (50, "update"), (55, "update"),
                          (55, "joined"), (60, "resolved"), (60, "update")]
    assert [kind for _, kind in slack.sent].count("alert") == 1
    assert "2 alerts, 1 firing" not in slack.texts[-1] and "2 alerts" in slack.texts[-1]


def test_after_the_group_interval_a_second_episode_is_a_new_post(tmp_path):
    slack = replay(tmp_path, {"train/loss": "2.4-0.01x40 NaN 2-0.01x10 NaN 1.9-0.01x20"},
                   seconds=60)
    assert slack.sent == [(45, "alert"), (50, "resolved"), (50, "update"), (55, "alert"),
                          (60, "resolved"), (60, "update")]


def test_keep_firing_holds_each_resolution(tmp_path):
    alerting = AlertingConfig(signals={"spike": {"keep_firing_steps": 10}})
    slack = replay(tmp_path, {"train/loss": "2.4-0.01x40 NaN 2-0.01x10 NaN 1.9-0.01x20"},
                   alerting=alerting)
    assert slack.sent == [(45, "alert"), (55, "update"), (55, "joined"), (60, "resolved"),
                          (60, "update"), (70, "resolved"), (70, "update")]


def test_pending_evaluations_delay_firing_by_a_poll(tmp_path):
    alerting = AlertingConfig(signals={"spike": {"pending_evaluations": 1}})
    slack = replay(tmp_path, {"train/loss": "2.1-0.01x200 9.5 2.0x50"}, every=10,
                   alerting=alerting)
    assert slack.sent == [(220, "alert")]


def test_a_blip_shorter_than_the_pending_period_is_never_posted(tmp_path):
    alerting = AlertingConfig(signals={"spike": {"pending_evaluations": 1}})
    slack = replay(tmp_path, {"train/loss": "2.4-0.01x40 NaN 2-0.01x20"}, alerting=alerting)
    assert slack.sent == []
