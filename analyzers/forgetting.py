"""Forgetting: a fixed general-ability eval suite drops below its baseline while the domain
eval improves."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzers import register
from analyzers.base import (
    Analyzer,
    Finding,
    RunData,
    check_int,
    check_metric,
    check_real,
    checkpoint_at_or_before,
    fmt_number,
)
from analyzers.stats import (
    Episode,
    episodes,
    evaluation_noise,
    finite,
    higher_is_better,
    improvement,
    percent,
    rolling_median,
    tags_under,
)

# The run's baseline values (the base model's scores before this training): a mapping of tag
# to value under this key of the run's metadata.
BASELINE_KEY = "baseline"
# Evaluations shown in the evidence: the last ones up to the detection.
_MAX_EVIDENCE_POINTS = 30
# Evaluations needed to estimate the suite's noise; before, the tolerance is doubled.
_MIN_NOISE_EVALUATIONS = 6


@dataclass(frozen=True)
class _Progress:
    """A domain eval's progress: at each of its evaluations after the first, the median of
    its last ``patience`` values (``level``) and that median's relative gain on the first
    value (positive: better)."""

    tag: str
    steps: np.ndarray
    values: np.ndarray
    level: np.ndarray
    gains: np.ndarray

    def at(self, step: int) -> dict[str, Any]:
        """The progress as of ``step``, for the evidence."""
        j = int(np.searchsorted(self.steps, step, side="right")) - 2
        return {"tag": self.tag, "first_step": int(self.steps[0]),
                "first": float(self.values[0]), "recent_median": float(self.level[j]),
                "gain": float(self.gains[j])}


@register
class Forgetting(Analyzer):
    """Forgetting: new skill up, old skill down.

    *Signal* (SIGNALS.md ``forgetting``, a cross-metric signal). Each tag of the general
    suite (``metric`` and every tag under it, e.g. ``eval/general/accuracy``) is compared
    with its baseline: the run's ``meta["baseline"][tag]`` when present (the base model's
    score, e.g. ``{"eval/general/accuracy": 0.62}``), otherwise the run's first evaluation
    of that tag. Higher is better unless the tag's name says loss or perplexity. An
    evaluation has *dropped* when it is worse than the baseline by more than the
    tolerance: ``min_drop`` (relative) or ``threshold`` times the suite's own evaluation
    noise, whichever is larger. It counts only while the domain eval improves: at least
    one domain tag (``domain_metric``; by default ``eval/loss`` and every
    ``eval/<suite>/<metric>`` outside the general suite) has a median of its last
    ``patience`` evaluations better than its first evaluation by ``min_gain``. After
    ``patience`` such evaluations in a row the finding fires, with its onset at the first.

    The rollback target is the latest checkpoint at or before the last evaluation where
    the general suite was still within tolerance. The finding resolves once the median of
    the last ``patience`` evaluations is back within half the tolerance (or one evaluation
    is back at the baseline); a later drop is a new finding. Non-finite values are skipped.

    Parameters
    ----------
    metric : str, default "eval/general"
        The general suite: a tag, or a prefix whose tags are each judged on their own.
    domain_metric : str or None, default None
        The domain eval (a tag or a prefix) that must improve meanwhile. ``None`` takes
        ``eval/loss`` and every other ``eval/<suite>/…`` tag; name one when a run logs
        several suites and only one is the domain.
    min_drop : float, default 0.02
        Smallest relative drop below the baseline that counts (0.02 = 2%). Lower reports
        a slight erosion that replay may not be worth; higher waits for a clear loss.
    threshold : float, default 2.0
        Noise standard deviations a drop must also exceed. The noise of one evaluation is
        estimated robustly from the second differences of the suite's evaluations (from
        five of them on), so a small suite whose score jumps between evaluations needs a
        larger drop; a baseline that is itself a first evaluation adds its own noise
        (``sqrt(2)``). Lower fires on smaller drops of a noisy suite.
    patience : int, default 3
        Dropped evaluations in a row before firing. More rides out unlucky evaluations of
        a small suite; fewer alerts sooner. On a seeded suite with 2% relative noise and
        twenty evaluations, 2 raises a false alarm in about one run in eight, 3 in one in
        fifty, for one evaluation more of delay.
    min_gain : float, default 0.01
        Relative improvement of the domain eval on its first evaluation that shows the
        run is learning its new task (0.01 = 1%). Higher asks for clearer domain progress
        before blaming it for the loss.

    *False-positive guard*: ``patience`` asks for a sustained drop, never one
    evaluation; the tolerance grows with the suite's own noise; and the domain eval must
    be improving, so a run that gets worse at everything (a divergence: ``spike``,
    ``plateau``) or does not learn its task is not reported as forgetting, nor is a run
    without a domain eval. There is no warm-up exclusion: the baseline is the first
    evaluation (or the base model's score), and forgetting often begins in the first
    epoch. At least ``patience`` evaluations after the baseline are needed. The resolve
    level (half the tolerance, on a median) is stricter than the firing one, so a suite
    hovering at the edge does not flap.

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> from analyzers import Checkpoint, RunData
    >>> rng = np.random.default_rng(0)
    >>> steps = np.arange(0, 3001, 250)
    >>> general = 0.62 - 0.00004 * (steps - 1000).clip(0) + 0.003 * rng.standard_normal(13)
    >>> domain = 1.1 + np.exp(-steps / 800)
    >>> data = RunData.from_series(
    ...     "demo", {"eval/general/accuracy": pd.Series(general, index=steps),
    ...              "eval/loss": pd.Series(domain, index=steps)},
    ...     checkpoints=[Checkpoint(s, f"ckpt/checkpoint-{s}") for s in range(500, 3001, 500)])
    >>> [finding] = Forgetting().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.state
    (1500, 2000, 'firing')
    >>> finding.rollback_to.step, finding.evidence["last_good_step"]
    (1000, 1250)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    eval/general/accuracy 0.62 at its first evaluation (step 0) → 0.578 at step 2000,
    -6.8% (tolerance 2.0%), below tolerance for 3 evaluations in a row, while eval/loss
    improved 2.10 → 1.21 (-42.3%)
    """

    signal = "forgetting"

    def __init__(self, metric: str = "eval/general", domain_metric: str | None = None,
                 min_drop: float = 0.02, threshold: float = 2.0, patience: int = 3,
                 min_gain: float = 0.01) -> None:
        check_metric(metric)
        if domain_metric is not None:
            if not isinstance(domain_metric, str) or not domain_metric:
                raise ValueError(f"domain_metric must be a tag name or None, "
                                 f"got {domain_metric!r}")
        check_real("min_drop", min_drop, 0.0, below=1.0)
        check_real("threshold", threshold, 0.0, allow_equal=True)
        check_int("patience", patience, 1)
        check_real("min_gain", min_gain, 0.0, allow_equal=True)
        self.metric = metric
        self.domain_metric = domain_metric
        self.min_drop = min_drop
        self.threshold = threshold
        self.patience = patience
        self.min_gain = min_gain

    def detect(self, data: RunData) -> list[Finding]:
        tags = data.tags()
        general = tags_under(tags, self.metric)
        if not general:
            return []
        if self.domain_metric is not None:
            domain = [t for t in tags_under(tags, self.domain_metric) if t not in general]
        else:
            domain = [t for t in tags_under(tags, "eval") if t not in general]
        baselines = data.meta.get(BASELINE_KEY) if isinstance(data.meta, dict) else None
        findings = []
        for tag in general:
            findings += self._detect_tag(data, tag, domain, _baseline(baselines, tag))
        return sorted(findings, key=lambda f: (f.onset_step, f.metric))

    def _detect_tag(self, data: RunData, tag: str, domain: list[str],
                    given: float | None) -> list[Finding]:
        series = finite(data.series(tag))
        steps = series.index.to_numpy(dtype=np.int64)
        values = series.to_numpy(dtype=float)
        first_judged = 0 if given is not None else 1
        if len(values) < first_judged + self.patience:
            return []
        baseline = float(values[0]) if given is None else given
        higher = higher_is_better(tag)
        drop = -improvement(baseline, values, higher)
        positions = np.arange(len(values))
        noise = evaluation_noise(values, positions, min_points=_MIN_NOISE_EVALUATIONS)
        if given is None:
            noise = noise * math.sqrt(2)  # the baseline is one noisy evaluation too
        scale = abs(baseline) if baseline != 0 else 1.0
        tolerance = np.maximum(self.min_drop, self.threshold * noise / scale)
        tolerance[positions < _MIN_NOISE_EVALUATIONS - 1] = 2 * self.min_drop
        dropped = drop > tolerance
        dropped[:first_judged] = False
        gain, which, progress = self._domain_progress(data, domain, steps)
        learning = gain >= self.min_gain
        recent = rolling_median(drop, self.patience)
        calm = (recent <= tolerance / 2) | (drop <= 0)
        findings = []
        for episode in episodes(dropped & learning, calm, self.patience):
            domain_now = progress[which[episode.fired]].at(int(steps[episode.fired]))
            findings.append(self._finding(data, tag, steps, values, drop, tolerance, baseline,
                                          given is not None, domain_now, episode))
        return findings

    def _domain_progress(self, data: RunData, domain: list[str],
                         steps: np.ndarray) -> tuple[np.ndarray, list[_Progress]]:
        """At each general evaluation's step, the best relative gain of any domain tag
        (-inf where none can be judged yet), and which tag's progress gave it."""
        best = np.full(len(steps), -np.inf)
        which = np.full(len(steps), -1)
        progress = []
        for tag in domain:
            series = finite(data.series(tag))
            if len(series) < 2:
                continue
            d_steps = series.index.to_numpy(dtype=np.int64)
            d_values = series.to_numpy(dtype=float)
            level = rolling_median(d_values[1:], self.patience)
            gains = improvement(d_values[0], level, higher_is_better(tag))
            ends = np.searchsorted(d_steps, steps, side="right") - 2  # index into level
            at = np.where(ends >= 0, gains[ends.clip(0)], -np.inf)
            better = at > best
            best[better] = at[better]
            which[better] = len(progress)
            progress.append(_Progress(tag, d_steps, d_values, level, gains))
        return best, which, progress

    def _finding(self, data: RunData, tag: str, steps: np.ndarray, values: np.ndarray,
                 drop: np.ndarray, tolerance: np.ndarray, baseline: float, given: bool,
                 domain: dict[str, Any], episode: Episode) -> Finding:
        onset, fired = episode.onset, episode.fired
        within = np.flatnonzero(drop[:onset] <= tolerance[:onset])
        last_good = int(within[-1]) if within.size else None
        change = -float(drop[fired])
        where = "the run's baseline" if given else f"its first evaluation (step {int(steps[0])})"
        summary = (f"{tag} {fmt_number(baseline)} at {where} → {fmt_number(values[fired])} at "
                   f"step {int(steps[fired])}, {percent(change)} (tolerance "
                   f"{100 * tolerance[fired]:.1f}%), below tolerance for "
                   f"{fired - onset + 1} evaluations in a row, while {domain['tag']} improved "
                   f"{fmt_number(domain['first'])} → {fmt_number(domain['recent_median'])} "
                   f"({percent(_change(domain['first'], domain['recent_median']))})")
        shown = range(max(0, fired + 1 - _MAX_EVIDENCE_POINTS), fired + 1)
        evidence = {
            "baseline": baseline,
            "baseline_source": "meta" if given else "first evaluation",
            "baseline_step": None if given else int(steps[0]),
            "value": float(values[fired]),
            "change": change,
            "tolerance": float(tolerance[fired]),
            "dropped_evaluations": fired - onset + 1,
            "last_good_step": None if last_good is None else int(steps[last_good]),
            "domain": domain,
            "evaluations": [[int(steps[i]), float(values[i]), -float(drop[i])] for i in shown],
        }
        return self.finding(
            data, metric=tag, onset_step=int(steps[onset]), detected_step=int(steps[fired]),
            summary=summary, evidence=evidence,
            rollback_to=None if last_good is None else checkpoint_at_or_before(
                data.checkpoints, int(steps[last_good]),
                f"latest checkpoint at or before step {int(steps[last_good])}, the last "
                f"evaluation where {tag} was still within tolerance of its baseline"),
            resolved_step=None if episode.resolved is None else int(steps[episode.resolved]))


def _baseline(baselines: Any, tag: str) -> float | None:
    """The run's baseline value for ``tag``: a finite number (or numeric text), else None."""
    if not isinstance(baselines, dict) or tag not in baselines:
        return None
    value = baselines[tag]
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _change(before: float, after: float) -> float:
    return (after - before) / abs(before) if before else after - before

