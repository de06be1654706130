"""The watch loop over real files and a real SQLite store."""

import json
import logging
import threading
import time

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from bot.scheduler import start_scheduler
from tests.helpers import Recorder


def settings(tmp_path, **config):
    config.setdefault("sources", [SourceConfig(path=str(tmp_path / "runs"))])
    return Settings(config=Config(**config), secrets=Secrets(), config_path=None,
                    db_path=str(tmp_path / "rw.db"))


def append(path, steps, loss=lambda s: 2.0 + 1.0 / s):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        for step in steps:
            value = loss(step)
            handle.write(json.dumps({"step": step, "loss": value}) + "\n")


def test_new_runs_are_picked_up_and_only_runs_with_new_points_analysed(tmp_path):
    engine = Engine(settings(tmp_path), notifier=Recorder())
    append(tmp_path / "runs" / "a" / "metrics.jsonl", range(1, 30))
    assert engine.poll().analysed == ["a"]
    append(tmp_path / "runs" / "b.jsonl", range(1, 10))
    assert engine.poll().analysed == ["b"]
    assert engine.poll().analysed == []
    append(tmp_path / "runs" / "a" / "metrics.jsonl", range(30, 32))
    report = engine.poll()
    assert report.analysed == ["a"] and report.ingested["a"].new_points == 2


def test_missing_directory_is_reported_once_then_watched(tmp_path, caplog):
    engine = Engine(settings(tmp_path))
    with caplog.at_level(logging.WARNING, logger="runwatch.engine"):
        engine.poll()
        engine.poll()
    assert sum("will look again every poll" in r.message for r in caplog.records) == 1
    append(tmp_path / "runs" / "late.jsonl", range(1, 5))
    assert engine.poll().analysed == ["late"]


def test_spike_alerts_once_and_resolves_in_its_thread(tmp_path, open_store):
    """On SQLite and on PostgreSQL (``open_store``): the whole engine on either store."""
    recorder = Recorder()
    engine = Engine(settings(tmp_path), store=open_store(), notifier=recorder)
    log = tmp_path / "runs" / "exp1.jsonl"
    append(log, range(1, 41))
    append(log, [41], loss=lambda s: float("nan"))
    engine.poll()
    assert [k for k, _, _ in recorder.sent] == ["alert"]
    assert "NaN at step 41" in recorder.sent[0][1]
    append(log, range(42, 45))
    engine.poll()  # still inside the episode: nothing new to say
    assert len(recorder.sent) == 1
    append(log, range(45, 50))
    engine.poll()
    assert [k for k, _, _ in recorder.sent] == ["alert", "resolved"]
    assert recorder.sent[1][2] == "1.1"  # in the alert's thread


def test_bad_lines_and_truncation_lose_nothing(tmp_path, caplog):
    engine = Engine(settings(tmp_path))
    log = tmp_path / "runs" / "exp1.jsonl"
    append(log, range(1, 21))
    with open(log, "a") as handle:
        handle.write("{broken\n")
    engine.poll()
    run = engine.store.run("exp1")
    assert (run["malformed_lines"], run["first_malformed_line"]) == (1, 21)
    log.write_text('{"step": 1, "loss": 9.0}\n')  # the trainer restarted and truncated its log
    with caplog.at_level(logging.WARNING):
        engine.poll()
    assert any("reading it again from the start" in r.message for r in caplog.records)
    assert len(engine.store.run_data("exp1", attempt=1).series("train/loss")) == 20
    assert engine.store.run_data("exp1").series("train/loss").to_dict() == {1: 9.0}


def test_scheduler_polls_on_its_interval(tmp_path):
    engine = Engine(settings(tmp_path, poll_interval=0.2), notifier=Recorder())
    scheduler = start_scheduler(engine)
    try:
        append(tmp_path / "runs" / "exp1.jsonl", range(1, 11))
        deadline = time.monotonic() + 10
        while engine.store.run("exp1") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.store.run("exp1") is not None
        append(tmp_path / "runs" / "exp1.jsonl", range(11, 13))
        while (engine.store.latest("exp1", 1, "train/loss") or {}).get("step") != 12 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.store.latest("exp1", 1, "train/loss")["step"] == 12
    finally:
        scheduler.shutdown()


