"""The store's other concerns, one suite on both backends (``open_store``: SQLite, and a real
PostgreSQL server where the machine has one): the alert lifecycle through the pipeline and
the outbox, silences and acknowledgements, action requests and the audit log, and the
reads of points charts and answers make. The same assertions hold on both, so the mixins'
SQL means the same on each."""

import math

import pytest

from bot.alerting.lifecycle import LifecycleError
from bot.alerting.outbox import Outbox
from bot.alerting.pipeline import reconcile, tick
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
from bot.config import AlertingConfig
from tests.bot.test_lifecycle_store import SIGNALS, Recorder, finding
from tests.bot.test_shared_store import ingest


def pipeline(store, alerting=None):
    recorder, now = Recorder(), [0.0]
    outbox = Outbox(store, recorder, clock=lambda: now[0])
    alerting = alerting or AlertingConfig()

    def poll(findings, at, run="exp1"):
        now[0] = at
        reconcile(store, run, 1, findings, signals=SIGNALS, channel="#alerts", now=at,
                  alerting=alerting)
        tick(store, now=at, alerting=alerting)
        outbox.dispatch()

    return recorder, poll


# -- alerts --------------------------------------------------------------------------------

def test_an_alert_fires_is_redrawn_and_resolves_in_its_thread(open_store):
    store = open_store()
    slack, poll = pipeline(store)
    poll([finding("spike", 40)], at=0)
    [alert] = active_alerts(store)
    assert alert["state"] == "firing" and alert["summary"] == "spike at step 40"
    assert store.finding(alert["fingerprint"])["state"] == "firing"
    assert store.thread("#alerts", "5.1")["fingerprint"] == alert["fingerprint"]
    assert store.alert_message(alert["message_id"])["ts"] == "5.1"
    poll([finding("spike", 40), finding("plateau", 30, "warning")], at=60)
    assert [c[0] for c in slack.calls] == ["post", "update"]
    assert {a["signal"] for a in active_alerts(store)} == {"spike", "plateau"}
    # critical first
    assert [a["severity"] for a in store.open_alerts("exp1")] == ["critical", "warning"]
    poll([finding("spike", 40, state="resolved", resolved_step=50)], at=120)
    assert {a["signal"]: a["state"] for a in store.run_alerts("exp1")} == {
        "spike": "resolved", "plateau": "resolved"}
    assert active_alerts(store) == [] and store.firing_critical_alerts() == []
    assert store.findings("exp1", state="firing") == []
    assert len(store.alerts_by_prefix(alert["fingerprint"][:6], limit=5)) == 1
    poll([finding("spike", 40, state="resolved", resolved_step=50)], at=180)
    calls = len(slack.calls)
    poll([finding("spike", 40, state="resolved", resolved_step=50)], at=240)
    assert len(slack.calls) == calls  # nothing new to say


def test_a_stalled_run_mutes_the_alerts_it_explains(open_store):
    store = open_store()
    slack, poll = pipeline(store)
    poll([finding("stalled", 90, "warning"), finding("plateau", 80, "warning"),
          finding("throughput_drop", 85, "warning")], at=0)
    [post] = slack.calls
    assert "stalled at step 90" in post[4] and "plateau" not in post[4]
    assert {a["signal"]: a["muted"] for a in active_alerts(store)} == {
        "stalled": None, "plateau": "inhibited by stalled (step 90)",
        "throughput_drop": "inhibited by stalled (step 90)"}


def test_silence_list_and_expire(open_store):
    store = open_store()
    slack, poll = pipeline(store)
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


def test_the_silence_button_mutes_and_an_acknowledgement_is_drawn(open_store):
    store = open_store()
    slack, poll = pipeline(store)
    poll([finding()], at=0)
    [alert] = active_alerts(store)
    fp = alert["fingerprint"]
    assert acknowledge(store, fp[:8], "U0ALICE", now=5.0)["acked_by"] == "U0ALICE"
    assert acknowledge(store, fp, "U0BOB", now=6.0)["acked_by"] == "U0BOB"  # replaces
    assert store.acknowledged_by([fp, "other"]) == {fp: "U0BOB"}
    silence_alert(store, fp, created_by="U0BOB", now=7.0, alerting=AlertingConfig())
    poll([finding()], at=10)
    assert [c[0] for c in slack.calls] == ["post", "update"]
    assert "Acknowledged by <@U0BOB>" in slack.calls[-1][5]
    [member] = store.message_members(alert["message_id"])
    assert member["acked_by"] == "U0BOB" and member["muted"].startswith("silenced by <@U0BOB>")
    assert [a["fingerprint"] for a in alerts_in_message(store, "#alerts", "5.1")] == [fp]
    assert store.firing_severities(alert["message_id"], []) == ["critical"]
    assert store.firing_severities(alert["message_id"], [fp]) == []
    assert store.alert_states([]) == set() and store.alert_groups([]) == {}


def test_run_commands_for_alerts_and_silences(open_store):
    store = open_store()
    _, poll = pipeline(store)
    poll([finding()], at=0)
    assert "exp1" in handle_run_command("alerts", store).text
    made = handle_run_command("silence exp1 2h eval is flaky", store)
    assert made.kind == "silence" and "run=exp1 for 2h: eval is flaky" in made.text
    assert "#1 run=exp1" in handle_run_command("silences", store).text
    assert handle_run_command("silence expire 1", store).text == ":bell: Silence #1 ended."


