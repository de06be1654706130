"""The engine's time-based and text inputs, over real files and a real SQLite store:
stalls judged on polls that find nothing new, and sample generations beside a run's log."""

import json
import logging

import pytest

from analyzers.stalled import Stalled
from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from connectors.files import NOT_LOGS, LogDirectory
from connectors.generations import GENERATIONS_FILE
from tests.helpers import Recorder

T0 = 1_700_000_000.0  # the trainer's clock at step 0; a point every 10 s


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def settings(tmp_path):
    return Settings(config=Config(sources=[SourceConfig(path=str(tmp_path / "runs"))]),
                    secrets=Secrets(), config_path=None, db_path=str(tmp_path / "rw.db"))


def points(path, steps, loss=lambda s: 2.0 + 1.0 / s, late=0.0):
    """Loss points at steps, logged at ``T0 + 10 s × step`` (plus ``late`` seconds)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        for step in steps:
            handle.write(json.dumps({"step": step, "loss": loss(step),
                                     "time": T0 + 10.0 * step + late}) + "\n")


def generations(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False))
                         + "\n")


def kinds(recorder):
    return [kind for kind, _, _ in recorder.sent]


# -- stalls -----------------------------------------------------------------------------------


def test_a_silent_run_stalls_on_a_later_poll_and_resolves_when_points_arrive(tmp_path):
    recorder, clock = Recorder(), Clock(T0 + 505.0)
    engine = Engine(settings(tmp_path), notifier=recorder, clock=clock)
    log = tmp_path / "runs" / "exp1" / "metrics.jsonl"
    points(log, range(1, 51))  # last point at T0 + 500
    assert engine.poll().analysed == ["exp1"] and recorder.sent == []
    clock.now = T0 + 500 + 800  # silent, under the 15-minute floor
    assert engine.poll().changes == []
    clock.now = T0 + 500 + 1000
    report = engine.poll()
    assert report.analysed == []  # nothing new was read: only the stall was judged
    assert [(c.signal, c.transition) for c in report.changes] == [("stalled", "firing")]
    assert kinds(recorder) == ["alert"]
    assert "no new point for 16m 40s since step 50" in recorder.sent[0][1]
    clock.now += 3600
    engine.poll()
    assert kinds(recorder) == ["alert"]  # still stalled: nothing new to say
    points(log, range(51, 56), late=clock.now - T0 - 550)  # the run goes on, just now
    engine.poll()
    assert kinds(recorder) == ["alert", "resolved"]
    assert recorder.sent[1][2] == "1.1"  # in the alert's thread
    [stall] = engine.store.findings(run="exp1")
    assert (stall["signal"], stall["state"]) == ("stalled", "resolved")


def test_a_stall_check_leaves_other_signals_alerts_alone(tmp_path):
    recorder, clock = Recorder(), Clock(T0 + 505.0)
    engine = Engine(settings(tmp_path), notifier=recorder, clock=clock)
    log = tmp_path / "runs" / "exp1" / "metrics.jsonl"
    points(log, range(1, 50))
    points(log, [50], loss=lambda s: float("nan"))  # the run died on a NaN
    engine.poll()
    clock.now = T0 + 500 + 1000
    engine.poll()
    states = {f["signal"]: f["state"] for f in engine.store.findings(run="exp1")}
    assert states == {"spike": "firing", "stalled": "firing"}
    assert {a["signal"] for a in engine.store.query(
        "SELECT signal FROM alerts WHERE state = 'firing'")} == {"spike", "stalled"}


def test_idle_polls_judge_a_silent_run_rarely(tmp_path, monkeypatch):
    calls = []
    detect = Stalled.detect
    monkeypatch.setattr(Stalled, "detect", lambda self, data: calls.append(data.now)
                        or detect(self, data))
    clock = Clock(T0 + 5005.0)
    engine = Engine(settings(tmp_path), clock=clock)
    # a point every 100 s: the limit is 10 usual intervals, 1000 s, above the 900 s floor
    points(tmp_path / "runs" / "exp1" / "metrics.jsonl", range(10, 510, 10))
    engine.poll()
    assert calls == [T0 + 5005.0]  # with the new points
    for silence in range(10, 900, 10):  # under the floor: not judged
        clock.now = T0 + 5000 + silence
        engine.poll()
    assert len(calls) == 1
    clock.now = T0 + 5000 + 905
    assert engine.poll().changes == [] and len(calls) == 2  # judged: not over the limit yet
    clock.now += 80  # less than a tenth of the silence later: not judged again
    engine.poll()
    assert len(calls) == 2
    clock.now += 20
    assert [c.transition for c in engine.poll().changes] == ["firing"]
    assert len(calls) == 3
    clock.now += 7200  # firing: nothing to judge until the run logs again
    engine.poll()
    assert len(calls) == 3


def test_a_run_that_stalled_while_runwatch_was_down_is_reported_after_a_restart(tmp_path):
    points(tmp_path / "runs" / "exp1" / "metrics.jsonl", range(1, 51))
    Engine(settings(tmp_path), clock=Clock(T0 + 505.0)).poll()
    recorder = Recorder()
    engine = Engine(settings(tmp_path), notifier=recorder, clock=Clock(T0 + 500 + 1000))
    report = engine.poll()
    assert report.analysed == [] and [c.signal for c in report.changes] == ["stalled"]
    assert kinds(recorder) == ["alert"]


def test_history_that_was_already_quiet_is_no_stall(tmp_path):
    recorder = Recorder()
    points(tmp_path / "runs" / "old" / "metrics.jsonl", range(1, 51))
    clock = Clock(T0 + 86_400.0)  # runwatch first sees the run a day after its last point
    engine = Engine(settings(tmp_path), notifier=recorder, clock=clock)
    engine.poll()
    clock.now += 86_400
    engine.poll()
    assert recorder.sent == [] and engine.store.findings() == []


def test_a_silent_run_whose_metadata_changes_is_judged_again(tmp_path):
    recorder, clock = Recorder(), Clock(T0 + 505.0)
    engine = Engine(settings(tmp_path), notifier=recorder, clock=clock)
    log = tmp_path / "runs" / "exp1" / "metrics.jsonl"
    points(log, range(1, 51))
    engine.poll()
    clock.now = T0 + 500 + 1000
    engine.poll()
    assert kinds(recorder) == ["alert"]
    with open(log, "a") as handle:  # no new point, but the run says it had 50 steps to do
        handle.write(json.dumps({"step": 50, "total_steps": 50}) + "\n")
    report = engine.poll()
    assert report.analysed == [] and engine.store.run("exp1")["total_steps"] == 50
    assert kinds(recorder) == ["alert", "resolved"]  # it finished: it did not stall
    assert engine.store.findings(run="exp1", state="firing") == []


def test_analyze_judges_no_stall_on_a_finished_log(tmp_path, capsys):
    from bot.cli import main

    log = tmp_path / "runs" / "exp1" / "metrics.jsonl"
    points(log, range(1, 51))
    assert main(["analyze", str(log), "--json"]) == 0
    signals = [json.loads(line)["signal"] for line in capsys.readouterr().out.splitlines()]
    assert "stalled" not in signals


# -- sample generations ------------------------------------------------------------------------


def varied(i):
    words = "the model answers every question with fresh and varied words".split()
    return " ".join(words[(i + k) % len(words)] for k in range(10)) + f" case {i}"


def repeating(steps):
    return [{"step": s, "prompt": f"q{i}", "output": varied(i)} for s in steps for i in range(8)]


def looping(steps):
    return [{"step": s, "prompt": f"q{i}", "output": "I am sorry " * 6}
            for s in steps for i in range(8)]


def confused(steps):
    rows = [{"step": s, "prompt": f"question {i}", "output": f"Here is answer {i}."}
            for s in steps for i in range(10)]
    return rows + [{"step": s, "prompt": "question", "output": "Sure.\nUser: thanks!"}
                   for s in steps if s >= 300 for _ in range(3)]


def probes(step, refusals):
    return [{"step": step, "prompt": f"benign {i}", "probe": True,
             "output": "I cannot help with that." if i < refusals else "Sure! Here it is."}
            for i in range(20)]


@pytest.fixture
def text_runs(tmp_path):
    runs = tmp_path / "runs"
    for name in ("rep", "role", "refusal"):
        points(runs / name / "metrics.jsonl", range(1, 51))
    generations(runs / "rep" / GENERATIONS_FILE, repeating((100, 200, 300)))
    generations(runs / "role" / GENERATIONS_FILE, confused((100, 200)))
    generations(runs / "refusal" / GENERATIONS_FILE, probes(100, 1) + probes(200, 2))
    return runs


def test_generations_feed_the_text_signals_and_alert(tmp_path, text_runs):
    recorder = Recorder()
    engine = Engine(settings(tmp_path), notifier=recorder, clock=Clock(T0 + 505.0))
    engine.poll()
    assert recorder.sent == []
    assert len(engine.store.run_data("rep").generations) == 24
    assert engine.store.run_data("refusal").generations["probe"].all()
    assert "probe" not in engine.store.run_data("rep").generations.columns
    # the next evaluations, and no new metric point: new generations are news by themselves
    generations(text_runs / "rep" / GENERATIONS_FILE, looping((400, 500)))
    generations(text_runs / "role" / GENERATIONS_FILE, confused((300, 400)))
    generations(text_runs / "refusal" / GENERATIONS_FILE, probes(300, 8) + probes(400, 9))
    report = engine.poll()
    assert sorted(report.analysed) == ["refusal", "rep", "role"]
    assert all(r.new_points == 0 and r.new_generations for r in report.ingested.values())
    firing = {(f["run"], f["signal"]) for f in engine.store.findings(state="firing")}
    assert firing == {("rep", "repetition"), ("role", "role_confusion"),
                      ("refusal", "over_refusal")}
    assert kinds(recorder) == ["alert"] * 3
    assert any("refusal rate on the benign probe set 45% (9 of 20) at step 400" in text
               for _, text, _ in recorder.sent)


def test_generations_file_is_no_run_of_its_own(tmp_path, text_runs):
    assert GENERATIONS_FILE in NOT_LOGS
    assert sorted(r.run for r in LogDirectory(text_runs).discover()) == ["refusal", "rep", "role"]
    (text_runs / "lonely").mkdir()  # a folder with generations but no metrics is no run
    generations(text_runs / "lonely" / GENERATIONS_FILE, repeating((100,)))
    engine = Engine(settings(tmp_path), clock=Clock(T0 + 505.0))
    engine.poll()
    assert engine.store.run_names() == ["refusal", "rep", "role"]


def test_two_logs_in_one_folder_own_no_generations(tmp_path):
    folder = tmp_path / "runs" / "exp2"
    points(folder / "train.jsonl", range(1, 11))
    points(folder / "finetune.jsonl", range(1, 11))
    generations(folder / GENERATIONS_FILE, repeating((100,)))
    engine = Engine(settings(tmp_path), clock=Clock(T0 + 105.0))
    engine.poll()
    assert engine.store.run_names() == ["exp2/finetune", "exp2/train"]
    assert engine.store.query("SELECT COUNT(*) AS n FROM generations")[0]["n"] == 0


def test_malformed_generation_lines_are_counted_and_nothing_stored_is_lost(tmp_path, caplog):
    engine = Engine(settings(tmp_path), clock=Clock(T0 + 505.0))
    folder = tmp_path / "runs" / "exp1"
    points(folder / "metrics.jsonl", range(1, 51))
    path = folder / GENERATIONS_FILE
    generations(path, repeating((100,)) + ["{broken", json.dumps({"step": 100, "prompt": "x"})]
                + repeating((200,)))
    with caplog.at_level(logging.WARNING, logger="runwatch.engine"):
        engine.poll()
    assert len(engine.store.run_data("exp1").generations) == 16
    [source] = engine.store.sources()
    assert source["malformed_lines"] == 2
    assert any("exp1: generations.jsonl: 2 malformed lines skipped, first at line 9: not JSON"
               in r.message for r in caplog.records)
    assert "2 malformed lines" in engine.store.run("exp1")["last_notice"]
    with open(path, "a") as handle:  # a bad line, more rows, and a line still being written
        handle.write('{"step": "soon"' + "\n" + json.dumps(repeating((300,))[0]) + "\n"
                     + '{"step": 300, "prompt": "q1", "out')
    engine.poll()
    data = engine.store.run_data("exp1")
    assert len(data.generations) == 17 and len(data.series("train/loss")) == 50
    assert engine.store.sources()[0]["malformed_lines"] == 3
    with open(path, "a") as handle:
        handle.write('put": "done"}\n')
    engine.poll()
    assert len(engine.store.run_data("exp1").generations) == 18
    assert engine.store.sources()[0]["malformed_lines"] == 3
    engine.poll()  # unchanged: nothing read again
    assert len(engine.store.run_data("exp1").generations) == 18


def test_generations_cursor_survives_a_restart(tmp_path):
    folder = tmp_path / "runs" / "exp1"
    points(folder / "metrics.jsonl", range(1, 51))
    generations(folder / GENERATIONS_FILE, repeating((100,)))
    Engine(settings(tmp_path), clock=Clock(T0 + 505.0)).poll()
    generations(folder / GENERATIONS_FILE, repeating((200,)))
    engine = Engine(settings(tmp_path), clock=Clock(T0 + 505.0))
    assert engine.poll().ingested["exp1"].new_generations == 8
    assert engine.store.run_data("exp1").generations["step"].tolist() == [100] * 8 + [200] * 8


def test_generations_go_to_the_current_attempt(tmp_path):
    folder = tmp_path / "runs" / "exp1"
    points(folder / "metrics.jsonl", range(1, 51))
    generations(folder / GENERATIONS_FILE, repeating((10,)))
    engine = Engine(settings(tmp_path), clock=Clock(T0 + 505.0))
    engine.poll()
    points(folder / "metrics.jsonl", range(21, 31))  # resumed from step 20: attempt 2
    generations(folder / GENERATIONS_FILE, repeating((30,)))
    assert engine.poll().ingested["exp1"].attempt == 2
    assert engine.store.run_data("exp1").generations["step"].unique().tolist() == [30]
    assert engine.store.run_data("exp1", attempt=1).generations["step"].unique().tolist() == [10]
