"""Golden series for the business_flat analyzer: exact onset, detection and resolve steps."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analyzers import Checkpoint, RunData
from analyzers.business_flat import BusinessFlat
from analyzers.catalog import CATALOG

STEPS = np.arange(1, 6001)
EVALS = np.arange(0, 6001, 250)  # 25 business evaluations
CHECKPOINTS = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in range(500, 6001, 500)]


def falling_loss(sd: float = 0.03, seed: int = 0) -> np.ndarray:
    """A per-step train loss still falling steadily at the end: 2.4 → 1.1."""
    rng = np.random.default_rng(seed)
    return 0.9 + 1.5 * np.exp(-STEPS / 2500) + sd * rng.standard_normal(len(STEPS))


def flat_loss(seed: int = 0, phi: float = 0.95, sd: float = 0.03) -> np.ndarray:
    """A converged loss with autocorrelated noise (AR(1)): wanders, never trends."""
    rng = np.random.default_rng(seed)
    noise = np.zeros(len(STEPS))
    shocks = sd * np.sqrt(1 - phi**2) * rng.standard_normal(len(STEPS))
    for i in range(1, len(STEPS)):
        noise[i] = phi * noise[i - 1] + shocks[i]
    return 1.2 + noise


def business(plateau_from: int | None = 1500, slope: float = 1e-4, level: float = 0.30,
             after: float = 0.0, sd: float = 0.002, seed: int = 1) -> pd.Series:
    """A pass rate rising ``slope`` per step until ``plateau_from``, then ``after`` per step."""
    rng = np.random.default_rng(seed)
    stop = EVALS.max() if plateau_from is None else plateau_from
    values = level + slope * np.minimum(EVALS, stop) + after * (EVALS - stop).clip(0)
    return pd.Series(values + sd * rng.standard_normal(len(EVALS)), index=EVALS)


def run(loss: np.ndarray | None, business_series: pd.Series, *,
        tag: str = "eval/business/pass_rate", **extra) -> RunData:
    series = {tag: business_series, **extra}
    if loss is not None:
        series["train/loss"] = pd.Series(loss, index=STEPS)
    return RunData.from_series("run-1", series, checkpoints=CHECKPOINTS)


def test_loss_falling_while_the_business_metric_is_flat_fires_with_its_numbers() -> None:
    [finding] = BusinessFlat().detect(run(falling_loss(), business()))
    # The pass rate stops at 1500; four evaluations later (1750–2500) it has not gained 1%.
    assert (finding.onset_step, finding.detected_step) == (1750, 2500)
    assert (finding.state, finding.severity, finding.metric) == (
        "firing", "warning", "eval/business/pass_rate")
    assert finding.summary == (
        "train/loss fell 1.70 → 1.45 (-14.4%) over steps 1500–2500 (Kendall's tau -1.00), "
        "while eval/business/pass_rate stayed flat: a level of 0.451 over the last 4 "
        "evaluations, +0.4% on its best before them (0.449 at step 1500; progress needs +1%)")
    evidence = finding.evidence
    assert (evidence["best_step"], evidence["window_steps"]) == (1500, [1750, 2500])
    assert evidence["loss_trend"]["blocks"] == 10
    assert evidence["loss_trend"]["kendall_tau"] <= -0.6
    assert finding.rollback_to.step == 1500
    assert "trust the business metric" in finding.rollback_to.reason
    spec = CATALOG["business_flat"]
    assert finding.fixes == list(spec.fixes)
    assert finding.fixes[0].text == "Trust the business metric when they diverge"
    json.dumps(finding.to_dict(), allow_nan=False)


def test_a_falling_business_metric_fires_too_and_a_window_sooner() -> None:
    """A pass rate falling from its best at step 1500: the window may begin with that best
    (its level is already below the best before it), so the finding comes one evaluation
    sooner than for a flat one; the rollback goes to the best itself."""
    [finding] = BusinessFlat().detect(run(falling_loss(), business(after=-1e-4)))
    assert (finding.onset_step, finding.detected_step) == (1500, 2250)
    assert ("eval/business/pass_rate fell: a level of 0.401 over the last 4 evaluations, -5.9% "
            "on its best before them (0.426 at step 1250; progress needs +1%)") in finding.summary
    assert finding.rollback_to.step == 1500


def test_a_noisy_metric_that_stopped_is_judged_by_its_level_not_its_luckiest_value() -> None:
    """Evaluation noise of ~0.9%: one evaluation of the first window after the stop reads
    +1.7% on the best before it, which judged by the window's best would be progress; the
    window's level (+0.9%) is not, and the finding comes at the earliest evaluation."""
    [finding] = BusinessFlat().detect(run(falling_loss(), business(sd=0.004, seed=20)))
    assert (finding.onset_step, finding.detected_step) == (1750, 2500)
    best = finding.evidence["best_value"]
    assert max(v for _, v in finding.evidence["evaluations"][-4:]) > 1.01 * best
    assert finding.evidence["window_level"] < 1.01 * best


