"""RL reward collapse and the actor/critic loss bursts before it (issue 22: a DeepSpeed-Chat
step-3 log, ``act_loss``/``cri_loss`` bursting to 5–6× their level, then ``average reward
score`` halving), on synthetic series; and healthy RL runs that stay silent."""

from __future__ import annotations

import numpy as np
import pytest

from analyzers import RunData
from analyzers.catalog import CATALOG
from analyzers.divergence import Divergence
from analyzers.reward_collapse import RewardCollapse


def rising(n: int = 600, start: float = 1.0, end: float = 2.0, noise: float = 0.05,
           seed: int = 0) -> np.ndarray:
    """A reward that rises from ``start`` to ``end`` over the first 200 points, then holds,
    with noise as a share of the range's scale."""
    rng = np.random.default_rng(seed)
    scale = max(abs(start), abs(end))
    return (start + (end - start) * np.minimum(np.arange(n) / 200, 1.0)
            + noise * scale * rng.standard_normal(n))


def ppo(seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Reward 1 → 2, then at point 400 the critic and actor losses burst to 5.5x their
    level over five points and the reward halves from point 410."""
    rng = np.random.default_rng(seed + 100)
    n = 600
    reward = rising(seed=seed) * scale
    reward[410:] -= scale * np.r_[np.linspace(0, 1.1, 6), np.full(n - 416, 1.1)]
    critic = 0.2 * (1 + 0.1 * rng.standard_normal(n))
    actor = 0.05 * (1 + 0.1 * rng.standard_normal(n))
    for loss in (critic, actor):
        loss[400:420] *= np.r_[np.geomspace(1.5, 5.5, 5), np.full(15, 5.5)]
    return {"reward": reward, "cri_loss": critic, "act_loss": actor}


def run(series: dict[str, np.ndarray]) -> RunData:
    """Point ``i`` at step ``10 * (i + 1)``."""
    n = len(next(iter(series.values())))
    return RunData.from_series("ppo-1", series, steps=10 * np.arange(1, n + 1))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_a_reward_halving_after_a_loss_burst_is_found_at_any_scale(scale: float) -> None:
    [finding] = RewardCollapse().detect(run(ppo(scale=scale)))
    assert (finding.metric, finding.severity, finding.state) == ("reward", "warning", "firing")
    assert 4110 <= finding.onset_step <= finding.detected_step <= 4200
    assert finding.fixes == list(CATALOG["reward_collapse"].fixes)
    assert {b["metric"] for b in finding.evidence["loss_bursts"]} == {"act_loss", "cri_loss"}
    assert "after a burst of " in finding.summary
    assert 0.45 <= finding.evidence["drop"] <= 0.8  # at its lowest point, noise included


def test_the_loss_bursts_are_divergence_findings_of_their_tags() -> None:
    findings = Divergence().detect(run(ppo()))
    assert sorted((f.metric, f.severity) for f in findings) == [
        ("act_loss", "critical"), ("cri_loss", "critical")]
    assert all(4000 <= f.onset_step <= f.detected_step <= 4080 for f in findings)


def test_a_negative_reward_that_falls_further_is_a_collapse() -> None:
    """DeepSpeed-Chat rewards are often negative: -3 → -1, then back down to -2.5."""
    reward = rising(start=-3.0, end=-1.0, noise=0.01)
    reward[400:] -= np.r_[np.linspace(0, 1.5, 5), np.full(195, 1.5)]
    [finding] = RewardCollapse().detect(run({"reward": reward}))
    assert finding.severity == "critical"  # more than its level's whole magnitude
    assert 4010 <= finding.onset_step <= finding.detected_step <= 4100


def test_the_reward_is_read_under_deepspeed_chats_name_when_no_alias_maps_it() -> None:
    series = ppo()
    series["average reward score"] = series.pop("reward")
    [finding] = RewardCollapse().detect(run(series))
    assert finding.metric == "average reward score"


def test_a_dip_that_comes_back_resolves() -> None:
    reward = rising(noise=0.02)
    reward[400:440] -= 1.2
    [finding] = RewardCollapse().detect(run({"reward": reward}))
    assert finding.state == "resolved" and 4400 <= finding.resolved_step <= 4500


# -- healthy RL runs stay silent ----------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_a_noisy_rising_reward_is_quiet(seed: int) -> None:
    assert RewardCollapse().detect(run({"reward": rising(noise=0.2, seed=seed)})) == []


@pytest.mark.parametrize("seed", range(3))
def test_a_reward_around_zero_is_quiet(seed: int) -> None:
    rng = np.random.default_rng(seed)
    reward = 0.3 * rng.standard_t(4, 2000)
    assert RewardCollapse().detect(run({"reward": reward})) == []


def test_dpos_chosen_reward_drifting_down_from_zero_is_no_collapse() -> None:
    """DPO's implicit reward of the chosen answers often falls from 0 in healthy runs: it
    never rose, so there is nothing to collapse from."""
    rng = np.random.default_rng(3)
    reward = -np.linspace(0, 2.0, 800) + 0.1 * rng.standard_normal(800)
    assert RewardCollapse().detect(run({"reward": reward})) == []


def test_a_slowly_saturating_reward_with_a_late_small_dip_is_quiet() -> None:
    reward = rising(noise=0.05, seed=9)
    reward[450:480] -= 0.4  # -20%: a dip, not a collapse
    assert RewardCollapse().detect(run({"reward": reward})) == []


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"window": 2}, "window"),
    ({"min_drop": 0}, "min_drop"),
    ({"threshold": -1.0}, "threshold"),
    ({"critical_drop": 0}, "critical_drop"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        RewardCollapse(**kwargs)
