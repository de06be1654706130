"""Golden series for the oscillation analyzer: exact onset, detection and resolve steps; noise,
autocorrelated noise, epoch-boundary drops and rounding stay quiet."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from analyzers import Checkpoint, RunData, oscillation
from analyzers.catalog import CATALOG
from analyzers.oscillation import Oscillation, _Context
from connectors.registry import open_source
from tests.analyzers.test_lr_schedule import demo_logs
from tests.corpus import CORPUS


def run(values: np.ndarray, checkpoints: list[Checkpoint] | None = None) -> RunData:
    """Steps are 10, 20, 30, …: point ``i`` is logged at step ``10 * (i + 1)``."""
    return RunData.from_series("run-1", {"train/loss": values},
                               steps=10 * np.arange(1, len(values) + 1),
                               checkpoints=checkpoints)


def decaying(n: int, seed: int = 0, sd: float = 0.02) -> np.ndarray:
    """2.0 + 2.0 * exp(-t / 100) with white noise."""
    t = np.arange(n)
    return 2.0 + 2.0 * np.exp(-t / 100) + sd * np.random.default_rng(seed).standard_normal(n)


def swing(n: int, start: int, stop: int, period: float, amplitude: float) -> np.ndarray:
    """A sine of ``period`` points over points ``start`` … ``stop - 1``, zero elsewhere."""
    t = np.arange(n)
    inside = (t >= start) & (t < stop)
    out = np.zeros(n)
    out[inside] = amplitude * np.sin(2 * np.pi * (t[inside] - start) / period)
    return out


def ar1(n: int, phi: float, seed: int) -> np.ndarray:
    """Unit-variance AR(1) noise."""
    shocks = np.random.default_rng(seed).standard_normal(n)
    out = np.empty(n)
    out[0] = shocks[0] / np.sqrt(1 - phi**2)
    for i in range(1, n):
        out[i] = phi * out[i - 1] + shocks[i]
    return out * np.sqrt(1 - phi**2)


def power_law(n: int) -> np.ndarray:
    t = np.arange(n)
    return 2.0 + 3.0 * (1 + t / 200) ** -0.7


def test_a_swing_from_point_600_fires_with_its_period() -> None:
    loss = decaying(1500) + swing(1500, 600, 1500, 20, 0.1)
    [finding] = Oscillation().detect(run(loss))
    # A swing five times the noise is significant over two periods (two points of the onset
    # are lost to the period's estimate from so short a window: 18 points, not 20).
    assert (finding.onset_step, finding.detected_step) == (5990, 6250)
    assert (finding.state, finding.resolved_step, finding.severity) == ("firing", None,
                                                                         "warning")
    assert finding.summary == (
        "train/loss oscillates with a period of 180 steps and amplitude 0.0814 (4.1% of its "
        "level 2.01) from step 5990: over steps 5900–6250 (2 periods) the swing carries 46 "
        "times the power its own noise has at that period")
    evidence = finding.evidence
    assert (evidence["period_points"], evidence["period_steps"]) == (18, 180.0)
    assert evidence["window_steps"] == [5900, 6250]
    assert evidence["cycles"] == 2
    assert evidence["power"] >= 25 and 0 <= evidence["noise_ar1"] < 1
    assert evidence["relative_amplitude"] == pytest.approx(
        evidence["amplitude"] / evidence["level"])
    assert evidence["swing_ratio"] > 3
    spec = CATALOG["oscillation"]
    assert finding.fixes == list(spec.fixes)
    assert (finding.kind, finding.source) == ("not_learning", spec.source)
    json.dumps(finding.to_dict(), allow_nan=False)


def test_it_resolves_after_the_swing_stops_and_a_later_one_is_a_new_finding() -> None:
    loss = (decaying(3000, seed=1) + swing(3000, 600, 1000, 20, 0.1)
            + swing(3000, 2000, 3000, 40, 0.08))
    first, second = Oscillation().detect(run(loss))
    assert (first.onset_step, first.detected_step) == (5980, 6250)
    # The swing stops at step 10010; the weaker test over three periods must then fail for
    # three periods (persistence) before it is over.
    assert (first.state, first.resolved_step) == ("resolved", 10990)
    assert (second.onset_step, second.detected_step, second.state) == (19960, 20610,
                                                                        "firing")
    # 400, to within what a two-period window resolves.
    assert second.evidence["period_steps"] == 430.0


@pytest.mark.parametrize("period", [5, 12, 33, 90])
@pytest.mark.parametrize("seed", [0, 1])
def test_swings_of_many_periods_fire_within_a_few_periods_of_their_onset(
        period: int, seed: int) -> None:
    """Amplitude twice the noise's standard deviation, 2.4% of the level."""
    n, start = 600 + 25 * period, 300 + 5 * period
    loss = decaying(n, seed, sd=0.025) + swing(n, start, n, period, 0.05)
    steps = np.arange(n)
    [finding] = Oscillation().detect(RunData.from_series("r", {"train/loss": loss},
                                                         steps=steps))
    # A window of k periods tells the period to about a k-th of itself (a Fourier
    # peak's width): the faster it fires, the coarser the period it reports.
    cycles = finding.evidence["cycles"]
    assert abs(finding.evidence["period_points"] - period) <= max(1, period / cycles)
    assert abs(finding.onset_step - start) <= period
    assert finding.detected_step - start <= 13 * max(period, 8)