def test_history_present_at_start_is_silent_but_a_new_run_is_news(tmp_path):
    def spike_and_recover(path):
        append(path, range(1, 41))
        append(path, [41], loss=lambda s: 50.0)
        append(path, range(42, 60))

    spike_and_recover(tmp_path / "runs" / "old.jsonl")
    recorder = Recorder()
    engine = Engine(settings(tmp_path), notifier=recorder)
    report = engine.poll()
    assert report.catching_up == {"old"} and recorder.sent == []
    assert engine.store.findings(run="old")[0]["state"] == "resolved"
    spike_and_recover(tmp_path / "runs" / "new.jsonl")  # began and ended between two polls
    engine.poll()
    assert [k for k, _, _ in recorder.sent] == ["alert", "resolved"]
    assert "new:" in recorder.sent[0][1]


def test_deleted_checkpoints_are_no_longer_offered(tmp_path):
    engine = Engine(settings(tmp_path))
    run = tmp_path / "runs" / "exp1"
    for step in (10, 20, 30):
        (run / f"checkpoint-{step}").mkdir(parents=True)
    append(run / "metrics.jsonl", range(1, 35))
    engine.poll()
    assert [c.step for c in engine.store.checkpoints("exp1")] == [10, 20, 30]
    (run / "checkpoint-10").rmdir()  # save_total_limit pruned the oldest
    append(run / "metrics.jsonl", [35])
    engine.poll()
    assert [c.step for c in engine.store.checkpoints("exp1")] == [20, 30]


def test_status_right_after_a_nan(tmp_path):
    from bot.services.status import run_status
    from bot.views.status import status_lines

    engine = Engine(settings(tmp_path))
    append(tmp_path / "runs" / "exp1.jsonl", range(1, 10))
    append(tmp_path / "runs" / "exp1.jsonl", [10], loss=lambda s: float("nan"))
    engine.poll()
    lines = status_lines(run_status(engine.store, "exp1"))
    assert lines["train loss"] == "NaN"
    assert lines["open alerts"] == "critical spike since step 10"


def test_a_rewound_run_resolves_the_earlier_attempts_alerts(tmp_path):
    recorder = Recorder()
    engine = Engine(settings(tmp_path), notifier=recorder)
    log = tmp_path / "runs" / "exp1.jsonl"
    append(log, range(1, 30))
    append(log, [30], loss=lambda s: float("nan"))
    engine.poll()
    append(log, range(21, 25), loss=lambda s: 1.5)  # resumed from the checkpoint at step 20
    engine.poll()
    assert [k for k, _, _ in recorder.sent] == ["alert", "resolved"]
    assert "started attempt 2" in recorder.sent[1][1]
    assert engine.store.findings(state="firing") == []


