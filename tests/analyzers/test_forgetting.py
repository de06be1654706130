"""Golden series for the forgetting analyzer: exact onset, detection and resolve steps."""

from __future__ import annotations

import json
import warnings

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
    # 0.60 until 2000, then -0.0125 per evaluation: a CUSUM of 1.8, 3.8 and 5.8 noise units
    # (noise 0.62%, the prior's, slack 1.58; the second evaluation adds only its cap of 2)
    # fires at the third evaluation of the drop.
    assert (finding.onset_step, finding.detected_step) == (2250, 2750)
    assert (finding.state, finding.severity, finding.metric) == (
        "firing", "warning", "eval/general/accuracy")
    assert finding.summary == (
        "eval/general/accuracy 0.6 at its first 9 evaluations (mean, steps 0–2000) → 0.562 at "
        "step 2750, -6.2% (noise 0.6%), 5.8 noise units of shortfall over 3 evaluations, "
        "while eval/loss improved 2.20 → 1.28 (-41.7%)")
    evidence = finding.evidence
    assert evidence["baseline_source"] == "first evaluations"
    assert (evidence["baseline"], evidence["baseline_evaluations"]) == (0.6, 9)
    assert evidence["last_good_step"] == 2000
    assert evidence["domain"]["tag"] == "eval/loss"
    assert [s for s, _, _, _ in evidence["evaluations"]][-4:] == [2000, 2250, 2500, 2750]
    assert [round(c, 2) for _, _, _, c in evidence["evaluations"]][-4:] == [0, 1.78, 3.78, 5.78]
    # The checkpoint at the last evaluation before the drop.
    assert (finding.rollback_to.step, finding.rollback_to.path) == (2000, "ckpt/checkpoint-2000")
    assert "fall short" in finding.rollback_to.reason
    spec = CATALOG["forgetting"]
    assert finding.fixes == list(spec.fixes) and finding.fixes[0].text.startswith("Mix")
    assert (finding.kind, finding.source) == ("not_learning", spec.source)
    json.dumps(finding.to_dict(), allow_nan=False)


def test_the_baseline_can_come_from_the_run_metadata() -> None:
    """The base model scored 0.70: the run is 14% below it from its first evaluation on,
    which is judged too; the second fires (one evaluation adds at most half the
    threshold)."""
    [finding] = Forgetting().detect(run(general(None), meta={"baseline": {
        "eval/general/accuracy": "0.70"}}))
    assert (finding.onset_step, finding.detected_step) == (0, 250)
    assert finding.evidence["baseline_source"] == "meta"
    assert finding.evidence["baseline_evaluations"] == 0
    assert finding.summary.startswith("eval/general/accuracy 0.7 at the run's baseline → 0.6 "
                                      "at step 250, -14.3% (noise 1.0%)")
    # The noise is that of the evaluations so far (the prior, with two), not of later ones.
    assert finding.evidence["noise"] == pytest.approx(0.01, abs=1e-4)
    assert finding.rollback_to is None  # no evaluation before the drop
    # A baseline that is not a number is ignored: the first evaluations are the baseline.
    assert Forgetting().detect(run(general(None), meta={"baseline": {
        "eval/general/accuracy": "n/a"}})) == []


def test_no_finding_when_the_domain_eval_does_not_improve() -> None:
    """Everything getting worse is a divergence, not forgetting."""
    assert Forgetting().detect(run(general(), domain_loss(falling=False))) == []
    assert Forgetting().detect(RunData.from_series(
        "run-1", {"eval/general/accuracy": general()})) == []


def test_a_noisy_suite_needs_a_drop_beyond_its_own_noise() -> None:
    """A small suite whose score wobbles by 2% (relative) around a flat level: shortfalls
    of a noise unit or two are within the slack."""
    noisy = general(None, sd=0.012, seed=3)
    assert Forgetting().detect(run(noisy)) == []
    assert len(Forgetting(slack=0).detect(run(noisy))) == 1  # without the slack
    # A real drop stands out of the same noise, measured in its units.
    [finding] = Forgetting().detect(run(general(2000, per_step=2e-4, sd=0.012, seed=3)))
    assert (finding.onset_step, finding.detected_step) == (2500, 2750)
    assert finding.evidence["noise"] == pytest.approx(0.025, abs=0.001)


