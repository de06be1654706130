"""`/run stoploss`: a rule declared before (or during) the run, stored in the run's metadata in a
real SQLite store, applied by the real `diminishing_returns` analyzer on the next poll."""

from __future__ import annotations

import json

import pytest

from bot.commands import handle_run_command
from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from bot.services.stoploss import RuleError, parse_rule
from connectors.training.torchloop import RunLogger


def _eval_loss(evaluation: int) -> float:
    return 3.0 - 0.2 * min(evaluation, 6) - 0.0001 * evaluation  # flat after 6 evaluations


def _log(run_dir, steps: range) -> None:
    with RunLogger(run_dir, config={"lr": 1e-3}, versions=False) as logger:
        for step in steps:
            metrics = {"loss": 2.0}
            if step % 10 == 0:
                metrics["eval_loss"] = _eval_loss(step // 10)
            logger.log(step, **metrics)


def _stop_loss(engine: Engine, run: str) -> list[dict]:
    return [f for f in engine.store.findings(run) if f["signal"] == "diminishing_returns"]


@pytest.fixture
def engine(tmp_path):
    _log(tmp_path / "runs" / "exp1", range(1, 121))
    settings = Settings(config=Config(sources=[SourceConfig(path=str(tmp_path / "runs"))]),
                        secrets=Secrets(), config_path=None, db_path=str(tmp_path / "rw.db"))
    engine = Engine(settings)
    engine.poll()
    return engine


def test_a_declared_rule_is_stored_shown_and_makes_the_finding_a_warning(engine, tmp_path):
    before = _stop_loss(engine, "exp1")
    assert before and {f["severity"] for f in before} == {"info"}  # runwatch's default rule
    shown = handle_run_command("stoploss exp1", engine.store)
    assert "none declared" in shown.text
    reply = handle_run_command('stoploss exp1 "4 evals < 1% on eval/loss"', engine.store)
    assert reply.kind == "stoploss" and "4 evaluations < 1.00% on eval/loss" in reply.text
    meta = json.loads(engine.store.run("exp1")["meta"])
    assert meta["runwatch_stop_loss"] == {"evaluations": 4, "min_improvement": 0.01,
                                          "metric": "eval/loss"}
    assert meta["stop_loss_declared"]["by"] == "console"
    _log(tmp_path / "runs" / "exp1", range(121, 161))  # the run goes on
    engine.poll()
    after = _stop_loss(engine, "exp1")
    assert {f["severity"] for f in after if f["state"] != "resolved"} == {"warning"}
    assert "declared by console" in handle_run_command("stoploss exp1", engine.store).text
    status = handle_run_command("status exp1", engine.store)
    assert "stop-loss 4 evaluations < 1.00% on eval/loss" in status.text


def test_bad_rules_and_unknown_runs_get_one_line(engine):
    reply = handle_run_command('stoploss exp1 "whenever it feels slow"', engine.store)
    assert reply.kind == "help" and "write it as" in reply.text
    assert handle_run_command('stoploss nope "3 evals < 1%"', engine.store).kind == "error"
    assert "runwatch_stop_loss" not in json.loads(engine.store.run("exp1")["meta"] or "{}")


@pytest.mark.parametrize("text, rule", [
    ("3 evals < 0.5% on eval/loss", {"evaluations": 3, "min_improvement": 0.005,
                                     "metric": "eval/loss"}),
    ("5 evaluations under 2%", {"evaluations": 5, "min_improvement": 0.02}),
    ("2 eval < 1% on eval/business/pass_rate max",
     {"evaluations": 2, "min_improvement": 0.01, "metric": "eval/business/pass_rate",
      "mode": "max"}),
    ("off", {"enabled": False}),
])
def test_rules_are_read_as_teams_write_them(text, rule):
    assert parse_rule(text) == rule


def test_a_rule_the_analyzer_would_refuse_is_refused_here():
    with pytest.raises(RuleError, match="min_improvement"):
        parse_rule("3 evals < 150%")
