"""The store's other concerns, one suite on both backends (``open_store``: SQLite, and a real
PostgreSQL server where the machine has one; ``test_lifecycle_store.py`` runs some of its
cases so too): the alert lifecycle through the pipeline and the outbox, silences and
acknowledgements, action requests and the audit log, the reads of points charts and
answers make, and the records about runs (sources, metadata, generations, suite versions,
rollbacks, retries, retention). The same assertions hold on both, so the mixins' SQL means
the same on each."""

import math

import pandas as pd

from analyzers.base import Checkpoint
from bot.alerting.silences import (
    acknowledge,
    active_alerts,
    alerts_in_message,
    silence_alert,
)
from bot.config import AlertingConfig
from tests.bot.test_lifecycle_store import finding
from tests.bot.test_lifecycle_store import pipeline as lifecycle_pipeline
from tests.bot.test_shared_store import ingest
from tests.bot.test_store import generation_rows


def pipeline(store):
    """test_lifecycle_store's pipeline on ``store`` (which runs some of its cases so too)."""
    _, recorder, poll = lifecycle_pipeline(None, store=store)
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


# -- records about runs ----------------------------------------------------------------------

def points(rows):
    return pd.DataFrame(rows, columns=["step", "tag", "value", "wall_time"])


def test_sources_metadata_generations_and_suite_versions(open_store):
    store = open_store()
    store.source_health("file:///runs", now=1.0, runs=2, state="ok")
    store.source_health("file:///runs", now=2.0, error="gone", malformed=3)
    [source] = store.sources()
    assert (source["state"], source["runs"], source["errors"], source["malformed_lines"],
            source["last_ok_at"], source["last_error_at"]) == ("ok", 2, 1, 3, 1.0, 2.0)
    ingest(store, [(1, "loss", 2.0, 10.0), (2, "loss", 1.9, 11.0)])
    store.judged("exp1")
    assert store.update_run_meta("exp1", {"status": "running"}) is True
    assert store.update_run_meta("nope", {}) is False and store.unjudged() == ["exp1"]
    assert [(a["run"], a["attempt"], a["last_wall"]) for a in store.activity()] == [
        ("exp1", 1, 11.0)]
    assert store.latest("exp1", 1, "loss") == {"step": 2, "value": 1.9, "wall_time": 11.0}
    result = store.ingest_generations(
        run="exp1", source="file", log_path="x", cursor_key="generations:/x",
        cursor={"offset": 9}, notices=[],
        rows=generation_rows([(100, "benign", "Sure.", True), (100, "hi", "hello", None)]))
    assert (result.new_generations, result.attempt) == (2, 1)
    changed = store.record_suite_versions("exp1", 1, None, [
        {"suite": "mmlu", "version": "v1", "prefix": "eval/mmlu", "source": "log"}], now=3.0)
    assert changed == []
    [changed] = store.record_suite_versions("exp1", 1, 2, [
        {"suite": "mmlu", "version": "v2", "prefix": "eval/mmlu", "source": "log"}], now=4.0)
    assert changed["before"] == "v1" and len(store.suite_history("exp1")) == 2
    data = store.run_data("exp1")
    assert data.meta["status"] == "running"
    assert data.meta["eval_suite_versions"] == {"mmlu": [[None, "v1"], [2, "v2"]]}
    assert data.generations.to_dict("records") == [
        {"step": 100, "prompt": "benign", "output": "Sure.", "probe": True},
        {"step": 100, "prompt": "hi", "output": "hello", "probe": False}]


def test_a_rollback_mark_a_retry_and_retention(open_store):
    store = open_store()
    kw = dict(run="r", source="f", log_path="p", cursor_key="k", cursor={},
              checkpoints=[Checkpoint(50, "/ckpt/50", 1000.5)], meta={}, malformed=[],
              skipped_values=0, notices=[])
    store.ingest(points=points([(s, "loss", 1.0, 1000.0 + s / 100) for s in range(1, 91)]),
                 now=1_000.0, **kw)
    store.begin_attempt("r", stopped_at=2000.0)
    resumed = points([(s, "loss", 1.0, 2100.0 + s / 100) for s in range(111, 121)])
    assert store.ingest(points=resumed, now=1_000.0, **kw).attempt == 2
    store.forget_checkpoints("r", [50])
    assert store.checkpoints("r") == []
    row_id = store.enqueue_retry(kind="alert", fingerprint="f", run="r", channel="#c",
                                 now=1.0, due=5.0, error="ratelimited")
    [queued] = store.pending_outbox()
    assert (queued["id"], queued["attempts"], queued["last_error"]) == (
        row_id, 1, "ratelimited")
    loss = [2.0 + 0.001 * (s % 7) for s in range(3000)]
    loss[1234], loss[2000] = 9.0, math.nan
    store.ingest(points=points([(s, "loss", v, 100.0 + s) for s, v in enumerate(loss)]),
                 now=1_000.0, **{**kw, "run": "old", "checkpoints": []})
    removed = store.thin_finished(7, now=1_000.0 + 86_400 * 8, buckets=100)
    kept = store.run_data("old").series("loss")
    assert removed == 3000 - len(kept) and len(kept) < 500
    assert kept[1234] == 9.0 and math.isnan(kept[2000]) and kept.index[-1] == 2999
