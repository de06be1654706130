"""A non-finite value in any metric that matters is a critical spike at once (issue 22:
an HF run with ``eval_loss`` NaN at every evaluation and a finite train loss got nothing)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.spike import Spike

CHECKPOINTS = [Checkpoint(500, "ckpt/checkpoint-500"), Checkpoint(1500, "ckpt/checkpoint-1500")]


def loss(n: int = 300, seed: int = 0) -> pd.Series:
    """A healthy falling train loss logged every 10 steps (10, 20, …)."""
    rng = np.random.default_rng(seed)
    values = 1.0 + 2.0 * np.exp(-np.arange(n) / 100) + 0.02 * rng.standard_normal(n)
    return pd.Series(values, index=10 * np.arange(1, n + 1))


def run(**series: pd.Series) -> RunData:
    series = {"train/loss": loss(), **series}
    return RunData.from_series("run-1", {k.replace("__", "/"): v for k, v in series.items()},
                               checkpoints=CHECKPOINTS)


def every(step: int, values: list[float] | np.ndarray, n: int | None = None) -> pd.Series:
    values = np.asarray(values, dtype=float)
    return pd.Series(values, index=step * np.arange(1, len(values) + 1))


def test_a_nan_eval_loss_at_every_evaluation_is_critical_with_the_eval_fixes() -> None:
    [finding] = Spike().detect(run(eval__loss=every(200, [np.nan] * 15)))
    assert (finding.metric, finding.severity, finding.onset_step, finding.detected_step,
            finding.state) == ("eval/loss", "critical", 200, 200, "firing")
    assert finding.fixes == list(CATALOG["spike"].eval_fixes)
    assert finding.rollback_to is None  # the weights may be fine
    assert finding.summary == ("eval/loss became NaN at step 200 (no earlier finite value); "
                               "non-finite at 15 of the 15 points since; train/loss is "
                               "finite there: check the eval before the weights")


@pytest.mark.parametrize("tag", ["reward", "kl", "act_loss", "cri_loss", "val_ppl",
                                 "eval/perplexity", "rewards/chosen"])
def test_a_non_finite_value_in_any_metric_that_matters_fires_at_once(tag: str) -> None:
    values = 0.5 + 0.01 * np.random.default_rng(1).standard_normal(300)
    values[180] = np.inf
    [finding] = Spike().detect(run(**{tag: every(10, values)}))
    assert (finding.metric, finding.severity, finding.onset_step, finding.detected_step) == (
        tag, "critical", 1810, 1810)
    assert finding.state == "resolved" and finding.resolved_step == 1860
    eval_tag = tag in ("val_ppl", "eval/perplexity")
    assert finding.fixes == list(CATALOG["spike"].eval_fixes if eval_tag
                                 else CATALOG["spike"].fixes)
    assert (finding.rollback_to is None) == eval_tag
    if not eval_tag:
        assert finding.rollback_to.step == 1500


def test_a_single_overflowed_grad_norm_is_routine_two_in_a_row_are_not() -> None:
    norm = 0.3 + 0.01 * np.random.default_rng(2).standard_normal(300)
    norm[[60, 140]] = np.inf  # fp16 overflow: the scaler skips the update
    assert Spike().detect(run(grad_norm=every(10, norm))) == []
    norm[200:202] = np.nan
    [finding] = Spike().detect(run(grad_norm=every(10, norm)))
    assert (finding.metric, finding.onset_step, finding.detected_step, finding.severity) == (
        "grad_norm", 2010, 2020, "critical")


def test_the_fp16_scalers_overflows_of_the_first_steps_are_the_warm_up() -> None:
    norm = 0.3 + 0.01 * np.random.default_rng(3).standard_normal(300)
    norm[:6] = np.inf
    assert Spike().detect(run(grad_norm=every(10, norm))) == []


def test_one_blow_up_is_said_once_by_the_loss() -> None:
    train = loss()
    train.iloc[200:] = np.nan
    norm = every(10, np.r_[np.full(199, 0.3), np.full(101, np.nan)])  # one point earlier
    evals = every(200, np.r_[np.full(10, 1.2), np.full(5, np.nan)])
    findings = Spike().detect(run(train__loss=train, grad_norm=norm, eval__loss=evals))
    assert [(f.metric, f.onset_step) for f in findings] == [("train/loss", 2010)]


@pytest.mark.parametrize("tag", ["loss_scale", "eval_runtime", "eval/general/accuracy"])
def test_metrics_that_do_not_matter_are_not_watched(tag: str) -> None:
    assert Spike().detect(run(**{tag: every(10, np.r_[np.ones(50), np.inf, np.ones(50)])})) == []


def test_the_tags_can_be_chosen() -> None:
    data = run(eval__loss=every(200, [np.nan] * 15), reward=every(10, [np.nan] * 3))
    assert Spike(nonfinite_tags=[]).detect(data) == []
    assert [f.metric for f in Spike(nonfinite_tags=["reward"]).detect(data)] == ["reward"]
    with pytest.raises(ValueError, match="nonfinite_tags"):
        Spike(nonfinite_tags="eval/loss")
    with pytest.raises(ValueError, match="nonfinite_tags"):
        Spike(nonfinite_tags=[""])


def test_an_episode_resolves_and_a_later_one_is_a_new_finding() -> None:
    values = np.full(40, 1.1)
    values[[5, 6, 30]] = np.nan
    findings = Spike().detect(run(eval__loss=every(50, values)))
    assert [(f.onset_step, f.state, f.resolved_step) for f in findings] == [
        (300, "resolved", 600), (1550, "resolved", 1800)]


def test_an_hf_trainer_state_with_nan_eval_loss_reaches_spike_as_nan(tmp_path) -> None:
    """The reader keeps ``"eval_loss": NaN`` (a value, not an error); it went unreported
    because spike read the train loss alone."""
    import json

    from connectors.registry import open_source

    history = []
    for s in range(10, 2001, 10):
        history.append({"step": s, "epoch": s / 2000, "loss": 1.0 + np.exp(-s / 500),
                        "learning_rate": 1e-4, "grad_norm": 0.8})
        if s % 200 == 0:
            history.append({"step": s, "epoch": s / 2000, "eval_loss": float("nan"),
                            "eval_runtime": 3.1})
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"log_history": history, "global_step": 2000}))
    batch = open_source(str(path)).discover()[0].read(final=True)
    data = RunData(run="hf", metrics=batch.points, checkpoints=batch.checkpoints,
                   meta=batch.meta)
    assert np.isnan(data.series("eval/loss").to_numpy()).all()
    [finding] = Spike().detect(data)
    assert (finding.metric, finding.severity, finding.onset_step) == ("eval/loss", "critical",
                                                                      200)
