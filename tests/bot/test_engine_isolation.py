"""One bad file, folder or server never stops the others: the watch loop over real folders
and a real SQLite store, with a file that breaks its reader beside a run that alerts."""

import json
import logging
import os

from rich.console import Console

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from tests.helpers import Recorder


def settings(tmp_path, *folders):
    sources = [SourceConfig(path=str(tmp_path / f)) for f in folders or ("runs",)]
    return Settings(config=Config(sources=sources), secrets=Secrets(), config_path=None,
                    db_path=str(tmp_path / "rw.db"))


def append(path, steps, loss=lambda s: 2.0 + 1.0 / s):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        for step in steps:
            handle.write(json.dumps({"step": step, "loss": loss(step)}) + "\n")


def neighbour_with_a_nan(folder):
    append(folder / "good.jsonl", range(1, 30))
    append(folder / "good.jsonl", [30], loss=lambda s: float("nan"))


def alerts(recorder):
    return [text for kind, text, _ in recorder.sent if kind == "alert"]


def test_a_deeply_nested_line_is_malformed_and_the_neighbour_is_still_alerted(tmp_path):
    runs = tmp_path / "runs"
    append(runs / "deep.jsonl", range(1, 10))
    with open(runs / "deep.jsonl", "a") as handle:
        handle.write("[" * 100_000 + "\n")
    append(runs / "deep.jsonl", [10])
    neighbour_with_a_nan(runs)
    recorder = Recorder()
    engine = Engine(settings(tmp_path), notifier=recorder)
    engine.poll()
    assert any("good" in text and "NaN at step 30" in text for text in alerts(recorder))
    deep = engine.store.run("deep")
    assert (deep["malformed_lines"], deep["first_malformed_line"]) == (1, 10)
    assert "nested" in deep["first_malformed_error"]
    assert len(engine.store.run_data("deep").series("train/loss")) == 10


def test_a_symlink_loop_is_reported_and_the_neighbour_is_still_alerted(tmp_path, caplog):
    runs = tmp_path / "runs"
    runs.mkdir()
    os.symlink("b.jsonl", runs / "a.jsonl")
    os.symlink("a.jsonl", runs / "b.jsonl")
    neighbour_with_a_nan(runs)
    recorder = Recorder()
    engine = Engine(settings(tmp_path), notifier=recorder)
    with caplog.at_level(logging.WARNING, logger="runwatch.engine"):
        engine.poll()
        engine.poll()
    assert any("NaN at step 30" in text for text in alerts(recorder))
    [row] = engine.store.sources()
    assert row["state"] == "degraded" and row["errors"] == 4  # two files, two polls
    assert "symbolic link" in row["last_error"] and row["last_error_at"] is not None
    looped = [r.getMessage() for r in caplog.records if "symbolic link" in r.getMessage()]
    assert len(looped) == 2  # one line per file, not one per poll
    assert all(len(line.splitlines()) == 1 for line in looped)


def test_any_failing_reader_or_source_leaves_the_others_judged(tmp_path, caplog):
    """The mechanism, not a list of known errors: a reader or a discovery that raises
    anything is recorded as degraded with its error and time, and the pass goes on."""
    neighbour_with_a_nan(tmp_path / "runs")
    append(tmp_path / "runs" / "broken.jsonl", range(1, 5))
    append(tmp_path / "other" / "x.jsonl", range(1, 5))
    recorder = Recorder()
    engine = Engine(settings(tmp_path, "other", "runs"), notifier=recorder)
    other, runs = engine.sources
    broken = next(r for r in runs.discover() if r.run == "broken")

    def read(*args, **kwargs):
        raise ValueError("a reader bug")

    def discover():
        raise RuntimeError("a discovery bug")

    other.discover, broken.read = discover, read
    with caplog.at_level(logging.WARNING, logger="runwatch.engine"):
        engine.poll()
    assert any("NaN at step 30" in text for text in alerts(recorder))
    health = {row["uri"]: row for row in engine.store.sources()}
    assert health[other.uri]["state"] == health[runs.uri]["state"] == "degraded"
    assert "a discovery bug" in health[other.uri]["last_error"]
    assert "run broken" in health[runs.uri]["last_error"] \
        and "a reader bug" in health[runs.uri]["last_error"]
    assert sum("a reader bug" in r.getMessage() for r in caplog.records) == 1


