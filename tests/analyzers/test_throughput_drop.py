"""Golden series for the throughput-drop analyzer: exact onset, detection and resolve steps;
evaluation and checkpoint slowdowns that must stay quiet; real logs from the corpus."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.throughput_drop import ThroughputDrop
from connectors.registry import open_source
from tests.corpus import CORPUS

MANIFEST = CORPUS / "MANIFEST.csv"


def speed(n: int, level: float = 50_000.0, sd: float = 0.03, seed: int = 0) -> np.ndarray:
    """Tokens/s with log-normal step-to-step noise."""
    return level * np.exp(sd * np.random.default_rng(seed).standard_normal(n))


def run(values: np.ndarray, metric: str = "throughput",
        checkpoints: list[Checkpoint] | None = None) -> RunData:
    """Steps are 10, 20, 30, …: point ``i`` is logged at step ``10 * (i + 1)``."""
    return RunData.from_series("run-1", {metric: values},
                               steps=10 * np.arange(1, len(values) + 1),
                               checkpoints=checkpoints)


def step(i: int) -> int:
    return 10 * (i + 1)


def test_a_lasting_drop_fires_after_patience_and_resolves_on_recovery() -> None:
    tokens = speed(500)
    tokens[200:320] *= 0.5
    cps = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (1000, 2000)]
    [finding] = ThroughputDrop().detect(run(tokens, checkpoints=cps))
    assert (finding.onset_step, finding.detected_step) == (step(200), step(209))
    assert (finding.state, finding.resolved_step) == ("resolved", step(329))
    assert finding.severity == "warning"
    assert finding.summary == ("throughput fell 50% from step 2010: 24,647 over its first 10 "
                               "points, against a median of 49,736 over the 50 points before")
    evidence = finding.evidence
    assert evidence["before"] == pytest.approx(np.median(tokens[150:200]), rel=1e-4)
    assert evidence["after"] == pytest.approx(np.median(tokens[200:210]), rel=1e-4)
    assert evidence["drop"] == pytest.approx(0.5, abs=0.01)
    assert [s for s, _ in evidence["points"]] == [step(i) for i in range(195, 225)]
    spec = CATALOG["throughput_drop"]
    assert finding.fixes == list(spec.fixes)
    assert (finding.kind, finding.source) == ("slow", spec.source)
    assert finding.rollback_to is None  # a slow run's weights are fine


def test_a_drop_that_lasts_keeps_one_finding_firing() -> None:
    tokens = speed(500)
    tokens[300:] *= 0.6
    [finding] = ThroughputDrop().detect(run(tokens))
    assert (finding.onset_step, finding.state, finding.resolved_step) == (step(300), "firing",
                                                                         None)


def test_evaluation_and_checkpoint_pauses_never_fire() -> None:
    """An evaluation pause (one step at a quarter speed) every 20 points, a checkpoint save
    (three slow steps) every 50, and their overlap: a cluster of slow steps shorter than
    patience."""
    tokens = speed(2000)
    tokens[::20] /= 4
    for start in range(0, 2000, 50):
        tokens[start:start + 3] /= 3
    assert ThroughputDrop().detect(run(tokens)) == []


def test_tqdm_smoothed_pauses_shorter_than_patience_never_fire() -> None:
    """tqdm's s/it is smoothed: after an evaluation it decays over several points (the
    qwen3 log: 111 → 84 → 65 → 52 → 43 → 36 → 32 → 29 s/it against a median of 21)."""
    seconds = 21.4 * np.exp(0.005 * np.random.default_rng(2).standard_normal(1800))
    for start in range(200, 1800, 200):
        seconds[start:start + 12] = 21.4 + 89.6 * 0.78 ** np.arange(12) ** 1.1
    assert ThroughputDrop(metric="s_per_it", mode="min").detect(
        run(seconds, metric="s_per_it")) == []


@pytest.mark.parametrize(("slow_points", "fires"), [(9, False), (10, True)])
def test_persistence_is_patience_points_in_a_row(slow_points: int, fires: bool) -> None:
    tokens = speed(400)
    tokens[200:200 + slow_points] *= 0.5
    findings = ThroughputDrop().detect(run(tokens))
    assert [f.onset_step for f in findings] == ([step(200)] if fires else [])


def test_one_fast_point_in_the_run_restarts_it() -> None:
    tokens = speed(400)
    tokens[200:240] *= 0.5
    tokens[205] = 50_000.0
    [finding] = ThroughputDrop().detect(run(tokens))
    assert (finding.onset_step, finding.detected_step) == (step(206), step(215))


@pytest.mark.parametrize(("factor", "fires"), [(0.75, False), (0.65, True)])
def test_the_drop_must_reach_min_drop(factor: float, fires: bool) -> None:
    tokens = speed(400, sd=0.01)
    tokens[200:] *= factor
    assert bool(ThroughputDrop().detect(run(tokens))) == fires


def test_a_partial_recovery_does_not_resolve() -> None:
    tokens = speed(600, sd=0.01)
    tokens[200:300] *= 0.5
    tokens[300:] *= 0.85  # back up, but still 15% slower than before the drop
    [finding] = ThroughputDrop().detect(run(tokens))
    assert finding.state == "firing"
    [finding] = ThroughputDrop(recovery=0.2).detect(run(tokens))
    assert (finding.state, finding.resolved_step) == ("resolved", step(309))


def test_a_second_drop_is_judged_against_the_level_before_the_first() -> None:
    """After a 40-point drop, a second one: its level leaves the first drop's points out."""
    tokens = speed(600, sd=0.02)
    tokens[200:240] *= 0.5
    tokens[260:300] *= 0.6
    first, second = ThroughputDrop().detect(run(tokens))
    assert (first.onset_step, first.resolved_step) == (step(200), step(249))
    assert (second.onset_step, second.resolved_step) == (step(260), step(309))
    assert second.evidence["before"] == pytest.approx(50_000, rel=0.02)
    assert second.evidence["baseline_points"] == 50


