"""Alert pipeline logic: reconcile and the outbox, over a real SQLite store."""

from dataclasses import replace

from slack_sdk import WebClient

from analyzers.finding import Finding, Fix
from benchmarks.devslack import LocalSlack
from bot.alerting.notify import SendResult, SlackNotifier
from bot.alerting.outbox import Outbox
from bot.alerting.pipeline import reconcile
from bot.charts import ChartFile
from bot.config import OutboxConfig
from bot.store import Store


def finding(state="firing", onset=40, signal="spike", resolved_step=None, run="exp1"):
    return Finding(run=run, signal=signal, severity="critical", metric="train/loss",
                   onset_step=onset, detected_step=onset, summary=f"loss NaN at step {onset}",
                   evidence={"peak": float("nan")}, fixes=[Fix("Roll back", "000 §3.2",
                                                               "rollback")],
                   kind="not_learning", source="000 §3.2", state=state,
                   resolved_step=resolved_step)


class Flaky:
    def __init__(self, results=()):
        self.results = list(results)
        self.calls = []

    def post(self, channel, message, thread_ts=None):
        self.calls.append((message.kind, thread_ts))
        return self.results.pop(0) if self.results else SendResult(True, channel=channel,
                                                                    ts=f"9.{len(self.calls)}")


class Editing(Flaky):
    def update(self, channel, ts, message):
        self.calls.append(("update", ts, message.text))
        return SendResult(True, channel=channel, ts=ts)


def pending(store):
    return store.query("SELECT kind, state, attempts FROM outbox ORDER BY id")


