"""Golden series for the spike analyzer: exact onset, resolve steps and severities."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.spike import Spike
from connectors.registry import open_source
from tests.corpus import CORPUS


def noisy(n: int, level: float = 2.0, sd: float = 0.02, seed: int = 0) -> np.ndarray:
    return level + sd * np.random.default_rng(seed).standard_normal(n)


def run(values: np.ndarray, checkpoints: list[Checkpoint] | None = None,
        **extra: np.ndarray) -> RunData:
    """Steps are 10, 20, 30, …: point ``i`` is logged at step ``10 * (i + 1)``."""
    series = {"train/loss": values, **extra}
    return RunData.from_series("run-1", series, steps=10 * np.arange(1, len(values) + 1),
                               checkpoints=checkpoints)


def step(i: int) -> int:
    return 10 * (i + 1)


def test_single_spike_fires_at_its_step_and_resolves() -> None:
    loss = noisy(300)
    loss[150] = 7.5
    [finding] = Spike().detect(run(loss))
    assert (finding.onset_step, finding.detected_step) == (step(150), step(150))
    assert finding.severity == "critical"
    assert (finding.state, finding.resolved_step) == ("resolved", step(155))
    assert finding.summary == ("train/loss jumped to 7.50 at step 1510 (3.7x its recent "
                               "median 2.01 over 20 points)")
    evidence = finding.evidence
    assert evidence["baseline"] == pytest.approx(np.median(loss[130:150]))
    assert (evidence["peak"], evidence["peak_step"]) == (7.5, step(150))
    assert evidence["ratio"] == pytest.approx(7.5 / evidence["baseline"])
    assert [s for s, _ in evidence["points"]] == [step(i) for i in range(145, 156)]
    assert finding.fixes == list(CATALOG["spike"].fixes)
    assert finding.fixes[0].request == "rollback"
    assert (finding.kind, finding.source) == ("not_learning", CATALOG["spike"].source)


def test_a_moderate_jump_is_a_warning() -> None:
    loss = noisy(300)
    loss[200] = 4.0
    [finding] = Spike().detect(run(loss))
    assert (finding.onset_step, finding.severity) == (step(200), "warning")


def test_severity_follows_the_peak_of_the_episode() -> None:
    loss = noisy(300)
    loss[200:204] = [4.0, 5.0, 9.0, 4.0]
    [finding] = Spike().detect(run(loss))
    assert (finding.onset_step, finding.severity) == (step(200), "critical")
    assert (finding.evidence["peak"], finding.evidence["peak_step"]) == (9.0, step(202))
    assert finding.resolved_step == step(208)
    assert finding.summary.endswith("peaking at 9.00 at step 2030")


@pytest.mark.parametrize(("bad", "name"), [(np.nan, "NaN"), (np.inf, "+Inf"),
                                           (-np.inf, "-Inf")])
def test_non_finite_is_critical_at_once(bad: float, name: str) -> None:
    loss = noisy(300)
    loss[120] = bad
    [finding] = Spike().detect(run(loss))
    assert (finding.onset_step, finding.detected_step) == (step(120), step(120))
    assert finding.severity == "critical"
    assert finding.summary == f"train/loss became {name} at step 1210 (recent median 2.01)"
    assert (finding.state, finding.resolved_step) == ("resolved", step(125))
    as_dict = finding.to_dict()
    assert as_dict["evidence"]["peak"] == str(bad)
    assert as_dict["evidence"]["ratio"] is None


def test_non_finite_during_warm_up_is_still_reported() -> None:
    loss = noisy(100)
    loss[0] = np.nan
    loss[12] = np.inf
    first, second = Spike().detect(run(loss))
    assert first.onset_step == step(0)
    assert first.summary == "train/loss became NaN at step 10 (no earlier finite value)"
    assert first.resolved_step == step(5)
    assert (second.onset_step, second.severity) == (step(12), "critical")
    assert second.resolved_step == step(17)


def test_nan_episode_lasts_until_finite_points_are_back_near_the_old_level() -> None:
    loss = noisy(300)
    loss[100:104] = np.nan
    loss[104:110] = 2.9  # finite, but above 2.0 * (1 + 0.5 / 2)
    [finding] = Spike().detect(run(loss))
    assert finding.onset_step == step(100)
    assert finding.resolved_step == step(114)


def test_a_run_that_stays_high_keeps_one_finding_firing() -> None:
    loss = noisy(300)
    loss[150:] = noisy(150, level=9.0, seed=1)
    [finding] = Spike().detect(run(loss))
    assert (finding.onset_step, finding.state, finding.resolved_step) == (step(150), "firing",
                                                                          None)
    assert len(finding.evidence["points"]) == 30


def test_two_spikes_are_two_episodes() -> None:
    loss = noisy(400)
    loss[100] = 8.0
    loss[250:253] = 6.0
    first, second = Spike().detect(run(loss))
    assert (first.onset_step, first.resolved_step) == (step(100), step(105))
    assert (second.onset_step, second.resolved_step) == (step(250), step(257))


def test_episode_points_do_not_poison_the_next_baseline() -> None:
    loss = noisy(300)
    loss[100:115] = 8.0  # fifteen points high: a plain 20-point median would sit at 8
    loss[122] = 8.0
    first, second = Spike().detect(run(loss))
    assert (first.onset_step, first.resolved_step) == (step(100), step(119))
    assert second.onset_step == step(122)
    assert second.evidence["baseline"] == pytest.approx(2.0, abs=0.02)


def test_warm_up_is_excluded() -> None:
    loss = noisy(300)
    loss[19] = 9.0  # the 20th point: only 19 exist before it
    assert Spike().detect(run(loss)) == []
    loss[20] = 9.0
    [finding] = Spike(grace_period=20).detect(run(loss))
    assert finding.onset_step == step(20)
    assert finding.evidence["baseline_points"] == 20


def test_short_warm_up_judges_on_the_points_there_are() -> None:
    loss = noisy(300)
    loss[8] = 9.0
    [finding] = Spike(grace_period=5).detect(run(loss))
    assert finding.onset_step == step(8)
    assert finding.evidence["baseline_points"] == 8


def test_without_warm_up_judging_starts_at_the_second_point() -> None:
    loss = noisy(50)
    loss[1] = 7.0  # 3.5x the one point before: at least critical_ratio
    loss[9] = 9.0
    first, second = Spike(grace_period=0).detect(run(loss))
    assert (first.onset_step, first.evidence["baseline_points"]) == (step(1), 1)
    assert (second.onset_step, second.evidence["baseline_points"]) == (step(9), 8)
    assert first.summary.endswith("over 1 point)")  # not "1 points"
    assert second.summary.endswith("over 8 points)")


def test_one_point_of_history_needs_a_critical_rise() -> None:
    """One earlier point measures no noise: +50% over it is not enough, 3x is."""
    loss = noisy(50)
    loss[1] = 5.0  # 2.5x
    assert Spike(grace_period=0).detect(run(loss)) == []
    loss = noisy(50)
    loss[2] = 5.0  # 2.5x the median of two tight points: the usual rule
    assert [f.onset_step for f in Spike(grace_period=0).detect(run(loss))] == [step(2)]


def test_an_excerpt_is_past_its_warm_up() -> None:
    """A Megatron excerpt from iteration 29 020: the spike is its fourth record, long after
    the run's warm-up. The same records logged from step 10 are early training."""
    loss = np.array([2.7759, 2.7728, 2.7681, 7.3437, 8.7159, 7.6541, 7.1925, 6.849])
    excerpt = RunData.from_series("tr1", {"train/loss": loss},
                                  steps=29_020 + 10 * np.arange(len(loss)))
    [finding] = Spike().detect(excerpt)
    assert (finding.onset_step, finding.severity) == (29_050, "critical")
    assert finding.evidence["baseline_points"] == 3
    assert Spike().detect(run(loss)) == []