def test_a_faint_swing_fires_over_twelve_periods_within_twelve_periods() -> None:
    """A swing of 1.5% of the level at 0.6 times the noise's standard deviation: no window
    of up to eight periods reaches the significance, the twelve-period window does, 112
    points (11 periods) after the onset."""
    loss = decaying(1600, 2, sd=0.05) + swing(1600, 1000, 1600, 10, 0.03)
    [finding] = Oscillation().detect(run(loss))
    assert finding.evidence["cycles"] == 12
    assert finding.evidence["period_points"] == 10
    assert finding.detected_step == 10 * (1000 + 112 + 1)
    # One period of so faint a swing is mostly noise: the onset is only bracketed.
    assert 10 * 1001 - 100 <= finding.onset_step <= finding.detected_step


def test_the_noise_fit_spans_the_longest_window_and_dilutes_the_onset() -> None:
    """The differences a period apart cancel a swing but for the period across its onset;
    a fit over twelve periods (the longest window) gives that period a smaller share than
    one over eight did, so right after the onset the swing inflates the noise at its period
    less and fires with more power."""
    assert all(oscillation._noise_window(p) >= max(oscillation._CYCLES) * p
               for p in Oscillation().periods())
    loss = decaying(1500) + swing(1500, 600, 1500, 20, 0.1)
    ends = np.array([640, 700])

    def inflation() -> np.ndarray:
        with np.errstate(all="ignore"):
            swung, _ = _Context(loss).detrended(20).spectrum(ends)
            clean, _ = _Context(decaying(1500)).detrended(20).spectrum(ends)
        return swung / clean

    now = inflation()
    assert np.all(now < 3.5)
    eight = pytest.MonkeyPatch()
    eight.setattr(oscillation, "_NOISE_PERIODS", 8)
    try:
        assert np.all(inflation() > 1.3 * now)
    finally:
        eight.undo()


