"""Golden series for the overfit analyzer: exact onset, detection and resolve steps."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analyzers.overfit as overfit_module
from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.overfit import Overfit, _Train, _train_point_noise
from analyzers.streaming import FiniteIndex
from connectors.registry import open_source
from tests.corpus import CORPUS
from tests.demo_logs import demo_logs

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = CORPUS / "MANIFEST.csv"
EVAL_EVERY = 100


def train_loss(steps: int = 4000, sd: float = 0.02, seed: int = 0) -> np.ndarray:
    """A healthy per-step train loss: 2.3 → 0.3, still falling at the end."""
    t = np.arange(1, steps + 1)
    return 0.3 + 2.0 * np.exp(-t / 600) + sd * np.random.default_rng(seed).standard_normal(steps)


def eval_curve(rise_from: int | None = 2000, rise_per_step: float = 1e-4,
               steps: int = 4000) -> pd.Series:
    """Eval loss every 100 steps: 0.6 + e^(-t/400) up to ``rise_from`` (its best), then
    rising linearly from there."""
    t = np.arange(EVAL_EVERY, steps + 1, EVAL_EVERY)
    values = 0.6 + np.exp(-t / 400)
    if rise_from is not None:
        after = t > rise_from
        values[after] = 0.6 + np.exp(-rise_from / 400) + rise_per_step * (t[after] - rise_from)
    return pd.Series(values, index=t)


def run(train: np.ndarray, evals: pd.Series, checkpoints: list[Checkpoint] | None = None,
        **extra: pd.Series) -> RunData:
    """Train loss at steps 1, 2, 3, …; the eval loss at its own steps."""
    series = {"train/loss": pd.Series(train, index=np.arange(1, len(train) + 1)),
              "eval/loss": evals, **extra}
    return RunData.from_series("run-1", series, checkpoints=checkpoints)


def checkpoints_every(interval: int, last: int = 4000) -> list[Checkpoint]:
    return [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in range(interval, last + 1, interval)]


def test_eval_rising_while_train_falls_fires_with_its_numbers() -> None:
    data = run(train_loss(), eval_curve(), checkpoints_every(500))
    [finding] = Overfit().detect(data)
    # Best at 2000 (0.607); 0.5% above it from 2100 (0.617); three worse evaluations by 2300.
    assert (finding.onset_step, finding.detected_step) == (2100, 2300)
    assert (finding.state, finding.resolved_step, finding.severity) == ("firing", None, "warning")
    assert finding.summary == ("eval/loss 0.607 at step 2000 (best) → 0.637 at step 2300, "
                               "+4.9%, 0.5% or more above its best for 3 evaluations in a "
                               "row, while train/loss fell 0.377 → 0.342 (-9.2%)")
    evidence = finding.evidence
    assert (evidence["best_step"], evidence["worse_evaluations"]) == (2000, 3)
    assert evidence["eval_value"] == pytest.approx(0.6 + np.exp(-5) + 0.03)
    assert evidence["train_change"] < 0 < evidence["eval_change"]
    assert [s for s, _, _ in evidence["evaluations"]] == [2000, 2100, 2200, 2300]
    json.dumps(finding.to_dict(), allow_nan=False)
    spec = CATALOG["overfit"]
    assert finding.fixes == list(spec.fixes)
    assert finding.fixes[-1].request == "rollback"
    assert (finding.kind, finding.source) == ("not_learning", spec.source)


def test_the_rollback_target_is_the_checkpoint_with_the_best_validation() -> None:
    [finding] = Overfit().detect(run(train_loss(), eval_curve(), checkpoints_every(500)))
    assert finding.rollback_to is not None
    assert (finding.rollback_to.step, finding.rollback_to.path) == (2000, "ckpt/checkpoint-2000")
    assert finding.rollback_to.reason.startswith("checkpoint with the best validation")
    [finding] = Overfit().detect(run(train_loss(), eval_curve(), checkpoints_every(300)))
    assert finding.rollback_to is not None and finding.rollback_to.step == 1800
    late = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (2100, 3000)]
    [finding] = Overfit().detect(run(train_loss(), eval_curve(), late))
    assert finding.rollback_to is None


def test_patience_is_counted_in_evaluations() -> None:
    data = run(train_loss(), eval_curve())
    [eager] = Overfit(patience=1).detect(data)
    [patient] = Overfit(patience=5).detect(data)
    assert eager.onset_step == patient.onset_step == 2100
    # The gap widens steadily from 2000, so the first worse evaluation is enough for one.
    assert (eager.detected_step, patient.detected_step) == (2100, 2500)


def test_min_delta_is_relative_to_the_best() -> None:
    """The eval loss ends 1.8% above its best: under 2% it is not worse, under 1% it is."""
    data = run(train_loss(), eval_curve(rise_from=2000, rise_per_step=0.55e-5))
    assert Overfit(min_delta=0.02).detect(data) == []
    [finding] = Overfit(min_delta=0.01).detect(data)
    assert finding.evidence["best_step"] == 2000


def test_resolves_at_a_new_best_and_a_second_rise_is_a_new_finding() -> None:
    evals = eval_curve(rise_from=4000, rise_per_step=2e-4, steps=6000)
    bump = np.where((evals.index > 1500) & (evals.index <= 2500), 0.05, 0.0)
    first, second = Overfit().detect(run(train_loss(6000), evals + bump))
    assert (first.onset_step, first.detected_step) == (1600, 1800)
    assert (first.state, first.resolved_step) == ("resolved", 2600)
    assert first.evidence["best_step"] == 1500
    assert (second.onset_step, second.detected_step, second.state) == (4100, 4300, "firing")
    assert second.evidence["best_step"] == 4000


def test_a_median_back_near_the_best_also_resolves() -> None:
    """Back within min_delta / 2 of the best, without beating it: the median of the last
    three is back near it from 2800, for three evaluations in a row at 3000."""
    evals = eval_curve(rise_from=None)
    best = evals[2000]
    evals[evals.index > 2000] = best * 1.05
    evals[evals.index > 2600] = best * 1.005
    [finding] = Overfit(min_delta=0.02).detect(run(train_loss(), evals))
    assert (finding.detected_step, finding.resolved_step) == (2300, 3000)


def test_a_run_whose_train_loss_rises_with_the_eval_loss_is_not_overfitting() -> None:
    """Both climb 40% from step 2000: a divergence (spike's and plateau's business)."""
    t = np.arange(1, 4001)
    ramp = 1 + 0.4 * ((t - 2000) / 2000).clip(0)
    rng = np.random.default_rng(0)
    train = (0.3 + 2.0 * np.exp(-np.minimum(t, 2000) / 600)) * ramp
    train += 0.02 * rng.standard_normal(4000)
    evals = eval_curve(rise_from=2000, rise_per_step=0.0)
    evals = evals * ramp[evals.index.to_numpy() - 1]
    assert Overfit().detect(run(train, evals)) == []


def test_it_fires_once_the_train_loss_comes_back_down_while_eval_stays_up() -> None:
    """The whisper_finetune_tr pattern: both jump, then only the train loss recovers."""
    train = train_loss()
    train[2000:3000] *= 1.8
    evals = eval_curve(rise_from=None)
    evals[evals.index > 2000] *= 1.8
    [finding] = Overfit().detect(run(train, evals))
    assert finding.onset_step == 2100
    # The first evaluation whose last three (the eval median's) see train/loss recovered
    # in phase: at 3100 two of them (2900, 3000) still saw it raised.
    assert finding.detected_step == 3200
    assert finding.summary == ("eval/loss 0.607 at step 2000 (best) → 1.08 at step 3200, "
                               "+78.1%, 0.5% or more above its best for 12 evaluations in a "
                               "row, while train/loss fell 0.377 → 0.307 (-18.5%)")


def oscillating_run(period: int, seed: int = 0) -> RunData:
    """From step 2000 the train loss swings ±4% with ``period`` steps; the eval loss,
    computed every 100 steps, is the same curve at those single steps (3% above it)."""
    t = np.arange(1, 6001)
    rng = np.random.default_rng(seed)
    clean = 0.3 + 2.0 * np.exp(-t / 600)
    clean = clean + np.where(t > 2000, 0.04 * clean * np.sin(2 * np.pi * (t - 2000) / period),
                             0.0)
    train = clean * np.exp(0.01 * rng.standard_normal(6000))
    at = np.arange(100, 6001, 100)
    evals = clean[at - 1] * 1.03 * (1 + 0.002 * rng.standard_normal(len(at)))
    return run(train, pd.Series(evals, index=at))


@pytest.mark.parametrize("period", [52, 110])
def test_an_eval_loss_sampling_an_oscillating_train_loss_is_quiet(period: int) -> None:
    """Sampled every 100 steps, a swing of 52 or 110 steps aliases into a slow wave of the
    eval loss that climbs for several evaluations above its best while the 20-point train
    median, which averages the swing, does not; the train loss at the same steps (in phase)
    climbs with it. Compared with the long median only, this fired twice."""
    assert Overfit().detect(oscillating_run(period)) == []


def test_a_steadily_widening_gap_brings_a_slow_rise_forward() -> None:
    """From 2500 the eval loss drifts up 0.4% per evaluation over a train loss that still
    falls 0.3% per evaluation: the eval loss turns up only gently, the gap widens steadily.
    On the eval loss's own evidence (threshold plus luck) this fired at 4000; with the gap's
    evidence the rise need only clear the best's luck (3500); the gap's bend at 2500 sees
    the stalled eval loss at 3400, before three evaluations clear ``min_delta``."""
    rng = np.random.default_rng(0)
    t = np.arange(1, 6001)
    clean = 0.3 + 2.0 * np.exp(-t / 400) - 3e-6 * t
    train = clean * np.exp(0.02 * rng.standard_normal(6000))
    at = np.arange(100, 6001, 100)
    drift = 1 + 0.004 * ((at - 2500) / 100).clip(0)
    evals = clean[at - 1] * 1.05 * drift * (1 + 0.002 * rng.standard_normal(len(at)))
    [finding] = Overfit().detect(run(train, pd.Series(evals, index=at)))
    assert (finding.onset_step, finding.detected_step) == (3000, 3400)


def stalling_run(seed: int = 0) -> tuple[RunData, pd.Series]:
    """The bench's overfit: from 2000 the eval loss gains 1% per evaluation on a curve
    that still falls, so it bottoms out at 2900 and turns up slowly (+0.4%, +0.5%, +0.9%
    at 3000-3200); the gap (eval over train) bends upwards at 2000."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, 5001)
    clean = 0.3 + 2.0 * np.exp(-t / 600)
    train = clean * np.exp(0.01 * rng.standard_normal(5000))
    at = np.arange(100, 5001, 100)
    rise = 1 + 0.01 * ((at - 2000) / 100).clip(0)
    evals = pd.Series(clean[at - 1] * 1.05 * rise * (1 + 0.001 * rng.standard_normal(len(at))),
                      index=at)
    return run(train, evals), evals