def test_new_firing_finding_is_stored_and_queued_once(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    args = dict(signals={"spike"}, channel="#a", now=100.0)
    assert [c.transition for c in reconcile(store, "exp1", 1, [finding()], **args)] == ["firing"]
    assert [c.transition for c in reconcile(store, "exp1", 1, [finding()], **args)] == \
        ["updated"]
    assert pending(store) == [{"kind": "alert", "state": "pending", "attempts": 0}]
    assert store.findings(state="firing")[0]["summary"] == "loss NaN at step 40"


def test_resolution_and_disappearance_queue_a_resolved_notice(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    args = dict(signals={"spike", "plateau"}, channel="#a")
    reconcile(store, "exp1", 1, [finding(), finding(signal="plateau", onset=10)], **args)
    changes = reconcile(store, "exp1", 1, [finding("resolved", resolved_step=50)], **args)
    assert sorted((c.signal, c.transition) for c in changes) == [("plateau", "resolved"),
                                                                  ("spike", "resolved")]
    # one message for the run's two alerts; each resolution answers in its thread
    assert [r["kind"] for r in pending(store)] == ["alert", "resolved", "resolved"]
    assert store.findings(state="firing") == []


def test_history_first_seen_resolved_is_kept_silently(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    reconcile(store, "exp1", 1, [finding("resolved", resolved_step=50)], signals={"spike"},
              channel="#a", catching_up=True)
    assert pending(store) == []
    assert store.findings()[0]["state"] == "resolved"


def test_a_spike_over_between_two_polls_is_still_announced(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    changes = reconcile(store, "exp1", 1, [finding("resolved", resolved_step=50)],
                        signals={"spike"}, channel="#a")
    assert [c.transition for c in changes] == ["firing", "resolved"]
    assert [r["kind"] for r in pending(store)] == ["alert", "resolved"]


def test_outbox_backs_off_on_recoverable_errors_and_gives_up_on_others(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    now = [1000.0]
    for run in ("exp1", "exp2"):  # two runs: two messages
        reconcile(store, run, 1, [finding(run=run)], signals={"spike"}, channel="#a",
                  now=now[0])
    transport = Flaky([SendResult(False, True, "Slack answered 503"),
                       SendResult(False, False, "channel_not_found")])
    outbox = Outbox(store, transport, OutboxConfig(backoff_seconds=10), clock=lambda: now[0])
    assert outbox.dispatch() == 0
    assert len(transport.calls) == 1  # a recoverable failure stops the pass: order is kept
    assert outbox.dispatch() == 0 and len(transport.calls) == 1  # not due before the backoff
    now[0] += 10
    assert outbox.dispatch() == 1  # the first alert now fails for good; the second goes out
    rows = pending(store)
    assert rows == [{"kind": "alert", "state": "failed", "attempts": 2},
                    {"kind": "alert", "state": "sent", "attempts": 0}]


def test_resolved_notice_waits_for_its_alert_and_replies_in_thread(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    now = [0.0]
    reconcile(store, "exp1", 1, [finding()], signals={"spike"}, channel="#a", now=now[0])
    reconcile(store, "exp1", 1, [finding("resolved", resolved_step=50)], signals={"spike"},
              channel="#a", now=now[0])
    transport = Flaky([SendResult(False, True, "timeout")])
    outbox = Outbox(store, transport, OutboxConfig(backoff_seconds=1), clock=lambda: now[0])
    outbox.dispatch()
    assert transport.calls == [("alert", None)]
    now[0] += 1
    assert outbox.dispatch() == 2
    assert transport.calls[1:] == [("alert", None), ("resolved", "9.2")]
    assert store.alert_thread(store.findings()[0]["fingerprint"])["ts"] == "9.2"


def test_an_alert_joining_within_the_group_interval_redraws_the_message(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    args = dict(signals={"spike", "plateau"}, channel="#a")
    transport = Editing()
    outbox = Outbox(store, transport, clock=lambda: 100.0)
    reconcile(store, "exp1", 1, [finding()], now=0.0, **args)
    outbox.dispatch()
    reconcile(store, "exp1", 1, [finding(), finding(signal="plateau", onset=45)], now=60.0,
              **args)
    outbox.dispatch()
    # redrawn in place, and a new critical is said in the thread too (an edit is silent)
    assert [c[:2] for c in transport.calls] == [("alert", None), ("update", "9.1"),
                                                ("joined", "9.1")]
    assert "2 alerts" in transport.calls[1][2] and "plateau" in transport.calls[1][2]


def test_a_transport_that_cannot_edit_skips_redraws(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    transport = Flaky()
    outbox = Outbox(store, transport, clock=lambda: 100.0)
    reconcile(store, "exp1", 1, [finding()], signals={"spike"}, channel="#a", now=0.0)
    outbox.dispatch()
    reconcile(store, "exp1", 1, [finding("resolved", resolved_step=50)], signals={"spike"},
              channel="#a", now=10.0)
    assert outbox.dispatch() == 1
    assert transport.calls == [("alert", None), ("resolved", "9.1")]
    assert [r["state"] for r in pending(store)] == ["sent", "sent", "skipped"]


def test_group_wait_holds_the_first_post_without_blocking_other_runs(tmp_path):
    from bot.config import AlertingConfig

    store = Store(str(tmp_path / "rw.db"))
    now = [0.0]
    waiting = AlertingConfig(group_wait=30)
    reconcile(store, "exp1", 1, [finding()], signals={"spike"}, channel="#a", now=0.0,
              alerting=waiting)
    reconcile(store, "exp2", 1, [finding(run="exp2")], signals={"spike"}, channel="#a",
              now=0.0)
    transport = Editing()
    outbox = Outbox(store, transport, clock=lambda: now[0])
    assert outbox.dispatch() == 1  # exp2's, not held back by exp1's wait
    reconcile(store, "exp1", 1, [finding(), finding(signal="plateau", onset=45)],
              signals={"spike", "plateau"}, channel="#a", now=20.0, alerting=waiting)
    now[0] = 30.0
    assert outbox.dispatch() == 1  # one post with both alerts, no redraw needed
    assert [c[0] for c in transport.calls] == ["alert", "alert"]


class Uploading(Editing):
    """Edits, and uploads charts (a PNG per alert, into a thread)."""

    def __init__(self, results=(), uploads=()):
        super().__init__(results)
        self.uploads = list(uploads)
        self.charts = []

    def post(self, channel, message, thread_ts=None):
        self.calls.append((message.kind, thread_ts))
        self.broadcast = getattr(self, "broadcast", []) + [message.broadcast]
        self.texts = getattr(self, "texts", []) + [message.text]
        return SendResult(True, channel=channel, ts=f"9.{len(self.calls)}")

    def upload(self, channel, thread_ts, filename, data, title, comment=None):
        result = self.uploads.pop(0) if self.uploads else SendResult(True, channel=channel,
                                                                     ts=thread_ts)
        self.charts.append((thread_ts, filename, result.ok))
        return result


def warning(signal="plateau", onset=45):
    return replace(finding(signal=signal, onset=onset), severity="warning",
                   evidence={"peak": 3.0})


def test_a_critical_joining_a_message_by_an_edit_is_said_in_its_thread_to_the_channel(tmp_path):
    """An edit notifies nobody: a NaN joining the run's warning message within the group
    interval was silent. A new critical, or anything worse than the message showed, is a
    reply in the message's thread shown in the channel, after the message is redrawn."""
    store = Store(str(tmp_path / "rw.db"))
    args = dict(signals={"spike", "plateau", "overfit"}, channel="#a")
    transport = Uploading()
    outbox = Outbox(store, transport, clock=lambda: 100.0)
    reconcile(store, "exp1", 1, [warning()], now=0.0, **args)
    outbox.dispatch()
    reconcile(store, "exp1", 1, [warning(), finding()], now=60.0, **args)  # NaN: critical
    outbox.dispatch()
    assert [c[:2] for c in transport.calls] == [("alert", None), ("update", "9.1"),
                                                ("joined", "9.1")]
    assert transport.broadcast == [False, True]
    assert "critical" in transport.texts[1] and "loss NaN at step 40" in transport.texts[1]
    # a warning joining a message that already shows a critical is only drawn in
    reconcile(store, "exp1", 1, [warning(), finding(), warning("overfit", 50)], now=90.0,
              **args)
    outbox.dispatch()
    assert [c[0] for c in transport.calls[3:]] == ["update"]


def test_every_alert_joining_a_message_gets_its_chart_in_the_thread_once(tmp_path,
                                                                         monkeypatch):
    """The README: every alert's thread gets a chart. One that joined by an edit got none.
    Its chart is a row of the outbox, queued with the join: retried after a failure,
    sent once across restarts."""
    monkeypatch.setattr("bot.alerting.outbox.finding_chart", lambda store, f: ChartFile(
        b"png", f"{f['run']}-{f['signal']}-{f['fingerprint'][:8]}.png", "chart", "comment"))
    store = Store(str(tmp_path / "rw.db"))
    args = dict(signals={"spike", "plateau"}, channel="#a")
    transport = Uploading(uploads=[SendResult(True), SendResult(False, True, "Slack 503")])
    now = [100.0]
    outbox = Outbox(store, transport, OutboxConfig(backoff_seconds=5), clock=lambda: now[0])
    reconcile(store, "exp1", 1, [finding()], now=0.0, **args)
    outbox.dispatch()
    reconcile(store, "exp1", 1, [finding(), warning()], now=60.0, **args)
    outbox.dispatch()  # the chart's upload fails recoverably: queued again
    reconcile(store, "exp1", 1, [finding(), warning()], now=70.0, **args)
    assert [c[0] for c in transport.charts] == ["9.1", "9.1"]
    now[0] += 5
    Outbox(store, transport, OutboxConfig(backoff_seconds=5), clock=lambda: now[0]).dispatch()
    now[0] += 60
    Outbox(store, transport, OutboxConfig(backoff_seconds=5), clock=lambda: now[0]).dispatch()
    assert [(ts, name.split("-")[1], ok) for ts, name, ok in transport.charts] == [
        ("9.1", "spike", True), ("9.1", "plateau", False), ("9.1", "plateau", True)]


def test_on_slack_the_joining_critical_is_broadcast_from_the_thread_with_its_chart(tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setattr("bot.alerting.outbox.finding_chart", lambda store, f: ChartFile(
        b"png", f"{f['run']}-{f['signal']}-{f['fingerprint'][:8]}.png", "chart", "comment"))
    with LocalSlack() as local:
        store = Store(str(tmp_path / "rw.db"))
        outbox = Outbox(store, SlackNotifier(WebClient(base_url=local.api_url, token="x")),
                        clock=lambda: 100.0)
        args = dict(signals={"spike", "plateau"}, channel="C0ALERTS")
        reconcile(store, "exp1", 1, [warning()], now=0.0, **args)
        outbox.dispatch()
        reconcile(store, "exp1", 1, [warning(), finding()], now=60.0, **args)
        outbox.dispatch()
        [post, notice] = local.calls_to("chat.postMessage")
        [edit] = local.calls_to("chat.update")
        ts = post.response["ts"]
        assert edit.args["ts"] == ts and "2 alerts" in edit.args["text"]
        assert notice.args["thread_ts"] == ts and notice.args["reply_broadcast"] is True
        assert "New critical on exp1" in notice.args["text"]
        uploads = local.calls_to("files.completeUploadExternal")
        assert [u.args.get("thread_ts") for u in uploads] == [ts, ts]  # the warning's, the NaN's


def test_an_alert_below_min_severity_is_kept_but_not_posted(tmp_path):
    """A quiet channel (issue 22): an info finding (the default stop-loss hint) is stored
    and listed with why it was not posted; a warning is posted; min_severity = "info"
    posts both."""
    from bot.config import AlertingConfig

    hint = replace(finding(signal="diminishing_returns", onset=30), severity="info",
                   evidence={})
    store = Store(str(tmp_path / "rw.db"))
    reconcile(store, "exp1", 1, [hint], signals={"diminishing_returns"}, channel="#a")
    assert pending(store) == []
    [alert] = store.query("SELECT state, muted FROM alerts")
    assert alert["state"] == "firing"
    assert alert["muted"] == ("not posted: info is below the channel's min_severity "
                              "(warning)")
    warning = replace(finding(signal="plateau", onset=10), severity="warning", evidence={})
    reconcile(store, "exp1", 1, [hint, warning], signals={"diminishing_returns", "plateau"},
              channel="#a")
    assert [r["kind"] for r in pending(store)] == ["alert"]

    loud = Store(str(tmp_path / "loud.db"))
    reconcile(loud, "exp1", 1, [hint], signals={"diminishing_returns"}, channel="#a",
              alerting=AlertingConfig(min_severity="info"))
    assert [r["kind"] for r in pending(loud)] == ["alert"]
    assert loud.query("SELECT muted FROM alerts") == [{"muted": None}]
