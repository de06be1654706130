"""Measurements several analyzers share: trend tests that tolerate autocorrelated step-level
series, robust noise, episodes with persistence and hysteresis, metric direction, and the
tokens and per-evaluation grouping of logged sample generations.

Everything here is a pure function of arrays or frames; nothing knows about a signal.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import bottleneck as bn
import numpy as np
import pandas as pd

# 1.4826 * MAD estimates a normal standard deviation.
MAD_TO_SD = 1.4826
# Name parts that make a metric lower-is-better.
_LOWER_IS_BETTER = ("loss", "perplexity", "ppl")
# A token is one CJK/kana character (those scripts do not separate words by spaces) or a run
# of letters and digits (any script); punctuation and spaces are not tokens.
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]"
                    r"|[^\W_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def higher_is_better(tag: str) -> bool:
    """Whether a larger value of ``tag`` is better: anything but a loss or a perplexity.

    >>> higher_is_better("eval/general/accuracy"), higher_is_better("eval/business/loss")
    (True, False)
    >>> higher_is_better("eval/loss"), higher_is_better("eval/general/wiki_ppl")
    (False, False)
    """
    name = tag.rsplit("/", 1)[-1].lower()
    return not any(part in name for part in _LOWER_IS_BETTER)


def config_number(value: Any) -> float | None:
    """A finite number from a run's config (MLflow stores params as text), or None.

    >>> config_number("500"), config_number(2e-4), config_number(True), config_number("x")
    (500.0, 0.0002, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value):
        return float(value)
    return None


def tags_under(tags: Iterable[str], prefix: str) -> list[str]:
    """The tags equal to ``prefix`` or below it (``eval/general`` holds
    ``eval/general/accuracy``, not ``eval/generalist``), sorted."""
    return sorted(t for t in tags if t == prefix or t.startswith(prefix.rstrip("/") + "/"))


def finite(series: pd.Series) -> pd.Series:
    """The finite points of a series."""
    return series[np.isfinite(series.to_numpy(dtype=float))]


def improvement(reference: float | np.ndarray, value: float | np.ndarray,
                higher: bool) -> np.ndarray:
    """Relative improvement of ``value`` on ``reference`` (positive: better); on a zero
    reference, the plain difference."""
    reference = np.asarray(reference, dtype=float)
    change = np.asarray(value, dtype=float) - reference
    if not higher:
        change = -change
    scale = np.abs(reference)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale > 0, change / np.where(scale > 0, scale, 1.0), change)


def percent(change: float) -> str:
    """A relative change as a signed percentage: ``+6.6%``."""
    return f"{100 * change:+.1f}%" if math.isfinite(change) else "from zero"


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


def theil_sen_slope(values: np.ndarray) -> float:
    """The median of the pairwise slopes of ``values`` against their position."""
    n = len(values)
    if n < 2:
        return 0.0
    i, j = np.triu_indices(n, 1)
    return float(np.median((values[j] - values[i]) / (j - i)))


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


# --- logged sample generations --------------------------------------------------------------

def tokens(text: str) -> list[str]:
    """Lower-cased word tokens; each CJK or kana character is a token of its own.

    >>> tokens("Hello, world! 你好世界 x_y 2024")
    ['hello', 'world', '你', '好', '世', '界', 'x', 'y', '2024']
    """
    return _TOKEN.findall(text.lower())


def evaluation_rows(generations: pd.DataFrame | None, probes_only: bool = False
                    ) -> list[tuple[int, list[str], list[str]]]:
    """The prompts and outputs of each evaluation step, ascending, in logged order;
    ``probes_only`` keeps the rows marked ``probe`` (all rows when no row carries the mark).

    >>> frame = pd.DataFrame({"step": [200, 100, 200], "prompt": ["a", "b", "c"],
    ...                       "output": ["x", "y", "z"]})
    >>> evaluation_rows(frame)
    [(100, ['b'], ['y']), (200, ['a', 'c'], ['x', 'z'])]
    """
    if generations is None or generations.empty:
        return []
    if probes_only and "probe" in generations.columns:
        generations = generations[generations["probe"].astype(bool)]
    steps = generations["step"].to_numpy(dtype=np.int64)
    order = np.argsort(steps, kind="stable")
    steps = steps[order]
    prompts = generations["prompt"].to_numpy()[order]
    outputs = generations["output"].to_numpy()[order]
    bounds = [0, *(np.flatnonzero(steps[1:] != steps[:-1]) + 1).tolist(), len(steps)]
    return [(int(steps[a]), prompts[a:b].tolist(), outputs[a:b].tolist())
            for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def excerpt(text: str, limit: int = 160) -> str:
    """The start of a text on one line, cut at ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def episode_steps(judged: Sequence[Any], episode: Episode) -> dict[str, int | None]:
    """An episode of judged evaluations (anything with a ``step``) as the steps a finding
    takes: ``onset_step``, ``detected_step`` and ``resolved_step``."""
    return {"onset_step": judged[episode.onset].step,
            "detected_step": judged[episode.fired].step,
            "resolved_step": (None if episode.resolved is None
                              else judged[episode.resolved].step)}


def shown_evaluations(judged: Sequence[Any], episode: Episode, limit: int) -> list[Any]:
    """The last ``limit`` judged evaluations up to the one that fired."""
    return list(judged[max(0, episode.fired + 1 - limit):episode.fired + 1])


def example_evidence(step: int, example: tuple[str, str] | None) -> dict[str, Any] | None:
    """A (prompt, output) example as evidence, both cut to an excerpt."""
    if example is None:
        return None
    return {"step": step, "prompt": excerpt(example[0]), "output": excerpt(example[1])}


def share(rate: float) -> str:
    """A rate as a whole percentage: ``45%``."""
    return f"{100 * rate:.0f}%"
