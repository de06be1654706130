"""Trend tests that tolerate autocorrelated step-level series (blocked Mann–Kendall, Theil–Sen),
episodes with persistence and hysteresis, and the rate tests (Fisher) of generation checks.

Pure functions of arrays or frames; nothing here knows about a signal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analyzers.fmt import share
from analyzers.stats.robust import robust_sd


@dataclass(frozen=True)
class Trend:
    """A robust trend over a stretch of a series: Mann–Kendall ``z`` of the block medians'
    order and Kendall's ``tau`` (the share of concordant minus discordant pairs: 1 when every
    block is above the one before, -1 when below; positive: rising), and the Theil–Sen line
    through them, as its level at the first and last block."""

    z: float
    tau: float
    start: float
    end: float
    blocks: int


def trend(values: np.ndarray, *, blocks: int = 10, min_blocks: int = 5) -> Trend | None:
    """The trend of a step-level series, judged on block medians.

    Step-level series (a per-batch loss, an RL reward) are autocorrelated, and a rank test on
    raw points then sees trends everywhere; the medians of ``blocks`` consecutive blocks are
    far closer to independent, and blunt outliers too. A short series (fewer than two points
    a block) is judged point by point. None with fewer than ``min_blocks`` finite values.

    >>> rng = np.random.default_rng(0)
    >>> rising = np.linspace(0, 1, 400) + 0.3 * rng.standard_normal(400)
    >>> t = trend(rising)
    >>> round(t.z, 2), round(t.tau, 2), round(t.start, 2), round(t.end, 2), t.blocks
    (3.76, 0.96, 0.07, 0.89, 10)
    >>> round(trend(0.3 * rng.standard_normal(400)).z, 2)
    -0.89
    """
    used, size = _blocked(values, blocks)
    if len(used) < min_blocks:
        return None
    medians = np.median(used.reshape(-1, size), axis=1) if size > 1 else used
    slope = theil_sen_slope(medians)
    x = np.arange(len(medians))
    intercept = float(np.median(medians - slope * x))
    m = len(medians)
    i, j = np.triu_indices(m, 1)
    tau = float(np.sign(medians[j] - medians[i]).sum()) / (m * (m - 1) / 2)
    return Trend(z=mann_kendall_z(medians), tau=tau, start=intercept,
                 end=intercept + slope * (m - 1), blocks=m)


def trend_scatter(values: np.ndarray, fit: Trend) -> float:
    """The robust standard deviation of the points of ``values`` about the line that
    :func:`trend` fitted to them (through the block medians, each point at its place in its
    block)."""
    used, size = _blocked(values, fit.blocks)
    x = (np.arange(len(used)) - (size - 1) / 2) / size
    slope = (fit.end - fit.start) / (fit.blocks - 1)
    return robust_sd(used - (fit.start + slope * x))


def _blocked(values: np.ndarray, blocks: int) -> tuple[np.ndarray, int]:
    """The finite values :func:`trend` judges (the last whole ``blocks`` blocks of them, or
    all of them point by point when there are fewer than two a block) and the block size."""
    values = values[np.isfinite(values)]
    n = len(values)
    if n < 2 * blocks:
        return values, 1
    size = n // blocks
    return values[n - size * blocks:], size


def mann_kendall_z(values: np.ndarray) -> float:
    """The Mann–Kendall statistic as a z score, with the tie and continuity corrections
    (positive: rising; 0 for a constant series)."""
    n = len(values)
    if n < 3:
        return 0.0
    i, j = np.triu_indices(n, 1)
    score = float(np.sign(values[j] - values[i]).sum())
    _, counts = np.unique(values, return_counts=True)
    variance = (n * (n - 1) * (2 * n + 5)
                - float(np.sum(counts * (counts - 1) * (2 * counts + 5)))) / 18
    if variance <= 0 or score == 0:
        return 0.0
    return (score - math.copysign(1.0, score)) / math.sqrt(variance)


def theil_sen_slope(values: np.ndarray, positions: np.ndarray | None = None) -> float:
    """The median of the pairwise slopes of ``values`` against their position (their index,
    or ``positions``): one lucky or unlucky point does not tilt the line.

    >>> theil_sen_slope(np.array([1.0, 2.0, 30.0, 4.0]))
    1.0
    >>> theil_sen_slope(np.array([1.0, 3.0]), np.array([0.0, 4.0]))
    0.5
    """
    n = len(values)
    if n < 2:
        return 0.0
    i, j = np.triu_indices(n, 1)
    run = (j - i) if positions is None else (positions[j] - positions[i])
    return float(np.median((values[j] - values[i]) / run))


def theil_sen_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the Theil–Sen slope against position and the line's level at the row's last
    position (the median intercept), for many windows at once.

    >>> slope, level = theil_sen_rows(np.array([[1.0, 2.0, 3.0, 4.0, 50.0]]))
    >>> float(slope[0]), float(level[0])
    (1.0, 5.0)
    """
    width = rows.shape[1]
    i, j = np.triu_indices(width, 1)
    slope = np.median((rows[:, j] - rows[:, i]) / (j - i), axis=1)
    level = np.median(rows - slope[:, None] * np.arange(width), axis=1) + slope * (width - 1)
    return slope, level


