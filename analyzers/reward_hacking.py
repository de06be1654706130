"""Reward hacking: the RL reward keeps rising while a held-out judged eval falls and the KL to
the reference model grows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzers import register
from analyzers.base import Analyzer, RunData, checkpoint_at_or_before
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_number, percent
from analyzers.stats.metric import higher_is_better, improvement, tags_under
from analyzers.stats.robust import evaluation_noise, finite
from analyzers.stats.trend import Trend, trend

# Evaluations shown in the evidence: the best one and the last ones up to the detection.
_MAX_EVIDENCE_POINTS = 30
# Judged evaluations needed to estimate their noise; before, ``min_drop`` alone decides.
_MIN_NOISE_EVALUATIONS = 6
# The reward's rise and the KL's growth are tested over this many judged evaluations back:
# a reward being gamed keeps rising, before the judged eval's best as after it, and over
# the few evaluations since a recent best a rise is lost in the noise; a bounded window
# keeps what the test says about now, and the cost of a poll, independent of history.
_TREND_EVALUATIONS = 10


@register
class RewardHacking(Analyzer):
    """Reward hacking: reward up, quality down, KL growing.

    *Signal* (SIGNALS.md ``reward_hacking``, a cross-metric signal). Judged at each
    evaluation of each judged-eval tag (``judge_metric`` and every tag under it, e.g.
    ``eval/judge/score``; higher is better unless the name says loss or perplexity). An
    evaluation is *hacked* when all three hold:

    - the judged eval has fallen at least ``min_drop`` (relative) below its best
      evaluation before it, and out of its own noise: by ``threshold`` noise standard
      deviations plus the best's luck (the best of ``m`` noisy evaluations typically lies
      ``sqrt(2 ln m)`` deviations above their level);
    - ``metric`` (the reward) has kept rising: over the steps from ten judged
      evaluations back up to it, the medians of ten blocks of its points rise in a
      one-sided Mann–Kendall test (z at least ``trend_z``), and from the judged eval's
      best on (within those steps) they do not fall by the same test (the reward has not
      turned down while the judged eval fell);
    - ``kl_metric`` has grown by the same two tests.

    After ``patience`` hacked evaluations in a row the finding fires, its onset at the
    first. The rollback target is the latest checkpoint at or before the judged eval's
    best. It resolves once the judged eval is back within ``min_drop / 2`` of that best; a
    later fall is a new finding. A run without any of the three series gives no finding.

    Parameters
    ----------
    metric : str, default "reward"
        The RL reward (the reward model's score of the policy's samples).
    judge_metric : str, default "eval/judge"
        The held-out judged eval (a tag, or a prefix whose tags are each judged): human or
        LLM-judge scores on prompts the reward model never trained on.
    kl_metric : str, default "kl"
        The KL divergence of the policy to the reference model.
    min_drop : float, default 0.02
        Relative fall of the judged eval below its best that counts (0.02 = 2%). Lower
        fires on the wobble of a small judged set; higher waits for visible damage.
    threshold : float, default 2.0
        Noise standard deviations (beyond the best's luck) the fall must also reach. The
        noise of one judged evaluation is estimated from second differences of up to the
        last 100 (from six on; on a long run the window ends every 25), whose trend is
        nearly nil: their robust deviation (MAD) sets aside those beyond three of it (a
        step, the kink where a fall begins), and the standard deviation of the rest is the
        estimate (:func:`analyzers.stats.robust.evaluation_noise`; the MAD alone wastes much of
        the few dozen evaluations of a run: on twenty its standard error is a third of
        the noise, this one's a quarter; a noise read too low makes a lucky best's fall
        look real).
        Lower fires sooner on a noisy judged set, and on a long run also on the slow
        creep of its best-so-far.
    patience : int, default 2
        Hacked evaluations in a row before firing. More rides out one bad judged
        evaluation; fewer alerts one evaluation sooner.
    trend_z : float, default 1.645
        Mann–Kendall z the reward's rise and the KL's growth must reach (1.645: one-sided
        p < 0.05 each; both must hold, with the judged eval falling). Higher asks for
        steadier trends and may miss a reward that rises in bursts.
    grace_period : int, default 2
        Judged evaluations at the start that are never judged: early in RL the policy
        moves fast (KL climbs from zero, the reward jumps) and a judged score often dips
        before it settles.

    *False-positive guard*: the fall must stand out of the judged eval's noise and of
    its best's luck (on a long run the best of many noisy evaluations is always well
    above the rest); all three series must agree, so a judged eval that falls
    while the reward also falls or turns down (a run that is simply getting worse) or
    while the KL stays put (noise in the judged set) is not reported; the reward and KL
    trends are tested on block medians, which tolerates their step-to-step
    autocorrelation and single outliers, and need five points at least in the window;
    ``patience`` asks for a sustained fall; ``grace_period`` skips the start. The resolve
    level (``min_drop / 2``) is stricter than the firing one, so a judged eval at the edge
    does not flap.

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> from analyzers import Checkpoint, RunData
    >>> rng = np.random.default_rng(0)
    >>> steps = np.arange(1, 2001)
    >>> reward = 0.5 + steps / 1000 + 0.1 * rng.standard_normal(2000)
    >>> kl = 0.002 * steps + 0.2 * rng.standard_normal(2000)
    >>> evals = np.arange(100, 2001, 100)
    >>> judge = 7.0 + 0.5 * np.minimum(evals, 800) / 800 - 0.001 * (evals - 800).clip(0)
    >>> data = RunData.from_series(
    ...     "demo", {"reward": reward, "kl": kl, "eval/judge/score": pd.Series(judge, evals)},
    ...     checkpoints=[Checkpoint(s, f"ckpt/checkpoint-{s}") for s in range(250, 2001, 250)])
    >>> [finding] = RewardHacking().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.state
    (1000, 1100, 'firing')
    >>> finding.rollback_to.step
    750
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    reward rose 0.65 → 1.54 and kl grew 0.275 → 2.08 over steps 100–1100, while
    eval/judge/score fell 7.50 at step 800 (best) → 7.20 at step 1100 (-4.0%), 2% or more
    below its best for 2 evaluations in a row
    """

    signal = "reward_hacking"

    def __init__(self, metric: str = "reward", judge_metric: str = "eval/judge",
                 kl_metric: str = "kl", min_drop: float = 0.02, threshold: float = 2.0,
                 patience: int = 2, trend_z: float = 1.645, grace_period: int = 2) -> None:
        check_metric(metric)
        check_metric(judge_metric, "judge_metric")
        check_metric(kl_metric, "kl_metric")
        check_real("min_drop", min_drop, 0.0, below=1.0)
        check_real("threshold", threshold, 0.0, allow_equal=True)
        check_int("patience", patience, 1)
        check_real("trend_z", trend_z, 0.0)
        check_int("grace_period", grace_period, 0)
        self.metric = metric
        self.judge_metric = judge_metric
        self.kl_metric = kl_metric
        self.min_drop = min_drop
        self.threshold = threshold
        self.patience = patience
        self.trend_z = trend_z
        self.grace_period = grace_period

    def detect(self, data: RunData) -> list[Finding]:
        judges = [t for t in tags_under(data.tags(), self.judge_metric)
                  if t not in (self.metric, self.kl_metric)]
        reward = finite(data.series(self.metric))
        kl = finite(data.series(self.kl_metric))
        if not judges or len(reward) < 5 or len(kl) < 5:
            return []
        findings = []
        for tag in judges:
            findings += self._detect_tag(data, tag, reward, kl)
        return sorted(findings, key=lambda f: (f.onset_step, f.metric))

    def _detect_tag(self, data: RunData, tag: str, reward: pd.Series,
                    kl: pd.Series) -> list[Finding]:
        series = finite(data.series(tag))
        n = len(series)
        first_judged = max(self.grace_period, 1)
        if n < first_judged + self.patience:
            return []
        steps = series.index.to_numpy(dtype=np.int64)
        values = series.to_numpy(dtype=float)
        signed = values if higher_is_better(tag) else -values  # larger is better from here on
        best_before = np.concatenate(([np.inf], np.maximum.accumulate(signed)[:-1]))
        is_best = np.concatenate(([True], signed[1:] > best_before[1:]))
        best_at = np.concatenate(([0], np.maximum.accumulate(
            np.where(is_best, np.arange(n), 0))[:-1]))
        fallen = improvement(best_before, signed, True) <= -self.min_drop
        fallen[:first_judged] = False
        candidates = np.flatnonzero(fallen)
        # The best of m noisy evaluations lies about sqrt(2 ln m) deviations above their
        # level: a fall from it must clear that luck and the threshold in the judge's noise.
        luck = np.sqrt(2 * np.log(best_at[candidates] + 1))
        noise = evaluation_noise(signed, candidates, min_points=_MIN_NOISE_EVALUATIONS)
        fallen[candidates] = (best_before[candidates] - signed[candidates]
                              >= (self.threshold + luck) * noise)
        series_r = (reward.index.to_numpy(dtype=np.int64), reward.to_numpy(dtype=float))
        series_k = (kl.index.to_numpy(dtype=np.int64), kl.to_numpy(dtype=float))
        findings = []
        run = 0
        j = first_judged
        while j < n:
            if not fallen[j]:
                run, j = 0, j + 1
                continue
            first = max(j - _TREND_EVALUATIONS, 0)
            lo, hi = int(steps[first]), int(steps[j])
            rise = _trend_between(*series_r, lo, hi)
            growth = _trend_between(*series_k, lo, hi)
            # From the best on, within the window (a best before it: the rise covers it).
            since = int(steps[max(int(best_at[j]), first)])
            if not (self._rises(rise) and self._rises(growth)
                    and self._holds(series_r, series_k, since, hi)):
                run, j = 0, j + 1
                continue
            run += 1
            if run < self.patience:
                j += 1
                continue
            onset, best = j - run + 1, int(best_at[j])
            near_best = signed[best] - self.min_drop / 2 * abs(signed[best])
            back = np.flatnonzero(signed[j + 1:] >= near_best)[:1]
            resolved = j + 1 + int(back[0]) if back.size else None
            findings.append(self._finding(data, tag, steps, values, best, onset, j, resolved,
                                          lo, rise, growth))
            if resolved is None:
                break
            run, j = 0, resolved + 1
        return findings

    def _rises(self, found: Trend | None) -> bool:
        return found is not None and found.z >= self.trend_z and found.end > found.start

    def _holds(self, reward: tuple[np.ndarray, np.ndarray], kl: tuple[np.ndarray, np.ndarray],
               since: int, hi: int) -> bool:
        """Neither the reward nor the KL has turned down since the judged eval's best
        (``since``): no significant fall from there to ``hi``."""
        for series in (reward, kl):
            found = _trend_between(*series, since, hi)
            if found is not None and found.z <= -self.trend_z:
                return False
        return True

    def _finding(self, data: RunData, tag: str, steps: np.ndarray, values: np.ndarray,
                 best: int, onset: int, fired: int, resolved: int | None, since: int,
                 rise: Trend, growth: Trend) -> Finding:
        best_step, fired_step = int(steps[best]), int(steps[fired])
        change = float(improvement(values[best], values[fired], True))
        summary = (f"{self.metric} rose {fmt_number(rise.start)} → {fmt_number(rise.end)} and "
                   f"{self.kl_metric} grew {fmt_number(growth.start)} → "
                   f"{fmt_number(growth.end)} over steps {since}–{fired_step}, while {tag} "
                   f"fell {fmt_number(values[best])} at step {best_step} (best) → "
                   f"{fmt_number(values[fired])} at step {fired_step} ({percent(change)}), "
                   f"{100 * self.min_drop:g}% or more below its best for "
                   f"{fired - onset + 1} evaluations in a row")
        shown = [best, *range(max(best + 1, fired + 2 - _MAX_EVIDENCE_POINTS), fired + 1)]
        evidence = {
            "best_step": best_step,
            "best_value": float(values[best]),
            "judge_value": float(values[fired]),
            "judge_change": change,
            "hacked_evaluations": fired - onset + 1,
            "reward": {"start": rise.start, "end": rise.end, "mann_kendall_z": rise.z,
                       "blocks": rise.blocks},
            "kl": {"start": growth.start, "end": growth.end, "mann_kendall_z": growth.z,
                   "blocks": growth.blocks},
            "window_steps": [since, fired_step],
            "evaluations": [[int(steps[i]), float(values[i])] for i in shown],
        }
        return self.finding(
            data, metric=tag, onset_step=int(steps[onset]), detected_step=fired_step,
            summary=summary, evidence=evidence,
            rollback_to=checkpoint_at_or_before(
                data.checkpoints, best_step,
                f"latest checkpoint at or before step {best_step}, where {tag} was at its best "
                f"({fmt_number(values[best])}) before the reward started to be gamed"),
            resolved_step=None if resolved is None else int(steps[resolved]))


def _trend_between(steps: np.ndarray, values: np.ndarray, lo: int, hi: int) -> Trend | None:
    """The trend of the points logged at steps ``lo`` to ``hi``, both included."""
    start = int(np.searchsorted(steps, lo, side="left"))
    end = int(np.searchsorted(steps, hi, side="right"))
    return trend(values[start:end])

