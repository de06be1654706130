"""Eval suites as assets (issue 26 part 4), with real parts: a config file validated as
`runwatch config check` does, a real SQLite store fed by the engine from JSONL logs (one
written by RunLogger), the real analyzers, "what changed" and `/run compare`."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from analyzers import RunData
from analyzers.forgetting import Forgetting
from bot.cli import main
from bot.config import ConfigError, load_settings
from bot.engine import Engine
from bot.services.changes import what_changed
from bot.services.compare import compare_runs
from bot.views.compare import compare_message


def write(tmp_path, text):
    path = tmp_path / "runwatch.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, says", [
    ('[[eval_suites]]\nname = "mmlu"\nfile = "evals/none.jsonl"\n',
     "eval suite file '{tmp}/evals/none.jsonl' not found; fix the path"),
    ('[[eval_suites]]\nname = "mmlu"\n',
     "eval suite 'mmlu': give `file` (its prompts; the content hash is the version) or "
     "`metric_prefix`"),
    ('[[eval_suites]]\nname = "mmlu"\nfile = "mmlu.jsonl"\nversion = "3"\n',
     "a file suite's version is its content hash; drop `version`"),
    ('[[eval_suites]]\nname = "mmlu"\nmetric_prefix = "eval/mmlu/"\n'
     '[[eval_suites]]\nname = "mmlu"\nmetric_prefix = "eval/x/"\n',
     "suite 'mmlu' is declared twice"),
    ('[[eval_suites]]\nname = "mmlu"\nmetric_prefix = "eval/mmlu/"\n'
     '[analyzers.forgetting]\nsuites = ["mmlu", "gsm8k"]\n',
     "analyzers.forgetting.suites: unknown eval suite 'gsm8k'; declare it under "
     "[[eval_suites]] (known: mmlu)"),
    ('[analyzers.business_flat]\nsuites = ["biz"]\n',
     "unknown eval suite 'biz'; declare it under [[eval_suites]] (none is declared yet)"),
    ('[[eval_suites]]\nname = "mm lu"\nmetric_prefix = "eval/mmlu/"\n',
     "eval suite name 'mm lu': use letters, digits"),
])
def test_config_check_says_in_one_line_what_to_fix(tmp_path, capsys, text, says):
    (tmp_path / "mmlu.jsonl").write_text('{"prompt": "2+2?"}\n')
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_settings(path, env={})
    message = str(err.value)
    assert says.format(tmp=tmp_path) in message and "\n" not in message
    assert message.startswith(str(path))
    assert main(["--config", str(path), "config", "check"]) != 0


def test_a_file_suite_is_read_from_the_config_folder_and_versioned_by_its_content(
        tmp_path, monkeypatch, capsys):
    (tmp_path / "evals").mkdir()
    suite = tmp_path / "evals" / "mmlu.jsonl"
    suite.write_text('{"prompt": "2+2?", "answer": "4"}\n')
    path = write(tmp_path, '[[eval_suites]]\nname = "mmlu"\nfile = "evals/mmlu.jsonl"\n'
                           '[[eval_suites]]\nname = "biz"\nmetric_prefix = "eval/business/"\n'
                           'version = "v7"\n'
                           '[analyzers.forgetting]\nsuites = ["mmlu"]\n'
                           '[analyzers.business_flat]\nsuites = ["biz"]\n')
    monkeypatch.chdir(tmp_path / "evals")  # not where the config is
    settings = load_settings(path, env={})
    mmlu, biz = settings.config.eval_suites
    expected = hashlib.sha256(suite.read_bytes()).hexdigest()[:12]
    assert mmlu.current_version() == expected and mmlu.prefix == "eval/mmlu/"
    assert biz.current_version() == "v7"
    # the analyzers get each suite's prefix
    assert settings.config.analyzer_settings() == {
        "forgetting": {"suites": {"mmlu": "eval/mmlu/"}},
        "business_flat": {"suites": {"biz": "eval/business/"}}}
    suite.write_text('{"prompt": "2+3?", "answer": "5"}\n')
    assert mmlu.current_version() not in (expected, None)  # a new file is a new version
    assert main(["--config", str(path), "config", "check"]) == 0
    assert "eval_suite_versions" in capsys.readouterr().out


def log_lines(path, steps, accuracy, *, meta=None, mode="a"):
    lines = [json.dumps({"meta": meta})] if meta else []
    lines += [json.dumps({"step": int(s), "loss": 3.0 - 0.0002 * s, "time": 1.7e9 + s})
              for s in range(steps[0], steps[-1] + 1, 50)]
    lines += [json.dumps({"step": int(s), "eval/mmlu/accuracy": float(a),
                          "eval/loss": 1.2 + float(np.exp(-s / 1500)), "time": 1.7e9 + s})
              for s, a in zip(steps, accuracy, strict=True)]
    lines.sort(key=lambda line: json.loads(line).get("step", -1))
    with open(path, mode) as handle:
        handle.write("\n".join(lines) + "\n")


def engine_for(tmp_path, suite_text):
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    path = write(tmp_path, f'[[sources]]\npath = "{runs}"\n{suite_text}'
                           '[analyzers.forgetting]\nsuites = ["mmlu"]\n')
    settings = load_settings(path, env={"RUNWATCH_DB": str(tmp_path / "rw.db")})
    return Engine(settings), runs


def test_a_suite_file_that_changes_is_a_change_event_and_is_flagged_in_compare(tmp_path):
    suite = tmp_path / "mmlu.jsonl"
    suite.write_text('{"prompt": "2+2?"}\n')
    engine, runs = engine_for(tmp_path, '[[eval_suites]]\nname = "mmlu"\nfile = "mmlu.jsonl"\n')
    evals = np.arange(250, 3001, 250)
    log_lines(runs / "exp1.jsonl", evals, np.full(len(evals), 0.62), mode="w")
    engine.poll(dispatch=False)
    old = hashlib.sha256(suite.read_bytes()).hexdigest()[:12]
    assert engine.store.suite_marks("exp1", 1) == {"mmlu": [[None, old]]}

    suite.write_text('{"prompt": "harder: 17*23?"}\n')
    new = hashlib.sha256(suite.read_bytes()).hexdigest()[:12]
    # exp1 is resumed from step 2000 (a new attempt); exp2 starts on the new suite
    later = np.arange(2000, 4001, 250)
    log_lines(runs / "exp1.jsonl", later, np.full(len(later), 0.55))
    log_lines(runs / "exp2.jsonl", evals, np.full(len(evals), 0.55), mode="w")
    engine.poll(dispatch=False)

    report = what_changed(engine.store, "exp1")
    [event] = [c for c in report.changes if "eval_suites.mmlu" in c.changed]
    assert event.changed["eval_suites.mmlu"] == (old, new)
    assert event.attempt == 2 and event.step == 2000
    assert "eval_suites.mmlu" in event.variables
    between = what_changed(engine.store, "exp2", "exp1")  # both now on the new version
    assert all("eval_suites.mmlu" not in c.changed for c in between.changes)

    comparison = compare_runs(engine.store, "exp1", "exp2")
    lines = [c.line for c in comparison.suite_changes]
    assert lines == [f"eval suite mmlu changed version {old} → {new} (in exp1 at step 2000): "
                     f"numbers not compared"]
    assert lines[0] in compare_message(comparison, None).text
    # and a question asked in the thread hears of it as /run changes does
    from bot.qa.service import build_facts
    sheet = build_facts(engine.store, "exp1", "what changed?", visible=lambda run: True)
    said = [f.text for f in sheet.facts if f.kind == "change"]
    assert any('"eval_suites.mmlu"' in t and old in t and new in t and "step 2000" in t
               for t in said), said


def test_a_version_the_log_declares_mid_run_restarts_forgetting_at_its_step(tmp_path):
    """RunLogger writes the suite's version in the meta line of each attempt; a relaunch
    that resumes past the last step (no step goes back) on a new suite version is seen,
    and forgetting compares only within the version."""
    from connectors.training.torchloop import RunLogger

    engine, runs = engine_for(tmp_path, '[[eval_suites]]\nname = "mmlu"\n'
                                        'metric_prefix = "eval/mmlu/"\nversion = "cfg-1"\n')
    run_dir = runs / "exp3"
    noise = 0.003 * np.random.default_rng(2).standard_normal(24)

    def log_evals(logger, steps, level):
        for s in steps:
            logger.log(int(s), loss=3.0 - 0.0002 * s)
            logger.log(int(s), **{"eval/mmlu/accuracy": level + noise[int(s) // 250 % 24],
                                  "eval/loss": 1.2 + float(np.exp(-s / 1500))})

    with RunLogger(run_dir, versions=False, eval_suites={"mmlu": "a1b2"}) as logger:
        log_evals(logger, np.arange(250, 3001, 250), 0.62)
    engine.poll(dispatch=False)
    with RunLogger(run_dir, versions=False, step=3001, eval_suites={"mmlu": "c3d4"}) as logger:
        log_evals(logger, np.arange(3250, 6001, 250), 0.55)
    engine.poll(dispatch=False)

    data = engine.store.run_data("exp3")
    assert data.attempt == 1  # the relaunch went on from the last step
    assert data.meta["eval_suite_versions"] == {"mmlu": [[None, "a1b2"], [3250, "c3d4"]]}
    assert not [f for f in engine.analyze("exp3") if f.signal == "forgetting"]
    # the same numbers without the record of the change: 0.62 → 0.55 reads as forgetting
    blind = RunData(run="exp3", metrics=data.metrics, meta={})
    assert [f.onset_step for f in Forgetting(suites=["mmlu"]).detect(blind)] == [3250]
    [event] = what_changed(engine.store, "exp3").changes
    assert event.changed == {"eval_suites.mmlu": ("a1b2", "c3d4")} and event.step == 3250
    # the config's version never overrides what the log declared
    assert {r["source"] for r in engine.store.suite_history("exp3")} == {"log"}


def test_a_version_declared_in_a_read_without_points_holds_from_the_next_step(tmp_path):
    engine, runs = engine_for(tmp_path, '[[eval_suites]]\nname = "mmlu"\n'
                                        'metric_prefix = "eval/mmlu/"\n')
    log = runs / "exp4.jsonl"
    steps = np.arange(100, 1001, 100)
    log_lines(log, steps, np.full(len(steps), 0.6), meta={"eval_suites": {"mmlu": "a1"}},
              mode="w")
    engine.poll(dispatch=False)
    with open(log, "a") as handle:
        handle.write(json.dumps({"meta": {"eval_suites": {"mmlu": "b2"}}}) + "\n")
    engine.poll(dispatch=False)
    assert engine.store.suite_marks("exp4", 1) == {"mmlu": [[None, "a1"], [1001, "b2"]]}


def test_a_new_suite_version_reaches_the_alert_line_and_the_digest(tmp_path):
    """The alert's "changed since …" line and the digest's "settings changed" ask the same
    changes service as `/run changes`: an eval suite's new version is among them."""
    from bot.services.digest import build_digest
    from bot.views.alerts import alert_message
    from bot.views.digest import digest_message
    from connectors.training.torchloop import RunLogger

    engine, runs = engine_for(tmp_path, '[[eval_suites]]\nname = "mmlu"\n'
                                        'metric_prefix = "eval/mmlu/"\n')

    def log(logger, steps, spike_at=None):
        for s in steps:
            logger.log(s, loss=60.0 if s == spike_at else 2.0 + 1.0 / s)
            if s % 10 == 0:
                logger.log(s, **{"eval/mmlu/accuracy": 0.6})

    with RunLogger(runs / "exp5", versions=False, eval_suites={"mmlu": "a1"}) as logger:
        log(logger, range(1, 61))
    engine.poll(dispatch=False)
    with RunLogger(runs / "exp5", versions=False, step=60, eval_suites={"mmlu": "b2"}) as logger:
        log(logger, range(61, 81), spike_at=75)
    engine.poll(dispatch=False)

    [spike] = [f for f in engine.store.findings("exp5") if f["signal"] == "spike"]
    line = "at step 61: eval suite mmlu a1 → b2"
    assert json.loads(spike["data"])["evidence"]["changed_before"] == line
    assert f"changed since the previous attempt {line}" in \
        json.dumps(alert_message(spike).blocks, ensure_ascii=False)
    digest = build_digest(engine.store)
    assert [(run, c.changed) for run, c in digest.changed] == [
        ("exp5", {"eval_suites.mmlu": ("a1", "b2")})]
    assert "exp5 at step 61: eval suite mmlu a1 → b2" in digest_message(digest).text