@dataclass(frozen=True)
class Episode:
    """Positions: the first bad point, the point that fired (the ``patience``-th bad one in
    a row) and the first calm point after it (None while it lasts)."""

    onset: int
    fired: int
    resolved: int | None


def episodes(bad: np.ndarray, calm: np.ndarray, patience: int) -> list[Episode]:
    """Every episode: ``patience`` bad points in a row fire; the first calm point after the
    firing one resolves (calm should be stricter than not-bad, so a value at the edge does
    not flap); the next episode may begin after it.

    >>> bad = np.array([0, 1, 1, 1, 0, 0, 1, 1], dtype=bool)
    >>> calm = np.array([1, 0, 0, 0, 0, 1, 0, 0], dtype=bool)
    >>> episodes(bad, calm, 2)  # doctest: +NORMALIZE_WHITESPACE
    [Episode(onset=1, fired=2, resolved=5), Episode(onset=6, fired=7, resolved=None)]
    """
    found = []
    run = 0
    onset = fired = None
    bad_list, calm_list = bad.tolist(), calm.tolist()
    for i, is_bad in enumerate(bad_list):
        if fired is not None:
            if calm_list[i]:
                found.append(Episode(onset, fired, i))
                onset = fired = None
                run = 0
            continue
        if is_bad:
            run += 1
            if run == 1:
                onset = i
            if run >= patience:
                fired = i
        else:
            run = 0
    if fired is not None:
        found.append(Episode(onset, fired, None))
    return found


@dataclass(frozen=True)
class RateJudgement:
    """An evaluation's share of bad outputs (looping, refusing, …) judged against the
    baseline pooled before it: that baseline, the level, the test and the verdicts."""

    hits: int  # bad outputs in the baseline evaluations
    outputs: int  # outputs judged in them
    evaluations: int  # baseline evaluations
    last_step: int  # the baseline's last evaluation
    level: float  # the share the evaluation had to exceed
    p_value: float  # one-sided Fisher exact test: more bad outputs than the baseline
    bad: bool
    calm: bool

    @property
    def rate(self) -> float:
        return self.hits / self.outputs if self.outputs else 0.0

    @property
    def baseline_text(self) -> str:
        """The baseline as a finding's summary names it: ``5% over the 3 baseline
        evaluations to step 300``."""
        plural = "s" if self.evaluations > 1 else ""
        return (f"{share(self.rate)} over the {self.evaluations} baseline evaluation{plural} "
                f"to step {self.last_step}")

    @property
    def p_text(self) -> str:
        """The test's p-value as a summary names it: ``p = 0.0013``, ``p < 0.0001``."""
        return "p < 0.0001" if self.p_value < 1e-4 else f"p = {self.p_value:.2g}"