def test_source_health_is_recorded_and_listed(tmp_path, capsys, monkeypatch):
    from bot.cli import main

    engine = Engine(settings(tmp_path))
    engine.poll()
    [row] = engine.store.sources()
    assert (row["state"], row["errors"]) == ("missing", 1)
    engine.poll()
    assert engine.store.sources()[0]["errors"] == 1  # reported once, not every poll
    append(tmp_path / "runs" / "exp1.jsonl", range(1, 5))
    with open(tmp_path / "runs" / "exp1.jsonl", "a") as handle:
        handle.write("oops\n")
    engine.poll()
    [row] = engine.store.sources()
    assert (row["state"], row["runs"], row["malformed_lines"]) == ("ok", 1, 1)

    (tmp_path / "runwatch.toml").write_text(f'[[sources]]\npath = "{tmp_path / "runs"}"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNWATCH_DB", str(tmp_path / "rw.db"))
    assert main(["sources"]) == 0
    out = capsys.readouterr().out
    assert "runs" in out and " ok " in out and "never" not in out


def test_a_watched_run_is_read_incrementally_and_judged_the_same(tmp_path):
    """Each poll reads only the points logged since the last one; the findings are those of
    the whole attempt read at once."""
    engine = Engine(settings(tmp_path), notifier=Recorder())
    log = tmp_path / "runs" / "exp1.jsonl"
    spike = lambda s: 2.0 + 1.0 / s + (3.0 if s == 120 else 0.0)  # noqa: E731
    for lo in range(1, 200, 40):
        append(log, range(lo, lo + 40), loss=spike)
        engine.poll()
        assert engine._live["exp1"].live or lo == 1  # extended after the first read
    live = engine._live["exp1"]
    whole = engine.store.run_data("exp1")
    assert live.series("train/loss").equals(whole.series("train/loss"))
    fresh = Engine(settings(tmp_path))
    key = lambda fs: sorted((f.signal, f.onset_step, f.detected_step) for f in fs)  # noqa: E731
    assert key(engine.analyze("exp1")) == key(fresh.analyze("exp1"))
    assert ("spike", 120, 120) in key(engine.analyze("exp1"))


def test_a_poll_that_overruns_its_interval_is_reported_in_runwatchs_words(tmp_path, caplog):
    """APScheduler skips a pass while the last still runs and warns with the job's repr
    ("maximum number of running instances reached"); runwatch says it once, with the fix."""
    engine = Engine(settings(tmp_path, poll_interval=0.1), notifier=Recorder())
    slow = threading.Event()

    def poll(**kwargs):
        slow.wait(0.5)
        return engine_poll(**kwargs)

    engine_poll, engine.poll = engine.poll, poll
    with caplog.at_level(logging.INFO):
        scheduler = start_scheduler(engine)
        try:
            deadline = time.monotonic() + 10
            while not any("skipped" in r.getMessage() for r in caplog.records) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            scheduler.shutdown()
    skipped = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert skipped and all(r.name == "runwatch.scheduler" for r in skipped)
    assert skipped[0].getMessage().startswith(
        "poll: a pass was still running when the next was due (every 0.1s), so that one was "
        "skipped (1 skipped so far); if this keeps happening, raise poll_interval")
    assert not any("maximum number of running" in r.getMessage() for r in caplog.records)


def test_a_slow_signal_is_judged_again_once_the_run_has_grown_and_keeps_its_alert(tmp_path):
    """An analyzer with ``rejudge_share`` (oscillation rescans its whole look-back) is
    judged by the watcher once the attempt has grown by that share; in between its firing
    alert is neither judged nor resolved."""
    from analyzers.oscillation import Oscillation

    class Counting(Oscillation):
        rejudge_share = 0.5  # judge again after 50% more points (at most 50 more)
        calls: list[int] = []

        def detect(self, data):
            self.calls.append(data.points())
            if len(self.calls) > 1:  # fires on the first judgement only
                return []
            return [self.finding(data, onset_step=5, detected_step=10, summary="swings",
                                 evidence={}, severity="warning")]

    engine = Engine(settings(tmp_path), notifier=Recorder())
    engine.analyzers = [Counting()]
    run = tmp_path / "runs" / "a.jsonl"
    append(run, range(1, 41))
    engine.poll()
    assert Counting.calls == [40]
    firing = lambda: [a["signal"] for a in engine.store.open_alerts()]  # noqa: E731
    assert firing() == ["oscillation"]
    append(run, range(41, 60))  # 19 more: less than half of 40
    assert engine.poll().analysed == ["a"] and Counting.calls == [40]
    assert firing() == ["oscillation"]  # not judged, so not resolved either
    append(run, range(60, 61))  # 20 more since the last judgement
    engine.poll()
    assert Counting.calls == [40, 60] and firing() == []  # judged, and no longer firing
