"""Alert pipeline logic: reconcile and the outbox, over a real SQLite store."""

from analyzers.base import Finding, Fix
from bot.alerts import Outbox, reconcile
from bot.config import OutboxConfig
from bot.notify import SendResult
from bot.store import Store


def finding(state="firing", onset=40, signal="spike", resolved_step=None):
    return Finding(run="exp1", signal=signal, severity="critical", metric="train/loss",
                   onset_step=onset, detected_step=onset, summary=f"loss NaN at step {onset}",
                   evidence={"peak": float("nan")}, fixes=[Fix("Roll back", "000 §3.2",
                                                               "rollback")],
                   kind="not_learning", source="000 §3.2", state=state,
                   resolved_step=resolved_step)


class Flaky:
    def __init__(self, results):
        self.results = list(results)
        self.calls = []

    def post(self, channel, message, thread_ts=None):
        self.calls.append((message.kind, thread_ts))
        return self.results.pop(0) if self.results else SendResult(True, channel=channel,
                                                                    ts=f"9.{len(self.calls)}")


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
    assert [r["kind"] for r in pending(store)] == ["alert", "alert", "resolved", "resolved"]
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
    reconcile(store, "exp1", 1, [finding(onset=40), finding(onset=80)], signals={"spike"},
              channel="#a", now=now[0])
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