def test_a_run_without_lr_warm_up_is_judged_from_its_second_point() -> None:
    """QLoRA at a constant learning rate of 5: the loss blows up at the first update."""
    loss = np.array([1.637, 11.8069, 11.6046, 10.3829] + [10.3735] * 6)
    steps = np.arange(1, 11)
    constant = RunData.from_series("qlora", {"train/loss": loss, "lr": np.full(10, 5.0)},
                                   steps=steps)
    [finding] = Spike().detect(constant)
    assert (finding.onset_step, finding.severity, finding.state) == (2, "critical", "firing")
    warming = RunData.from_series("qlora", {"train/loss": loss, "lr": 5.0 * steps / 10},
                                  steps=steps)
    assert Spike().detect(warming) == []


def test_a_poll_that_learns_the_lr_starts_over() -> None:
    loss = np.array([1.637, 11.8069, 11.6046, 10.3829] + [10.3735] * 6)
    lr = pd.Series([5.0, 5.0], index=[2, 3])  # the LR comes in after the loss
    spike = Spike()
    first = RunData.from_series("qlora", {"train/loss": loss[:2]}, steps=[1, 2])
    assert spike.detect(first) == []
    data = RunData.from_series("qlora", {"train/loss": loss, "lr": lr}, steps=np.arange(1, 11))
    assert ([f.to_dict() for f in spike.detect(data)]
            == [f.to_dict() for f in Spike().detect(data)])
    assert [f.onset_step for f in spike.detect(data)] == [2]