def test_step_times_are_judged_as_their_inverse() -> None:
    seconds = 0.2 * np.exp(0.03 * np.random.default_rng(4).standard_normal(400))
    seconds[250:] *= 1.6  # 1 / 1.6: the speed fell 38% (39% with the noise)
    [finding] = ThroughputDrop(metric="step_time_s", mode="min").detect(
        run(seconds, metric="step_time_s"))
    assert (finding.onset_step, finding.detected_step) == (step(250), step(259))
    assert finding.summary == ("step_time_s rose 1.6x from step 2510 (the speed fell 39%): "
                               "0.327 over its first 10 points, against a median of 0.201 "
                               "over the 50 points before")
    assert finding.evidence["mode"] == "min"
    seconds[250:] /= 1.6 ** 2  # faster steps never fire
    assert ThroughputDrop(metric="step_time_s", mode="min").detect(
        run(seconds, metric="step_time_s")) == []


def test_warm_up_points_are_neither_judged_nor_a_level() -> None:
    """The first 40 steps run on a warm cache, then the loader settles 35% slower."""
    tokens = speed(400, sd=0.01)
    tokens[40:] *= 0.65
    assert ThroughputDrop().detect(run(tokens)) == []
    [finding] = ThroughputDrop(grace_period=0).detect(run(tokens))
    assert finding.onset_step == step(50)  # the first point with 50 points before it


def test_a_run_that_speeds_up_or_is_noisy_does_not_fire() -> None:
    tokens = speed(3000, sd=0.1, seed=7)  # ±10% step to step
    tokens[1000:] *= 1.5
    tokens[np.random.default_rng(8).integers(0, 3000, 100)] /= 5  # stray slow steps
    assert ThroughputDrop().detect(run(tokens)) == []


def test_non_finite_and_zero_readings_are_skipped() -> None:
    tokens = speed(400)
    tokens[[100, 101, 102]] = [np.nan, np.inf, 0.0]
    tokens[200:212] = 0.0  # nothing logged as processed: not a speed
    assert ThroughputDrop().detect(run(tokens)) == []