def test_a_stalled_eval_loss_over_a_bending_gap_fires_before_it_clears_min_delta() -> None:
    """No new best since 2900 and a gap that bent upwards at 2000: the stall fires at 3300,
    where only two evaluations (3200, 3300) lie ``min_delta`` above the best (three would
    take until 3400, and the rise's own evidence until 3500)."""
    data, evals = stalling_run()
    [finding] = Overfit().detect(data)
    assert (finding.evidence["best_step"], finding.onset_step, finding.detected_step) == (
        2900, 3000, 3300)
    best = evals[2900]
    assert (evals[[3000, 3100]] < 1.005 * best).all() and (evals[[3200, 3300]] > 1.005 * best).all()
    # The summary says what held: a stall, not four worse evaluations in a row.
    assert ("no better than its best for 4 evaluations (2 of them 0.5% or more above its "
            "best)") in finding.summary
    assert (finding.evidence["evaluations_since_onset"],
            finding.evidence["worse_evaluations"]) == (4, 2)


def test_a_gap_widening_at_one_pace_from_the_start_is_no_stall() -> None:
    """A fine-tune whose train loss keeps falling at a steady pace (a healthy one opens the
    gap so) under an eval loss that has levelled off: the gap has widened at one pace
    since the start, with no bend, so the eval loss's wobble at its best is no stall.
    Judged by the gap's slope alone, this fired at 4900."""
    rng = np.random.default_rng(1)
    t = np.arange(1, 5001)
    train = (0.45 + 2.0 * np.exp(-t / 600) - 3e-5 * t) * np.exp(0.01 * rng.standard_normal(5000))
    at = np.arange(100, 5001, 100)
    evals = (0.55 + 2.0 * np.exp(-at / 600)) * (1 + 0.003 * rng.standard_normal(len(at)))
    assert Overfit().detect(run(train, pd.Series(evals, index=at))) == []


