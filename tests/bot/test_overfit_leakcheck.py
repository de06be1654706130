"""An overfit alert puts the leakage check first (seed §3.3): what the check at the run's start
found, or "run the leakage check" when it never ran. Real RunLogger files, the real engine and
store, the real overfit analyzer."""

from __future__ import annotations

import json

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from connectors.training.torchloop import RunLogger
from tests.analyzers.test_overfit import eval_curve, train_loss


def _overfitting_run(run_dir, leakcheck=None) -> None:
    train, evals = train_loss(), eval_curve()
    with RunLogger(run_dir, total_steps=len(train), versions=False,
                   leakcheck=leakcheck) as logger:
        for step, loss in enumerate(train, 1):
            extra = {"eval_loss": float(evals[step])} if step in evals.index else {}
            logger.log(step, loss=float(loss), **extra)


def _first_fix(engine: Engine, run: str) -> str:
    [finding] = [f for f in engine.store.findings(run) if f["signal"] == "overfit"]
    return json.loads(finding["data"])["fixes"][0]["text"]


def test_the_first_fix_is_what_the_leakage_check_found_or_to_run_it(tmp_path):
    runs = tmp_path / "runs"
    train, eval_ = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train.write_text("".join(json.dumps({"text": f"the {i}th training example about birds"})
                             + "\n" for i in range(500)))
    eval_.write_text("".join(json.dumps({"text": t}) + "\n" for t in (
        "The 3th training example, about birds!", "the 41th training example about birds today",
        "something else entirely", "and one more held-out row")))
    _overfitting_run(runs / "leaky", {"train": train, "eval": eval_})
    _overfitting_run(runs / "unchecked")
    settings = Settings(config=Config(sources=[SourceConfig(path=str(runs))]),
                        secrets=Secrets(), config_path=None, db_path=str(tmp_path / "rw.db"))
    engine = Engine(settings)
    engine.poll()
    assert _first_fix(engine, "leaky").startswith(
        "Remove the 2 eval rows that are also in train (50.0% of eval")
    assert _first_fix(engine, "unchecked").startswith(
        "Run the leakage check first: `runwatch leakcheck TRAIN EVAL`")
