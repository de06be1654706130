"""Golden series for the forgetting analyzer: exact onset, detection and resolve steps."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.forgetting import Forgetting

EVALS = np.arange(0, 5001, 250)  # 21 evaluations
CHECKPOINTS = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in range(500, 5001, 500)]


def general(drop_from: int | None = 2000, per_step: float = 5e-5, level: float = 0.60,
            sd: float = 0.0, seed: int = 0) -> pd.Series:
    """A general-suite accuracy, flat at ``level`` until ``drop_from``, then falling."""
    values = level - (per_step * (EVALS - drop_from).clip(0) if drop_from is not None else 0)
    values = values + sd * np.random.default_rng(seed).standard_normal(len(EVALS))
    return pd.Series(values, index=EVALS)


def domain_loss(falling: bool = True) -> pd.Series:
    return pd.Series(1.2 + np.exp(-EVALS / 1000) if falling else np.full(len(EVALS), 2.2),
                     index=EVALS)


def run(general_series: pd.Series, domain: pd.Series | None = None, *,
        tag: str = "eval/general/accuracy", meta: dict | None = None, **extra) -> RunData:
    series = {tag: general_series, "eval/loss": domain_loss() if domain is None else domain,
              **extra}
    return RunData.from_series("run-1", series, checkpoints=CHECKPOINTS, meta=meta)


def test_general_drop_while_domain_improves_fires_with_its_numbers() -> None:
    [finding] = Forgetting().detect(run(general()))
    # 0.60 until 2000, then -0.0125 per evaluation: -2.1% at 2250, three in a row by 2750.
    assert (finding.onset_step, finding.detected_step) == (2250, 2750)
    assert (finding.state, finding.severity, finding.metric) == (
        "firing", "warning", "eval/general/accuracy")
    assert finding.summary == (
        "eval/general/accuracy 0.6 at its first evaluation (step 0) → 0.562 at step 2750, "
        "-6.2% (tolerance 2.0%), below tolerance for 3 evaluations in a row, while eval/loss "
        "improved 2.20 → 1.28 (-41.7%)")
    evidence = finding.evidence
    assert evidence["baseline_source"] == "first evaluation"
    assert evidence["last_good_step"] == 2000
    assert evidence["domain"]["tag"] == "eval/loss"
    assert [s for s, _, _ in evidence["evaluations"]][-4:] == [2000, 2250, 2500, 2750]
    # The checkpoint at the last evaluation still within tolerance.
    assert (finding.rollback_to.step, finding.rollback_to.path) == (2000, "ckpt/checkpoint-2000")
    assert "within tolerance" in finding.rollback_to.reason
    spec = CATALOG["forgetting"]
    assert finding.fixes == list(spec.fixes) and finding.fixes[0].text.startswith("Mix")
    assert (finding.kind, finding.source) == ("not_learning", spec.source)
    json.dumps(finding.to_dict(), allow_nan=False)


def test_the_baseline_can_come_from_the_run_metadata() -> None:
    """The base model scored 0.70: the run is below it from its first evaluation on, and
    is judged as soon as the domain eval has a second evaluation to show progress."""
    [finding] = Forgetting().detect(run(general(None), meta={"baseline": {
        "eval/general/accuracy": "0.70"}}))
    assert (finding.onset_step, finding.detected_step) == (250, 750)
    assert finding.evidence["baseline_source"] == "meta"
    assert finding.summary.startswith("eval/general/accuracy 0.7 at the run's baseline → 0.6 "
                                      "at step 750, -14.3% (tolerance 4.0%)")
    assert finding.rollback_to is None  # no evaluation was ever within tolerance
    # A baseline that is not a number is ignored: the first evaluation is the baseline.
    assert Forgetting().detect(run(general(None), meta={"baseline": {
        "eval/general/accuracy": "n/a"}})) == []


def test_no_finding_when_the_domain_eval_does_not_improve() -> None:
    """Everything getting worse is a divergence, not forgetting."""
    assert Forgetting().detect(run(general(), domain_loss(falling=False))) == []
    assert Forgetting().detect(RunData.from_series(
        "run-1", {"eval/general/accuracy": general()})) == []


def test_a_noisy_suite_needs_a_drop_beyond_its_own_noise() -> None:
    """A small suite whose score wobbles by 2% (relative) around a flat level: a 2% drop is
    within its noise."""
    noisy = general(None, sd=0.012, seed=3)
    assert Forgetting().detect(run(noisy)) == []
    assert len(Forgetting(threshold=0).detect(run(noisy))) == 2  # without the noise guard
    # A real drop stands out of the same noise, against a tolerance widened by it.
    [finding] = Forgetting().detect(run(general(2000, per_step=2e-4, sd=0.012, seed=3)))
    assert (finding.onset_step, finding.detected_step) == (2500, 3000)
    assert finding.evidence["tolerance"] == pytest.approx(0.089, abs=0.001)


def test_a_single_bad_evaluation_does_not_fire() -> None:
    values = general(None)
    values[2500] = 0.50
    values[3000] = 0.55
    assert Forgetting().detect(run(values)) == []
    assert Forgetting(patience=1).detect(run(values))[0].onset_step == 2500


def test_it_resolves_when_the_general_suite_recovers() -> None:
    values = general()
    values[values.index >= 3500] = 0.598  # replay mixed in from step 3500
    [finding] = Forgetting().detect(run(values))
    assert (finding.onset_step, finding.detected_step) == (2250, 2750)
    # The median of the last three evaluations is back within 1% (half the tolerance) at 3750.
    assert (finding.state, finding.resolved_step) == ("resolved", 3750)


def test_loss_like_general_metrics_are_lower_is_better() -> None:
    rising = pd.Series(1.5 + 1e-4 * (EVALS - 2000).clip(0), index=EVALS)
    [finding] = Forgetting().detect(run(rising, tag="eval/general/wiki_loss"))
    assert finding.metric == "eval/general/wiki_loss"
    assert (finding.onset_step, finding.detected_step) == (2500, 3000)


def test_each_general_tag_is_judged_on_its_own() -> None:
    data = run(general(), **{"eval/general/mmlu": general(None, level=0.45)})
    [finding] = Forgetting().detect(data)
    assert finding.metric == "eval/general/accuracy"


def test_a_named_domain_metric_is_the_only_domain() -> None:
    data = run(general(), domain_loss(falling=False),
               **{"eval/business/pass_rate": pd.Series(0.3 + EVALS / 20000, index=EVALS)})
    assert Forgetting().detect(data)[0].evidence["domain"]["tag"] == "eval/business/pass_rate"
    assert Forgetting(domain_metric="eval/loss").detect(data) == []


def test_non_finite_evaluations_are_skipped() -> None:
    values = general()
    values[1000] = np.nan
    values[2500] = np.inf
    [finding] = Forgetting().detect(run(values))
    assert (finding.onset_step, finding.detected_step) == (2250, 3000)


@pytest.mark.parametrize(("params", "name"), [
    ({"metric": ""}, "metric"),
    ({"domain_metric": ""}, "domain_metric"),
    ({"min_drop": 0}, "min_drop"),
    ({"min_drop": 1.5}, "min_drop"),
    ({"threshold": -1}, "threshold"),
    ({"patience": 0}, "patience"),
    ({"min_gain": float("nan")}, "min_gain"),
])
def test_bad_parameters_are_rejected(params: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Forgetting(**params)