def judge_rates(evaluations: Sequence[tuple[int, int, int]], *, floor: float, margin: float,
                alpha: float, baseline: int) -> list[RateJudgement]:
    """Each evaluation ``(step, bad outputs, outputs)`` against the baseline pooled from
    the first ``baseline`` evaluations that were not bad (the first one alone starts it and
    is never bad). An evaluation is bad when its share exceeds ``floor`` and the baseline's
    share by ``margin`` *and* a one-sided Fisher exact test finds more bad outputs than the
    baseline's at level ``alpha`` (a few outputs against a small baseline are sampling
    noise: 2 of 19 against none of 19 is p = 0.24); calm when the share is back at least
    halfway from that level to the baseline's.

    >>> [(j.bad, j.calm) for j in judge_rates([(1, 0, 20), (2, 1, 20), (3, 8, 20)],
    ...                                        floor=0.1, margin=0.1, alpha=0.01, baseline=3)]
    [(False, True), (False, True), (True, False)]
    """
    verdicts: list[RateJudgement] = []
    hits = outputs = count = 0
    last = evaluations[0][0] if evaluations else 0
    for step, k, m in evaluations:
        if count == 0:
            verdict = RateJudgement(0, 0, 0, step, 1.0, 1.0, bad=False, calm=True)
        else:
            base = hits / outputs
            level = max(floor, base + margin)
            p_value = fisher_greater(k, m, hits, outputs)
            rate = k / m
            verdict = RateJudgement(hits, outputs, count, last, level, p_value,
                                    bad=rate > level - _RATE_ROUNDING and rate > floor
                                    and p_value < alpha,
                                    calm=rate <= level - (level - base) / 2)
        verdicts.append(verdict)
        if count < baseline and not verdict.bad:
            hits, outputs, count, last = hits + k, outputs + m, count + 1, step
    return verdicts


def rate_episodes(verdicts: Sequence[RateJudgement], patience: int) -> list[Episode]:
    """Episodes of judged rates: ``patience`` bad evaluations in a row fire, as many calm
    ones in a row resolve (the last of them), so a rate hovering at the level does not
    flap."""
    calm = np.array([v.calm for v in verdicts], dtype=bool)
    return episodes(np.array([v.bad for v in verdicts], dtype=bool),
                    run_lengths(calm) >= patience, patience)


def run_lengths(flags: np.ndarray) -> np.ndarray:
    """For each position, how many flags in a row end there (0 where the flag is off).

    >>> run_lengths(np.array([1, 1, 0, 1, 1, 1], dtype=bool)).tolist()
    [1, 2, 0, 1, 2, 3]
    """
    positions = np.arange(len(flags))
    last_off = np.maximum.accumulate(np.where(flags, -1, positions))
    return np.where(flags, positions - last_off, 0)


def fisher_greater(k: int, m: int, base_k: int, base_m: int) -> float:
    """One-sided Fisher exact test: the chance of ``k`` or more bad outputs of ``m`` when
    they and the baseline's ``base_k`` of ``base_m`` share one rate (the hypergeometric
    upper tail).

    >>> round(fisher_greater(5, 20, 0, 20), 4)  # 5 of 20 against none of 20
    0.0236
    >>> fisher_greater(0, 20, 3, 20)
    1.0
    """
    total, hits = m + base_m, k + base_k

    def log_comb(a: int, b: int) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    denominator = log_comb(total, m)
    tail = sum(math.exp(log_comb(hits, x) + log_comb(total - hits, m - x) - denominator)
               for x in range(k, min(m, hits) + 1))
    return min(1.0, tail)


# Rates are shares of counts: differences below this are float rounding, not a change
# (3 of 20 is 0.1 above 1 of 20 whatever 0.05 + 0.1 rounds to).
_RATE_ROUNDING = 1e-9