def test_one_broken_evaluation_does_not_make_a_rising_metric_flat() -> None:
    """A failed evaluation run logs 0 in a pass rate that keeps rising: the window's level is
    held at or above its second-worst evaluation, so the line through the broken one does
    not drag it below the best before."""
    values = business(None, slope=5e-5)
    values[3000] = 0.0
    assert BusinessFlat().detect(run(falling_loss(), values)) == []


def test_quiet_while_the_business_metric_improves_with_the_loss() -> None:
    assert BusinessFlat().detect(run(falling_loss(), business(None, slope=5e-5))) == []


def test_quiet_when_the_loss_has_converged_too() -> None:
    """A flat business metric beside a flat loss is a converged run (diminishing_returns),
    even when the loss's autocorrelated noise wanders for hundreds of steps."""
    for seed in range(5):
        assert BusinessFlat().detect(run(flat_loss(seed), business())) == []


def test_a_single_flat_stretch_shorter_than_the_window_does_not_fire() -> None:
    values = business(None, slope=5e-5)
    values[(values.index > 2000) & (values.index <= 2750)] = values[2000]  # 3 flat evals
    assert BusinessFlat().detect(run(falling_loss(), values)) == []


def test_it_resolves_when_the_business_metric_moves_again() -> None:
    values = business()
    values[values.index >= 4000] += 0.02  # +4.4% on the old best from step 4000, then flat
    first, again = BusinessFlat().detect(run(falling_loss(), values))
    assert (first.onset_step, first.detected_step) == (1750, 2500)
    assert (first.state, first.resolved_step) == ("resolved", 4000)
    # Flat again at its new level while the loss keeps falling: a new finding. A window
    # is judged against the best level of a window that ended before it began: the window
    # from 4250 against the one ending at 4000 (three evaluations from before the jump,
    # 1% and more below the new level), so the first flat window is the one from 4500,
    # judged against the window ending at 4250.
    assert (again.onset_step, again.detected_step, again.state) == (4500, 5250, "firing")
    assert again.evidence["reference_step"] == 4250


def test_a_metric_creeping_up_slower_than_the_resolve_rate_stays_flat() -> None:
    """After it stops, the pass rate creeps up 0.17% of its level per evaluation: in no
    window of four does it gain the 2% that resolves, so the finding stays firing, however
    far the creep gets in the end (past the old best + 2% by step 6000)."""
    values = business(after=3e-6)
    [finding] = BusinessFlat().detect(run(falling_loss(), values))
    assert (finding.onset_step, finding.detected_step, finding.state) == (1750, 2500, "firing")
    assert values.iloc[-1] > 1.02 * values[1500]


def test_eval_loss_stands_in_when_no_train_loss_is_logged() -> None:
    eval_loss = pd.Series(1.1 + np.exp(-EVALS / 2000), index=EVALS)
    [finding] = BusinessFlat().detect(run(None, business(), **{"eval/loss": eval_loss}))
    assert finding.evidence["loss_metric"] == "eval/loss"
    assert (finding.onset_step, finding.detected_step) == (1750, 2500)
    assert finding.evidence["loss_trend"]["blocks"] == 5  # one point per evaluation


def test_lower_is_better_business_metrics_and_each_tag_alone() -> None:
    error = pd.Series(0.5 - 1e-4 * np.minimum(EVALS, 1500), index=EVALS)
    data = run(falling_loss(), business(None, slope=5e-5),
               **{"eval/business/error_loss": error})
    [finding] = BusinessFlat().detect(data)
    assert finding.metric == "eval/business/error_loss"
    assert "a level of 0.35 over the last 4 evaluations" in finding.summary


def test_the_warm_up_never_begins_a_window() -> None:
    """Business flat from the start while the loss falls: the first window may begin only
    after ``grace_period`` evaluations."""
    flat = business(0)
    assert BusinessFlat().detect(run(falling_loss(), flat))[0].onset_step == 500
    assert BusinessFlat(grace_period=4).detect(run(falling_loss(), flat))[0].onset_step == 1250