def test_constant_throughput_is_quiet() -> None:
    assert ThroughputDrop().detect(run(np.full(1000, 1e5))) == []


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"mode": "rate"}, "mode"),
    ({"window": 2}, "window"),
    ({"min_drop": 0}, "min_drop"),
    ({"min_drop": 1.0}, "min_drop"),
    ({"patience": 0}, "patience"),
    ({"recovery": -0.1}, "recovery"),
    ({"recovery": 0.3}, "recovery"),
    ({"grace_period": -1}, "grace_period"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        ThroughputDrop(**kwargs)


def test_a_million_points_are_analysed() -> None:
    rng = np.random.default_rng(1)
    tokens = speed(1_000_000, sd=0.05)
    for start in rng.integers(100, 999_000, 30):
        tokens[start:start + 100] *= 0.5
    data = run(tokens)
    data.series("throughput")
    findings = ThroughputDrop().detect(data)
    assert len(findings) >= 25


# --- the shared corpus ------------------------------------------------------------

needs_corpus = pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")


def corpus_run(relative: str) -> RunData:
    batch = open_source(str(CORPUS / relative)).discover()[0].read(final=True)
    return RunData(run=relative, metrics=batch.points, checkpoints=batch.checkpoints,
                   meta=batch.meta)


@needs_corpus
def test_qwen3_evaluation_pauses_stay_quiet() -> None:
    """The HF console log's tqdm s/it is not a metric runwatch reads (no tag); read here
    from the raw text: median 21.4 s/it, ~111 right after every 200th step, decaying back
    over about seven points. Quiet at patience 10; patience 6 would fire at every one."""
    text = (CORPUS / "hf_console_log" / "qwen3_medical_qlora_training.log").read_text()
    seconds = {int(m[1]): float(m[2])
               for m in re.finditer(r"(\d+)/1755 \[[^\]]*?, ([\d.]+)s/it\]", text)}
    steps = sorted(seconds)
    data = RunData.from_series("qwen3", {"s_per_it": [seconds[s] for s in steps]}, steps=steps)
    assert "s_per_it" not in corpus_run("hf_console_log/qwen3_medical_qlora_training.log").tags()
    assert ThroughputDrop(metric="s_per_it", mode="min").detect(data) == []
    eager = ThroughputDrop(metric="s_per_it", mode="min", patience=6).detect(data)
    assert [f.onset_step for f in eager] == list(range(201, 1800, 200))


@needs_corpus
@pytest.mark.parametrize(("relative", "metric", "mode"), [
    # 6 iteration-time outliers >2x (worst 88.1 s at step 9870 against 8.96 s)
    ("megatron_golden_json/mixtral_8x7b_release_h100.json", "iteration-time", "min"),
    ("megatron_golden_json/gpt3_15b_8t_release_h100.json", "iteration-time", "min"),
    ("megatron_golden_json/t5_release_h100.json", "iteration-time", "min"),
    ("custom_text/gpt2_lora_alpaca_train.log", "step_time_s", "min"),
    ("deepspeed_chat_text/dschat_step1_sft_opt1.3b.log", "throughput", "max"),
    ("olmo_text/olmo1b_tied_no_scale.log", "throughput", "max"),
    ("olmo_text/olmo20m_train_fresh_zero_grad.log", "throughput", "max"),
])
def test_real_speed_series_stay_quiet(relative: str, metric: str, mode: str) -> None:
    data = corpus_run(relative)
    assert len(data.series(metric)) >= 40
    assert ThroughputDrop(metric=metric, mode=mode).detect(data) == []


@needs_corpus
def test_modded_nanogpt_sporadic_slow_steps_stay_quiet() -> None:
    """Per-step times from its cumulative train_time: median 214 ms, 66 steps over 2x."""
    train_time = corpus_run("modded_nanogpt_text/modded_nanogpt_muon_record.txt").series(
        "train_time_ms")
    per_step = np.diff(train_time.to_numpy())  # the timer's reset at step 10 is negative
    data = RunData.from_series("nanogpt", {"step_ms": per_step},
                               steps=train_time.index.to_numpy()[1:])
    assert int((per_step > 2 * np.median(per_step)).sum()) == 66
    assert ThroughputDrop(metric="step_ms", mode="min").detect(data) == []


@needs_corpus
def test_runs_with_no_visible_problem_stay_quiet() -> None:
    with open(MANIFEST, newline="") as fh:
        healthy = [row["file"] for row in csv.DictReader(fh)
                   if row["your_observation"].startswith("NO VISIBLE PROBLEM")]
    for relative in healthy:
        assert ThroughputDrop().detect(corpus_run(relative)) == [], relative
