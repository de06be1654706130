"""The lifecycle wired to the store, the outbox, the services and Slack: real SQLite files,
the local Slack Web API server, restarts."""

import json

import pytest
from slack_sdk import WebClient

import bot.store as store_module
from analyzers.finding import Finding, Fix
from benchmarks.devslack import LocalSlack
from bot.alerting.lifecycle import LifecycleError
from bot.alerting.notify import SendResult, SlackNotifier
from bot.alerting.outbox import Outbox
from bot.alerting.pipeline import UnknownAlert, reconcile, tick
from bot.alerting.silences import (
    acknowledge,
    active_alerts,
    alerts_in_message,
    expire_silence,
    list_silences,
    silence,
    silence_alert,
)
from bot.commands import handle_run_command
from bot.config import AlertingConfig, ConfigError, parse_config
from bot.store import Store

SIGNALS = {"spike", "plateau", "stalled", "throughput_drop", "grad_norm"}


def finding(signal="spike", onset=40, severity="critical", state="firing", run="exp1",
            resolved_step=None, peak=9.5):
    return Finding(run=run, signal=signal, severity=severity, metric="train/loss",
                   onset_step=onset, detected_step=onset, summary=f"{signal} at step {onset}",
                   evidence={"peak": peak}, fixes=[Fix("Roll back", "000 §3.2", "rollback")],
                   kind="not_learning", source="000 §3.2", state=state,
                   resolved_step=resolved_step)


class Recorder:
    def __init__(self):
        self.calls = []

    def post(self, channel, message, thread_ts=None):
        self.calls.append(("post", channel, message.kind, thread_ts, message.text,
                           json.dumps(message.blocks)))
        return SendResult(True, channel=channel, ts=f"5.{len(self.calls)}")

    def update(self, channel, ts, message):
        self.calls.append(("update", channel, "alert", ts, message.text,
                           json.dumps(message.blocks)))
        return SendResult(True, channel=channel, ts=ts)


def pipeline(tmp_path, alerting=None, *, store=None):
    """The pipeline on a SQLite file in ``tmp_path``, or on ``store`` (either backend)."""
    store = store or Store(str(tmp_path / "rw.db"))
    recorder = Recorder()
    now = [0.0]
    outbox = Outbox(store, recorder, clock=lambda: now[0])
    alerting = alerting or AlertingConfig()

    def poll(findings, at, run="exp1"):
        now[0] = at
        reconcile(store, run, 1, findings, signals=SIGNALS, channel="#alerts", now=at,
                  alerting=alerting)
        tick(store, now=at, alerting=alerting)
        outbox.dispatch()

    return store, recorder, poll


# -- inhibition and routing through the store ------------------------------------------------

def test_a_stalled_run_mutes_the_alerts_it_explains(open_store):  # on SQLite and PostgreSQL
    store, slack, poll = pipeline(None, store=open_store())
    poll([finding("stalled", 90, "warning"), finding("plateau", 80, "warning"),
          finding("throughput_drop", 85, "warning")], at=0)
    [post] = slack.calls
    assert "stalled at step 90" in post[4] and "plateau" not in post[4]
    assert {a["signal"]: a["muted"] for a in active_alerts(store)} == {
        "stalled": None, "plateau": "inhibited by stalled (step 90)",
        "throughput_drop": "inhibited by stalled (step 90)"}


def test_an_alert_posted_before_its_explanation_is_redrawn_as_inhibited(tmp_path):
    store, slack, poll = pipeline(tmp_path)
    poll([finding("plateau", 80, "warning")], at=0)
    poll([finding("plateau", 80, "warning"), finding("stalled", 90, "warning")], at=60)
    assert [c[0] for c in slack.calls] == ["post", "update"]
    assert "stalled" in slack.calls[1][4]
    assert "inhibited by stalled" in json.dumps(store.query("SELECT muted FROM alerts"))


def test_inhibition_rules_come_from_config(tmp_path):
    alerting = AlertingConfig(inhibit=[])  # no rules: nothing is muted
    store, slack, poll = pipeline(tmp_path, alerting)
    poll([finding("stalled", 90, "warning"), finding("plateau", 80, "warning")], at=0)
    assert all(a["muted"] is None for a in active_alerts(store))


def test_severity_routes_to_a_channel_and_groups_per_channel(tmp_path):
    alerting = AlertingConfig(routes=[{"channel": "#oncall", "severity": ["critical"]}])
    store, slack, poll = pipeline(tmp_path, alerting)
    poll([finding("spike", 40, "critical"), finding("plateau", 30, "warning")], at=0)
    assert sorted((c[1], c[4].split(":")[0]) for c in slack.calls) == [
        ("#alerts", "[warning] exp1"), ("#oncall", "[critical] exp1")]


def test_a_project_routes_to_its_team_channel(tmp_path):
    alerting = AlertingConfig(routes=[{"channel": "#nlp", "project": "nlp"}])
    store, slack, poll = pipeline(tmp_path, alerting)
    with store.transaction() as db:
        db["runs"].insert({"name": "exp1", "attempt": 1, "meta": json.dumps({"project": "nlp"})})
    poll([finding()], at=0)
    assert slack.calls[0][1] == "#nlp"


