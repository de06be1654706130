"""The oracle bound of ``runwatch bench detect``: the matched filter's SNR is the right one,
and the figures it gives for the suite say what the issue's targets meet."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from benchmarks import bound as bb
from benchmarks import synthetic as bd


def test_snr_of_a_shift_in_white_noise_grows_with_the_root_of_the_points():
    snr = bb.matched_filter_snr(np.full(16, 0.5), 2.0)
    assert snr[0] == pytest.approx(0.25)
    assert snr[15] == pytest.approx(0.25 * 4)


def test_snr_of_a_shift_in_ar1_noise_counts_only_what_the_noise_does_not_carry_over():
    phi, mu, m = 0.6, 1.0, 50
    snr = bb.matched_filter_snr(np.full(m, mu), 1.0, phi)
    # The first point carries the noise's whole variance, the later ones only what the
    # noise does not carry over from the point before.
    expected = np.sqrt(mu**2 + (m - 1) * (mu * (1 - phi)) ** 2 / (1 - phi**2))
    assert snr[-1] == pytest.approx(expected)
    # Persistent noise hides a level shift: far less than the white-noise figure.
    assert snr[-1] < 0.6 * np.sqrt(m)


def test_the_whitened_matched_filter_statistic_has_mean_snr_and_unit_variance():
    rng = np.random.default_rng(0)
    phi, m, trials = 0.5, 40, 4000
    change = 0.3 * np.sin(np.arange(m) / 3.0)
    noise = np.empty((trials, m))
    noise[:, 0] = rng.standard_normal(trials)
    for i in range(1, m):
        noise[:, i] = phi * noise[:, i - 1] + np.sqrt(1 - phi**2) * rng.standard_normal(trials)
    x = change + noise

    def whiten(v):
        out = (v - phi * np.concatenate((np.zeros(v.shape[:-1] + (1,)), v[..., :-1]), -1)
               ) / np.sqrt(1 - phi**2)
        out[..., 0] = v[..., 0]
        return out
    snr = bb.matched_filter_snr(change, 1.0, phi)[-1]
    statistic = whiten(x) @ whiten(change) / snr
    assert statistic.mean() == pytest.approx(snr, abs=0.06)
    assert statistic.std() == pytest.approx(1.0, abs=0.05)


def test_oracle_delay_counts_from_the_onset_and_is_infinite_when_never_reached():
    snr = np.array([0.0, 0.0, 1.0, 3.9, 4.0, 5.0])
    assert bb.oracle_delay(snr, 2) == 2
    assert bb.oracle_delay(snr, 2, threshold=9.0) == float("inf")


def test_the_base_run_keeps_the_noise_model_it_drew():
    rng = np.random.default_rng(3)
    run = bd.base_run(rng, bd.PROFILES[1])  # the fine-tune: 3000 points
    sd, phi = run.noise_model
    unit = run.noise / sd
    assert 0.2 <= phi <= 0.7
    assert unit.std() == pytest.approx(1.0, abs=0.1)
    assert np.corrcoef(unit[:-1], unit[1:])[0, 1] == pytest.approx(phi, abs=0.06)
    g_sigma, _ = run.grad_noise
    t = run.steps / run.profile.steps
    level = np.log(1 + 5 * np.exp(-t / 0.02))
    residual = np.log(run.grad_norm) - level
    assert (residual - residual.mean()).std() == pytest.approx(g_sigma, rel=0.15)


def test_a_stronger_plateau_is_seen_sooner_and_no_plateau_within_two_percent_of_a_run():
    by_strength = {}
    for strength in bd.STRENGTHS:
        delays = []
        for k in range(6):
            rng = np.random.default_rng(k)
            healthy = bd.base_run(rng, bd.PROFILES[0])
            run = copy.deepcopy(healthy)
            events, _ = bd._inject_plateau(run, strength, rng)
            onset = int(np.searchsorted(run.steps, events[0].onset))
            snr = bb.matched_filter_snr(bb._loss_change(healthy, run), *healthy.noise_model)
            delays.append(bb.oracle_delay(snr, onset) / len(run.steps))
        by_strength[strength] = np.median(delays)
    assert by_strength["strong"] < by_strength["weak"]
    assert by_strength["strong"] > 0.02


def test_the_oscillation_bound_waits_for_a_period():
    (bound,) = bb.bounds(["oscillation"])
    # The shortest period is 10 points on runs of at most 3000: at least a third of a percent.
    assert bound.delays.min() >= 100 * 10 / 3000 - 1e-9
    assert 0.0 < bound.within() < 1.0


def test_bound_rows_set_the_oracle_beside_runwatch_climbs_not_its_spikes():
    ours = {"plateau": {"median_delay_share": 0.12, "median_delay_units": 240.0},
            "grad_norm": {"median_delay_share": 0.01, "median_delay_units": 0.0},
            "forgetting": {"median_delay_share": None, "median_delay_units": 3.5}}
    variants = {("grad_norm", "climb"): {"median_delay_share": 0.058,
                                         "median_delay_units": 116.0}}
    found = bb.found_delays(ours, variants)
    assert found == {"plateau": pytest.approx(12.0), "grad_norm": pytest.approx(5.8),
                     "forgetting": 3.5}
    header, rows = bb.bound_rows(found, ["plateau", "forgetting"])
    assert [r[0] for r in rows] == ["plateau", "forgetting"]
    assert rows[0][6] == "12.0 % of the run" and rows[1][6] == "3.5 evals"
    assert rows[0][4] == "0%"  # no plateau within 2% of the run, even for the oracle
    assert rows[0][5].endswith("% of the run, 0%")  # nor for a lenient one


def test_the_snr_of_a_change_from_the_first_point_is_the_exact_whitened_energy():
    rng = np.random.default_rng(1)
    phi, m = 0.6, 12
    change, sd = rng.normal(size=m), rng.uniform(0.5, 2.0, m)
    correlation = phi ** np.abs(np.subtract.outer(np.arange(m), np.arange(m)))
    covariance = correlation * np.outer(sd, sd)
    exact = [np.sqrt(change[:k] @ np.linalg.solve(covariance[:k, :k], change[:k]))
             for k in range(1, m + 1)]
    assert bb.matched_filter_snr(change, sd, phi) == pytest.approx(exact)


def test_an_event_the_oracle_never_sees_keeps_an_infinite_p90():
    bound = bb.Bound("plateau", "", "% of the run", 2.0,
                     np.array([1.0, 2.0, np.inf, np.inf]), np.full(4, 20.0))
    assert bound.p90() == np.inf
    assert bb._number(bound.p90()) == "never"


def test_oracle_recall_counts_each_event_against_its_own_tolerance():
    bound = bb.Bound("oscillation", "", "% of the run", 2.0,
                     np.array([1.0, 3.0, 9.0, float("inf")]), np.array([2.0, 4.0, 8.0, 8.0]))
    assert bound.recall() == 0.5  # 1 <= 2 and 3 <= 4; 9 > 8 and never
    assert bound.within() == 0.25
    assert bound.median() == 6.0


def test_plateaus_are_slow_for_any_detector_but_within_reach_of_their_tolerance():
    (bound,) = bb.bounds(["plateau"])
    assert bound.within() < 0.05  # the 2% delay target: out of reach
    assert bound.recall() > 0.9  # the F1 target: within reach
    # Even an oracle that fires at 3 standard deviations (false alarms and all) is slower.
    (lenient,) = bb.bounds(["plateau"], threshold=bb.LENIENT_THRESHOLD)
    assert bound.median() > lenient.median() > 2.0 and lenient.within() < 0.05


def test_a_lower_threshold_only_ever_detects_sooner():
    strict, lenient = (bb.bounds(["oscillation"], threshold=t)[0]
                       for t in (bb.THRESHOLD, bb.LENIENT_THRESHOLD))
    assert np.all(lenient.delays <= strict.delays)
    assert lenient.within() > strict.within()
