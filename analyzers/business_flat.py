"""Business flat: the loss keeps improving while the business eval stays flat or falls."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from analyzers import register
from analyzers.base import Analyzer, RunData, checkpoint_at_or_before
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_number, percent
from analyzers.stats.metric import higher_is_better, improvement, tags_under
from analyzers.stats.robust import finite
from analyzers.stats.trend import Trend, theil_sen_rows, trend, trend_scatter
from analyzers.suites import check_suites, suite_prefixes, suite_tags, version_marks, version_pieces

# The loss watched when the run logs no training loss at all.
_FALLBACK_LOSS = {"train/loss": "eval/loss"}
# Evaluations shown in the evidence: the last ones up to the detection.
_MAX_EVIDENCE_POINTS = 30


@register
class BusinessFlat(Analyzer):
    """Business flat: loss falls, the business metric doesn't.

    *Signal* (SIGNALS.md ``business_flat``, a cross-metric signal). Judged at each
    evaluation of each business tag (``metric`` and every tag under it, e.g.
    ``eval/business/pass_rate``; higher is better unless the name says loss or
    perplexity). The business metric is *flat* when its level over its last
    ``evaluations`` evaluations improves on the best level before them (that of a window
    that ended before this one began; the best single evaluation before one whole window
    has ended) by less than ``min_improvement`` (relative; a fall counts as flat). A
    window's level is the Theil–Sen line through its evaluations at the last one, held
    between their second-worst and best values: the best of a few noisy evaluations sits
    about one noise deviation above the metric (for four), so judged by it a metric that
    has stopped seems to creep on; the line's end does not, and it still follows a metric
    that keeps rising. Level is compared with level: against a best single evaluation, a
    metric that keeps rising slowly would look flat. The finding fires
    at the first flat evaluation where, since the business metric's best before the window
    (from that evaluation to the judged one: the whole stretch without business progress,
    at least the window), ``loss_metric`` has fallen steadily: the medians of ten blocks of
    its points fall in order (Kendall's tau at most ``-min_tau``) and the Theil–Sen line
    through them drops by at least ``min_loss_drop`` (relative), from or to a level further
    from zero than the loss's points scatter about the line. The onset is the window's
    first evaluation. It resolves when a window's level again gains twice
    ``min_improvement`` on the best before it; a later flat stretch is a new finding. The
    rollback target is the latest checkpoint at or before the business metric's best yet
    (its first evaluation within ``min_improvement`` of it; when the two diverge, trust the
    business metric). Non-finite values are skipped; without ``train/loss`` at all,
    ``eval/loss`` is the loss.

    With ``suites``, the business suite is the named eval suites (``[[eval_suites]]`` in
    the config), and each tag is judged only within one version of its suite: where the run
    records that a suite changed version, the evaluations after the change are judged as a
    new series (its best, its windows and ``grace_period`` start again), never against the
    levels of the old version.

    Parameters
    ----------
    metric : str, default "eval/business"
        The business suite: a tag, or a prefix whose tags are each judged on their own.
    suites : list of str or dict, default None
        The business suite as named eval suites: names (metrics under ``eval/<name>/``) or
        name → metric prefix (the bot passes the config's prefixes). Replaces ``metric``;
        numbers are compared only within one version of a suite.
    loss_metric : str, default "train/loss"
        The loss that keeps improving.
    min_improvement : float, default 0.01
        Relative improvement over the earlier best that counts as business progress
        (0.01 = 1%). Higher also reports a business metric that still creeps up; lower
        only one that is truly stuck.
    evaluations : int, default 4
        Business evaluations in the window, the rule's N; the finding comes at the
        earliest ``evaluations - 1`` evaluations after the business metric stops (one
        sooner when it falls from its best, which the window may then begin with). More
        rides out a business metric that moves in steps (a pass rate on a small suite) and
        levels its noise further; fewer alerts sooner but takes a few unlucky evaluations
        for a stop.
    min_loss_drop : float, default 0.02
        Relative fall of the loss's trend line over the window that counts as the loss
        improving (0.02 = 2%). Lower also reports runs whose loss has nearly converged,
        where a flat business metric is expected.
    min_tau : float, default 0.6
        How steadily the loss must fall: Kendall's tau of the block medians against time
        must be at most ``-min_tau`` (-1: every block below all those before it). 0.6
        asks for four in five block pairs in order, which on ten blocks is a one-sided
        Mann–Kendall test at the 1% level (z 2.3) and stays reachable when only five
        points (an eval loss) span the window. Higher misses a noisy per-step loss (a
        small-batch fine-tune) falling a few percent over the window; lower also takes a
        loss that wanders slowly (a converged loss with strongly autocorrelated noise) for
        a falling one.
    grace_period : int, default 1
        Evaluations at the start that never begin a judged window: the warm-up, where the
        loss falls so steeply that any business metric looks flat beside it.

    *False-positive guard*: the window of ``evaluations`` is itself the persistence (one
    flat evaluation never fires); the loss must fall *steadily* by a trend test on block
    medians, which tolerates the autocorrelation of a per-step loss and blunts single
    spikes, and by a relevant amount, so a converged loss wobbling down does not count
    (the stretch since the business best grows while the metric stays flat, so a noisy
    loss that falls gets more points to show it, but a converged one does not fall); a
    loss whose line stays within its scatter of zero (a PPO or GRPO policy loss) has no
    level for a relative fall, where any wobble would be a large one, and never falls;
    ``grace_period`` skips the warm-up; the window's level is held between its
    second-worst and best evaluations, so one unlucky evaluation (a broken evaluation run)
    pulls it no lower than the others allow, and the level of a metric rising steadily is
    its latest value, not one lagging behind. Five loss points at least are needed in the
    stretch. The resolve level (a window's level gaining twice ``min_improvement``) is
    above the firing one and, being a rate, is not reached by a metric creeping up slower
    than that, however far it gets in the end: it does not flap.

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> from analyzers import Checkpoint, RunData
    >>> rng = np.random.default_rng(0)
    >>> steps = np.arange(1, 4001)
    >>> loss = 0.8 + 1.5 * np.exp(-steps / 1500) + 0.03 * rng.standard_normal(4000)
    >>> evals = np.arange(0, 4001, 250)
    >>> business = (0.30 + 0.1 * np.minimum(evals, 1000) / 1000
    ...             + 0.004 * rng.standard_normal(len(evals)))
    >>> data = RunData.from_series(
    ...     "demo", {"train/loss": loss, "eval/business/pass_rate": pd.Series(business, evals)},
    ...     checkpoints=[Checkpoint(s, f"ckpt/checkpoint-{s}") for s in range(500, 4001, 500)])
    >>> [finding] = BusinessFlat().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.state
    (1250, 2000, 'firing')
    >>> finding.rollback_to.step
    1000
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    train/loss fell 1.53 → 1.19 (-22.2%) over steps 1000–2000 (Kendall's tau -1.00), while
    eval/business/pass_rate stayed flat: a level of 0.404 over the last 4 evaluations,
    -0.2% on its best before them (0.405 at step 1000; progress needs +1%)
    """

    signal = "business_flat"

    def __init__(self, metric: str = "eval/business", loss_metric: str = "train/loss",
                 min_improvement: float = 0.01, evaluations: int = 4,
                 min_loss_drop: float = 0.02, min_tau: float = 0.6,
                 grace_period: int = 1,
                 suites: list[str] | dict[str, str] | None = None) -> None:
        check_metric(metric)
        check_suites(suites)
        check_metric(loss_metric, "loss_metric")
        check_real("min_improvement", min_improvement, 0.0, below=1.0)
        check_int("evaluations", evaluations, 2)
        check_real("min_loss_drop", min_loss_drop, 0.0, allow_equal=True, below=1.0)
        check_real("min_tau", min_tau, 0.0, allow_equal=True, below=1.0)
        check_int("grace_period", grace_period, 0)
        self.metric = metric
        self.loss_metric = loss_metric
        self.min_improvement = min_improvement
        self.evaluations = evaluations
        self.min_loss_drop = min_loss_drop
        self.min_tau = min_tau
        self.grace_period = grace_period
        self.suites = suites

    def detect(self, data: RunData) -> list[Finding]:
        in_suite = suite_tags(data.tags(), suite_prefixes(self.suites)) if self.suites else {}
        judged = list(in_suite) if self.suites else tags_under(data.tags(), self.metric)
        business = [t for t in judged if t != self.loss_metric]
        if not business:
            return []
        loss_metric = self.loss_metric
        loss = finite(data.series(loss_metric))
        if loss.empty and loss_metric in _FALLBACK_LOSS:
            loss_metric = _FALLBACK_LOSS[loss_metric]
            loss = finite(data.series(loss_metric))
        if len(loss) < 5:
            return []
        findings = []
        for tag in business:
            suite = in_suite.get(tag)
            for version, series in version_pieces(finite(data.series(tag)), version_marks(
                    data.meta, suite) if suite else []):
                findings += self._detect_tag(data, tag, series, loss_metric, loss,
                                             {"suite": suite, "suite_version": version}
                                             if suite else {})
        return sorted(findings, key=lambda f: (f.onset_step, f.metric))

    def _detect_tag(self, data: RunData, tag: str, series: pd.Series, loss_metric: str,
                    loss: pd.Series, suite: dict[str, Any]) -> list[Finding]:
        """One business tag's findings over ``series`` (its finite values within one
        version of its suite, ``suite``: the name and version for the evidence)."""
        n, window = len(series), self.evaluations
        if n <= window + self.grace_period:
            return []
        steps = series.index.to_numpy(dtype=np.int64)
        values = series.to_numpy(dtype=float)
        higher = higher_is_better(tag)
        signed = values if higher else -values  # larger is better from here on
        # For the window ending at j: its level, and the best level before it.
        levels = self._levels(signed)
        reference, reference_at = self._references(signed, levels)
        gain = improvement(reference, levels, True)
        flat = np.zeros(n, dtype=bool)
        flat[window + self.grace_period:] = gain[window + self.grace_period:] < self.min_improvement
        loss_steps = loss.index.to_numpy(dtype=np.int64)
        loss_values = loss.to_numpy(dtype=float)
        findings = []
        j = window + self.grace_period
        while j < n:
            if not flat[j]:
                j += 1
                continue
            since = int(np.argmax(signed[:j - window + 1]))  # the business metric's best
            lo = int(np.searchsorted(loss_steps, steps[since], side="left"))
            hi = int(np.searchsorted(loss_steps, steps[j], side="right"))
            fall = trend(loss_values[lo:hi])
            if not self._falls(fall, loss_values[lo:hi]):
                j += 1
                continue
            # Resolved once a window shows progress again, by twice the firing margin: a
            # metric creeping up by less than that per window stays flat however far it
            # gets in the end.
            later = np.flatnonzero(gain[j + 1:] >= 2 * self.min_improvement)[:1]
            resolved = j + 1 + int(later[0]) if later.size else None
            findings.append(self._finding(data, tag, loss_metric, steps, values, levels,
                                          (float(reference[j]), int(reference_at[j])), since,
                                          j, fall, float(gain[j]), resolved, suite))
            if resolved is None:
                break
            j = resolved + window  # a new window begins after the resolve
        return findings

    def _levels(self, signed: np.ndarray) -> np.ndarray:
        """The level of the window of ``evaluations`` ending at each evaluation (NaN before
        the first whole one): the Theil–Sen line through them at the last one, held between
        their second-worst and best values."""
        window = self.evaluations
        levels = np.full(len(signed), np.nan)
        if len(signed) < window:
            return levels
        rows = sliding_window_view(signed, window)
        _, end = theil_sen_rows(rows)
        ordered = np.sort(rows, axis=1)
        levels[window - 1:] = np.clip(end, ordered[:, 1], ordered[:, -1])
        return levels

    def _references(self, signed: np.ndarray, levels: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """For the window ending at each evaluation (NaN and -1 before the first): the best
        level of the windows that ended before it began, and the evaluation where that
        window ended; before one whole window had ended, the best single evaluation and
        its position. Level against level: the best of several noisy evaluations sits
        above the metric, so a level measured against it would call a metric that keeps
        rising slowly flat."""
        window, n = self.evaluations, len(signed)
        positions = np.arange(n)

        def running_best(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            best = np.maximum.accumulate(values)
            return best, np.maximum.accumulate(np.where(values == best, positions, 0))

        level_best, level_at = running_best(np.where(np.isnan(levels), -np.inf, levels))
        value_best, value_at = running_best(signed)
        whole = np.isfinite(level_best)
        best = np.where(whole, level_best, value_best)
        at = np.where(whole, level_at, value_at)
        reference, reference_at = np.full(n, np.nan), np.full(n, -1)
        reference[window:], reference_at[window:] = best[:-window], at[:-window]
        return reference, reference_at

    def _falls(self, fall: Trend | None, values: np.ndarray) -> bool:
        if fall is None or fall.tau > -self.min_tau:
            return False
        fell_by = float(improvement(fall.start, fall.end, False))
        # Relative to a level within the loss's noise of zero, any wobble is a large fall: a
        # loss whose trend stays within its scatter of zero (a PPO or GRPO policy loss) has
        # no level to fall from.
        return (fell_by >= self.min_loss_drop
                and max(abs(fall.start), abs(fall.end)) > trend_scatter(values, fall))

    def _finding(self, data: RunData, tag: str, loss_metric: str, steps: np.ndarray,
                 values: np.ndarray, levels: np.ndarray, reference: tuple[float, int],
                 best_at: int, fired: int, fall: Trend, gain: float,
                 resolved: int | None, suite: dict[str, Any]) -> Finding:
        """The finding fired at evaluation ``fired``: its window's level against
        ``reference`` (the best earlier level and where it ended), the loss's ``fall`` since
        the business metric's best evaluation ``best_at``."""
        window = self.evaluations
        start = fired - window  # the evaluation before the window
        higher = higher_is_better(tag)
        signed = values if higher else -values
        # The rollback target: the business metric's best yet (in the window when it fell from
        # there), taken at the first evaluation within min_improvement of it (closer is noise).
        near = improvement(signed[:fired + 1], signed[:fired + 1].max(), True)
        peak = int(np.flatnonzero(near < self.min_improvement)[0])
        sign = 1.0 if higher else -1.0
        level = sign * float(levels[fired])
        reference_value, reference_at = sign * reference[0], reference[1]
        loss_change = float((fall.end - fall.start) / abs(fall.start)) if fall.start else 0.0
        # Worse by min_improvement or more: a fall (a rise for a loss); the change in the
        # metric's own direction.
        verb = ("fell" if higher else "rose") if gain <= -self.min_improvement else "stayed flat"
        summary = (f"{loss_metric} fell {fmt_number(fall.start)} → {fmt_number(fall.end)} "
                   f"({percent(loss_change)}) over steps {int(steps[best_at])}–"
                   f"{int(steps[fired])} (Kendall's tau {fall.tau:.2f}), while {tag} {verb}: "
                   f"a level of {fmt_number(level)} over the last {window} evaluations, "
                   f"{percent(gain if higher else -gain)} on its best before them "
                   f"({fmt_number(reference_value)} at step {int(steps[reference_at])}; "
                   f"progress needs {'+' if higher else '-'}{100 * self.min_improvement:g}%)")
        shown = range(max(0, fired + 1 - _MAX_EVIDENCE_POINTS), fired + 1)
        evidence = {
            "best_step": int(steps[best_at]),
            "best_value": float(values[best_at]),
            "window_steps": [int(steps[start + 1]), int(steps[fired])],
            "window_level": level,
            "reference_step": int(steps[reference_at]),
            "reference_level": reference_value,
            "improvement": gain,
            "min_improvement": self.min_improvement,
            "loss_metric": loss_metric,
            "loss_trend": {"steps": [int(steps[best_at]), int(steps[fired])],
                           "start": fall.start, "end": fall.end, "change": loss_change,
                           "kendall_tau": fall.tau, "mann_kendall_z": fall.z,
                           "blocks": fall.blocks},
            "evaluations": [[int(steps[i]), float(values[i])] for i in shown],
            **suite,
        }
        return self.finding(
            data, metric=tag, onset_step=int(steps[start + 1]), detected_step=int(steps[fired]),
            summary=summary, evidence=evidence,
            rollback_to=checkpoint_at_or_before(
                data.checkpoints, int(steps[peak]),
                f"latest checkpoint at or before step {int(steps[peak])}, where {tag} was at "
                f"its best: when loss and business metric diverge, trust the business metric"),
            resolved_step=None if resolved is None else int(steps[resolved]))

