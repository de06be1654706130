"""Golden series for the plateau analyzer: exact onset, detection and resolve steps."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.plateau import Plateau
from tests.corpus import CORPUS

PLATEAU_RUN = CORPUS / "hf_trainer_state" / "gpt_lora_plateau.json"


def run(values: np.ndarray, checkpoints: list[Checkpoint] | None = None) -> RunData:
    """Steps are 10, 20, 30, …: point ``i`` is logged at step ``10 * (i + 1)``."""
    return RunData.from_series("run-1", {"train/loss": values},
                               steps=10 * np.arange(1, len(values) + 1),
                               checkpoints=checkpoints)


def drop_then_flat(seed: int = 0) -> np.ndarray:
    """5.3 → 3.4 within ~250 points, then flat with 0.02 noise."""
    t = np.arange(800)
    return 3.4 + 1.9 * np.exp(-t / 50) + 0.02 * np.random.default_rng(seed).standard_normal(800)


def test_a_loss_that_drops_then_stays_flat_fires() -> None:
    [finding] = Plateau().detect(run(drop_then_flat()))
    # The exponential approach to 3.4 still falls a little at step ~2000, but at less than
    # half the pace of the window before: from there the windows count as flat.
    assert (finding.onset_step, finding.detected_step) == (1910, 3200)
    # flat for 40% of the run when detected: shown (status, answers), not posted
    assert (finding.state, finding.resolved_step, finding.severity) == ("firing", None, "info")
    assert Plateau(warning_share=0.4).detect(run(drop_then_flat()))[0].severity == "warning"
    assert finding.summary == ("train/loss has not improved over the last 100 points "
                               "(steps 2210–3200): median 3.41 → 3.40 (-0.2%, less than the "
                               "1.0% fall required)")
    evidence = finding.evidence
    assert evidence["window_steps"] == [2210, 3200]
    assert evidence["improvement"] == pytest.approx(
        (evidence["first_median"] - evidence["last_median"]) / evidence["first_median"])
    assert evidence["improvement"] < evidence["min_delta"] == 0.01
    low, high = evidence["band"]
    assert 3.3 < low < evidence["last_median"] < high < 3.5
    spec = CATALOG["plateau"]
    assert finding.fixes == list(spec.fixes)
    assert (finding.kind, finding.source) == ("not_learning", spec.source)


def test_patience_is_counted_in_evaluations() -> None:
    data = run(drop_then_flat())
    [eager] = Plateau(patience=1).detect(data)
    [patient] = Plateau().detect(data)  # patience=4
    assert eager.onset_step == patient.onset_step == 1910
    assert (eager.detected_step, patient.detected_step) == (2900, 3200)  # 3 strides later


def ar1(rng: np.random.Generator, n: int, phi: float, df: float = 5.0) -> np.ndarray:
    """AR(1) noise of unit variance with Student-t innovations (a per-step loss)."""
    shocks = rng.standard_t(df, n) / np.sqrt(df / (df - 2))
    out = np.empty(n)
    out[0] = shocks[0]
    for i in range(1, n):
        out[i] = phi * out[i - 1] + np.sqrt(1 - phi * phi) * shocks[i]
    return out


def test_patience_outlasts_a_chance_low_standard_error_in_a_per_step_fine_tune() -> None:
    """One point per step, 3% autocorrelated fat-tailed noise, still falling ~2% per 100
    points at step 500: three ten-point shifts of one window can look flat by chance
    (their last thirds share 23 of 33 points); four, whose last thirds barely overlap,
    do not."""
    rng = np.random.default_rng(36)
    t = np.arange(3000)
    loss = (1.5 + 2.0 * (t / 60 + 1.0) ** -0.4) * (1 + 0.03 * ar1(rng, 3000, 0.5))
    data = RunData.from_series("fine-tune", {"train/loss": loss}, steps=t + 1)
    [chance] = Plateau(patience=3).detect(data)
    assert (chance.onset_step, chance.detected_step) == (450, 583)
    assert Plateau().detect(data) == []


def test_a_short_stall_does_not_outlast_patience() -> None:
    falling = 5 * np.exp(-np.arange(300) / 1000)  # about -3% per 100 points
    stall = np.full(60, falling[-1])
    loss = np.concatenate([falling, stall, falling[-1] * np.exp(-np.arange(300) / 1000)])
    assert Plateau().detect(run(loss)) == []
    # Noise-free, every window around the stall still falls by more than min_delta / 4: a
    # steady descent with a pause in it is not flat even for a single evaluation.
    assert Plateau(patience=1).detect(run(loss)) == []


def test_a_loss_still_falling_steadily_does_not_fire() -> None:
    rng = np.random.default_rng(3)
    t = np.arange(2000)
    loss = 5 * np.exp(-t / 2000) * (1 + 0.02 * rng.standard_normal(2000))
    assert Plateau().detect(run(loss)) == []


def test_a_noisy_per_batch_loss_falling_slowly_does_not_flap() -> None:
    """Its noise (a standard error of ~10% per window) hides any 1% verdict."""
    rng = np.random.default_rng(0)
    t = np.arange(3000)
    loss = 0.5 * np.exp(-t / 3000) * rng.lognormal(0.0, 0.5, 3000)
    assert Plateau().detect(run(loss)) == []


def test_a_loss_that_slows_to_a_crawl_fires_though_it_still_falls() -> None:
    """A power law whose progress drops to 30% of its pace at point 1200: its windows still
    fall by more than two standard errors, but at less than half the pace of the window
    before them. Without the pace comparison (pace=0) such a run never counts as flat."""
    rng = np.random.default_rng(0)
    progress = np.arange(1, 3001, dtype=float)
    progress[1200:] = progress[1200] + 0.3 * (progress[1200:] - progress[1200])
    loss = 2.0 + 6.0 * (progress + 50.0) ** -0.4 * np.exp(0.004 * rng.standard_normal(3000))
    [finding] = Plateau().detect(run(loss))
    assert (finding.onset_step, finding.detected_step) == (11100, 14690)
    assert Plateau(pace=0).detect(run(loss)) == []


def test_resolves_when_the_loss_falls_again_and_a_new_plateau_is_a_new_finding() -> None:
    rng = np.random.default_rng(1)
    loss = np.concatenate([np.full(400, 3.0), 3.0 * np.exp(-3 * np.arange(300) / 1000),
                           np.full(400, 3.0 * np.exp(-0.9))])
    loss += 0.02 * rng.standard_normal(len(loss))
    first, second = Plateau().detect(run(loss))
    # Flat from the start: judged before the first full window (early windows).
    assert (first.onset_step, first.detected_step) == (80, 500)
    assert (first.state, first.resolved_step) == ("resolved", 4400)
    # The second plateau comes after 900 points: its windows span a fifth of the history.
    assert (second.onset_step, second.detected_step) == (6980, 9230)
    assert (second.state, second.resolved_step) == ("firing", None)


def test_warm_up_and_first_evaluation() -> None:
    constant = np.full(1000, 2.5)
    [finding] = Plateau(early_points=0).detect(run(constant))
    # Windows start after 50 warm-up points: points 50–149, 60–159, 70–169, 80–179 are flat.
    assert (finding.onset_step, finding.detected_step) == (510, 1800)
    assert finding.summary.startswith("train/loss has not improved over the last 100 points "
                                      "(steps 810–1800): median 2.50 → 2.50 (+0.0%")
    [finding] = Plateau(grace_period=0, early_points=0).detect(run(constant))
    assert (finding.onset_step, finding.detected_step) == (10, 1300)
    assert Plateau(early_points=0).detect(run(constant[:179])) == []
    assert len(Plateau(early_points=0).detect(run(constant[:180]))) == 1


def test_a_run_that_never_learns_is_judged_before_its_first_full_window() -> None:
    """A fresh run flat from its first step (the corpus's OLMo run with zero gradients:
    10.38 → 10.32 over 43 logged points) fires after 20 + 3 × 5 points, over all its points
    less the first fifth; with ``early_points=0`` it waits for grace + window points."""
    rng = np.random.default_rng(0)
    stuck = 10.35 + 0.01 * rng.standard_normal(43)
    [finding] = Plateau().detect(run(stuck))
    # Windows over points 4–19, 5–24, 6–29 and 7–34 (steps 50–350).
    assert (finding.onset_step, finding.detected_step) == (50, 350)
    assert finding.summary.startswith("train/loss has not improved over the last 28 points")
    assert Plateau(early_points=0).detect(run(stuck)) == []
    assert Plateau().detect(run(stuck[:34])) == []


def test_a_healthy_fresh_run_is_not_judged_flat_early() -> None:
    """A fresh run that learns falls fastest in its first points (after a warm-up that
    is flat for its first tenth): the early windows see it descending."""
    rng = np.random.default_rng(2)
    t = np.arange(400)
    loss = np.where(t < 15, 6.0, 2.0 + 4.0 * np.exp(-(t - 15) / 120))
    loss = loss * np.exp(0.02 * rng.standard_normal(len(t)))
    assert Plateau().detect(run(loss)) == []


def test_a_resumed_run_is_not_judged_before_its_first_full_window() -> None:
    """A run resumed from step 50,000 continues a curve that may already be slow: its
    first points say nothing about whether it learns. Only full windows judge it."""
    rng = np.random.default_rng(0)
    stuck = 2.0 + 0.005 * rng.standard_normal(250)
    resumed = RunData.from_series("run-1", {"train/loss": stuck},
                                  steps=50_000 + 10 * np.arange(1, 251))
    [finding] = Plateau().detect(resumed)
    assert finding.onset_step >= 50_000 + 10 * 50  # past the grace period
    [early] = Plateau().detect(run(stuck))
    assert early.onset_step < 500


def test_a_loss_stuck_at_zero_is_flat() -> None:
    [finding] = Plateau().detect(run(np.zeros(300)))
    assert finding.evidence["improvement"] == 0.0


def test_non_finite_points_are_skipped() -> None:
    loss = drop_then_flat()
    with_gaps = np.insert(loss, [300, 400, 500], [np.nan, np.inf, -np.inf])
    [finding] = Plateau().detect(run(with_gaps))
    json.dumps(finding.to_dict(), allow_nan=False)
    assert finding.evidence["first_median"] == pytest.approx(3.41, abs=0.01)


def test_rollback_target_is_the_latest_checkpoint_before_the_onset() -> None:
    cps = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (1000, 1500, 2110, 3000)]
    [finding] = Plateau().detect(run(drop_then_flat(), checkpoints=cps))
    assert finding.rollback_to is not None and finding.rollback_to.step == 1500
    late = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (2110, 3000)]
    [finding] = Plateau().detect(run(drop_then_flat(), checkpoints=late))
    assert finding.rollback_to is None


def test_a_long_run_still_falling_along_a_power_law_is_not_a_plateau() -> None:
    """Pretraining's tail: over 100 points it barely moves, over a fifth of the run it
    still falls clearly (the Megatron release runs of the corpus)."""
    rng = np.random.default_rng(0)
    t = np.arange(1, 20_001)
    loss = 1.9 + 8.0 * (t + 50.0) ** -0.35 + 0.01 * rng.standard_normal(len(t))
    assert Plateau().detect(run(loss)) == []
    [short_sighted] = Plateau(history=0.0).detect(run(loss))
    assert short_sighted.state == "firing"


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"window": 2}, "window"),
    ({"window": 5}, "window"),  # thirds of one point: no differences to measure
    ({"window": 100.0}, "window"),
    ({"min_delta": 0}, "min_delta"),
    ({"min_delta": 1.5}, "min_delta"),
    ({"grace_period": -1}, "grace_period"),
    ({"patience": 0}, "patience"),
    ({"stride": 0}, "stride"),
    ({"stride": False}, "stride"),
    ({"history": 1.0}, "history"),
    ({"history": -0.1}, "history"),
    ({"pace": 1.0}, "pace"),
    ({"pace": -0.1}, "pace"),
    ({"margin": -0.5}, "margin"),
    ({"margin": float("inf")}, "margin"),
    ({"span": 0.5}, "span"),
    ({"span_patience": 0}, "span_patience"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Plateau(**kwargs)


@pytest.mark.skipif(not PLATEAU_RUN.exists(), reason="shared corpus not available")
def test_real_lora_run_that_plateaus_at_3_4_fires() -> None:
    """HF trainer_state.json: loss 5.29 → ~3.4 by step ~1500, then flat to step 7500."""
    history = json.loads(PLATEAU_RUN.read_text())["log_history"]
    logged = [entry for entry in history if "loss" in entry]
    data = RunData.from_series("gpt-lora", {"train/loss": [e["loss"] for e in logged]},
                               steps=[e["step"] for e in logged])
    [finding] = Plateau().detect(data)
    assert (finding.onset_step, finding.detected_step, finding.state) == (1210, 2500, "firing")
    assert finding.evidence["first_median"] == pytest.approx(3.39, abs=0.01)


def test_the_shortest_window_is_judged() -> None:
    """Six points, two per third: the smallest window whose thirds have a difference."""
    loss = np.concatenate([np.linspace(3.0, 2.0, 100), np.full(100, 2.0)])
    [finding] = Plateau(window=6, grace_period=0, early_points=0, history=0).detect(run(loss))
    assert finding.evidence["window_steps"][1] - finding.evidence["window_steps"][0] == 50


def test_a_fine_tune_still_falling_just_over_min_delta_does_not_fire() -> None:
    """One point per step, 3–4.5% autocorrelated fat-tailed noise, a power law whose
    noise-free windows all still fall by more than 1.15%. Judged hundreds of times, at one
    standard error of margin a few chance lows line up for ``patience`` evaluations (3 of
    40 seeds fire, this one among them); at 1.5 standard errors none does."""
    t = np.arange(3000)
    clean = 0.7 + 1.3 * (t / 30 + 1.0) ** -0.5
    rule = Plateau()
    starts, widths = rule._windows(len(t), True)
    judged = starts >= rule.grace_period
    falls = rule._evaluate(clean, starts[judged], widths[judged]).improvement
    assert falls.min() > 0.0115
    rng = np.random.default_rng(7)
    noise = 0.03 * np.linspace(1.5, 0.8, 3000) * ar1(rng, 3000, 0.5)
    data = RunData.from_series("fine-tune", {"train/loss": clean * np.exp(noise)}, steps=t + 1)
    [chance] = Plateau(margin=1.0).detect(data)
    assert (chance.onset_step, chance.detected_step) == (1402, 1857)
    assert Plateau().detect(data) == []


def test_the_long_window_sees_a_stall_in_a_loss_too_noisy_for_the_window() -> None:
    """One point per step, 4% autocorrelated fat-tailed noise: a window's standard error is
    about min_delta, so the window alone cannot tell a stall from a loss still falling 1%
    per window. The long window (twice as wide, held to 2%) can: the stall at step 1200
    fires ~550 steps in, while the same run without the stall stays quiet."""
    t = np.arange(3000)
    rng = np.random.default_rng(0)
    noise = np.exp(0.04 * ar1(rng, 3000, 0.5))
    stalled = (0.8 + 1.5 * (np.minimum(t, 1200) / 30 + 1.0) ** -0.5) * noise
    data = RunData.from_series("fine-tune", {"train/loss": stalled}, steps=t + 1)
    [finding] = Plateau().detect(data)
    assert (finding.onset_step, finding.detected_step) == (955, 1751)
    assert finding.evidence["required_fall"] == 0.02  # the long window fired
    assert finding.summary.endswith("less than the 2.0% fall required)")
    assert Plateau(span=1).detect(data) == []
    healthy = (0.8 + 1.5 * (t / 30 + 1.0) ** -0.5) * noise  # still falls >1.2% per window
    assert Plateau().detect(RunData.from_series("fine-tune", {"train/loss": healthy},
                                                steps=t + 1)) == []


def test_an_eval_loss_that_never_changes_is_a_model_that_does_not_learn() -> None:
    """A classifier whose val loss is 0.7458 at every evaluation and whose train loss is
    noise around its start: too noisy for the window rule, but the weights are frozen."""
    rng = np.random.default_rng(2)
    steps = np.arange(4, 354, 5)
    train = pd.Series(0.73 + 0.08 * rng.standard_normal(len(steps)), index=steps)
    evals = pd.Series(np.full(50, 0.7458), index=np.arange(6, 356, 7))
    data = RunData.from_series("r", {"train/loss": train, "eval/loss": evals})
    [finding] = Plateau().detect(data)
    assert (finding.metric, finding.onset_step, finding.detected_step, finding.severity,
            finding.state) == ("train/loss", 6, 34, "warning", "firing")
    assert finding.summary.startswith("eval/loss was 0.746 at every one of the 50 evaluations")
    falling = pd.Series(np.linspace(2.0, 1.0, len(steps)), index=steps)  # an eval carried
    assert Plateau().detect(RunData.from_series(  # forward on every row: not frozen
        "r", {"train/loss": falling, "eval/loss": evals})) == []
    moving = evals + 0.001 * np.arange(50)
    assert not [f for f in Plateau().detect(RunData.from_series(
        "r", {"train/loss": train, "eval/loss": moving})) if "every one" in f.summary]