def test_what_is_said_in_an_alert_thread_is_kept_once(open_store):
    store = open_store()
    _, poll = pipeline(store)
    poll([finding()], at=0)
    fp = active_alerts(store)[0]["fingerprint"]
    for _ in range(2):  # a redelivered event
        store.add_thread_message(channel="#alerts", thread_ts="5.1", ts="6.0", fingerprint=fp,
                                 run="exp1", user="U0ALICE", text="restarting it", at=6.0)
    [said] = store.thread_messages(fp)
    assert (said["user"], said["text"]) == ("U0ALICE", "restarting it")
    assert store.alert_thread(fp)["ts"] == "5.1"


# -- actions -------------------------------------------------------------------------------

def test_action_requests_move_once_and_the_audit_log_keeps_every_step(open_store):
    first, second = open_store(), open_store()
    first.add_action_request(request_id="r1", run="exp1", action="rollback",
                             params={"step": 40}, requested_by="U0A", channel="#c",
                             thread_ts="5.1", fingerprint="fp", now=1.0)
    assert second.action_request("r1")["state"] == "requested"
    assert first.move_action_request("r1", ("requested",), "confirmed", now=2.0,
                                     confirmed_by="U0B") is True
    assert second.move_action_request("r1", ("requested",), "confirmed", now=2.0) is False
    assert [r["id"] for r in second.action_requests_in("exp1", "rollback",
                                                      ("confirmed", "running"))] == ["r1"]
    first.move_action_request("r1", ("confirmed",), "done", now=3.0)
    assert [r["id"] for r in second.rollbacks_awaiting_followup()] == ["r1"]
    second.set_followup("r1", "recovered")
    assert first.rollbacks_awaiting_followup() == []
    for at, status in [(1.0, "requested"), (2.0, "confirmed"), (3.0, "done")]:
        first.record_action(at=at, run="exp1", action="rollback", actor="U0A", status=status,
                            request_id="r1", exit_status=0 if status == "done" else None)
    second.record_action(at=4.0, run="exp2", action="stop", actor="U0C", status="requested")
    assert [r["status"] for r in second.audit_log("exp1")] == ["requested", "confirmed", "done"]
    assert [r["run"] for r in first.audit_log(limit=2)] == ["exp1", "exp2"]
    assert [r["status"] for r in first.run_actions("exp1")] == ["requested", "confirmed",
                                                                "done"]


# -- reads of points -------------------------------------------------------------------------

def test_the_reads_of_points_for_charts_and_answers(open_store):
    store = open_store()
    ingest(store, [(1, "loss", 3.0, 10.0), (2, "loss", math.nan, 11.0), (3, "loss", 2.0, 12.0),
                   (4, "loss", math.inf, 13.0), (2, "lr", 0.1, 11.0), (1, "loss", 2.5, 20.0),
                   (2, "loss", 2.0, 21.0)])
    assert store.tag_names("exp1") == ["loss", "lr"]
    assert store.tag_summary("exp1") == [
        {"tag": "loss", "points": 6, "first_step": 1, "last_step": 4},
        {"tag": "lr", "points": 1, "first_step": 2, "last_step": 2}]
    assert store.step_span("exp1") == (1, 4)
    assert [(s["attempt"], s["first"], s["last"], s["started"], s["ended"])
            for s in store.attempt_spans("exp1")] == [(1, 1, 4, 10.0, 13.0), (2, 1, 2, 20.0, 21.0)]
    assert [r["step"] for r in store.recent_steps("exp1", 1, limit=2)] == [4, 3]
    assert store.wall_span("exp1", 1) == (10.0, 13.0)
    assert store.wall_time_from("exp1", 1, 3) == 12.0
    assert store.step_at_time("exp1", 1, 11.5) == 3
    series = store.series("exp1", 1, "loss")
    assert [s for s, _ in series] == [1, 2, 3, 4] and math.isnan(series[1][1])
    assert series[3][1] == math.inf
    assert math.isnan(store.value_at("exp1", 1, "loss", 2))
    assert store.value_at("exp1", 1, "loss", 9) is None
    assert store.logged_values("exp1", 1, "loss") == [3.0, 2.0, math.inf]
    assert store.first_step_with("exp1", 1, "loss", 2.0) == 3
    assert store.lowest("exp1", 1, "loss") == {"step": 3, "value": 2.0}
    assert store.lowest("exp1", 1, "loss", up_to=1) == {"step": 1, "value": 3.0}
    step, first, second = store.last_common_point(("exp1", 1), ("exp1", 2), "loss")
    assert step == 2 and math.isnan(first) and second == 2.0
    points = store.chart_points("exp1", attempt=1, tags=["loss"], steps=(2, None))
    assert list(points) == [1] and points[1]["loss"][0] == (2, None)
    assert points[1]["loss"][1:] == [(3, 2.0), (4, math.inf)]
    assert store.chart_points("exp1", tags=[]) == {}


def test_a_long_series_comes_back_as_its_envelope(open_store):
    store = open_store()
    rows = [(s, "loss", 1.0 / (s + 1), float(s)) for s in range(2000)]
    rows[700] = (700, "loss", 50.0, 700.0)  # a one-step spike
    rows[900] = (900, "loss", math.nan, 900.0)
    rows[1300] = (1300, "loss", -math.inf, 1300.0)
    ingest(store, rows)
    [reduced] = store.chart_points("exp1", max_points=100)[1].values()
    assert len(reduced) < 200 and reduced[0][0] == 0 and reduced[-1][0] == 1999
    assert (700, 50.0) in reduced and (1300, -math.inf) in reduced
    assert any(step == 900 and math.isnan(value) for step, value in reduced)
