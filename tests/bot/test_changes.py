""""What changed?" end to end: runs written by the real RunLogger, read by the real engine into a
real SQLite store, answered by `/run changes`, `/run compare` and `runwatch changes`."""

from __future__ import annotations

import json

import pytest

from bot.cli import main
from bot.commands import handle_run_command
from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from bot.services.changes import what_changed
from bot.views.alerts import alert_message
from connectors.training.torchloop import RunLogger

BASE = {"lr": 3e-4, "epochs": 3, "data_mix": "v3", "seed": 1}


def _log(logger: RunLogger, steps: range) -> None:
    for step in steps:
        logger.log(step, loss=2.0 + 1.0 / step, eval_loss=2.1 + 1.0 / step)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("changes")
    runs = tmp_path / "runs"
    # two runs: the second changed two settings at once
    with RunLogger(runs / "base", config=BASE) as logger:
        _log(logger, range(1, 41))
    with RunLogger(runs / "two", config={**BASE, "lr": 6e-4, "epochs": 5}) as logger:
        _log(logger, range(1, 41))
    # one run resumed at step 50 with a new learning rate: a change event
    with RunLogger(runs / "resumed", config=BASE) as logger:
        _log(logger, range(1, 61))
    with RunLogger(runs / "resumed", config={**BASE, "lr": 1.5e-4}, step=50) as logger:
        _log(logger, range(51, 75))
        logger.log(75, loss=60.0)  # a spike after the change
        _log(logger, range(76, 81))
    # a run from a plain log: nothing recorded
    (runs / "plain").mkdir()
    (runs / "plain" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 11)))
    settings = Settings(config=Config(sources=[SourceConfig(path=str(runs))]),
                        secrets=Secrets(), config_path=None, db_path=str(tmp_path / "rw.db"))
    engine = Engine(settings)
    engine.poll()
    return engine


def test_two_settings_changed_between_runs_warns_one_variable_at_a_time(engine):
    report = what_changed(engine.store, "base", "two")
    (change,) = report.changes
    assert change.changed == {"config.epochs": (3, 5), "config.lr": (3e-4, 6e-4)}
    assert report.warnings and "2 variables changed" in report.warnings[0]
    message = handle_run_command("changes base two", engine.store)
    assert "`config.lr`: 0.0003 → 0.0006" in message.text
    assert "change one variable at a time" in message.text
    compare = handle_run_command("compare base two", engine.store)
    assert "2 settings differ" in compare.text and "one variable at a time" in compare.text


def test_a_resume_with_a_new_lr_is_a_change_event_at_its_step(engine):
    message = handle_run_command("changes resumed", engine.store)
    assert "attempt 2 at step 50" in message.text
    assert "`config.lr`: 0.0003 → 0.00015" in message.text
    assert "1 variable changed" in message.text and "one variable at a time" not in message.text
    at_70 = what_changed(engine.store, "resumed", "70")
    assert [(c.step, c.attempt) for c in at_70.changes] == [(50, 2)]
    before = handle_run_command("changes resumed 40", engine.store)
    assert "step 50 (after it)" in before.text


def test_an_alert_after_a_change_says_what_was_changed_then(engine):
    [spike] = [f for f in engine.store.findings("resumed") if f["signal"] == "spike"]
    assert json.loads(spike["data"])["evidence"]["changed_before"] == \
        "at step 50: lr 0.0003 → 0.00015"
    message = alert_message(spike)
    assert "changed since the previous attempt at step 50: lr 0.0003 → 0.00015" in \
        json.dumps(message.blocks, ensure_ascii=False)
    assert not [f for f in engine.store.findings("base") if f["signal"] == "spike"]


def test_what_was_never_recorded_is_said_to_be_missing(engine):
    message = handle_run_command("changes plain", engine.store)
    assert "no change recorded" in message.text
    assert "plain recorded no versions" in message.text
    versus = what_changed(engine.store, "base", "plain")
    assert versus.changes == []  # nothing to compare is not "the same"
    assert any("plain recorded no versions" in m for m in versus.missing)


def test_usage_and_unknown_runs_get_one_line(engine):
    assert "takes a run" in handle_run_command("changes", engine.store).text
    unknown = handle_run_command("changes nope", engine.store)
    assert unknown.kind == "error" and "unknown run 'nope'" in unknown.text


def test_the_cli_answers_from_the_database(engine, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RUNWATCH_DB", engine.settings.db_path)
    monkeypatch.chdir(tmp_path)
    assert main(["changes", "resumed", "70"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "config.lr: 0.0003 → 0.00015" in out
    assert main(["changes", "nope"]) == 1


def test_a_question_about_changes_is_answered_from_the_change_event(engine, tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setenv("RUNWATCH_DB", engine.settings.db_path)
    monkeypatch.chdir(tmp_path)
    assert main(["ask", "resumed", "what", "changed?", "--model", "none"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "resumed at step 50 with 1 recorded change(s)" in out
    assert '"config.lr": 0.0003 → 0.00015' in out