# -- services ----------------------------------------------------------------------------------

def test_silence_list_and_expire(open_store):  # on SQLite and PostgreSQL
    store, slack, poll = pipeline(None, store=open_store())
    created = silence(store, ["run=exp1", "signal=plateau"], created_by="U0BOB",
                      reason="eval suite flaky", duration=3600, now=0.0)
    assert [s.id for s in list_silences(store, now=10.0)] == [created.id]
    poll([finding("plateau", 80, "warning")], at=10)
    assert slack.calls == []
    expire_silence(store, created.id, user="U0BOB", now=20.0)
    assert list_silences(store, now=30.0) == []
    assert [s.id for s in list_silences(store, now=30.0, include_expired=True)] == [created.id]
    poll([finding("plateau", 80, "warning")], at=30)
    assert [c[0] for c in slack.calls] == ["post"]
    with pytest.raises(LifecycleError, match="already ended"):
        expire_silence(store, created.id, user="U0BOB", now=40.0)
    with pytest.raises(LifecycleError, match="at least one matcher"):
        silence(store, ["run=~.*"], created_by="U0BOB", reason="all", now=0.0)


def test_the_silence_button_mutes_and_redraws_at_once(tmp_path):
    alerting = AlertingConfig()
    store, slack, poll = pipeline(tmp_path, alerting)
    poll([finding()], at=0)
    [alert] = active_alerts(store)
    made = silence_alert(store, alert["fingerprint"], created_by="U0BOB", now=5.0,
                         alerting=alerting)
    assert [str(m) for m in made.matchers] == ["run=exp1", "signal=spike"]
    poll([finding()], at=10)
    assert [c[0] for c in slack.calls] == ["post", "update"]
    assert store.query("SELECT muted FROM alerts")[0]["muted"].startswith("silenced by <@U0BOB>")


def test_acknowledge_records_who_and_accepts_a_prefix(open_store):  # on SQLite and PostgreSQL
    store, slack, poll = pipeline(None, store=open_store())
    poll([finding()], at=0)
    fp = active_alerts(store)[0]["fingerprint"]
    assert acknowledge(store, fp[:8], "U0ALICE", now=5.0)["acked_by"] == "U0ALICE"
    assert active_alerts(store)[0]["acked_by"] == "U0ALICE"
    poll([finding()], at=10)
    assert slack.calls[-1][0] == "update" and "Acknowledged by <@U0ALICE>" in slack.calls[-1][5]
    assert "alert_acknowledge" in slack.calls[0][5] and "alert_acknowledge" not in \
        slack.calls[-1][5]  # no button once acknowledged
    assert [a["fingerprint"] for a in alerts_in_message(store, "#alerts", "5.1")] == [fp]
    with pytest.raises(UnknownAlert, match="no alert"):
        acknowledge(store, "nope", "U0ALICE")


def test_run_commands_for_alerts_and_silences(open_store):  # on SQLite and PostgreSQL
    store, slack, poll = pipeline(None, store=open_store())
    poll([finding()], at=0)
    assert "exp1" in handle_run_command("alerts", store).text
    made = handle_run_command("silence exp1 2h eval is flaky", store)
    assert made.kind == "silence" and "run=exp1 for 2h: eval is flaky" in made.text
    listing = handle_run_command("silences", store).text
    assert "#1 run=exp1" in listing and "eval is flaky" in listing
    assert handle_run_command("silence expire 1", store).text == ":bell: Silence #1 ended."
    assert "Usage" in handle_run_command("silence run=exp1", store).text  # no reason
    assert "cannot match on 'host'" in handle_run_command("silence host=a 1h x", store).text
    fp = active_alerts(store)[0]["fingerprint"]
    assert "acknowledged" in handle_run_command(f"ack {fp[:8]}", store).text


def test_alerting_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="alerting.signals.nope: unknown signal"):
        parse_config({"alerting": {"signals": {"nope": {}}}}, "rw.toml")
    with pytest.raises(ConfigError, match=r"alerting.inhibit\[0\]: label 'host' unknown"):
        parse_config({"alerting": {"inhibit": [{"source": {"host": "a"},
                                                "target": {"signal": "x"}}]}}, "rw.toml")
    with pytest.raises(ConfigError, match="alerting.repeat_interval"):
        parse_config({"alerting": {"repeat_interval": 0}}, "rw.toml")
    with pytest.raises(ConfigError, match=r"alerting.routes\[0\].run"):
        parse_config({"alerting": {"routes": [{"channel": "#a", "run": "("}]}}, "rw.toml")


# -- Slack, restarts, upgrades ---------------------------------------------------------------------