@pytest.mark.parametrize(("params", "name"), [
    ({"metric": ""}, "metric"),
    ({"loss_metric": ""}, "loss_metric"),
    ({"min_improvement": 0}, "min_improvement"),
    ({"evaluations": 1}, "evaluations"),
    ({"min_loss_drop": -0.1}, "min_loss_drop"),
    ({"min_tau": 1.0}, "min_tau"),
    ({"grace_period": -1}, "grace_period"),
])
def test_bad_parameters_are_rejected(params: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        BusinessFlat(**params)


def noisy_falling_loss(seed: int = 2, sd: float = 0.06, phi: float = 0.9) -> np.ndarray:
    """A small-batch loss: falling 0.05 per 1000 steps (about 4%) under AR(1) noise of 5%."""
    rng = np.random.default_rng(seed)
    noise = np.zeros(len(STEPS))
    shocks = sd * np.sqrt(1 - phi**2) * rng.standard_normal(len(STEPS))
    for i in range(1, len(STEPS)):
        noise[i] = phi * noise[i - 1] + shocks[i]
    return 1.5 - 5e-5 * STEPS + noise


def test_the_loss_is_judged_over_the_whole_stretch_since_the_business_best() -> None:
    """Within any window of four evaluations this noisy loss never falls steadily enough;
    over the growing stretch since the business metric's best (step 1750) it does."""
    [finding] = BusinessFlat().detect(run(noisy_falling_loss(), business()))
    assert (finding.onset_step, finding.detected_step) == (2500, 3250)
    assert finding.evidence["best_step"] == 1750
    assert finding.evidence["loss_trend"]["steps"] == [1750, 3250]
    assert finding.evidence["window_steps"] == [2500, 3250]


def test_a_loss_wobbling_about_zero_is_not_a_falling_one() -> None:
    """A PPO or GRPO policy loss sits about 0, where any wobble is a large relative fall
    (noise alone read "fell 0.000686 → -0.00209 (-404.3%)"): a trend that stays within the
    loss's scatter of zero has no level to fall from. A loss that falls steadily through
    zero leaves that band and still counts."""
    evals = np.arange(100, 4001, 100)
    for seed in range(6):
        rng = np.random.default_rng(seed)
        loss = pd.Series(0.01 * rng.standard_normal(4000), index=np.arange(1, 4001))
        pass_rate = pd.Series(0.40 + 0.004 * rng.standard_normal(len(evals)), index=evals)
        data = RunData.from_series("run-1", {"train/loss": loss,
                                             "eval/business/pass_rate": pass_rate})
        assert BusinessFlat().detect(data) == [], seed
    through_zero = 0.3 - 1e-4 * STEPS + 0.01 * np.random.default_rng(0).standard_normal(
        len(STEPS))
    [finding] = BusinessFlat().detect(run(through_zero, business()))
    assert (finding.onset_step, finding.detected_step) == (1750, 2500)


def test_a_metric_that_keeps_rising_is_judged_level_against_level() -> None:
    """A pass rate rising 0.65% per evaluation (2.6% a window of four) with 0.6% noise,
    the loss falling all along: never flat. Its window's level measured against the best
    single evaluation before it (which sits about a noise deviation above the metric)
    came out under +1% twice in this run; against the best level before it, never."""
    rng = np.random.default_rng(14)
    steps = np.arange(1, 4001)
    loss = 2 * (steps + 100) ** -0.2 * (1 + 0.01 * rng.standard_normal(4000))
    at = np.arange(100, 4001, 100)
    rate = 0.5 * 1.0065 ** np.arange(len(at)) * (1 + 0.006 * rng.standard_normal(len(at)))
    data = RunData.from_series("run-1", {"train/loss": pd.Series(loss, index=steps),
                                         "eval/business/pass_rate": pd.Series(rate, index=at)})
    assert BusinessFlat().detect(data) == []


def test_a_business_loss_that_rose_says_so_in_its_own_direction() -> None:
    """A business loss (lower is better) at its best at 1500, then 6% higher: the summary
    says it rose, by +6.4% on its best, where progress needs -1% (not "fell -6.4%")."""
    rng = np.random.default_rng(3)
    values = 0.5 - 1e-4 * np.minimum(EVALS, 1500)
    values = np.where(EVALS > 1500, values * 1.06, values) + 0.001 * rng.standard_normal(
        len(EVALS))
    [finding] = BusinessFlat().detect(run(falling_loss(), pd.Series(values, index=EVALS),
                                          tag="eval/business/error_loss"))
    assert ("eval/business/error_loss rose: a level of 0.371 over the last 4 evaluations, "
            "+6.4% on its best before them (0.349 at step 1500; progress needs -1%)"
            ) in finding.summary
    assert finding.evidence["improvement"] == pytest.approx(-0.0636, abs=1e-4)