def test_a_noisy_loss_does_not_fire_on_its_own_largest_excursions() -> None:
    """A small-batch loss with 15% AR(1) Student-t noise: its 20-point windows often look
    quieter than the loss is, and its own largest excursions pass the window rule alone.
    Against the long history's tail they are routine; a 6x jump is not."""
    rng = np.random.default_rng(0)
    shocks = rng.standard_t(5, 3000) / np.sqrt(5 / 3) * np.sqrt(1 - 0.3**2)
    noise = np.zeros(3000)
    for i in range(1, 3000):
        noise[i] = 0.3 * noise[i - 1] + shocks[i]
    loss = np.exp(0.15 * noise)
    assert len(Spike(tail_threshold=0).detect(run(loss))) == 6  # the window rule alone
    assert Spike().detect(run(loss)) == []
    loss[2000] *= 6.0
    assert [f.onset_step for f in Spike().detect(run(loss))] == [step(2000)]


def test_steady_loss_needs_a_relative_jump() -> None:
    loss = noisy(300, sd=0.001)
    loss[150] = 2.5  # hundreds of MADs up, but only +25%
    assert Spike().detect(run(loss)) == []
    loss[150] = 3.5
    assert [f.onset_step for f in Spike().detect(run(loss))] == [step(150)]


def test_a_jump_while_the_loss_still_falls_fast_is_caught() -> None:
    """An LR burst at the end of warm-up: the descent must not count as noise."""
    t = np.arange(120)
    loss = 0.8 + 2.6 * np.exp(-t / 15) + 0.02 * np.random.default_rng(0).standard_normal(120)
    loss[40] *= 2.5  # 1.02 → 2.39 while the window spans 1.0 to 1.6
    [finding] = Spike().detect(run(loss))
    assert (finding.onset_step, finding.severity) == (step(40), "warning")
    assert finding.resolved_step == step(45)


def test_a_steady_climb_is_not_a_spike_at_every_point() -> None:
    """+5% a point for 60 points: on its trend, though far above the lagging median."""
    rng = np.random.default_rng(0)
    loss = np.concatenate([0.12 * 1.05 ** np.arange(60), np.full(60, 0.12 * 1.05 ** 59)])
    loss *= 1 + 0.01 * rng.standard_normal(120)
    assert Spike().detect(run(loss)) == []


def test_constant_series_is_quiet() -> None:
    assert Spike().detect(run(np.full(1000, 2.5))) == []


def test_noisy_near_zero_per_batch_loss_does_not_fire() -> None:
    """Log-normal per-batch losses swing 100-fold around a median of 0.05.

    The price of the guard: on such a loss a spike must stand out on the log scale too.
    """
    loss = np.random.default_rng(7).lognormal(mean=-3.0, sigma=1.0, size=3000)
    assert Spike().detect(run(loss)) == []
    loss[2000] = 100.0  # 2000 times the median: far outside even that noise
    assert [f.onset_step for f in Spike().detect(run(loss))] == [step(2000)]


def test_quantised_near_zero_loss_does_not_fire() -> None:
    """Losses logged with four decimals: 0.0003 → 0.0008 is one rounding grid, not a spike."""
    rng = np.random.default_rng(3)
    loss = np.round(rng.choice([0.0002, 0.0003, 0.0003, 0.0003, 0.0004], size=500), 4)
    loss[300] = 0.0008
    assert Spike().detect(run(loss)) == []