def test_grouped_message_is_edited_in_place_on_the_local_slack(tmp_path):
    with LocalSlack() as local:
        store = Store(str(tmp_path / "rw.db"))
        outbox = Outbox(store, SlackNotifier(WebClient(base_url=local.api_url, token="x")),
                        clock=lambda: 100.0)
        args = dict(signals=SIGNALS, channel="C0ALERTS", alerting=AlertingConfig())
        reconcile(store, "exp1", 1, [finding()], now=0.0, **args)
        outbox.dispatch()
        reconcile(store, "exp1", 1, [finding(), finding("plateau", 45, "warning")], now=30.0,
                  **args)
        reconcile(store, "exp1", 1, [finding(state="resolved", resolved_step=50),
                                     finding("plateau", 45, "warning")], now=60.0, **args)
        outbox.dispatch()
        [post] = local.calls_to("chat.postMessage")[:1]
        edits = local.calls_to("chat.update")
        assert edits and {e.args["ts"] for e in edits} == {post.response["ts"]}
        shown = local.messages[("C0ALERTS", post.response["ts"])]
        assert "2 alerts, 1 firing" in json.dumps(shown["blocks"])
        [notice] = [c for c in local.calls_to("chat.postMessage") if c.args.get("thread_ts")]
        assert notice.args["thread_ts"] == post.response["ts"]


def test_restarts_during_active_alerting_post_nothing_twice(tmp_path):
    """A fresh store, outbox and transport every poll, some polls dying before they send."""
    path = str(tmp_path / "rw.db")
    posts, alerting = [], AlertingConfig(repeat_interval=600, escalate_after=300,
                                         oncall="S1")
    for i in range(40):
        store = Store(path)
        slack = Recorder()
        now = i * 60.0
        findings = [finding("spike", 40, state="resolved" if i >= 30 else "firing",
                            resolved_step=45 if i >= 30 else None)]
        if 10 <= i:
            findings.append(finding("plateau", 100, "warning", state="firing"))
        reconcile(store, "exp1", 1, findings, signals=SIGNALS, channel="#a", now=now,
                  alerting=alerting)
        tick(store, now=now, alerting=alerting)
        if i % 3 != 1:  # every third bot dies between deciding and sending
            Outbox(store, slack, clock=lambda now=now: now).dispatch()
        store.close()
        posts += [c for c in slack.calls if c[0] == "post"]
    # the spike's message; its escalation; the plateau's own message (after the group
    # interval); the spike's repeat 10 min after the last notification; its resolution
    assert [c[2] for c in posts] == ["alert", "escalate", "alert", "repeat", "resolved"]


def test_an_upgrade_adopts_alerts_already_posted(tmp_path, monkeypatch):
    path = str(tmp_path / "rw.db")
    lifecycle = store_module.MIGRATIONS.index(store_module._alert_lifecycle)
    monkeypatch.setattr(store_module, "MIGRATIONS", store_module.MIGRATIONS[:lifecycle])
    old = Store(path)
    f = finding()
    with old.transaction() as db:
        old.save_finding(db, f, 0.0, None)
        db["outbox"].insert({"kind": "alert", "fingerprint": f.fingerprint, "run": "exp1",
                             "channel": "#a", "state": "sent", "attempts": 0,
                             "next_attempt_at": 0.0, "created_at": 0.0})
        db["threads"].insert({"channel": "C1", "ts": "7.1", "run": "exp1",
                              "fingerprint": f.fingerprint, "created_at": 0.0})
    old.close()
    monkeypatch.undo()
    store = Store(path)
    slack = Recorder()
    reconcile(store, "exp1", 1, [f], signals=SIGNALS, channel="#a", now=10.0)
    reconcile(store, "exp1", 1, [finding(state="resolved", resolved_step=50)], signals=SIGNALS,
              channel="#a", now=20.0)
    Outbox(store, slack, clock=lambda: 30.0).dispatch()
    assert [(c[0], c[2], c[3]) for c in slack.calls] == [("post", "resolved", "7.1"),
                                                         ("update", "alert", "7.1")]


class Crash(BaseException):
    """The process dies: nothing after it runs."""


class DiesAfterSending:
    """Slack gets the message, then runwatch dies before it can record the answer."""

    def __init__(self, notifier):
        self.notifier = notifier

    def post(self, channel, message, thread_ts=None):
        self.notifier.post(channel, message, thread_ts)
        raise Crash


def test_a_crash_between_sending_and_recording_posts_nothing_twice(tmp_path):
    with LocalSlack() as local:
        slack = SlackNotifier(WebClient(base_url=local.api_url, token="x"))
        store = Store(str(tmp_path / "rw.db"))
        reconcile(store, "exp1", 1, [finding()], signals=SIGNALS, channel="C0ALERTS", now=0.0)
        with pytest.raises(Crash):
            Outbox(store, DiesAfterSending(slack)).dispatch()
        store.close()
        store = Store(str(tmp_path / "rw.db"))
        reconcile(store, "exp1", 1, [finding(state="resolved", resolved_step=50)],
                  signals=SIGNALS, channel="C0ALERTS", now=10.0)
        Outbox(store, slack).dispatch()
        posts = local.calls_to("chat.postMessage")
        assert len(posts) == 2 and posts[1].args["thread_ts"] == posts[0].response["ts"]
        assert store.query("SELECT state FROM outbox ORDER BY id")[0]["state"] == "sent"
