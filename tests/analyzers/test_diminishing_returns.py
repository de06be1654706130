"""Golden series for the diminishing-returns analyzer (the stop-loss rule)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzers import RunData, diminishing_returns
from analyzers.catalog import CATALOG
from analyzers.diminishing_returns import DiminishingReturns
from analyzers.overfit import Overfit
from connectors.registry import open_source
from tests.corpus import CORPUS
from tests.demo_logs import demo_logs

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = CORPUS / "MANIFEST.csv"


def evals(values: list[float] | np.ndarray, every: int = 100) -> pd.Series:
    """Evaluations at steps 100, 200, 300, …"""
    return pd.Series(np.asarray(values, dtype=float),
                     index=every * np.arange(1, len(values) + 1))


def run(values: list[float] | np.ndarray | pd.Series, tag: str = "eval/loss",
        config: dict | None = None) -> RunData:
    series = values if isinstance(values, pd.Series) else evals(values)
    meta = {"config": config} if config is not None else {}
    return RunData.from_series("run-1", {tag: series}, meta=meta)


def converging(n: int = 40, scale: float = 600, noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """1.2 + e^(-t/scale) at t = 100, 200, …, with relative noise."""
    t = 100 * np.arange(1, n + 1)
    rng = np.random.default_rng(seed)
    return (1.2 + np.exp(-t / scale)) * (1 + noise * rng.standard_normal(n))


def test_a_converged_eval_loss_fires_the_stop_loss_rule() -> None:
    [finding] = DiminishingReturns().detect(run(converging()))
    # 1.2 + e^(-t/600): the three evaluations after step 2700 gain 0.36% on it in all.
    assert (finding.onset_step, finding.detected_step) == (2800, 3000)
    assert (finding.severity, finding.state, finding.resolved_step) == ("info", "firing", None)
    assert finding.summary == ("eval/loss has not improved by 0.5% on 1.21 (step 2700) over 3 "
                               "evaluations (steps 2800–3000; best since 1.21, -0.36%); "
                               "stop-loss rule: stop after 3 evaluations that improve less "
                               "than 0.5%")
    evidence = finding.evidence
    assert evidence["rule"] == {"evaluations": 3, "min_improvement": 0.005, "mode": "min",
                                "grace_period": 3, "set_by": "analyzer"}
    assert (evidence["test"], evidence["reference_step"], len(evidence["evaluations"])) == (
        "flat", 2700, 3)
    assert all(gain < 0.005 for _, _, gain in evidence["evaluations"])
    assert evidence["improvement_per_1k_steps"] == pytest.approx(evidence["improvement"] / 0.3)
    json.dumps(finding.to_dict(), allow_nan=False)
    spec = CATALOG["diminishing_returns"]
    assert finding.fixes == list(spec.fixes)
    assert finding.fixes[0].request == "stop"
    assert (finding.kind, finding.source, finding.rollback_to) == ("not_learning", spec.source,
                                                                   None)


def test_the_rule_is_n_evaluations_without_an_improvement_of_x_on_the_reference() -> None:
    """0.3% per evaluation adds up to 0.5% every second evaluation: still progress. Under
    a rule of 2% it is a stall, and returns never come back to 2% per evaluation."""
    steady = 2.0 * 0.997 ** np.arange(60)
    assert DiminishingReturns().detect(run(steady)) == []
    [finding] = DiminishingReturns(min_improvement=0.02).detect(run(steady))
    assert (finding.onset_step, finding.detected_step, finding.state) == (900, 1100, "firing")


def test_a_bounce_back_after_a_bad_evaluation_is_not_progress() -> None:
    """Each bounce back to 1.0 gains 0.3-0.9% on the evaluation before: no progress on the
    reference. (Bounces of 10-30% make the evaluation noise so large that a trend of
    seven evaluations cannot show the stall under 0.5% per evaluation: quiet.)"""
    values = [2.0, 1.5, 1.2, 1.0, 1.0, 1.006, 1.0, 1.009, 1.0, 1.003, 1.0, 1.006, 1.0, 1.003]
    [finding] = DiminishingReturns().detect(run(values))
    assert finding.evidence["reference_step"] == 400
    assert finding.onset_step == 500


def test_patience_is_counted_in_evaluations() -> None:
    """A flat stall right after a steep descent: the trend over the last 2 N evaluations
    still slopes down for one evaluation more (the trend test's price)."""
    values = [2.0, 1.5, 1.2, 1.0] + [1.0] * 8
    assert [f.detected_step for f in DiminishingReturns().detect(run(values))] == [900]
    assert [f.detected_step for f in DiminishingReturns(evaluations=5).detect(run(values))] \
        == [1100]
    assert DiminishingReturns(evaluations=9).detect(run(values)) == []


def test_a_break_in_the_pace_fires_within_n_evaluations() -> None:
    """1% per evaluation, then 0.1% from step 2100: the last three evaluations' pace is under
    0.5% and under a quarter of the six before it, by far more than the noise, at two
    evaluations in a row; the flat test alone would wait for the trend of six."""
    rng = np.random.default_rng(0)
    pace = np.where(np.arange(40) < 20, 0.01, 0.001)
    values = 3.0 * np.cumprod(1 - pace) * (1 + 0.001 * rng.standard_normal(40))
    [finding] = DiminishingReturns().detect(run(values))
    assert (finding.evidence["test"], finding.onset_step, finding.detected_step) == (
        "break", 2200, 2400)
    assert finding.summary.startswith("eval/loss improves 0.")
    assert "under 25% of its pace of 0.9" in finding.summary


def test_a_pace_that_falls_with_the_learning_rate_is_not_a_break() -> None:
    """The same slowdown while the logged LR falls to 5% of its level (an annealing
    schedule slows the loss by design): only the flat test fires, later."""
    rng = np.random.default_rng(0)
    pace = np.where(np.arange(40) < 20, 0.01, 0.001)
    values = 3.0 * np.cumprod(1 - pace) * (1 + 0.001 * rng.standard_normal(40))
    lr = np.where(np.arange(40) < 17, 3e-4, 1.5e-5)
    data = RunData.from_series("run-1", {"eval/loss": evals(values), "lr": evals(lr)})
    [finding] = DiminishingReturns().detect(data)
    assert (finding.evidence["test"], finding.detected_step) == ("flat", 2800)


def test_a_run_that_never_improved_is_not_a_converged_one() -> None:
    """Flat from the first evaluation (a DPO loss stuck at ln 2): plateau's business."""
    assert DiminishingReturns().detect(run(np.full(30, np.log(2)))) == []
    values = np.concatenate([[0.6931, 0.6930, 0.6925], np.full(20, 0.6924)])
    assert DiminishingReturns().detect(run(values)) == []


def test_the_warm_up_is_not_judged() -> None:
    """Improved once at the second evaluation, then flat: judged from the fourth."""
    values = [2.0, 1.0] + [1.0] * 10
    [finding] = DiminishingReturns().detect(run(values))
    assert (finding.onset_step, finding.detected_step) == (400, 600)
    [finding] = DiminishingReturns(grace_period=0).detect(run(values))
    assert (finding.onset_step, finding.detected_step) == (300, 500)


def test_a_run_still_descending_under_the_threshold_is_left_alone() -> None:
    """A lucky evaluation makes the reference hard to beat for six evaluations, but the
    trend still falls 1% per five evaluations: the trend test keeps the rule quiet."""
    values = 2.0 * 0.998 ** np.arange(40)
    values[20] *= 0.992
    assert DiminishingReturns().detect(run(values)) == []
    flat = np.concatenate([2.0 * 0.97 ** np.arange(20), np.full(20, 2.0 * 0.97 ** 19)])
    flat[20] *= 0.992
    # A truly flat run after the lucky evaluation is still stopped. Behind that evaluation
    # the pace reads as a rise beyond this noise-free series' noise, which the break test
    # leaves alone (a metric that went back has not slowed down), so the flat test stops
    # it, one evaluation after the break test used to.
    [finding] = DiminishingReturns().detect(run(flat))
    assert (finding.evidence["test"], finding.detected_step) == ("flat", 2500)


def test_a_warmup_stable_decay_schedule_resolves_in_its_decay() -> None:
    """Slow progress at the stable learning rate (0.2% per evaluation: under the rule's
    0.5% and a quarter of the pace before it) is a stall; the decay phase's returns (1% per
    evaluation) resolve it at its third evaluation (steps 4100–4300: the second and third
    beat the stall's best up to step 3800 by 1.5%). Without the descent before it, the
    stable phase is quiet."""
    steep = 5.0 * 0.9 ** np.arange(10) + 1.0
    stable = steep[-1] * 0.9 * 0.998 ** np.arange(30)
    decay = stable[-1] * 0.99 ** np.arange(1, 11)
    values = np.concatenate([steep, stable, decay])
    values *= 1 + 0.0005 * np.random.default_rng(0).standard_normal(len(values))
    [finding] = DiminishingReturns().detect(run(values))
    assert (finding.evidence["test"], finding.detected_step, finding.resolved_step) == (
        "break", 1500, 4300)
    assert DiminishingReturns().detect(run(values[10:])) == []


def test_a_healthy_noisy_run_with_its_best_at_the_end_is_quiet() -> None:
    assert DiminishingReturns().detect(run(converging(scale=2000, noise=0.002))) == []


def test_resolves_when_returns_are_back_and_a_second_stall_is_a_new_finding() -> None:
    """A learning-rate drop lowers the loss 8% after a stall, then it stalls again."""
    values = np.concatenate([[2.0, 1.6, 1.3, 1.1], np.full(8, 1.0), np.full(8, 0.92)])
    first, second = DiminishingReturns().detect(run(values))
    # At 1000 the noise (second differences of the descent so far) reads 3%: the trend is
    # not under the rule by half a standard error until 1100, where it reads 0.
    assert (first.onset_step, first.detected_step) == (600, 1100)
    # Two evaluations in a row must beat the reference: resolved at the second one.
    assert (first.state, first.resolved_step) == ("resolved", 1400)
    assert (second.onset_step, second.detected_step, second.state) == (1500, 1700, "firing")


def test_a_small_gain_during_a_stall_does_not_resolve_it() -> None:
    """Under evaluations * min_improvement (1.5%) on the reference the stall stands."""
    values = np.concatenate([[2.0, 1.6, 1.3, 1.1], np.full(8, 1.0), np.full(8, 0.99)])
    [finding] = DiminishingReturns().detect(run(values))
    assert (finding.detected_step, finding.state) == (1100, "firing")


def test_a_run_crawling_on_below_the_threshold_does_not_flap() -> None:
    """0.1% per evaluation under 1% noise is one stall for good. Against a reference that
    never moves it flapped (six findings on seed 0): the crawl gets 1.5% past the reference
    in the end, and the pace of the last three passes by luck. The stall's own best up to
    N evaluations before moves with the crawl. A loss crossing zero, where relative gains
    grow large, flapped too (five to eight findings a seed)."""
    k = np.arange(200)
    for seed in range(6):
        noise = np.random.default_rng(seed).standard_normal(200)
        [finding] = DiminishingReturns().detect(run(1.5 * 0.999 ** k * (1 + 0.01 * noise)))
        assert finding.state == "firing", seed
        if seed == 0:
            assert (finding.onset_step, finding.detected_step) == (600, 800)
        crossing = DiminishingReturns().detect(run(1.5 * 0.999 ** k - 1.35 + 0.01 * noise))
        assert len(crossing) <= 2 and crossing[-1].state == "firing", seed


def test_higher_is_better_metrics_use_mode_max() -> None:
    accuracy = 0.9 - 0.4 * 0.7 ** np.arange(30)
    data = run(accuracy, tag="eval/general/accuracy")
    [finding] = DiminishingReturns(metric="eval/general/accuracy", mode="max").detect(data)
    assert finding.metric == "eval/general/accuracy"
    assert finding.evidence["best_since"] >= finding.evidence["reference"]
    assert finding.summary.startswith("eval/general/accuracy improves 0.19% per evaluation")
    assert DiminishingReturns(metric="eval/general/accuracy").detect(data) == []


def test_the_runs_own_rule_replaces_the_default_and_is_a_warning() -> None:
    config = {"runwatch_stop_loss": {"evaluations": 5, "min_improvement": 0.01}}
    [finding] = DiminishingReturns().detect(run(converging(), config=config))
    assert (finding.onset_step, finding.detected_step, finding.severity) == (2700, 3100,
                                                                            "warning")
    assert finding.evidence["rule"]["set_by"] == "run config"
    assert finding.summary.endswith("the run's stop-loss rule: stop after 5 evaluations that "
                                    "improve less than 1%")
    assert "ignored_overrides" not in finding.evidence


def test_the_default_rule_is_an_info_hint_unless_the_team_declared_it() -> None:
    """Issue 22: runwatch's own default rule met on a healthy fine-tune is a hint (info, not
    posted by default); the same rule declared by the team in its config is a warning."""
    [hint] = DiminishingReturns().detect(run(converging()))
    assert (hint.severity, hint.evidence["rule"]["set_by"]) == ("info", "analyzer")
    [agreed] = DiminishingReturns(declared=True).detect(run(converging()))
    assert (agreed.severity, agreed.evidence["rule"]["set_by"]) == ("warning", "team config")
    assert (agreed.onset_step, agreed.detected_step) == (hint.onset_step, hint.detected_step)
    assert agreed.summary.endswith("the team's stop-loss rule: stop after 3 evaluations "
                                   "that improve less than 0.5%")


def test_the_runs_rule_may_be_a_json_string_with_numbers_as_text() -> None:
    """MLflow stores params as strings."""
    config = {"runwatch_stop_loss": json.dumps({"evaluations": "5", "min_improvement": "0.01"})}
    [finding] = DiminishingReturns().detect(run(converging(), config=config))
    assert finding.detected_step == 3100
    assert finding.evidence["rule"]["evaluations"] == 5


def test_bad_overrides_are_ignored_and_named() -> None:
    config = {"runwatch_stop_loss": {"evaluations": 0, "min_improvement": 0.01,
                                     "patience": 3}}
    [finding] = DiminishingReturns().detect(run(converging(), config=config))
    assert finding.evidence["rule"]["evaluations"] == 3
    assert finding.evidence["rule"]["min_improvement"] == 0.01
    assert set(finding.evidence["ignored_overrides"]) == {"evaluations", "patience"}
    assert "evaluations must be an integer >= 1" in finding.evidence["ignored_overrides"][
        "evaluations"]
    only_bad = {"runwatch_stop_loss": {"evaluations": -1}}
    [finding] = DiminishingReturns().detect(run(converging(), config=only_bad))
    assert (finding.severity, finding.evidence["rule"]["set_by"]) == ("info", "analyzer")
    not_a_dict = {"runwatch_stop_loss": "stop at 3"}
    [finding] = DiminishingReturns().detect(run(converging(), config=not_a_dict))
    assert list(finding.evidence["ignored_overrides"]) == ["runwatch_stop_loss"]


@pytest.mark.parametrize("enabled", [False, "false", "no", 0])
def test_a_run_can_opt_out(enabled: object) -> None:
    config = {"runwatch_stop_loss": {"enabled": enabled}}
    assert DiminishingReturns().detect(run(converging(), config=config)) == []


def test_the_analyzers_own_parameters_are_left_unchanged_by_a_run() -> None:
    analyzer = DiminishingReturns()
    config = {"runwatch_stop_loss": {"evaluations": 5}}
    analyzer.detect(run(converging(), config=config))
    assert analyzer.evaluations == 3


def test_eval_loss_falls_back_to_perplexity_but_never_to_the_train_loss() -> None:
    ppl = np.exp(converging())
    [finding] = DiminishingReturns().detect(run(ppl, tag="eval/perplexity"))
    assert finding.metric == "eval/perplexity"
    assert finding.summary.startswith("eval/perplexity has not improved")
    assert DiminishingReturns().detect(run(np.full(300, 2.0), tag="train/loss")) == []


def test_non_finite_points_are_skipped() -> None:
    values = converging()
    values[[5, 23, 30]] = [np.nan, np.inf, -np.inf]
    [finding] = DiminishingReturns().detect(run(values))
    json.dumps(finding.to_dict(), allow_nan=False)
    assert 2400 not in [s for s, _, _ in finding.evidence["evaluations"]]


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"mode": "lower"}, "mode"),
    ({"min_improvement": 0}, "min_improvement"),
    ({"min_improvement": 1.0}, "min_improvement"),
    ({"evaluations": 0}, "evaluations"),
    ({"evaluations": 5.0}, "evaluations"),
    ({"grace_period": -1}, "grace_period"),
    ({"declared": "yes"}, "declared"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        DiminishingReturns(**kwargs)


def test_a_hundred_thousand_evaluations_are_analysed() -> None:
    rng = np.random.default_rng(1)
    values = 2.0 + np.exp(-np.arange(100_000) / 20_000) + 0.01 * rng.standard_normal(100_000)
    data = run(values)
    data.series("eval/loss")
    DiminishingReturns().detect(data)


# --- the shared corpus -------------------------------------------------------------

needs_corpus = pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")


def corpus_files(prefix: str = "") -> list[str]:
    with open(MANIFEST, newline="") as fh:
        return [row["file"] for row in csv.DictReader(fh)
                if row["your_observation"].startswith(prefix)]


def corpus_run(relative: str, config: dict | None = None) -> RunData:
    batch = open_source(str(CORPUS / relative)).discover()[0].read(final=True)
    meta = dict(batch.meta)
    if config is not None:
        meta["config"] = {**meta.get("config", {}), "runwatch_stop_loss": config}
    return RunData(run=relative, metrics=batch.points, checkpoints=batch.checkpoints,
                   meta=meta)


@needs_corpus
def test_the_dpo_eval_plateau_fires() -> None:
    """llamatest_dpo: eval_loss 0.5125 at 1900, then 0.512–0.515 to step 2900."""
    [finding] = DiminishingReturns().detect(corpus_run("hf_trainer_state/llamatest_dpo.json"))
    assert (finding.evidence["reference_step"], finding.onset_step,
            finding.detected_step) == (1900, 2000, 2200)
    assert (finding.severity, finding.state) == ("info", "firing")


@needs_corpus
def test_the_short_eval_plateaus_fire_under_the_default_rule_of_three() -> None:
    """DeepSpeed-Chat's perplexity improves 0.74% over 4600–5980 and then has three epochs
    left without 0.5%: the default rule (three evaluations) fires at the last, a rule of five
    cannot. The Qwen3 eval loss still falls 0.2% per evaluation over its last seven: quiet."""
    dschat = "deepspeed_chat_text/dschat_step1_sft_opt1.3b.log"
    [finding] = DiminishingReturns().detect(corpus_run(dschat))
    assert (finding.metric, finding.evidence["reference_step"], finding.detected_step,
            finding.severity) == ("eval/perplexity", 5980, 7360, "info")
    assert DiminishingReturns().detect(corpus_run(dschat, {"evaluations": 5})) == []
    qwen = "hf_console_log/qwen3_medical_qlora_training.log"
    assert DiminishingReturns().detect(corpus_run(qwen)) == []


@needs_corpus
def test_runs_with_no_visible_problem_get_no_critical_and_at_most_one_warning() -> None:
    """Both analyzers of this batch together; the stop-loss rule may add one info (the
    noisy gaze val loss stalls five epochs before recovering; whisper-tiny's eval loss is
    flat over its last ten evaluations)."""
    for relative in corpus_files("NO VISIBLE PROBLEM"):
        data = corpus_run(relative)
        findings = Overfit().detect(data) + DiminishingReturns().detect(data)
        assert not [f for f in findings if f.severity == "critical"], relative
        assert len([f for f in findings if f.severity == "warning"]) <= 1, relative
        assert len(findings) <= 1, (relative, [f.summary for f in findings])


@needs_corpus
@pytest.mark.parametrize("relative", [
    "hf_trainer_state/tinyllama_sft_lora.json",
    "hf_trainer_state/bashkir_asr.json",
    "hf_trainer_state/whisper_small_zh.json",
    "lightning_csv/slm_training_v0.csv",
    "modded_nanogpt_text/modded_nanogpt_muon_record.txt",
])
def test_healthy_runs_with_their_best_at_the_end_are_quiet(relative: str) -> None:
    assert DiminishingReturns().detect(corpus_run(relative)) == []


# --- the demo trainer ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["none", "bad_batch"])
def test_the_demo_trainer_is_quiet(fault: str) -> None:
    """Twelve evaluations; the last four gain under 0.5% each, one short of the rule."""
    data = demo_logs()[fault]
    assert len(data.series("eval/loss")) == 12
    assert DiminishingReturns().detect(data) == []


def test_a_watcher_polling_the_run_finds_what_a_full_read_finds() -> None:
    """Evaluations judged for good are kept between polls; one judged before the learning
    rate of its steps arrived is judged again (here the LR of each step arrives a poll after
    its evaluation, and then only at the end: the break is the schedule's doing)."""
    rng = np.random.default_rng(0)
    pace = np.where(np.arange(40) < 20, 0.01, 0.001)
    values = 3.0 * np.cumprod(1 - pace) * (1 + 0.001 * rng.standard_normal(40))
    lr = np.where(np.arange(40) < 17, 3e-4, 1.5e-5)
    frame = pd.concat([RunData.from_series("run-1", {"eval/loss": evals(values)}).metrics,
                       RunData.from_series("run-1", {"lr": evals(lr)}).metrics])
    for lr_late in (False, True):
        live, streaming = RunData(run="run-1"), DiminishingReturns()
        found = []
        for end in range(500, 4001, 300):
            shown = frame[(frame["step"] <= end) & (frame["tag"] == "eval/loss")]
            lr_to = 4000 if lr_late and end == 3800 else (0 if lr_late else end - 900)
            shown = pd.concat([shown, frame[(frame["tag"] == "lr") & (frame["step"] <= lr_to)]])
            live = RunData(run="run-1", metrics=shown.sort_values("step", kind="stable"))
            found = streaming.detect(live)
            fresh = DiminishingReturns().detect(live)
            assert [(f.evidence["test"], f.detected_step) for f in found] == [
                (f.evidence["test"], f.detected_step) for f in fresh]
        assert [(f.evidence["test"], f.detected_step) for f in found] == [("flat", 2800)]


def test_one_evaluation_a_poll_weighs_the_noise_of_the_evaluations_before() -> None:
    """A break weighs the noise at the evaluation N before the one judged: a poll that
    judges only its new evaluation still needs it (without it, the streaming analyzer
    fired a break at 3100 that a full read does not find)."""
    rng = np.random.default_rng(80)
    n = 40
    knee = rng.integers(10, 30)
    pace = np.where(np.arange(n) < knee, rng.uniform(0.005, 0.03), rng.uniform(0.0, 0.004))
    values = 3.0 * np.cumprod(1 - pace) * (1 + rng.uniform(0.0005, 0.01)
                                           * rng.standard_normal(n))
    live, streaming = RunData(run="run-1"), DiminishingReturns()
    for step, value in zip(100 * np.arange(1, n + 1), values, strict=True):
        live = live.extended(pd.DataFrame({"step": [step], "tag": "eval/loss",
                                           "value": [value], "wall_time": [np.nan]}))
        found = [(f.evidence["test"], f.detected_step) for f in streaming.detect(live)]
        assert found == [(f.evidence["test"], f.detected_step)
                         for f in DiminishingReturns().detect(live)]
    assert found == [("flat", 3500)]


def test_a_swing_back_up_is_not_a_break_in_the_pace() -> None:
    """A run descending 1% per evaluation whose eval loss swings 5% up for two evaluations
    (an oscillating train loss sampled by the eval) and back onto its trend: the pace of
    the window over the swing reads negative, beyond the noise. The metric went back, it
    did not slow down, so the break test keeps quiet (it used to fire at step 1700 and
    resolve at 1900); the flat test is not met either (the reference is beaten again two
    evaluations after the swing)."""
    values = 2.0 * 0.99 ** np.arange(30)
    values *= 1 + 0.001 * np.random.default_rng(0).standard_normal(30)
    values[15:17] *= 1.05
    assert DiminishingReturns().detect(run(values)) == []
    # Without the swing the run keeps its pace: quiet too.
    values[15:17] /= 1.05
    assert DiminishingReturns().detect(run(values)) == []


def test_no_break_at_an_evaluation_that_improved_by_the_rule() -> None:
    """A run descending 1% per evaluation pauses for three evaluations (0.05% each), then
    its next evaluation beats the reference by 0.8% and the run goes on at 1%. The break
    test holds at the last pause evaluation and at the improving one, but an evaluation
    that beat the reference by the rule's 0.5% is progress by the rule's own reading: no
    stop there (the break test used to fire at step 1800 and resolve at 2000)."""
    fast = 2.0 * 0.99 ** np.arange(14)
    pause = fast[-1] * 0.9995 ** np.arange(1, 4)
    after = pause[-1] * 0.992 * 0.99 ** np.arange(8)
    values = np.concatenate([fast, pause, after])
    values *= 1 + 0.0005 * np.resize([1, -1], len(values))
    assert DiminishingReturns().detect(run(values)) == []
    # A fourth pause evaluation, not improving, is where the break test stops it.
    pause = fast[-1] * 0.9995 ** np.arange(1, 5)
    after = pause[-1] * 0.992 * 0.99 ** np.arange(8)
    values = np.concatenate([fast, pause, after])
    values *= 1 + 0.0005 * np.resize([1, -1], len(values))
    [finding] = DiminishingReturns().detect(run(values))
    assert (finding.evidence["test"], finding.detected_step) == ("break", 1800)


def test_a_swing_whose_lows_still_progress_is_not_stopped_by_a_trend_at_the_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An eval loss sampled from a train loss that swings 5% every three evaluations,
    falling 0.4% per evaluation: its lows beat the last low by 1.2% every three
    evaluations (progress by the rule's reference reading). With 0.3% noise a low now and
    then misses the reference and the trend of seven evaluations reads under the rule by
    chance: the flat test needs it under by half a standard error (from the evaluation
    noise, which the swing inflates). Without that margin 2 of 10 seeds fire."""
    k = np.arange(40)
    base = 3.0 * 0.996 ** k * (1 + np.where(k >= 10, 0.05 * np.sin(2 * np.pi * k / 3), 0))

    def findings() -> int:
        return sum(len(DiminishingReturns().detect(
            run(base * (1 + 0.003 * np.random.default_rng(seed).standard_normal(40)))))
            for seed in range(10))

    assert findings() == 0
    monkeypatch.setattr(diminishing_returns, "FLAT_MARGIN", 0.0)
    assert findings() == 2
