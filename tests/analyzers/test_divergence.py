"""Instability episodes: several points in a row well above the loss's level, at any scale
and sign, and the healthy losses that must stay silent (issue 22)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.divergence import Divergence
from analyzers.spike import Spike


def ar1(n: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """Autocorrelated unit noise (a smoothed or per-epoch-averaged loss)."""
    shocks = rng.standard_normal(n) * np.sqrt(1 - rho ** 2)
    out = np.empty(n)
    out[0] = rng.standard_normal()
    for i in range(1, n):
        out[i] = rho * out[i - 1] + shocks[i]
    return out


def episode(n: int = 800, at: int = 400, rise: float = 2.7, rise_points: int = 8,
            hold: int = 20, back: int = 30, seed: int = 0) -> np.ndarray:
    """A loss near 1 with 8% autocorrelated noise that rises ``rise``-fold over
    ``rise_points`` logs, holds, then comes back over ``back`` logs (the summed CTC loss
    of issue 22: ≈ 890 → 2400 over eight logs, recovering on its own)."""
    rng = np.random.default_rng(seed)
    factor = np.ones(n)
    factor[at:at + rise_points] = np.geomspace(rise ** (1 / rise_points), rise, rise_points)
    factor[at + rise_points:at + rise_points + hold] = rise
    factor[at + rise_points + hold:at + rise_points + hold + back] = np.linspace(rise, 1, back)
    return (1 + 0.08 * ar1(n, 0.7, rng)) * factor


def run(values: np.ndarray, **extra: np.ndarray | pd.Series) -> RunData:
    """Point ``i`` at step ``10 * (i + 1)``."""
    return RunData.from_series("run-1", {"train/loss": values, **extra},
                               steps=10 * np.arange(1, len(values) + 1),
                               checkpoints=[Checkpoint(3000, "ckpt/checkpoint-3000")])


def episodes(values: np.ndarray, **extra: np.ndarray | pd.Series) -> list[tuple]:
    return [(f.metric, f.onset_step, f.detected_step, f.severity, f.state)
            for f in Divergence().detect(run(values, **extra))]


def reported(values: np.ndarray) -> list[tuple[str, int]]:
    """What the user gets: spike's findings and divergence's, by signal and onset."""
    data = run(values)
    return sorted((f.signal, f.onset_step) for a in (Spike(), Divergence())
                  for f in a.detect(data))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_an_episode_is_found_at_any_scale_with_the_same_steps(scale: float) -> None:
    values = episode(seed=0)
    assert Spike().detect(run(values * scale)) == []  # no single point stands out
    [finding] = Divergence().detect(run(values * scale))
    assert (finding.onset_step, finding.detected_step, finding.severity, finding.state,
            finding.resolved_step) == (4010, 4060, "critical", "resolved", 4600)  # its 1st point
    assert 2.7 <= finding.evidence["ratio"] <= 3.6  # the peak over the best level
    assert finding.fixes == list(CATALOG["divergence"].fixes)
    assert finding.rollback_to.step == 3000
    assert finding.summary.startswith("train/loss rose from its level ")
    assert finding.summary.endswith("back near its level from step 4560")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shift", [0.0, -2.0, -5.0])
def test_an_episode_is_reported_once_at_its_start_whatever_its_sign(seed: int,
                                                                     shift: float) -> None:
    """The same episode shifted below zero: a margin of its magnitude and of its noise
    (spike may take it first, on a linear scale: then divergence defers)."""
    values = episode(seed=seed, rise=6.0) + shift
    [(_, onset)] = reported(values)
    assert 4010 <= onset <= 4080


def test_a_small_loss_rising_tenfold_over_five_points_and_back_fifty_later() -> None:
    """0.0011 → 0.0118 over five logged points, back to normal fifty points later, on a
    per-batch loss whose hard batches stand out again and again (spike's recurrence guard
    calls a single point there routine): an episode is not one hard batch."""
    rng = np.random.default_rng(4)
    values = 0.0011 * np.exp(0.1 * rng.standard_normal(900))
    values[[100, 220, 330, 420, 470]] *= 12  # hard batches, one point each
    values[500:505] *= np.geomspace(1.6, 10.7, 5)
    values[505:550] *= 10.7
    assert [f.onset_step for f in Spike().detect(run(values))] == [1010, 2210, 3310]
    [finding] = Divergence().detect(run(values))
    assert (finding.onset_step, finding.detected_step, finding.state, finding.severity) == (
        5010, 5030, "resolved", "critical")
    assert finding.resolved_step == 5550


def test_a_loss_that_keeps_rising_stays_firing() -> None:
    rng = np.random.default_rng(1)
    values = 2.0 * (1 + 0.02 * rng.standard_normal(700))
    values[400:] *= np.linspace(1.0, 3.0, 300)  # +200% over 300 points, never back
    [finding] = Divergence().detect(run(values))
    assert finding.state == "firing" and finding.resolved_step is None
    assert 4010 <= finding.onset_step <= finding.detected_step <= 5200
    assert "it has not come back" in finding.summary


def test_an_rl_critic_loss_burst_is_an_episode_of_that_tag() -> None:
    rng = np.random.default_rng(2)
    critic = 0.05 * (1 + 0.1 * ar1(600, 0.6, rng))
    critic[300:320] *= np.r_[np.geomspace(1.5, 5.5, 5), np.full(15, 5.5)]
    loss = 1.0 + 0.01 * rng.standard_normal(600)
    findings = Divergence().detect(run(loss, cri_loss=critic))
    assert [(f.metric, f.severity) for f in findings] == [("cri_loss", "critical")]
    assert Divergence(other_metrics=[]).detect(run(loss, cri_loss=critic)) == []


def test_a_sudden_held_jump_is_spikes_and_not_reported_twice() -> None:
    rng = np.random.default_rng(3)
    values = 2.0 * (1 + 0.01 * rng.standard_normal(600))
    values[300:340] *= 4.0
    assert len(Spike().detect(run(values))) == 1
    assert Divergence().detect(run(values)) == []


# -- healthy losses stay silent ----------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_a_noisy_heavy_tailed_per_batch_loss_is_quiet(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 3000
    values = (0.8 + 2.0 * np.exp(-np.arange(n) / 600)) * np.exp(0.3 * rng.standard_t(3, n))
    assert episodes(values) == []


@pytest.mark.parametrize("seed", range(5))
def test_an_autocorrelated_smoothed_loss_is_quiet(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = 2.0 * (1 + 0.1 * ar1(3000, 0.95, rng))
    assert episodes(values) == []


@pytest.mark.parametrize("level", [1e-3, -1.0])
def test_a_near_zero_or_negative_noisy_loss_is_quiet(level: float) -> None:
    rng = np.random.default_rng(5)
    noise = np.exp(1.0 * rng.standard_normal(3000)) if level > 0 else 0.3 * rng.standard_t(
        4, 3000)
    assert episodes(level * noise if level > 0 else level + noise) == []


def test_a_smooth_long_run_is_quiet() -> None:
    rng = np.random.default_rng(6)
    n = 50_000
    t = np.arange(n)
    values = 2.2 + 8.0 * (1 + t / 200) ** -0.5 + 0.01 * rng.standard_normal(n)
    assert episodes(values) == []


def test_an_lr_warm_up_bump_is_quiet() -> None:
    """The loss falls, rises 60% while the LR climbs to its peak, then falls again."""
    rng = np.random.default_rng(7)
    n = 1200
    t = np.arange(n)
    values = 2.0 + 3.0 * np.exp(-t / 40) + 0.02 * rng.standard_normal(n)
    values[60:200] += 1.5 * np.sin(np.linspace(0, np.pi, 140))  # the bump
    lr = np.minimum(t / 200, 1.0) * 3e-4 * np.r_[np.ones(200), np.cos(
        np.linspace(0, np.pi / 2, n - 200))]
    assert episodes(values, lr=lr) == []
    # without a logged LR, a bump inside the grace period is not judged either
    assert Divergence(grace_period=200).detect(run(values)) == []


def test_a_loss_blowing_up_while_the_lr_still_ramps_is_caught() -> None:
    """The LR rises for the whole log (a long warm-up, or a ramp that never ends): the
    loss falls to its best level, then climbs tenfold as the LR gets too high. A warm-up
    is no excuse for that; it only asks for a larger rise (critical_ratio)."""
    rng = np.random.default_rng(9)
    n = 220
    t = np.arange(n)
    values = (0.008 + 4.3 * np.exp(-t / 15)) * np.exp(0.2 * rng.standard_normal(n))
    values[185:] *= np.r_[np.geomspace(3, 15, 5), np.full(n - 190, 15.0)]
    lr = 1e-6 + 7.5e-7 * t
    [finding] = Divergence().detect(run(values, lr=lr))
    assert 1850 <= finding.onset_step <= finding.detected_step <= 1900
    assert finding.state == "firing"
    values[185:] /= np.r_[np.geomspace(3, 15, 5), np.full(n - 190, 15.0)] / 1.8  # +80%
    assert Divergence().detect(run(values, lr=lr)) == []  # a bump while the LR climbs


def test_multi_epoch_drops_and_a_resumed_runs_small_bump_are_quiet() -> None:
    rng = np.random.default_rng(8)
    n = 3000
    values = np.repeat([1.6, 1.2, 0.9], n // 3) * (1 + 0.05 * rng.standard_normal(n))
    values[1500:1510] *= 1.25  # a resume: a small bump for a few points
    assert episodes(values) == []


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"window": 2}, "window"),
    ({"points": 0}, "points"),
    ({"min_rel": 0}, "min_rel"),
    ({"threshold": -1.0}, "threshold"),
    ({"grace_period": -1}, "grace_period"),
    ({"resolve_points": 0}, "resolve_points"),
    ({"memory": 0}, "memory"),
    ({"tail_factor": float("nan")}, "tail_factor"),
    ({"critical_ratio": 1.0}, "critical_ratio"),
    ({"other_metrics": "cri_loss"}, "other_metrics"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Divergence(**kwargs)


def test_polling_a_growing_run_finds_what_one_read_finds() -> None:
    """Each poll judges only the points it has not judged (with their context): the
    findings are those of the whole history read at once, at every poll, with episodes
    closed, open and resolving between polls."""
    values = np.concatenate([episode(seed=s, n=700, at=300) for s in range(4)])
    values[2500:] *= np.linspace(1.0, 3.0, len(values) - 2500)  # then it keeps rising
    polled = Divergence()
    for n in (100, 350, 405, 406, 420, 460, 700, 1010, 1150, 2000, 2450, 2600, 2601, 2800):
        data = run(values[:n])
        assert ([f.to_dict() for f in polled.detect(data)]
                == [f.to_dict() for f in Divergence().detect(data)]), n
    assert len(polled.detect(run(values))) >= 4


# -- logs without a train loss, short logs, early rises (issue 22, the real corpus) -----------

def test_a_log_without_a_train_loss_is_judged_on_its_losses_and_perplexities() -> None:
    """An eval perplexity alone (a DeepSpeed example), an autoencoder's two named losses:
    divergence watches what the run logs; a reward or a loss scale is not a loss."""
    flat = np.r_[np.full(30, 60.0), np.full(10, 130.0), np.full(30, 60.0)]
    flat = flat * (1 + 0.001 * np.sin(np.arange(70)))
    data = RunData.from_series("r", {"eval/perplexity": flat, "train_loss_W": flat * 2,
                                     "loss_scale": flat, "reward": flat},
                               steps=10 * np.arange(1, 71))
    assert sorted({f.metric for f in Divergence().detect(data)}) == [
        "eval/perplexity", "train_loss_W"]
    with_loss = RunData.from_series("r", {"train/loss": np.full(70, 2.0),
                                          "eval/perplexity": flat})
    assert Divergence().detect(with_loss) == []  # the train loss is watched, and is flat


def test_a_short_log_is_judged_with_a_shorter_window() -> None:
    """18 logged points: a 20-point window would judge none of them."""
    values = np.array([8.3, 3.2, 3.1, 3.0, 2.9, 3.0, 3.05, 2.95, 3.0, 3.02, 2.98, 3.0,
                       6.1, 6.4, 6.2, 6.0, 6.3, 6.1])
    [finding] = episodes(values)
    assert finding[1:4] == (130, 150, "warning")


def test_a_rise_in_the_first_window_after_the_warm_up_is_found_where_it_began() -> None:
    """An eval ppl flat for 14 evaluations (8 of them the grace of an 80-point log without
    an LR), then a slow climb to 2x that comes back: judged within the first 20-point
    window, its onset the first raised point, not where it crossed the margin."""
    climb = np.r_[np.full(14, 61.8), 61.8 * np.geomspace(1.01, 2.1, 15), 61.8 * np.geomspace(
        2.1, 0.6, 51)] * (1 + 0.0005 * np.cos(np.arange(80)))
    [finding] = Divergence().detect(RunData.from_series(
        "r", {"ppl": climb}, steps=10 * np.arange(80)))
    assert finding.metric == "ppl"
    assert finding.onset_step == 140 and finding.detected_step <= 240


def test_an_early_episode_of_a_per_epoch_loss_with_short_last_batches_is_found() -> None:
    """An autoencoder's loss logged 180 times, no LR (issue 22's trajectory-clustering
    runs): 800 at the first log, ~300 after, every 9th point a short last batch at ~20,
    and from the 14th point (after the protocol's warm-up of 5 points or 2%, inside the
    tenth of the log the grace used to cover) +48% then +60% for three points. The first
    risen point falls just short of the margin; the noise is the points' before it, so
    the episode is found where it began."""
    rng = np.random.default_rng(3)
    values = 300 * (1 + 0.04 * rng.standard_normal(180))
    values[0] = 800
    values[8::9] = 20 + rng.standard_normal(20)
    values[13:17] = 300 * np.array([1.48, 1.6, 1.62, 1.6])
    data = RunData.from_series("run-1", {"train_loss_Ph": values},
                               steps=49 + 50 * np.arange(180))
    [finding] = Divergence().detect(data)
    assert (finding.metric, finding.onset_step, finding.detected_step, finding.state) == (
        "train_loss_Ph", 699, 849, "resolved")


def test_a_noisy_loss_that_steps_up_and_stays_up_is_found() -> None:
    """Issue 22 (dev half): a LoRA loss near 0.04 with ±30% batch noise steps up 2x for
    the rest of the run; no 3 points in a row clear 4 of its deviations, but 9 points that
    all stay above the level and whose median does clear 4 standard errors of a median of
    9 are a rise that holds. The same noise without the step stays quiet, and polling the
    run finds what one read finds."""
    rng = np.random.default_rng(3)
    noisy = 0.04 * np.exp(0.3 * rng.standard_normal(300))
    assert episodes(noisy) == []
    stepped = noisy.copy()
    stepped[200:] = 0.09 * np.exp(0.12 * rng.standard_normal(100))
    [(metric, onset, detected, _, state)] = episodes(stepped)
    assert (metric, state) == ("train/loss", "firing")
    assert step_of(197) <= onset <= step_of(203) and detected <= step_of(212)
    polled = Divergence()
    for n in (205, 207, 209, 211, 215, 300):
        data = run(stepped[:n])
        assert ([f.to_dict() for f in polled.detect(data)]
                == [f.to_dict() for f in Divergence().detect(data)]), n


def step_of(i: int) -> int:
    return 10 * (i + 1)
