"""Robust noise and levels: MAD-based standard deviations, evaluation noise, moving and row
medians, and the clean windows and runs that analyzers measure from.

Pure functions of arrays or frames; nothing here knows about a signal.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import bottleneck as bn
import numpy as np
import pandas as pd

# 1.4826 * MAD estimates a normal standard deviation.
MAD_TO_SD = 1.4826


def finite(series: pd.Series) -> pd.Series:
    """The finite points of a series."""
    return series[np.isfinite(series.to_numpy(dtype=float))]


def median_se(count: float | np.ndarray) -> float | np.ndarray:
    """The standard error of the median of ``count`` independent normal values, in units of
    their standard deviation: ``sqrt(pi / 2 / count)`` (1.2533 / sqrt(count)).

    >>> round(float(median_se(4)), 4)
    0.6267
    """
    return np.sqrt(math.pi / 2 / np.asarray(count, dtype=float))


def robust_sd(values: np.ndarray) -> float:
    """``1.4826 * MAD``: a standard deviation that single outliers do not move."""
    if not len(values):
        return 0.0
    median = float(np.median(values))
    return MAD_TO_SD * float(np.median(np.abs(values - median)))


def evaluation_noise(values: np.ndarray, positions: np.ndarray, *, window: int = 100,
                     min_points: int = 5, stride: int | None = None) -> np.ndarray:
    """The standard deviation of one evaluation's noise at each position, from the values up
    to it (0 where fewer than ``min_points`` values exist).

    Estimated from second differences (``x[i] - 2 x[i+1] + x[i+2]`` has six times the
    variance of independent noise and no trend), so a trend is not taken for noise: those
    within ``_NOISE_CUT`` robust deviations (MAD) of their median are kept (a step change,
    such as the drop being judged, or the kink where a fall begins, is set aside) and their
    standard deviation, corrected for the normal's cut tails, is the estimate. On the few
    dozen evaluations of a run it is far steadier than the MAD itself (on twenty, a
    standard error of a quarter of the noise against a third: a noise read too low makes a
    lucky evaluation's difference look real). Up to ``window`` values are used; past that,
    the window ends at a block boundary every ``stride`` values (``window // 4`` by
    default), so a long history costs one estimate per block, not one per evaluation.

    >>> rng = np.random.default_rng(0)
    >>> values = np.linspace(0, 5, 200) + 0.1 * rng.standard_normal(200)
    >>> evaluation_noise(values, np.array([2, 150])).round(3)
    array([0.   , 0.103])
    >>> values[120:] -= 1.0  # a step: no noise
    >>> evaluation_noise(values, np.array([150])).round(3)
    array([0.104])
    """
    curvature = np.diff(values, 2)  # curvature[i] spans values[i:i + 3]
    noise = np.zeros(len(positions))
    stride = max(1, window // 4 if stride is None else stride)
    late = positions >= window
    # One second difference needs three values.
    for k in np.flatnonzero(~late & (positions + 1 >= max(min_points, 3))).tolist():
        noise[k] = _trimmed_sd(curvature[None, :positions[k] - 1])[0]
    ends = window - 1 + (positions[late] - window + 1) // stride * stride
    unique_ends, which = np.unique(ends, return_inverse=True)
    if unique_ends.size:  # one estimate per block, all at once
        rows = curvature[unique_ends[:, None] - window + 1 + np.arange(window - 2)]
        noise[late] = _trimmed_sd(rows)[which]
    return noise / math.sqrt(6)


# Second differences beyond this many robust deviations are left out of the noise.
_NOISE_CUT = 3.0


# The variance a standard normal keeps within +-_NOISE_CUT.
_CUT_VARIANCE = 1 - 2 * _NOISE_CUT * math.exp(-_NOISE_CUT ** 2 / 2) / math.sqrt(
    2 * math.pi) / math.erf(_NOISE_CUT / math.sqrt(2))


def _trimmed_sd(rows: np.ndarray) -> np.ndarray:
    """Per row, the standard deviation of the values within ``_NOISE_CUT`` robust deviations
    of the median, corrected for the normal's cut tails (0 for a row without spread)."""
    median, spread = row_median_sd(rows)
    # In robust deviations: their squares neither overflow nor underflow whatever the
    # values' scale (1e300 squared is inf).
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        deviation = (rows - median[:, None]) / spread[:, None]
        kept = np.abs(deviation) <= _NOISE_CUT
        variance = np.where(kept, deviation ** 2, 0.0).sum(axis=1) / kept.sum(axis=1)
    return np.where(spread > 0, spread * np.sqrt(variance / _CUT_VARIANCE), 0.0)


def moving_median(values: np.ndarray | pd.Series, window: int,
                  min_count: int | None = None) -> np.ndarray:
    """The median of the last ``window`` values at each position, NaN skipped; NaN where
    fewer than ``min_count`` (default: ``window``) finite values are in it. The values of
    pandas' ``rolling(window, min_periods=min_count).median()``, from bottleneck's C.

    >>> moving_median(np.array([3.0, np.nan, 2.0, 8.0]), 2, min_count=1)
    array([3., 3., 2., 5.])
    >>> moving_median(np.array([3.0, 1.0, 2.0, 8.0]), 2, min_count=1)  # those there are, early
    array([3. , 2. , 1.5, 5. ])
    """
    array = np.asarray(values, dtype=float)
    needed = window if min_count is None else min_count
    if needed > len(array):
        return np.full(len(array), np.nan)
    # A window longer than the values covers all of them so far at every position.
    window = min(window, len(array))
    return bn.move_median(array, window, min_count=min(needed, window))


def row_median(rows: np.ndarray) -> np.ndarray:
    """The median of each row (sorting short rows is several times faster than
    ``np.median`` along an axis)."""
    return sorted_middle(np.sort(rows, axis=1))


def sorted_middle(ordered: np.ndarray) -> np.ndarray:
    """The median of each row of rows already sorted."""
    width = ordered.shape[1]
    return 0.5 * (ordered[:, (width - 1) // 2] + ordered[:, width // 2])


def row_sd(rows: np.ndarray) -> np.ndarray:
    """Per row, the robust standard deviation (``1.4826 * MAD``)."""
    return row_median_sd(rows)[1]


def row_median_sd(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the median and the robust standard deviation (``1.4826 * MAD``)."""
    median = row_median(rows)
    return median, MAD_TO_SD * row_median(np.abs(rows - median[:, None]))


def first_run(values: np.ndarray, start: int, length: int,
              passes: Callable[[np.ndarray], np.ndarray]) -> int | None:
    """Position of the last point of the first run of ``length`` values from ``start`` on
    that all ``passes`` (a test of a stretch of values, point by point), or None.

    Read in growing chunks: an episode usually ends within a few points, and the rest of a
    long history need not be scanned for it.

    >>> first_run(np.array([5.0, 1.0, 4.0, 1.0, 1.0, 1.0]), 0, 2, lambda v: v < 2)
    4
    """
    n = len(values)
    size = 256 * length
    lo = start
    while lo < n:
        hi = min(n, lo + size)
        ok = passes(values[lo:hi])
        counts = np.concatenate(([0], np.cumsum(ok)))
        full = np.flatnonzero(counts[length:] - counts[:-length] == length)
        if full.size:
            return lo + int(full[0]) + length - 1
        if hi == n:
            return None
        lo = hi - (length - 1)
        size *= 2
    return None


def clean_start(excluded: np.ndarray, k: int, window: int) -> int:
    """An index early enough that ``window`` points outside ``excluded`` lie between it and
    ``k``."""
    lo = max(0, k - window)
    while lo > 0 and np.count_nonzero(~excluded[lo:k]) < window:
        lo = max(0, k - 2 * (k - lo))
    return lo


def clean_window(values: np.ndarray, excluded: np.ndarray, k: int, window: int) -> np.ndarray:
    """The last ``window`` values before index ``k`` outside ``excluded``."""
    lo = clean_start(excluded, k, window)
    return values[lo + np.flatnonzero(~excluded[lo:k])[-window:]]


def _positive(values: np.ndarray) -> np.ndarray:
    return np.isfinite(values) & (values > 0)


def positive_before(values: np.ndarray, position: int, count: int) -> list[int]:
    """Positions of up to ``count`` finite, positive values just before ``position``."""
    span = 4 * count
    while True:
        lo = max(0, position - span)
        found = lo + np.flatnonzero(_positive(values[lo:position]))
        if found.size >= count or lo == 0:
            return found[len(found) - min(count, len(found)):].tolist()
        span *= 4


def positive_from(values: np.ndarray, position: int, end: int, count: int) -> list[int]:
    """Positions of up to ``count`` finite, positive values from ``position`` to ``end``."""
    span = 2 * count
    while True:
        hi = min(end, position + span)
        found = position + np.flatnonzero(_positive(values[position:hi]))
        if found.size >= count or hi == end:
            return found[:count].tolist()
        span *= 4