def test_a_clear_drop_fires_at_its_second_evaluation() -> None:
    """A 10% drop of a suite with 0.5% noise: 20 noise units, but one evaluation adds at
    most half the threshold, so it fires at the second."""
    for seed in range(5):
        values = general(None, sd=0.003, seed=seed)
        values[values.index >= 3000] -= 0.06
        [finding] = Forgetting().detect(run(values))
        assert (finding.onset_step, finding.detected_step) == (3000, 3250)


def test_a_small_sustained_drop_fires_later() -> None:
    """A 2% step down (four noise units, less the slack) takes a few evaluations to add up;
    a 1% one (half of it within the slack) longer."""
    values = general(None, sd=0.003, seed=1)
    values[values.index >= 2000] -= 0.012
    [finding] = Forgetting().detect(run(values))
    assert (finding.onset_step, finding.detected_step) == (2000, 2750)
    values = general(None, sd=0.003, seed=0)
    values[values.index >= 2000] -= 0.006
    [finding] = Forgetting().detect(run(values))
    assert (finding.onset_step, finding.detected_step) == (2000, 3000)


def test_a_wobble_within_the_noise_never_fires() -> None:
    """A flat suite with 1% noise per evaluation, fifty seeds: never a finding."""
    assert not any(Forgetting().detect(run(general(None, sd=0.006, seed=seed)))
                   for seed in range(50))


def test_a_drop_does_not_lower_its_own_baseline() -> None:
    """The baseline is the mean of the evaluations before the drop: a long drop is judged
    against the level before it, not a mean that the drop itself pulls down."""
    [finding] = Forgetting().detect(run(general(1000)))
    assert finding.evidence["baseline"] == 0.6
    assert finding.evidence["baseline_evaluations"] == 5  # steps 0–1000
    # Its shortfall keeps growing against it: every later evaluation adds to the CUSUM.
    cusum = [c for s, _, _, c in finding.evidence["evaluations"] if s > 1000]
    assert all(b > a for a, b in zip(cusum, cusum[1:], strict=False))


def test_a_single_bad_evaluation_does_not_fire() -> None:
    values = general(None)
    values[2500] = 0.50
    values[3000] = 0.55
    assert Forgetting().detect(run(values)) == []
    # Two in a row do; the suite is back at its level at the next, so it resolves.
    values = general(None)
    values[2500] = values[2750] = 0.50
    [finding] = Forgetting().detect(run(values))
    assert (finding.onset_step, finding.detected_step) == (2500, 2750)
    assert (finding.state, finding.resolved_step) == ("resolved", 3250)


def test_it_resolves_when_the_general_suite_recovers() -> None:
    values = general()
    values[values.index >= 3500] = 0.598  # replay mixed in from step 3500
    [finding] = Forgetting().detect(run(values))
    assert (finding.onset_step, finding.detected_step) == (2250, 2750)
    # The median of the last three shortfalls is back within the slack at 3750.
    assert (finding.state, finding.resolved_step) == ("resolved", 3750)


