"""Shared statistics of the analyzers, where a doctest cannot show the property."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analyzers.stats.robust import evaluation_noise, robust_sd


def mad_noise(values: np.ndarray) -> float:
    """The MAD of second differences, the estimate evaluation_noise replaced."""
    return robust_sd(np.diff(values, 2)) / math.sqrt(6)


def test_the_evaluation_noise_is_steadier_than_the_mad_and_ignores_a_step() -> None:
    """On the few dozen evaluations of a run, the MAD of second differences reads the
    noise at half its size now and then (a lucky best's fall then looks real to
    reward_hacking); trimming by it and taking the standard deviation of the rest is
    unbiased and steadier, and a step (the fall being judged) still does not count."""
    rng = np.random.default_rng(5)
    last = np.array([19])
    ours = np.array([evaluation_noise(rng.standard_normal(20), last)[0] for _ in range(2000)])
    mad = np.array([mad_noise(rng.standard_normal(20)) for _ in range(2000)])
    assert abs(ours.mean() - 1) < 0.06 and abs(mad.mean() - 1) < 0.06
    assert ours.std() < 0.8 * mad.std()
    noise = 0.1 * rng.standard_normal(40)
    stepped = noise - np.where(np.arange(40) >= 30, 1.0, 0.0)
    at = np.array([0, 4, 39])
    assert evaluation_noise(stepped, at)[2] == pytest.approx(evaluation_noise(noise, at)[2],
                                                             rel=0.1)
    assert list(evaluation_noise(stepped, at, min_points=6)[:2]) == [0.0, 0.0]


def test_a_long_history_is_estimated_per_block_of_the_stride() -> None:
    """Past ``window`` values one estimate serves every position of a block of ``stride``
    (positions 100-148, 149-198, ...): the same value within a block, each the estimate
    from the window that ends at the block's first position."""
    rng = np.random.default_rng(1)
    values = np.cumsum(0.01 * rng.standard_normal(400)) + 0.1 * rng.standard_normal(400)
    positions = np.arange(100, 400)
    noise = evaluation_noise(values, positions, window=100, stride=50)
    assert len(set(noise[:49].tolist())) == 1 and noise[49] != noise[48]
    assert noise[60] == evaluation_noise(values[:150], np.array([149]), window=100)[0]
    assert 0.07 < float(np.median(noise)) < 0.13


def test_the_evaluation_noise_needs_three_values_whatever_min_points_says() -> None:
    """No second difference exists before the third value: 0 there, not an empty median."""
    noise = evaluation_noise(np.array([1.0, 2.0, 4.0, 3.0]), np.arange(4), min_points=1)
    assert list(noise[:2]) == [0.0, 0.0] and noise[3] > 0