def test_sources_show_every_failure_with_its_last_error_and_time(tmp_path, capsys,
                                                                 monkeypatch):
    from bot.cli import main

    append(tmp_path / "runs" / "exp1.jsonl", range(1, 5))
    engine = Engine(settings(tmp_path))
    [reader] = engine.sources[0].discover()
    read = reader.read

    def unreadable(*args, **kwargs):
        raise OSError(5, "Input/output error")

    reader.read = unreadable
    for _ in range(30):
        engine.poll()
    [row] = engine.store.sources()
    assert (row["state"], row["errors"]) == ("degraded", 30)
    assert "Input/output error" in row["last_error"] and row["last_error_at"] is not None

    (tmp_path / "runwatch.toml").write_text(f'[[sources]]\npath = "{tmp_path / "runs"}"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNWATCH_DB", str(tmp_path / "rw.db"))
    monkeypatch.setenv("COLUMNS", "250")
    # the CLI's console may have been made (at its width) by an earlier test
    monkeypatch.setattr("bot.cli.console", Console(width=250))
    assert main(["sources"]) == 0  # a live look lists the runs; it cannot clear the failure
    out = capsys.readouterr().out
    assert "degraded" in out and "30" in out and "Input/output error" in out and " ago" in out

    reader.read = read  # the disk is back
    engine.poll()
    [row] = engine.store.sources()
    assert (row["state"], row["errors"]) == ("ok", 30)
    assert len(engine.store.run_data("exp1").series("train/loss")) == 4


def test_a_stop_ends_the_pass_between_runs_and_a_restart_loses_and_repeats_nothing(tmp_path):
    runs = tmp_path / "runs"
    for name in ("r1", "r2", "r3", "r4"):
        append(runs / f"{name}.jsonl", range(1, 30))
        if name in ("r1", "r3"):
            append(runs / f"{name}.jsonl", [30], loss=lambda s: float("nan"))
    recorder = Recorder()
    engine = Engine(settings(tmp_path), notifier=recorder)
    analyze = engine.analyze

    def analyze_then_stop(run, **kwargs):
        engine.request_stop()  # SIGTERM arrives while the first run is being judged
        return analyze(run, **kwargs)

    engine.analyze = analyze_then_stop
    report = engine.poll()
    assert report.stopped and report.analysed == ["r1"] and recorder.sent == []
    assert engine.store.run("r2") is None  # not read: its cursor did not move
    assert engine.poll().analysed == []  # a stopped engine starts no other pass
    engine.store.close()

    restarted = Engine(settings(tmp_path), notifier=recorder)
    restarted.poll()
    restarted.poll()
    for name in ("r1", "r2", "r3", "r4"):
        assert len(restarted.store.run_data(name).series("train/loss")) == 29 + (
            name in ("r1", "r3"))
    sent = alerts(recorder)  # each NaN once, from whichever process judged it
    assert len(sent) == 2 and all("NaN at step 30" in text for text in sent)
    assert [sum(f"{name}:" in text for text in sent) for name in ("r1", "r3")] == [1, 1]


def test_a_run_stored_but_not_judged_when_the_bot_died_is_judged_at_the_next_start(tmp_path):
    """The chaos test's find: `kill -9` after a run's points (a NaN) were stored with their
    cursor but before its alerts were reconciled; nothing new arrived after, so no later
    pass judged it and the NaN was never alerted."""
    runs = tmp_path / "runs"
    append(runs / "exp1.jsonl", range(1, 30))
    append(runs / "exp1.jsonl", [30], loss=lambda s: float("nan"))
    append(runs / "quiet.jsonl", range(1, 30))
    dying = Engine(settings(tmp_path), notifier=Recorder())
    dying.ingest()  # stored … and the process is killed here
    dying.store.close()

    recorder = Recorder()
    restarted = Engine(settings(tmp_path), notifier=recorder)
    report = restarted.poll()
    assert sorted(report.analysed) == ["exp1", "quiet"] and not report.ingested
    [sent] = alerts(recorder)
    assert "exp1:" in sent and "NaN at step 30" in sent
    assert restarted.store.unjudged() == []
    assert restarted.poll().analysed == []  # judged once: an idle pass judges nothing
    assert len(alerts(recorder)) == 1