def test_an_eval_loss_that_works_off_a_jump_is_quiet() -> None:
    """The eval loss jumps 3% at 2500 and then falls back 0.75% per evaluation: a level
    shift being worked off, not overfitting (without the guard this fired at 2700)."""
    t = np.arange(1, 5001)
    train = (0.3 + 2.0 * np.exp(-t / 600)) * np.exp(
        0.01 * np.random.default_rng(2).standard_normal(5000))
    at = np.arange(100, 5001, 100)
    k = (at - 2400) / 100
    jump = np.where(k >= 1, 0.03 * np.clip(1 - 0.25 * (k - 1), 0, None), 0.0)
    evals = (0.6 + np.exp(-at / 400)) * (1 + jump) * (
        1 + 0.001 * np.random.default_rng(3).standard_normal(len(at)))
    assert Overfit().detect(run(train, pd.Series(evals, index=at))) == []


def test_a_swing_sampled_at_one_phase_is_explained_by_the_train_offset() -> None:
    """From 10000 the loss swings ±8% every 250 steps; evaluated every 500, the eval loss
    sees one phase of it for good (+7%) and stays up while the train level keeps falling.
    The train points at the evaluations sit as far above that level: the gap is theirs.
    Compared with the raw in-phase train (diluted by the fall), this fired at 18000."""
    rng = np.random.default_rng(1)
    steps = np.arange(10, 20001, 10)
    clean = 2.0 + 6.0 * (steps / 50 + 10) ** -0.45
    k = (steps - 10000) // 10
    clean = clean * (1 + np.where(k >= 0, 0.08 * np.sin(2 * np.pi * (k + 6) / 25), 0.0))
    noise = np.empty(len(steps))
    noise[0] = rng.standard_normal()
    for i in range(1, len(steps)):  # AR(1), as per-batch losses are
        noise[i] = 0.5 * noise[i - 1] + np.sqrt(0.75) * rng.standard_normal()
    train = clean * np.exp(0.015 * noise)
    at = np.arange(500, 20001, 500)
    evals = clean[at // 10 - 1] * 1.03 * (1 + 0.002 * rng.standard_normal(len(at)))
    data = RunData.from_series("run-1", {"train/loss": pd.Series(train, index=steps),
                                         "eval/loss": pd.Series(evals, index=at)})
    assert Overfit().detect(data) == []


def test_the_best_is_lucky_only_among_evaluations_at_its_level() -> None:
    """After a steep fall the best has no rival (no luck to discount); on a flat stretch
    every evaluation within three noise deviations of it counts."""
    from analyzers.overfit import _contenders
    steep = np.array([2.0, 1.5, 1.2, 1.0, 1.05, 1.08])
    flat = np.array([1.02, 1.0, 1.01, 0.99, 1.0, 1.01])
    noise = np.array([0.01])
    assert _contenders(steep, np.array([3]), np.array([5]), noise).tolist() == [1.0]
    assert _contenders(flat, np.array([3]), np.array([5]), noise).tolist() == [6.0]


def test_a_healthy_run_with_noise_is_quiet() -> None:
    rng = np.random.default_rng(4)
    evals = eval_curve(rise_from=None) * (1 + 0.005 * rng.standard_normal(40))
    assert Overfit().detect(run(train_loss(sd=0.1), evals)) == []


def test_warmup_and_cosine_decay_shapes_are_quiet() -> None:
    """A loss that stalls at the peak learning rate and drops in the cosine tail."""
    t = np.arange(1, 6001)
    lr = np.where(t < 300, t / 300, 0.5 * (1 + np.cos(np.pi * (t - 300) / 5700)))
    progress = np.cumsum(lr) / np.sum(lr)
    rng = np.random.default_rng(5)
    train = 0.4 + 2.5 * np.exp(-6 * progress) + 0.03 * rng.standard_normal(6000)
    at = np.arange(200, 6001, 200)
    evals = pd.Series(0.7 + 2.5 * np.exp(-6 * progress[at - 1]), index=at)
    assert Overfit().detect(run(train, evals)) == []


def test_a_noisy_small_eval_set_still_trending_down_is_quiet() -> None:
    """An eval loss that swings ±15% between evaluations (the gaze classifier) while the
    train loss falls: EarlyStopping(patience=3) would stop it; the noise guard does not."""
    rng = np.random.default_rng(2)
    at = np.arange(200, 6001, 200)
    level = 0.25 + 0.25 * np.exp(-at / 1500)
    evals = pd.Series(level * (1 + 0.15 * rng.standard_normal(len(at))), index=at)
    train = train_loss(6000)
    assert Overfit().detect(run(train, evals)) == []


def test_before_six_evaluations_a_steady_rise_is_taken_at_face_value() -> None:
    """Five evaluations cannot measure noise (whisper runs evaluate five times in all):
    the best and three steadily rising evaluations fire, unsteady ones do not."""
    steady = pd.Series([0.40, 0.32, 0.35, 0.38, 0.41], index=[1000, 2000, 3000, 4000, 5000])
    [finding] = Overfit().detect(run(train_loss(5000), steady))
    assert (finding.evidence["best_step"], finding.detected_step) == (2000, 5000)
    unsteady = steady.copy()
    unsteady[4000] = 0.34
    assert Overfit().detect(run(train_loss(5000), unsteady)) == []


def test_the_noise_guard_does_not_hide_a_clear_rise() -> None:
    rng = np.random.default_rng(3)
    evals = eval_curve(rise_from=2000, rise_per_step=3e-4)
    evals *= 1 + 0.01 * rng.standard_normal(len(evals))
    [finding] = Overfit().detect(run(train_loss(), evals))
    assert finding.evidence["best_step"] == 2000
    assert (finding.onset_step, finding.detected_step) == (2100, 2300)


def test_a_very_noisy_per_batch_train_loss_does_not_matter() -> None:
    rng = np.random.default_rng(6)
    train = 0.5 * np.exp(-np.arange(4000) / 3000) * rng.lognormal(0.0, 0.8, 4000)
    assert Overfit().detect(run(train, eval_curve(rise_from=None))) == []
    [finding] = Overfit().detect(run(train, eval_curve()))
    assert (finding.onset_step, finding.detected_step) == (2100, 2500)


def test_without_a_train_loss_there_is_nothing_to_compare() -> None:
    data = RunData.from_series("run-1", {"eval/loss": eval_curve()})
    assert Overfit().detect(data) == []


def test_evaluations_before_any_train_loss_cannot_be_judged() -> None:
    """The best evaluation comes before the first train loss: no level to compare with."""
    evals = eval_curve(rise_from=None)
    evals[evals.index > 100] = 5.0
    train = pd.Series(train_loss()[999:], index=np.arange(1000, 4001))
    data = RunData.from_series("run-1", {"train/loss": train, "eval/loss": evals})
    assert Overfit().detect(data) == []


def test_non_finite_points_are_skipped() -> None:
    evals = eval_curve()
    evals[2300] = np.nan
    evals[2500] = np.inf
    train = train_loss()
    train[[100, 2200, 3000]] = [np.nan, np.inf, -np.inf]
    [finding] = Overfit().detect(run(train, evals))
    assert (finding.onset_step, finding.detected_step) == (2100, 2400)
    json.dumps(finding.to_dict(), allow_nan=False)


def test_another_eval_suite_can_be_watched() -> None:
    data = run(train_loss(), eval_curve(rise_from=None), **{"eval/code/loss": eval_curve()})
    assert Overfit().detect(data) == []
    [finding] = Overfit(metric="eval/code/loss").detect(data)
    assert (finding.metric, finding.detected_step) == ("eval/code/loss", 2300)
    assert finding.summary.startswith("eval/code/loss ")


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"train_metric": ""}, "metric"),
    ({"min_delta": 0}, "min_delta"),
    ({"min_delta": float("nan")}, "min_delta"),
    ({"patience": 0}, "patience"),
    ({"patience": 2.0}, "patience"),
    ({"threshold": -1}, "threshold"),
    ({"train_window": 0}, "train_window"),
    ({"train_window": True}, "train_window"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Overfit(**kwargs)


def test_a_million_train_points_are_analysed() -> None:
    rng = np.random.default_rng(1)
    n = 1_000_000
    train = 0.3 + 2.0 * np.exp(-np.arange(n) / 2e5) + 0.05 * rng.standard_normal(n)
    at = np.arange(1000, n + 1, 1000)
    evals = pd.Series(0.6 + 2.0 * np.exp(-at / 2e5) + 2e-7 * (at - 5e5).clip(0), index=at)
    data = run(train, evals)
    data.series("train/loss")
    data.series("eval/loss")
    [finding] = Overfit().detect(data)
    assert finding.evidence["best_step"] < finding.onset_step


# --- the shared corpus -------------------------------------------------------------

needs_corpus = pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")


def corpus_files(prefix: str = "") -> list[str]:
    with open(MANIFEST, newline="") as fh:
        return [row["file"] for row in csv.DictReader(fh)
                if row["your_observation"].startswith(prefix)]


def corpus_run(relative: str) -> RunData:
    batch = open_source(str(CORPUS / relative)).discover()[0].read(final=True)
    return RunData(run=relative, metrics=batch.points, checkpoints=batch.checkpoints,
                   meta=batch.meta)


@needs_corpus
@pytest.mark.parametrize(("relative", "best", "onset", "detected"), [
    # eval_loss 0.219 at 250 → 0.40–0.44 from 500; train rises with it until ~1100,
    # then falls back while the eval loss stays up.
    ("hf_trainer_state/whisper_finetune_tr.json", 250, 500, 1500),
    # eval_loss 0.321 at 1000 → 0.420 at 5000 while train 0.011 → 0.0002.
    ("hf_trainer_state/whisper_large_v2_ja_5k.json", 1000, 2000, 4000),
    # eval_loss 0.3075 at 1000 → 0.468 at 5000 while train 0.10 → 0.0002.
    ("hf_trainer_state/whisper_small_hi.json", 1000, 2000, 4000),
    # eval_loss 1.326 at 3105 → 1.43–1.51 while train 1.34 → 1.16.
    ("hf_trainer_state/finnews_sentiment_cls.json", 3105, 4140, 6210),
])
def test_the_corpus_overfits_fire_after_their_best_evaluation(relative: str, best: int,
                                                               onset: int, detected: int) -> None:
    [finding] = Overfit().detect(corpus_run(relative))
    assert finding.evidence["best_step"] == best
    assert (finding.onset_step, finding.detected_step) == (onset, detected)
    assert (finding.severity, finding.state) == ("warning", "firing")


@needs_corpus
@pytest.mark.parametrize("relative", [
    "hf_trainer_state/tinyllama_sft_lora.json",
    "hf_trainer_state/bashkir_asr.json",
    "hf_trainer_state/whisper_tiny_nbailab_100k.json",
    "lightning_csv/gaze_cls.csv",
    # Both losses rise together (LR too high): a divergence, not overfitting.
    "hf_trainer_state/whisper_small_braj_highlr.json",
    # val_loss +1.2% over three epochs while the train loss also rises.
    "lightning_csv/slm_training_v5_resume.csv",
])
def test_the_corpus_negative_controls_are_quiet(relative: str) -> None:
    assert Overfit().detect(corpus_run(relative)) == []


@needs_corpus
def test_runs_with_no_visible_problem_get_no_overfit_finding() -> None:
    """Stricter than the issue's bar (no critical, at most one warning): nothing at all."""
    for relative in corpus_files("NO VISIBLE PROBLEM"):
        assert Overfit().detect(corpus_run(relative)) == [], relative


# --- the demo trainer ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["none", "bad_batch"])
def test_the_demo_trainer_is_quiet(fault: str) -> None:
    """Eval every 25 steps settles at ~0.50 from step 150; a bad batch is spike's."""
    data = demo_logs()[fault]
    assert len(data.series("eval/loss")) == 12
    assert Overfit().detect(data) == []


def test_a_watcher_polling_the_run_finds_what_a_full_read_finds() -> None:
    """Settled verdicts are kept between polls; an evaluation logged before the train
    points of its step is judged again once they arrive. Train points with NaN, two
    overfit episodes (the first resolved), polls cut at awkward places."""
    rng = np.random.default_rng(1)
    steps = np.arange(1, 6001)
    train = 0.3 + 2.0 * np.exp(-steps / 400) + 0.02 * rng.standard_normal(6000)
    train[rng.choice(6000, 60, replace=False)] = np.nan
    evals = np.arange(100, 6001, 100)
    rise = 2e-4 * ((evals - 1500).clip(0) - 2 * (evals - 2600).clip(0)).clip(0)
    rise += 2e-4 * (evals - 4500).clip(0)
    eval_loss = (0.6 + np.exp(-evals / 300) + rise
                 + 0.003 * rng.standard_normal(len(evals)))
    whole = RunData.from_series("run-1", {"train/loss": train,
                                          "eval/loss": pd.Series(eval_loss, index=evals)},
                                steps=steps)
    rows = whole.metrics
    streaming = Overfit()
    cuts = np.sort(rng.choice(np.arange(200, 6000), 40, replace=False))
    for cut in cuts.tolist():
        # The evaluations are ahead of the train points: those of the last 30 steps lag.
        shown = rows[((rows["tag"] == "eval/loss") & (rows["step"] <= cut))
                     | ((rows["tag"] == "train/loss") & (rows["step"] <= cut - 30))]
        data = RunData(run="run-1", metrics=shown.reset_index(drop=True))
        found = streaming.detect(data)
        fresh = Overfit().detect(data)
        assert [(f.onset_step, f.detected_step, f.state, f.summary) for f in found] == [
            (f.onset_step, f.detected_step, f.state, f.summary) for f in fresh]
    assert [f.state for f in Overfit().detect(whole)] == ["resolved", "firing"]


def test_the_bend_test_over_all_positions_matches_a_direct_fit() -> None:
    """The gap's bend test runs over every candidate at once (a fit per window shape);
    each position must get what a direct least-squares fit of the broken line gives, the
    first evaluations (a shorter window before the bend) and missing values included."""
    from analyzers.overfit import (
        _CHANGE_BACK,
        _CHANGE_PRE,
        _FIT_Z,
        _MIN_CHANGE_PRE,
        _gap_change_t,
        _gap_noise,
    )
    rng = np.random.default_rng(5)
    n = 90
    gap = np.cumsum(rng.normal(0, 0.01, n)) + 0.003 * np.clip(np.arange(n) - 50, 0, None)
    gap[[7, 61]] = np.nan
    positions = np.arange(n)
    noise = _gap_noise(gap, positions)
    got = _gap_change_t(gap, positions, noise)
    for i in positions.tolist():
        expected = -np.inf
        for c in range(max(_MIN_CHANGE_PRE - 1, i - _CHANGE_BACK), i - 1):
            lo = max(0, c - _CHANGE_PRE)
            y = gap[lo:i + 1]
            if not noise[i] > 0 or not np.isfinite(y).all():
                continue
            x = np.arange(lo, i + 1) - c
            design = np.column_stack((np.ones(len(x)), x, np.maximum(x, 0)))
            coef = np.linalg.lstsq(design, y, rcond=None)[0]
            # The noise: the gap's own, or the residuals' scatter beyond chance if larger.
            dof = len(y) - 3
            scatter = np.sqrt(np.sum((y - design @ coef) ** 2) / dof)
            h = 2 / (9 * dof)
            fit_noise = max(noise[i], scatter / (1 - h + _FIT_Z * np.sqrt(h)) ** 1.5)
            cov = np.linalg.inv(design.T @ design) * fit_noise ** 2
            after = np.array([0.0, 1.0, 1.0])
            expected = max(expected, min(coef[2] / np.sqrt(cov[2, 2]),
                                         (coef[1] + coef[2]) / np.sqrt(after @ cov @ after)))
        assert got[i] == pytest.approx(expected, rel=1e-9, abs=1e-9), i
    assert np.isfinite(got[60:]).any() and got[np.isfinite(got)].max() > 4  # the bend shows


def test_a_stall_resolves_only_at_a_new_best_so_it_does_not_flap() -> None:
    """An eval loss flat at its best from 3000 (exactly constant) while the train loss
    drops 15% at each epoch boundary: one stall finding that stays open. Resolving it once
    the eval loss was back within half of a rise it never had closed it at once, and it
    fired again every few evaluations (15 findings)."""
    rng = np.random.default_rng(3)
    t = np.arange(1, 12001)
    train = ((0.3 + 2.0 * np.exp(-t / 600)) * 0.85 ** (t // 2000)
             * np.exp(0.01 * rng.standard_normal(len(t))))
    at = np.arange(100, 12001, 100)
    evals = pd.Series(0.6 + np.exp(-np.minimum(at, 3000) / 600), index=at)
    findings = Overfit().detect(run(train, evals))
    assert [f.state for f in findings] == ["firing"]
    assert "no better than its best" in findings[0].summary


@pytest.mark.parametrize("every", [100, 10])
def test_a_train_loss_logged_once_per_evaluation_is_no_evidence_of_a_widening_gap(
        every: int) -> None:
    """Healthy runs whose train loss is logged only at the evaluations (as epoch logs
    are), or less often than the eval loss: the train level (the last 20 points) spans
    20 evaluations, so neighbouring gaps share 19 of them and the gap looks sure of any
    trend. The gap's tests stand aside; with them, 10 healthy seeds gave 10 stall findings
    (evaluations every 100 steps)."""
    findings = []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        n = 300 * every
        train_steps = np.arange(every * (1 if every == 100 else 5), n + 1,
                                every * (1 if every == 100 else 5))
        train = ((0.3 + 2.0 * np.exp(-train_steps / (n / 8)))
                 * np.exp(0.01 * rng.standard_normal(len(train_steps))))
        at = np.arange(every, n + 1, every)
        evals = (0.6 + np.exp(-at / (n / 8))) * (1 + 0.002 * rng.standard_normal(len(at)))
        data = RunData.from_series("run-1", {"train/loss": pd.Series(train, index=train_steps),
                                             "eval/loss": pd.Series(evals, index=at)})
        findings += Overfit().detect(data)
    assert not [f.summary for f in findings if "no better than its best" in f.summary]


def test_a_watcher_agrees_with_a_full_read_when_patience_reaches_past_the_noise_window(
        ) -> None:
    """patience 150: the in-phase train check reads the train levels of the last 150
    evaluations; a poll judging only its newest candidates loaded them from 100 back and
    skipped the check that a full read applies (a finding the full read does not have)."""
    rng = np.random.default_rng(0)
    t = np.arange(1, 24001)
    level = 0.3 + 2.0 * np.exp(-t / 3000)
    train = level * np.exp(0.005 * rng.standard_normal(len(t)))
    at = np.arange(10, 24001, 10)
    phase = at >= 10000  # the train points at the evaluations stay at step 10000's level
    train[at[phase] - 1] = level[10000 - 1] * np.exp(0.005 * rng.standard_normal(phase.sum()))
    evals = np.where(at > 15000, 0.6 + np.exp(-5.0) + 2e-6 * (at - 15000),
                     0.6 + np.exp(-at / 3000)) * (1 + 0.001 * rng.standard_normal(len(at)))
    rows = run(train, pd.Series(evals, index=at)).metrics
    streaming = Overfit(patience=150)
    for cut in (17000, 17170, 17180, 17190, 17300, 18000):
        data = RunData(run="run-1", metrics=rows[rows["step"] <= cut].reset_index(drop=True))
        assert [(f.onset_step, f.detected_step, f.state) for f in streaming.detect(data)] == [
            (f.onset_step, f.detected_step, f.state) for f in Overfit(patience=150).detect(data)]


@pytest.mark.filterwarnings("error")
def test_losses_at_zero_or_below_warn_nothing() -> None:
    """A train loss memorised to exactly 0, or a DPO-like loss that crosses 0, and an eval
    loss at exactly 0: judged without numpy warnings (they would reach the user's log)."""
    t = np.arange(1, 4001)
    healthy = 0.3 + 2.0 * np.exp(-t / 400)
    at = np.arange(100, 4001, 100)
    rising = pd.Series(0.6 + np.exp(-at / 300) + 2e-5 * (at - 2000).clip(0), index=at)
    zero = healthy.copy()
    zero[2500:] = 0.0
    for train, evals in ((zero, rising), (healthy - 0.8, rising),
                         (healthy, rising.where(rising.index <= 2500, 0.0))):
        Overfit().detect(run(train, evals))


def test_an_eval_loss_that_ties_its_best_of_zero_is_not_worse() -> None:
    """A best of exactly 0 (a memorised toy eval set) is matched, not exceeded, by the
    zeros after it: no evaluation lies above it, so nothing rose (the relative margin of
    0 must not turn a tie into "0.5% above its best")."""
    at = np.arange(100, 4001, 100)
    for train in (np.zeros(4000), train_loss()):
        assert Overfit().detect(run(train, pd.Series(np.zeros(len(at)), index=at))) == []
    # Off zero the same eval loss rising is still seen.
    climbing = pd.Series(np.where(at > 2000, 1e-3 * (at - 2000) / 100, 0.0), index=at)
    [finding] = Overfit().detect(run(train_loss(), climbing))
    assert finding.onset_step == 2100


def test_a_stall_on_a_noisy_flat_eval_does_not_flap() -> None:
    """The eval loss flat from 3000 with 0.1% noise while the train loss keeps dropping: a
    dip under the best by noise alone (far less than min_delta) must not resolve the stall,
    or it fires again and again; a real new best (by min_delta / 2) still resolves it."""
    rng = np.random.default_rng(2)
    t = np.arange(1, 12001)
    train = ((0.3 + 2.0 * np.exp(-t / 600)) * 0.85 ** (t // 2000)
             * np.exp(0.01 * rng.standard_normal(len(t))))
    at = np.arange(100, 12001, 100)
    flat = 0.6 + np.exp(-np.minimum(at, 3000) / 600)
    noisy = pd.Series(flat * (1 + 0.001 * rng.standard_normal(len(at))), index=at)
    findings = Overfit().detect(run(train, noisy))
    assert [f.state for f in findings] == ["firing"]
    better = noisy.where(noisy.index < 9000, noisy * 0.99)  # 1% lower from 9000 on
    # Resolved once the median of the last three is a new best by min_delta / 2: the
    # second evaluation at the new level.
    assert Overfit().detect(run(train, better))[0].resolved_step == 9100
    # One lucky evaluation 1% under the best is no new level: the stall stands.
    lucky = noisy.copy()
    lucky[9000] *= 0.99
    assert [f.state for f in Overfit().detect(run(train, lucky))] == ["firing"]


def test_a_rise_back_near_its_best_once_does_not_flap() -> None:
    """A rise of 5% fires at 2300; the median of three then comes within min_delta / 2 of
    the best for two evaluations only (as a noisy eval loss at its best's level does by
    noise now and then) and the eval loss is 3% up again. Back near it for three
    evaluations in a row resolves a rise; once was enough, and it fired again at 3200."""
    at = np.arange(100, 4001, 100)
    evals = 0.6 + np.exp(-np.minimum(at, 2000) / 400)
    after = [1.05] * 3 + [1.002] * 2 + [1.03] * 4 + [1.01] * (len(at) - 29)
    evals[at > 2000] = evals[at == 2000][0] * np.array(after)
    train = 0.3 + 2.0 * np.exp(-np.arange(1, 4001) / 600)
    [finding] = Overfit().detect(run(train, pd.Series(evals, index=at)))
    assert (finding.onset_step, finding.detected_step, finding.state) == (2100, 2300, "firing")


def test_a_train_level_that_moved_by_its_own_noise_does_not_hide_a_rise() -> None:
    """A per-batch loss with 5% noise, flat from step 1000: its median of 20 points moves
    about 2% from one evaluation to another by chance (here 1.7% up at 1300, against half
    the eval loss's 3% rise). The eval loss rises 1.5% per evaluation from its best at
    1000: the train level's move lies within its noise and does not hide the overfit at
    the third worse evaluation (it waited for 1400)."""
    t = np.arange(1, 3001)
    at = np.arange(100, 3001, 100)
    evals = np.where(at <= 1000, 0.85 + 0.6 * np.exp(-at / 300),
                     (0.85 + 0.6 * np.exp(-1000 / 300)) * (1 + 0.015 * (at - 1000) / 100))
    train = (0.8 + 0.6 * np.exp(-t / 200)) * np.exp(
        0.05 * np.random.default_rng(0).standard_normal(len(t)))
    train[1280:1300] *= 1.004
    [finding] = Overfit().detect(run(train, pd.Series(evals, index=at)))
    assert (finding.onset_step, finding.detected_step) == (1100, 1300)


def ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """AR(1) noise of unit variance: each point keeps ``phi`` of the one before."""
    shocks = rng.standard_normal(n)
    out = np.empty(n)
    out[0] = shocks[0]
    for i in range(1, n):
        out[i] = phi * out[i - 1] + np.sqrt(1 - phi * phi) * shocks[i]
    return out


def point_noise(values: np.ndarray) -> float:
    train = _Train(pd.Series(values, index=np.arange(1, len(values) + 1)), FiniteIndex())
    return float(_train_point_noise(train, np.array([len(values)]))[0])


def test_the_train_point_noise_reads_persistent_noise_at_its_full_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """3% noise that keeps 0.6 of itself from one point to the next changes only by
    ``3% * sqrt(2 * 0.4)`` per point: the changes alone read it at about 60% of its size
    (so a chance rise of the train loss at the evaluations looked like a swing). The
    changes over two points give the autocorrelation and the correction; white noise
    keeps its reading (up to the sampling error of two spreads of 200 changes); a slow
    swing (smooth from point to point) is at most doubled."""
    rng = np.random.default_rng(0)
    persistent = 1 + 0.03 * ar1(rng, 2000, 0.6)
    white = 1 + 0.03 * rng.standard_normal(2000)
    swing = 1 + 0.05 * np.sin(2 * np.pi * np.arange(2000) / 60) + 0.002 * rng.standard_normal(2000)
    corrected = {name: point_noise(v) for name, v in
                 [("persistent", persistent), ("white", white), ("swing", swing)]}
    monkeypatch.setattr(overfit_module, "_MAX_AUTOCORRELATION", 0.0)
    plain = {name: point_noise(v) for name, v in
             [("persistent", persistent), ("white", white), ("swing", swing)]}
    assert plain["persistent"] < 0.7 * 0.03
    assert corrected["persistent"] == pytest.approx(0.03, rel=0.3)
    # White noise: the ratio of the two spreads is 1 up to its sampling error (the
    # autocorrelation it implies is never taken below 0, so the reading may only grow).
    assert plain["white"] <= corrected["white"] <= 1.25 * plain["white"]
    assert plain["swing"] < corrected["swing"] <= 2 * plain["swing"] + 1e-12
    assert corrected["swing"] < 0.01  # far below the 5% swing the in-phase check must see


def test_a_train_loss_with_persistent_noise_does_not_hold_an_overfit_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A per-batch loss with 4% noise that keeps 0.7 of itself from step to step; the
    eval loss rises 1.5e-4 a step from 1500. At 1800 the train points at the last three
    evaluations happen to lie above those at the best: read from the point-to-point
    changes alone (a third of the noise's size too low) that rise looked beyond noise, a
    swing sampled at the evaluations, and held the finding back to 1900."""
    rng = np.random.default_rng(30)
    t = np.arange(1, 3001)
    train = (0.3 + 2.0 * np.exp(-t / 400)) * np.exp(0.04 * ar1(rng, 3000, 0.7))
    at = np.arange(100, 3001, 100)
    evals = (0.6 + np.exp(-at / 300) + 1.5e-4 * (at - 1500).clip(0)
             + 0.002 * rng.standard_normal(len(at)))
    data = run(train, pd.Series(evals, index=at))
    [finding] = Overfit().detect(data)
    assert (finding.onset_step, finding.detected_step) == (1600, 1800)
    monkeypatch.setattr(overfit_module, "_MAX_AUTOCORRELATION", 0.0)
    [finding] = Overfit().detect(data)
    assert (finding.onset_step, finding.detected_step) == (1600, 1900)


def held_spike_run(seed: int, rise_from: int | None = None) -> RunData:
    """20000 steps under a cosine LR: the loss law of the LR area, so both losses flatten
    towards the end; the train loss (2% noise per step) held x2.5 for 400 steps from 12000
    and back over ~150 more (a shard of bad batches), the eval loss (every 500 steps, 0.3%
    noise) untouched: it keeps falling, ever more slowly. ``rise_from``: the eval loss
    climbs 0.6% per evaluation from there (a real overfit after the spike)."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, 20001)
    area = np.cumsum(0.5 * (1 + np.cos(np.pi * t / len(t))))

    def law(s: np.ndarray) -> np.ndarray:
        return 2.4 + 4.0 * (1 + s / 200) ** -0.5

    since = t - 12000
    spike = np.where(since >= 0, 1 + 1.5 * np.exp(-np.maximum(since - 400, 0) / 150), 1.0)
    train = law(area) * np.exp(0.02 * rng.standard_normal(len(t))) * spike
    at = np.arange(500, 20001, 500)
    evals = law(area[at - 1]) * 1.02 * (1 + 0.003 * rng.standard_normal(len(at)))
    if rise_from is not None:
        evals = evals * (1 + 0.006 * np.clip((at - rise_from) / 500, 0, None))
    return run(train, pd.Series(evals, index=at))


@pytest.mark.parametrize("seed", [0, 1, 2, 4])
def test_a_held_train_spike_is_no_bend_of_the_gap(seed: int) -> None:
    """The train level held high by a spike and falling back makes the gap jump up by ~0.9
    inside the bend test's window; a least-squares bend fitted through it lay 20 to 100
    standard errors above zero, and on the converged eval loss, whose median sits above a
    lucky best by chance, a stall fired (in 32 of 60 seeds; none without the spike). The
    broken line does not describe such a gap: its residuals scatter ~20 times the gap's
    noise, and they are the noise its slopes are weighed against."""
    assert Overfit().detect(held_spike_run(seed)) == []


def test_an_overfit_after_a_held_train_spike_is_still_seen() -> None:
    """The same run with the eval loss climbing 0.6% per evaluation from 15000 (its best a
    lucky 14000): it fires once the rise clears the noise (before, a stall fired at 16500
    over the spike's bend, by luck at about the same evaluation)."""
    [finding] = Overfit().detect(held_spike_run(0, rise_from=15000))
    assert (finding.evidence["best_step"], finding.detected_step) == (14000, 17000)


def test_the_gap_trend_is_weighed_against_what_its_line_leaves_unexplained() -> None:
    """A flat gap (noise 0.005) that a train spike pushed down by 0.5 and let back inside
    the last 16 evaluations: its slope over them is large, but the line leaves residuals
    far beyond the gap's noise, so it proves no widening; a gap that widens steadily
    keeps its t statistic (its residuals are its noise)."""
    from analyzers.overfit import _gap_change_t, _gap_t
    rng = np.random.default_rng(0)
    flat = 0.03 + 0.005 * rng.standard_normal(60)
    flat[50:53] -= [0.5, 0.3, 0.1]
    assert _gap_t(flat, np.array([59]), np.array([0.005]))[0] < 4
    assert _gap_change_t(flat, np.array([59]), np.array([0.005]))[0] < 4
    widening = 0.03 + 0.005 * rng.standard_normal(60)
    widening[44:] += 0.004 * np.arange(16)
    assert _gap_t(widening, np.array([59]), np.array([0.005]))[0] > 10
    assert _gap_change_t(widening, np.array([59]), np.array([0.005]))[0] > 4


def test_several_eval_sets_without_an_eval_loss_are_each_judged_and_told_once() -> None:
    """HF Trainer with several eval datasets logs ``eval_<set>_loss`` and no
    ``eval_loss``: every set turns after its best at step 400 while the train loss falls;
    one finding, on the set that turned first, naming the others."""
    train = pd.Series(np.geomspace(1.1, 0.05, 300), index=np.arange(40, 12040, 40))
    eval_steps = np.arange(400, 12400, 400)
    rise = np.r_[1.0, np.linspace(1.02, 2.4, len(eval_steps) - 1)]
    sets = {"eval_g0_loss": pd.Series(1.11 * rise, index=eval_steps),
            "eval_g1_loss": pd.Series(1.62 * rise, index=eval_steps),
            "eval_g1_runtime": pd.Series(np.full(len(eval_steps), 3.0), index=eval_steps)}
    data = RunData.from_series("r", {"train/loss": train, **sets})
    [finding] = Overfit().detect(data)
    assert (finding.metric, finding.onset_step) == ("eval_g0_loss", 800)  # first worse eval
    assert finding.evidence["also_on"] == ["eval_g1_loss"]
    assert finding.summary.endswith("(also on eval_g1_loss)")
    flat = {k: pd.Series(np.full(len(eval_steps), 1.0) - 1e-3 * np.arange(len(eval_steps)),
                         index=eval_steps) for k in ("eval_g0_loss", "eval_g1_loss")}
    assert Overfit().detect(RunData.from_series("r", {"train/loss": train, **flat})) == []