@pytest.mark.parametrize("level", [-1.0, -0.2, 0.0, 1.0])
def test_a_loss_at_or_below_zero_behaves_as_when_shifted_up(level: float) -> None:
    """DPO-style losses cross 0 and some losses are negative: ``min_rel`` is a margin of the
    median's magnitude, so the same noise shifted down stays quiet (a margin of
    ``median * min_rel`` made every point below 0 pass it: one episode that never resolved)
    and the same jump fires, resolves and is critical at every level."""
    loss = noisy(3000, level=level)
    assert Spike().detect(run(loss)) == []
    loss[2000] = level + 5.0
    [finding] = Spike().detect(run(loss))
    assert (finding.onset_step, finding.resolved_step) == (step(2000), step(2005))
    assert finding.severity == "critical"


def test_severity_of_a_negative_loss_is_measured_on_its_magnitude() -> None:
    """Critical once the peak rises ``(critical_ratio - 1) * |median|`` above the median:
    for a positive median that is ``critical_ratio`` times it."""
    loss = noisy(300, level=-1.0)
    loss[200] = 0.5  # +1.5 over -1: above the +0.5 margin, below +2
    [finding] = Spike().detect(run(loss))
    assert (finding.onset_step, finding.severity) == (step(200), "warning")
    assert finding.summary == ("train/loss jumped to 0.5 at step 2010 (against its recent "
                               "median -1.00 over 20 points)")
    loss[200] = 1.5
    [finding] = Spike().detect(run(loss))
    assert (finding.onset_step, finding.severity) == (step(200), "critical")


def test_a_rise_off_an_all_zero_loss_has_no_scale_to_measure_it_on() -> None:
    """No spread and a median of 0: neither the noise nor ``min_rel`` gives a margin, so a
    finite value is not a spike against it (1e-12 was a warning); NaN still is."""
    loss = np.zeros(300)
    loss[100] = 1e-12
    assert Spike().detect(run(loss)) == []
    loss[100] = np.nan
    assert [f.onset_step for f in Spike().detect(run(loss))] == [step(100)]


@pytest.mark.parametrize("level", [1e300, -1e300, 1.7e308, -1.7e308])
def test_huge_values_raise_no_floating_point_warnings(level: float) -> None:
    loss = level * (1 + 0.01 * np.random.default_rng(0).standard_normal(300))
    loss[200] = np.sign(level) * 1.7e308 if level < 0 else 1e-300
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Spike().detect(run(loss))
        Spike().detect(run(-loss))


def test_rollback_target_is_the_latest_checkpoint_before_the_onset() -> None:
    loss = noisy(300)
    loss[150] = 7.5  # step 1510
    cps = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (500, 1000, 1510, 2000)]
    [finding] = Spike().detect(run(loss, checkpoints=cps))
    assert finding.rollback_to is not None
    assert (finding.rollback_to.step, finding.rollback_to.path) == (1000, "ckpt/checkpoint-1000")
    late = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (1510, 2000)]
    [finding] = Spike().detect(run(loss, checkpoints=late))
    assert finding.rollback_to is None


def test_grad_norm_is_shown_beside_the_loss() -> None:
    loss = noisy(300)
    loss[150] = 7.5
    grad_norm = noisy(300, level=1.0, sd=0.05, seed=2)
    grad_norm[149] = 80.0
    [finding] = Spike().detect(run(loss, grad_norm=grad_norm))
    shown = dict((s, v) for s, v in finding.evidence["grad_norm"])
    assert sorted(shown) == [s for s, _ in finding.evidence["points"]]
    assert shown[step(149)] == 80.0