def test_a_loss_that_falls_in_steps_at_each_epoch_does_not_fire() -> None:
    """Multi-epoch SFT: the loss drops at each epoch boundary and is flat in between.
    Detrended it is a sawtooth, periodic and significant: only the swing guard tells it
    from an oscillation, since it never climbs back (its swing ratio is 2). With noise as
    large as half a step the trend is measured over four periods and the amplitude is
    taken less its noise, so chance does not lift the ratio over 3."""
    rng = np.random.default_rng(0)
    epoch = 40
    steps = np.arange(30 * epoch)
    for noise in (0.001, 0.005, 0.02):
        loss = 2.6 - 0.05 * (steps // epoch) + noise * rng.standard_normal(len(steps))
        assert Oscillation().detect(run(loss)) == []
    loss = 2.6 - 0.05 * (steps // epoch) + 0.001 * rng.standard_normal(len(steps))
    [periodic] = Oscillation(min_swing=0.0).detect(run(loss))
    assert abs(periodic.evidence["period_points"] - epoch) <= 1
    assert 2.0 < periodic.evidence["swing_ratio"] < 3.0


def test_spikes_a_period_apart_are_not_a_swing() -> None:
    """Two spikes ten points apart in white noise: in phase in both periods of a two-period
    window, and significant there; clipped at four robust standard deviations the window
    carries no swing."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        loss = 3.3 + 0.05 * rng.standard_normal(3000)
        loss[[2000, 2010]] += [0.7, 1.3]
        assert Oscillation().detect(run(loss)) == [], seed
        unguarded = Oscillation()
        unguarded._robust = lambda *args: True  # type: ignore[method-assign]
        assert [f.evidence["period_points"] for f in unguarded.detect(run(loss))] == [10]


NOISE = {
    "white": lambda rng, n: power_law(n) + 0.05 * rng.standard_normal(n),
    "random_walk": lambda rng, n: power_law(n) + 0.002 * np.cumsum(rng.standard_normal(n)),
    "small_batch": lambda rng, n: power_law(n) * rng.lognormal(0.0, 0.5, n),
    "heavy_tailed": lambda rng, n: power_law(n) + 0.03 * rng.standard_t(2, n),
}


@pytest.mark.parametrize("kind", sorted(NOISE))
def test_noise_does_not_fire(kind: str) -> None:
    for seed in range(3):
        loss = NOISE[kind](np.random.default_rng(seed), 20_000)
        assert Oscillation().detect(run(loss)) == [], (kind, seed)


@pytest.mark.parametrize("phi", [0.5, 0.8, 0.9, 0.95, 0.98])
def test_autocorrelated_noise_does_not_fire(phi: float) -> None:
    """Loud AR(1) noise (6% of the level): filtered, it looks periodic over a few cycles."""
    for seed in range(4):
        loss = power_law(20_000) + 0.15 * ar1(20_000, phi, seed)
        assert Oscillation().detect(run(loss)) == [], (phi, seed)


@pytest.mark.parametrize("scale", [1.0, 1e30, 1e160])
def test_white_noise_at_any_scale_does_not_fire(scale: float) -> None:
    """At 1e160 the squares in the noise fit overflow: a noise that cannot be measured
    must make nothing significant (it made the spectrum 0 and every swing infinitely
    significant)."""
    noise = 1 + 0.01 * np.random.default_rng(3).standard_normal(2000)
    assert Oscillation().detect(run(scale * noise)) == []


def test_lr_shaped_losses_do_not_fire() -> None:
    """Warmup + cosine, and warmup-stable-decay (a sharp fall in the decay phase)."""
    steps = np.arange(1, 20_001)
    warm = np.minimum(steps / 500, 1.0)
    cosine = warm * 0.5 * (1 + np.cos(np.pi * np.clip((steps - 500) / 19_500, 0, 1)))
    wsd = warm * np.where(steps < 16_000, 1.0, 1 - (steps - 16_000) / 4_000)
    rng = np.random.default_rng(0)
    for lr in (cosine, wsd):
        progress = np.cumsum(lr) / 2_000
        loss = 2.0 + 3.0 / (1 + progress) ** 0.7 - 0.2 * (1 - lr) * (steps > 16_000)
        loss = loss + 0.03 * rng.standard_normal(len(steps))
        assert Oscillation().detect(run(loss)) == []


def test_rounding_is_not_a_swing() -> None:
    """A loss logged with four decimals, flipping between 0.0001 and 0.0002."""
    rng = np.random.default_rng(0)
    loss = np.round(1.5e-4 + 0.5e-4 * np.sin(np.arange(2000) * 2 * np.pi / 6)
                    + 0.2e-4 * rng.standard_normal(2000), 4)
    assert Oscillation().detect(run(loss)) == []
    assert Oscillation().detect(run(loss * 1.0001 + 1e-9 * np.arange(2000))) != []


def test_a_faint_ripple_is_below_min_amplitude() -> None:
    loss = power_law(3000) + swing(3000, 1000, 3000, 20, 0.01)  # 0.4% of the level
    assert Oscillation().detect(run(loss)) == []
    [finding] = Oscillation(min_amplitude=0.002).detect(run(loss))
    assert abs(finding.onset_step - 10010) <= 200  # within a period


def test_the_warm_up_is_not_judged() -> None:
    loss = decaying(1000) + swing(1000, 0, 300, 10, 0.2)
    assert Oscillation(grace_period=400).detect(run(loss)) == []
    [finding] = Oscillation(grace_period=0).detect(run(loss))
    assert finding.state == "resolved"


def test_non_finite_values_are_skipped() -> None:
    loss = decaying(1500) + swing(1500, 600, 1500, 20, 0.1)
    loss[[100, 700, 900]] = [np.nan, np.inf, -np.inf]
    [finding] = Oscillation().detect(run(loss))
    assert abs(finding.onset_step - 6010) <= 200  # within a period
    json.dumps(finding.to_dict(), allow_nan=False)


def test_a_finite_blow_up_does_not_swamp_the_rest_of_the_run() -> None:
    loss = decaying(1500) + swing(1500, 600, 1500, 20, 0.1)
    [clean] = Oscillation().detect(run(loss))
    loss[80] = 1e12
    [finding] = Oscillation().detect(run(loss))
    assert (finding.onset_step, finding.detected_step) == (clean.onset_step,
                                                           clean.detected_step) == (5990, 6250)


def test_rollback_target_is_the_latest_checkpoint_before_the_onset() -> None:
    loss = decaying(1500) + swing(1500, 600, 1500, 20, 0.1)
    checkpoints = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (5000, 5900, 6500)]
    [finding] = Oscillation().detect(run(loss, checkpoints))
    assert finding.onset_step == 5990
    assert finding.rollback_to is not None and finding.rollback_to.step == 5900


def test_measures_at_chosen_positions_equal_the_vectorised_ones() -> None:
    """The firing evaluation is re-measured at its position alone: same numbers."""
    analyzer = Oscillation()
    with np.errstate(all="ignore"):
        context = _Context(decaying(3000) + swing(3000, 600, 3000, 20, 0.1))
        for period in (5, 19, 43):
            for every in analyzer._measure(context, period, analyzer.cycles(period)):
                for i in (3, 50, 200):
                    position = np.array([every.positions[i]])
                    [one] = analyzer._measure(context, period, [every.cycles], position)
                    for name in ("power", "amplitude", "level", "slope", "phi", "steady"):
                        assert getattr(one, name)[0] == pytest.approx(
                            getattr(every, name)[i], rel=1e-9, abs=1e-12)


def test_the_candidate_periods_are_whole_then_a_ten_percent_grid() -> None:
    periods = Oscillation().periods()
    assert periods[:17] == list(range(4, 21))
    assert periods[-1] == 100
    assert all(b / a <= 1.13 for a, b in zip(periods[16:], periods[17:], strict=False))
    assert Oscillation(min_period=10, max_period=10).periods() == [10]
    assert Oscillation(min_period=30, max_period=40).periods() == [30, 33, 36, 40]


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"min_period": 3}, "min_period"),
    ({"max_period": 3}, "max_period"),
    ({"min_period": 20, "max_period": 10}, "max_period"),
    ({"min_window": 4}, "min_window"),
    ({"significance": 0}, "significance"),
    ({"significance": float("nan")}, "significance"),
    ({"min_amplitude": -0.1}, "min_amplitude"),
    ({"min_swing": float("nan")}, "min_swing"),
    ({"persistence": 0}, "persistence"),
    ({"grace_period": -1}, "grace_period"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Oscillation(**kwargs)


def test_a_million_points_are_analysed() -> None:
    n = 1_000_000
    rng = np.random.default_rng(1)
    loss = power_law(n) + 0.05 * rng.standard_normal(n)
    loss += swing(n, 500_000, 700_000, 40, 0.1)
    loss[rng.integers(0, n, 50)] = np.nan
    data = run(loss)
    data.series("train/loss")
    [finding] = Oscillation().detect(data)
    assert abs(finding.onset_step - 5_000_010) <= 400
    assert finding.state == "resolved"


# --------------------------------------------------------------------- demo trainer
@pytest.mark.slow
@pytest.mark.parametrize("fault", ["none", "lr", "bad_batch"])
def test_demo_trainer_logs_do_not_oscillate(fault: str) -> None:
    """A loss spike (bad batch) or an LR burst is a one-off, not a swing."""
    data = demo_logs()[fault]
    for metric in ("train/loss", "eval/loss"):
        assert Oscillation(metric=metric).detect(data) == []


# ------------------------------------------------------------------------- real logs
def corpus_files() -> list[tuple[str, str]]:
    manifest = CORPUS / "MANIFEST.csv"
    if not manifest.exists():
        return []
    with manifest.open() as fh:
        return [(row["file"], row["your_observation"]) for row in csv.DictReader(fh)]


def read_corpus(name: str) -> list[RunData]:
    return [RunData(run=name, metrics=b.points, checkpoints=b.checkpoints, meta=b.meta)
            for b in (s.read(final=True) for s in open_source(str(CORPUS / name)).discover())]


# The one corpus log whose loss is periodic: a guanaco-style QLoRA run (logged every 10
# steps) whose loss repeats every 50 steps with a 7% swing, most likely its data order
# (length-grouped batches), not its LR.
PERIODIC = "hf_trainer_state/qlora_fujump_10k.json"


@pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")
@pytest.mark.parametrize(("name", "observation"), corpus_files())
def test_corpus_logs(name: str, observation: str) -> None:
    """No corpus log oscillates but the periodic one; NO VISIBLE PROBLEM logs get no
    critical and at most one warning. Includes stanford_alpaca_repro (a drop at each of
    its three epochs) and whisper_large_v2_ja (a loss of 0.0001–0.0002 at four decimals)."""
    for data in read_corpus(name):
        findings = [f for metric in ("train/loss", "eval/loss")
                    for f in Oscillation(metric=metric).detect(data)]
        if observation.startswith("NO VISIBLE PROBLEM"):
            assert not [f for f in findings if f.severity == "critical"]
            assert len(findings) <= 1
        if name != PERIODIC:
            assert findings == []


@pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")
def test_a_real_loss_that_repeats_every_50_steps_fires() -> None:
    [data] = read_corpus(PERIODIC)
    [finding] = Oscillation().detect(data)
    # It repeats from the start: the onset is the end of the grace period (50 points).
    assert (finding.onset_step, finding.detected_step) == (510, 1350)
    assert finding.evidence["period_steps"] == 50.0
    # The swing's Fourier amplitude over eight periods: 7% of the level.
    assert finding.evidence["relative_amplitude"] == pytest.approx(0.07, abs=0.002)