def test_loss_like_general_metrics_are_lower_is_better() -> None:
    rising = pd.Series(1.5 + 1e-4 * (EVALS - 2000).clip(0), index=EVALS)
    [finding] = Forgetting().detect(run(rising, tag="eval/general/wiki_loss"))
    assert finding.metric == "eval/general/wiki_loss"
    assert (finding.onset_step, finding.detected_step) == (2250, 2750)


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
    ({"threshold": 0}, "threshold"),
    ({"slack": -1}, "slack"),
    ({"min_gain": float("nan")}, "min_gain"),
])
def test_bad_parameters_are_rejected(params: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Forgetting(**params)


def short_run(values: list[float]) -> RunData:
    """A general accuracy evaluated every 100 steps while eval/loss falls."""
    steps = np.arange(len(values)) * 100
    return RunData.from_series("run-1", {
        "eval/general/accuracy": pd.Series(values, index=steps),
        "eval/loss": pd.Series(np.linspace(2, 1, len(values)), index=steps)})


def test_an_open_finding_keeps_its_onset_when_a_good_evaluation_drains_the_cusum() -> None:
    """One very good evaluation empties the CUSUM of a finding that has fired: the finding
    keeps its onset (never after its detection, never past the last evaluation) and stays
    open until the median of three evaluations is back within the slack."""
    drop = [0.62, 0.621, 0.619, 0.62, 0.62, 0.50, 0.50]
    for tail in ([], [0.95], [0.95, 0.50]):
        [finding] = Forgetting().detect(short_run(drop + tail))
        assert (finding.onset_step, finding.detected_step) == (500, 600)
    flat = list(0.62 + 0.001 * np.random.default_rng(0).standard_normal(12))
    for tail in ([0.95], [0.95, 0.50], [0.95, 0.50, 0.50]):
        [finding] = Forgetting().detect(short_run(flat + [0.50, 0.50] + tail))
        assert (finding.onset_step, finding.detected_step, finding.state) == (
            1200, 1300, "firing")
    [finding] = Forgetting().detect(short_run(flat + [0.50, 0.50, 0.95, 0.62, 0.62]))
    assert (finding.onset_step, finding.resolved_step) == (1200, 1500)


def test_the_eval_loops_runtime_is_not_a_domain_eval() -> None:
    """HF logs eval/runtime and eval/samples_per_second next to eval/loss: a slower eval
    (judged higher-is-better) is not the new skill improving."""
    steps = np.arange(21) * 100
    worse = {"eval/general/accuracy": pd.Series(np.r_[np.full(10, 0.62), np.full(11, 0.55)],
                                                index=steps),
             "eval/loss": pd.Series(np.r_[np.full(10, 1.0), np.full(11, 1.5)], index=steps)}
    noise = {"eval/runtime": pd.Series(np.linspace(10, 11, 21), index=steps),
             "eval/samples_per_second": pd.Series(np.linspace(50, 60, 21), index=steps),
             "eval/steps_per_second": pd.Series(np.linspace(5, 6, 21), index=steps)}
    assert Forgetting().detect(RunData.from_series("run-1", {**worse, **noise})) == []
    # eval/perplexity and an eval/<suite>/<metric> are domain evals.
    for tag, series in (("eval/perplexity", np.linspace(8, 4, 21)),
                        ("eval/business/pass_rate", np.linspace(0.3, 0.5, 21))):
        [finding] = Forgetting().detect(RunData.from_series(
            "run-1", {**worse, **noise, tag: pd.Series(series, index=steps)}))
        assert finding.evidence["domain"]["tag"] == tag


def test_huge_values_neither_overflow_nor_warn() -> None:
    """The noise and the shortfall are relative: a suite logged at 1e160 fires as it does
    at 0.6, and a 1e300 glitch raises no overflow."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [plain] = Forgetting().detect(run(general()))
        [huge] = Forgetting().detect(run(general() * 1e160))
        assert (huge.onset_step, huge.detected_step) == (plain.onset_step, plain.detected_step)
        assert huge.evidence["noise"] == pytest.approx(plain.evidence["noise"])
        values = general(None)
        values[1250] = 1e300
        assert Forgetting().detect(run(values)) == []


def test_a_glitch_leaves_the_noise_estimate_with_its_window() -> None:
    """The noise is that of the last hundred differences: a 1e20 (or 1e8) glitch two
    hundred evaluations before a drop does not change the noise the drop is judged in."""
    steps = np.arange(200) * 100
    values = 0.62 + 0.003 * np.random.default_rng(0).standard_normal(200)
    values[180:] -= 0.06

    def judged(series: np.ndarray) -> tuple:
        [finding] = Forgetting().detect(RunData.from_series("run-1", {
            "eval/general/accuracy": pd.Series(series, index=steps),
            "eval/loss": pd.Series(np.linspace(2, 1, 200), index=steps)}))
        return finding.onset_step, finding.detected_step, finding.evidence["noise"]

    clean = judged(values)
    assert clean[:2] == (18000, 18100)
    for glitch in (1e8, 1e20):
        glitched = values.copy()
        glitched[30] = glitch
        assert judged(glitched) == pytest.approx(clean, rel=1e-9)


def _long_run(values: np.ndarray) -> RunData:
    """A run of len(values) evaluations every 100 steps with a falling eval loss."""
    steps = np.arange(len(values)) * 100
    return RunData.from_series(
        "run-1", {"eval/general/accuracy": pd.Series(values, index=steps),
                  "eval/loss": pd.Series(1.2 + np.exp(-steps / 1000), index=steps)})


def test_a_gradual_fall_is_found_by_the_ramp_test_sooner() -> None:
    """A suite with 0.6% noise falling 1% of its level per evaluation from evaluation 20:
    the ramp test (the shortfalls weighted by a ramp from each onset) fires evaluations
    before the CUSUM, whose slack drops most of a ramp's first evaluations."""
    ramp_first, cusum_only = [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        fall = 0.01 * np.maximum(0, np.arange(40) - 19)
        values = 0.6 * (1 - fall) * (1 + 0.006 * rng.standard_normal(40))
        [finding] = Forgetting().detect(_long_run(values))
        [slower] = Forgetting(ramp_threshold=1e9).detect(_long_run(values))
        ramp_first.append(finding.detected_step)
        cusum_only.append(slower.detected_step)
        assert finding.detected_step <= slower.detected_step
        assert 1500 <= finding.onset_step <= 2100
    assert np.mean(ramp_first) <= np.mean(cusum_only) - 50
    assert np.median(np.array(ramp_first) - 2000) <= 300


def test_the_ramp_test_reports_its_statistic() -> None:
    rng = np.random.default_rng(1)
    fall = 0.01 * np.maximum(0, np.arange(40) - 19)
    values = 0.6 * (1 - fall) * (1 + 0.008 * rng.standard_normal(40))
    [finding] = Forgetting().detect(_long_run(values))
    assert (finding.onset_step, finding.detected_step) == (2000, 2200)
    assert finding.evidence["ramp"] >= finding.evidence["ramp_threshold"] == 4.5
    assert finding.evidence["cusum"] < finding.evidence["threshold"]  # not the CUSUM's yet
    assert "(ramp test) over 3 evaluations" in finding.summary


def test_a_single_glitch_does_not_carry_the_ramp_test(monkeypatch) -> None:
    """A flat suite (0.6% noise) with one evaluation 10% low, a hundred seeds, the CUSUM
    off: an evaluation counts at most a noise unit above the ramp through the others'
    median slope, so the glitch seldom fires the ramp test; without that clip it often
    does."""
    def fired() -> int:
        count = 0
        for seed in range(100):
            rng = np.random.default_rng(seed)
            values = 0.6 * (1 + 0.006 * rng.standard_normal(40))
            values[int(rng.integers(15, 39))] *= 0.9
            count += bool(Forgetting(threshold=1e9).detect(_long_run(values)))
        return count
    assert fired() <= 1
    import analyzers.forgetting as module
    monkeypatch.setattr(module, "_RAMP_CLIP", np.inf)
    assert fired() >= 5


def test_a_resolved_fall_is_not_the_start_of_the_next_ramp() -> None:
    """A fall of 1.5% per evaluation from step 2300 that comes back at step 3000: one
    finding, resolved there. The two slightly low evaluations after it do not re-fire
    through a ramp whose onset reaches back before the resolve (the old flap: a second
    finding from step 2300, detected at 3200, resolved at 3300)."""
    values = 0.6 * np.array([
        0.9975, 0.9916, 0.9948, 1.0189, 0.9946, 1.0005, 0.9958, 1.0041, 1.0029, 0.9918,
        1.0043, 1.0008, 1.0018, 1.0076, 1.0047, 0.9726, 0.9968, 0.9995, 1.0045, 1.0068,
        0.9978, 0.9939, 1.0052, 0.9895, 0.9786, 0.9481, 0.9373, 0.9372, 0.917, 0.99,
        0.9922, 0.9806, 0.9806, 1.0028])
    [finding] = Forgetting().detect(_long_run(values))
    assert (finding.onset_step, finding.detected_step, finding.resolved_step) == (
        2300, 2500, 3000)
    # A fresh fall after the resolve is still found, from its own onset.
    again = np.concatenate([values, 0.6 * (1 - 0.03 * np.arange(1, 6))])
    first, second = Forgetting().detect(_long_run(again))
    assert first.resolved_step == 3000 and second.onset_step == 3400