def test_another_metric_can_be_watched() -> None:
    grad_norm = noisy(300, level=1.0, sd=0.05)
    grad_norm[200] = 40.0
    data = run(noisy(300), grad_norm=grad_norm)
    [finding] = Spike(metric="grad_norm").detect(data)
    assert (finding.metric, finding.onset_step) == ("grad_norm", step(200))
    assert "grad_norm" in finding.summary
    assert Spike().detect(data) == []


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"window": 2}, "window"),
    ({"window": 20.5}, "window"),
    ({"threshold": 0}, "threshold"),
    ({"threshold": float("nan")}, "threshold"),
    ({"min_rel": -0.1}, "min_rel"),
    ({"grace_period": -1}, "grace_period"),
    ({"grace_period": True}, "grace_period"),
    ({"critical_ratio": 1.0}, "critical_ratio"),
    ({"resolve_points": 0}, "resolve_points"),
    ({"tail_window": 0}, "tail_window"),
    ({"tail_threshold": -1.0}, "tail_threshold"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Spike(**kwargs)


def test_a_hundred_thousand_points_with_a_hundred_events() -> None:
    """Speed lives in ``runwatch bench detect --speed``; this checks the result on a long
    run with many episodes."""
    rng = np.random.default_rng(1)
    loss = 2.0 + 0.05 * rng.standard_normal(100_000)
    loss[rng.integers(0, 100_000, 50)] = np.nan
    loss[rng.integers(100, 100_000, 50)] = 9.0
    assert len(Spike().detect(run(loss))) >= 90


def test_recurring_hard_batches_are_routine_but_nan_still_fires() -> None:
    """A memorised fine-tune: per-batch losses near 0.001 with a hard batch at 0.3–1.0
    every few dozen points. The first hard batches are news; once three have stood out
    within the recurrence window, more of them are the loss's normal tail."""
    rng = np.random.default_rng(3)
    loss = 0.001 * np.exp(0.3 * rng.standard_normal(3000))
    hard = np.arange(100, 3000, 47)
    loss[hard] = rng.uniform(0.3, 1.0, len(hard))
    loss[2500] = np.nan
    findings = Spike().detect(run(loss))
    assert [f.onset_step for f in findings] == [step(i) for i in hard[:3]] + [step(2500)]
    assert len(Spike(recurrences=0).detect(run(loss))) > 40  # without the guard


def test_two_spikes_close_together_are_not_a_heavy_tail() -> None:
    loss = noisy(1000)
    loss[300:305] = 6.0
    loss[420] = 5.0
    first, second = Spike().detect(run(loss))
    assert (first.onset_step, second.onset_step) == (step(300), step(420))


def test_polling_resumes_where_the_last_poll_stopped() -> None:
    loss = noisy(3000)
    loss[[700, 1800, 2950]] = 8.0
    loss[2000] = np.nan
    spike = Spike()
    for n in (1000, 2100, 3000):
        spike.detect(run(loss[:n]))
    state = spike._streams.resume(run(loss), ("train/loss",))
    assert state is not None and 2100 <= state.resume <= 3000
    assert ([f.to_dict() for f in spike.detect(run(loss))]
            == [f.to_dict() for f in Spike().detect(run(loss))])


@pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")
def test_gaze_per_batch_loss_near_zero_does_not_fire() -> None:
    """A healthy classifier whose per-batch loss swings from 4e-05 to 4 around a 0.03 median.

    Without the log-scale guard the linear rule alone reports 19 episodes here.
    """
    frame = pd.read_csv(CORPUS / "lightning_csv" / "gaze_cls.csv")
    rows = frame[["step", "train_loss_step"]].dropna()
    data = RunData.from_series("gaze", {"train/loss": rows["train_loss_step"].to_numpy()},
                               steps=rows["step"].to_numpy())
    assert Spike().detect(data) == []


def corpus_run(relative: str) -> RunData:
    batch = open_source(str(CORPUS / relative)).discover()[0].read(final=True)
    return RunData(run=relative, metrics=batch.points, checkpoints=batch.checkpoints,
                   meta=batch.meta)


@pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")
@pytest.mark.parametrize(("relative", "onset"), [
    ("megatron_text/tr1_13b_lm_loss_spike_it29050.excerpt.log", 29050),
    ("megatron_text/tr8_104b_exp11_spike_it11448.excerpt.log", 11448),
    ("megatron_text/tr8_104b_spike_it8741_then_divergence_it9027.excerpt.log", 8741),
    ("megatron_text/tr8b_104b_optim_reset_spike_overflow_it17062.excerpt.log", 17062),
    ("hf_trainer_state/qlora_lr5_divergence.json", 2),
    ("hf_trainer_state/qlora_lr5e-3_divergence.json", 20),
])
def test_short_real_logs_of_a_spike_fire_at_it(relative: str, onset: int) -> None:
    """Excerpts a few records long, and runs at a constant LR that blow up at once: the
    spike comes within what would be the 20-point warm-up of a run logged from step 0."""
    findings = Spike().detect(corpus_run(relative))
    assert [f.onset_step for f in findings][:1] == [onset]


@pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")
def test_memorised_fine_tune_hard_batches_are_not_spikes() -> None:
    """Per-batch losses ~0.001 with single hard batches at 0.3-1.0 (the recurrence guard
    alone let 4 through); against the long history's tail none stands out."""
    assert Spike().detect(corpus_run("custom_text/t5_finetune_train.log")) == []
