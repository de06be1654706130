"""Golden series for the reward_hacking analyzer: exact onset, detection and resolve steps."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.reward_hacking import RewardHacking
from analyzers.stats.trend import trend

STEPS = np.arange(1, 3001)
EVALS = np.arange(100, 3001, 100)  # 30 judged evaluations
CHECKPOINTS = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in range(250, 3001, 250)]


def reward(rising: bool = True, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    trend = 0.5 + STEPS / 1000 if rising else 2.0 - STEPS / 2000
    return trend + 0.15 * rng.standard_normal(len(STEPS))


def kl(growing: bool = True, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    trend = 0.002 * STEPS if growing else np.full(len(STEPS), 3.0)
    return trend + 0.2 * rng.standard_normal(len(STEPS))


def judge(best_at: int | None = 1200, fall: float = 0.001, sd: float = 0.0,
          seed: int = 2) -> pd.Series:
    """A judged score rising to 7.5 at ``best_at``, then falling ``fall`` per step."""
    rng = np.random.default_rng(seed)
    top = EVALS.max() if best_at is None else best_at
    values = 7.0 + 0.5 * np.minimum(EVALS, top) / top - fall * (EVALS - top).clip(0)
    return pd.Series(values + sd * rng.standard_normal(len(EVALS)), index=EVALS)


def run(reward_values: np.ndarray | None, kl_values: np.ndarray | None,
        judge_series: pd.Series, *, tag: str = "eval/judge/score") -> RunData:
    series: dict[str, object] = {tag: judge_series}
    if reward_values is not None:
        series["reward"] = pd.Series(reward_values, index=STEPS)
    if kl_values is not None:
        series["kl"] = pd.Series(kl_values, index=STEPS)
    return RunData.from_series("run-1", series, checkpoints=CHECKPOINTS)


def test_reward_up_judge_down_kl_up_fires_with_its_numbers() -> None:
    [finding] = RewardHacking().detect(run(reward(), kl(), judge()))
    # Best 7.5 at 1200; 2% below it (7.35) from 1400 (7.30); two in a row by 1500.
    assert (finding.onset_step, finding.detected_step) == (1400, 1500)
    assert (finding.state, finding.severity, finding.metric) == (
        "firing", "warning", "eval/judge/score")
    assert finding.summary == (
        "reward rose 1.03 → 1.97 and kl grew 1.09 → 2.90 over steps 500–1500, while "
        "eval/judge/score fell 7.50 at step 1200 (best) → 7.20 at step 1500 (-4.0%), 2% or "
        "more below its best for 2 evaluations in a row")
    evidence = finding.evidence
    # The trends span the last ten judged evaluations, from before the best on.
    assert (evidence["best_step"], evidence["window_steps"]) == (1200, [500, 1500])
    assert evidence["reward"]["mann_kendall_z"] >= 1.645
    assert evidence["kl"]["mann_kendall_z"] >= 1.645
    assert [s for s, _ in evidence["evaluations"]] == [1200, 1300, 1400, 1500]
    assert finding.rollback_to.step == 1000  # the checkpoint at or before the best
    spec = CATALOG["reward_hacking"]
    assert finding.fixes == list(spec.fixes)
    assert finding.fixes[0].text == "Raise the KL coefficient"
    json.dumps(finding.to_dict(), allow_nan=False)


def test_all_three_are_required() -> None:
    # KL flat: the judged set is just noisy, or something else broke.
    assert RewardHacking().detect(run(reward(), kl(growing=False), judge())) == []
    # Reward falling too: the run is getting worse as a whole.
    assert RewardHacking().detect(run(reward(rising=False), kl(), judge())) == []
    # Judged eval holding: healthy RL.
    assert RewardHacking().detect(run(reward(), kl(), judge(None))) == []
    # A series missing altogether.
    assert RewardHacking().detect(run(reward(), None, judge())) == []
    assert RewardHacking().detect(run(None, kl(), judge())) == []


def test_a_slow_steady_rise_is_seen_over_ten_evaluations() -> None:
    """Since a recent best the reward has risen by less than its noise; it has kept rising
    for longer than that, and over the last ten evaluations the rise is plain."""
    rng = np.random.default_rng(3)
    slow = 0.5 + STEPS / 10_000 + 0.15 * rng.standard_normal(len(STEPS))
    since_best = trend(slow[(STEPS >= 1200) & (STEPS <= 1500)])
    assert since_best is not None and since_best.z < 1.645
    [finding] = RewardHacking().detect(run(slow, kl(), judge()))
    assert (finding.onset_step, finding.detected_step) == (1400, 1500)
    assert finding.evidence["reward"]["mann_kendall_z"] >= 1.645


def test_a_reward_that_turned_down_since_the_best_is_not_hacking() -> None:
    """The reward rose for a long time, then fell from the judged eval's best on: over the
    last ten evaluations it still rises, but the run is getting worse, not gamed."""
    rng = np.random.default_rng(4)
    turned = np.where(STEPS <= 1200, 0.5 + STEPS / 1000, 1.7 - (STEPS - 1200) / 500)
    turned += 0.15 * rng.standard_normal(len(STEPS))
    window = (STEPS >= 500) & (STEPS <= 1500)
    assert trend(turned[window]).z >= 1.645
    assert RewardHacking().detect(run(turned, kl(), judge())) == []


def test_one_bad_judged_evaluation_does_not_fire() -> None:
    values = judge(None)
    values[2000] = 6.5
    assert RewardHacking().detect(run(reward(), kl(), values)) == []
    assert RewardHacking(patience=1).detect(run(reward(), kl(), values))[0].onset_step == 2000


def test_it_resolves_when_the_judged_eval_recovers() -> None:
    values = judge()
    values[values.index >= 1900] = 7.45  # KL coefficient raised at 1800
    [finding] = RewardHacking().detect(run(reward(), kl(), values))
    assert (finding.onset_step, finding.detected_step) == (1400, 1500)
    assert (finding.state, finding.resolved_step) == ("resolved", 1900)


def test_the_warm_up_is_not_judged() -> None:
    """Early RL: the judged score dips at the first evaluations while the policy moves."""
    values = judge(None)
    values[[300, 400]] = 6.5
    assert RewardHacking(patience=1, grace_period=4).detect(run(reward(), kl(), values)) == []
    # Judged: the reward's trend over 100–300 is too weak (z 1.4), over 100–400 it holds.
    [finding] = RewardHacking(patience=1).detect(run(reward(), kl(), values))
    assert (finding.onset_step, finding.detected_step, finding.state) == (400, 400, "resolved")


def test_lower_is_better_judged_metrics() -> None:
    loss_like = pd.Series(1.0 + 1e-3 * (EVALS - 1200).clip(0), index=EVALS)
    [finding] = RewardHacking().detect(run(reward(), kl(), loss_like,
                                           tag="eval/judge/rejection_loss"))
    assert finding.metric == "eval/judge/rejection_loss"
    assert (finding.onset_step, finding.detected_step) == (1300, 1400)


def test_the_trend_window_is_bounded() -> None:
    """A best long ago: the reward and KL trends span the last ten judged evaluations."""
    values = judge(300, fall=2e-4)
    [finding] = RewardHacking().detect(run(reward(), kl(), values))
    assert finding.evidence["best_step"] == 300
    assert finding.evidence["window_steps"][0] >= finding.detected_step - 1000


@pytest.mark.parametrize(("params", "name"), [
    ({"metric": ""}, "metric"),
    ({"judge_metric": ""}, "judge_metric"),
    ({"kl_metric": None}, "kl_metric"),
    ({"min_drop": 0}, "min_drop"),
    ({"patience": 0}, "patience"),
    ({"trend_z": -1}, "trend_z"),
    ({"grace_period": 1.5}, "grace_period"),
])
def test_bad_parameters_are_rejected(params: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        RewardHacking(**params)
