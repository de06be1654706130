"""Forgetting: a fixed general-ability eval suite drops below its baseline while the domain
eval improves."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from analyzers import register
from analyzers.base import Analyzer, RunData, checkpoint_at_or_before
from analyzers.checks import check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_number, percent
from analyzers.stats.metric import higher_is_better, improvement, tags_under
from analyzers.stats.robust import finite, moving_median
from analyzers.stats.trend import Episode
from analyzers.suites import check_suites, suite_prefixes, suite_tags, version_marks, version_pieces

# The run's baseline values (the base model's scores before this training): a mapping of tag
# to value under this key of the run's metadata.
BASELINE_KEY = "baseline"
# Evaluations shown in the evidence: the last ones up to the detection.
_MAX_EVIDENCE_POINTS = 30
# Without a given baseline, the mean of the run's first evaluations (up to this many).
_BASELINE_EVALUATIONS = 20
# The noise of one evaluation: the standard deviation of the differences between
# consecutive evaluations (over the last _NOISE_WINDOW of them) over sqrt(2), pooled with a
# prior of _NOISE_PRIOR (relative) that weighs as much as _NOISE_PRIOR_WEIGHT differences
# (also the differences a frozen noise estimate needs),
# and never below _NOISE_FLOOR (relative).
_NOISE_WINDOW = 100
_NOISE_PRIOR = 0.01
_NOISE_PRIOR_WEIGHT = 5
_NOISE_FLOOR = 0.0025
# The ramp test (a gradual fall from an unknown onset): onsets among the last _RAMP_ONSETS
# evaluations, at least _RAMP_MIN_EVALUATIONS of them judged, each with at least
# _RAMP_HISTORY differences before it for its noise; an evaluation counts at most
# _RAMP_CLIP noise units above the ramp through the median slope of the others.
_RAMP_ONSETS = 10
_RAMP_MIN_EVALUATIONS = 3
_RAMP_HISTORY = 10
_RAMP_CLIP = 1.0
# Evaluations whose median shortfall must be back within the slack to resolve.
_RESOLVE_EVALUATIONS = 3
# The default domain eval's top-level tags (besides every eval/<suite>/<metric>).
_DEFAULT_DOMAIN_TAGS = ("eval/loss", "eval/perplexity")


@dataclass(frozen=True)
class _Progress:
    """A domain eval's progress: at each of its evaluations after the first, the median of
    its last three values (``level``) and that median's relative gain on the first value
    (positive: better)."""

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


@dataclass(frozen=True)
class _Track:
    """A general tag judged at each of its evaluations: the baseline it is compared with
    (and how many of the run's evaluations made it, 0 for a given one), the relative
    shortfall below it (positive: worse), one evaluation's relative noise, the slack ``k``
    (in noise units), the CUSUM after it and the ramp statistic where the ramp test fired
    (else NaN)."""

    baseline: np.ndarray
    baseline_evaluations: np.ndarray
    drop: np.ndarray
    noise: np.ndarray
    slack: np.ndarray
    cusum: np.ndarray
    ramp: np.ndarray


@register
class Forgetting(Analyzer):
    """Forgetting: new skill up, old skill down.

    *Signal* (SIGNALS.md ``forgetting``, a cross-metric signal). Each tag of the general
    suite (``metric`` and every tag under it, e.g. ``eval/general/accuracy``) is compared
    with its baseline: the run's ``meta["baseline"][tag]`` when present (the base model's
    score, e.g. ``{"eval/general/accuracy": 0.62}``), otherwise the mean of the run's
    first evaluations of that tag (up to twenty, all before the drop being judged). Higher
    is better unless the tag's name says loss or perplexity. Each evaluation's relative
    shortfall below the baseline, in units of the suite's own noise (``z``), feeds a
    one-sided CUSUM, ``S = max(0, S + min(z - k, threshold / 2))``: shortfalls within the
    slack ``k`` drain it, larger ones add up. The finding fires when ``S`` reaches
    ``threshold`` at an evaluation where the domain eval improves: at least one domain tag
    (``domain_metric``; by default ``eval/loss``, ``eval/perplexity`` and every
    ``eval/<suite>/<metric>`` outside the general suite, not the eval loop's own
    ``eval/runtime`` or ``eval/samples_per_second``) has a median of its last three
    evaluations better than its first evaluation by ``min_gain``. So a drop of many noise
    units fires at its second evaluation, a small sustained one some evaluations later.
    The onset is the first evaluation of the accumulating run (the one after ``S`` was last
    zero before it fired; an open finding keeps its onset even if a good evaluation drains
    ``S``).

    The CUSUM is the quickest test for a step; forgetting is mostly gradual, and the slack
    throws away most of a ramp's first evaluations. So a ramp test also runs, at the same
    evaluations (where the domain eval improves): for each onset ``t`` among the last ten
    evaluations and after the last finding's resolve (a fall that came back is not the
    start of the next), with at least ten differences before it for its noise and at least
    three evaluations judged from it, the shortfalls ``z`` against the baseline and noise of the
    evaluations before ``t`` are weighted by a ramp from it (``w`` = 1, 2, … n), and
    ``sum(w·z)`` over its standard deviation, ``sqrt(sum(w²) + sum(w)²/m)`` (the second
    term: the error of a baseline that is a mean of ``m`` evaluations), is the evidence
    of a fall that began at ``t`` (the matched filter of a ramp). It fires when that
    reaches ``ramp_threshold``, the last two evaluations both fall short by more than the
    slack and the fitted ramp's shortfall at the last evaluation is at least ``min_drop``;
    its onset is the onset with the largest statistic. Each ``z`` counts at most one
    noise unit above the ramp through the median slope (``z/w``) of the others, so one
    glitch cannot carry it.

    The noise of one evaluation is the standard deviation of the differences between
    consecutive evaluations (the last hundred) over ``sqrt(2)``, so a steady trend is not
    taken for noise, pooled with a prior of 1% of the baseline that weighs as much as five
    differences (a short history is not trusted to be quiet; with ten, a suite with 0.3%
    noise and twenty evaluations was judged at twice its noise), and at least 0.25% of
    the baseline. The baseline and the noise are those of the evaluations before the
    current run of ``S`` above zero, or before an open finding's onset (the noise, once
    they hold five differences; before, all the evaluations so far), so a drop does not
    lower its own baseline nor widen its own noise. The slack is ``slack`` noise units plus the
    baseline's own error (``1/sqrt(m)`` for a mean of ``m`` evaluations, a bias shared by
    every evaluation judged against it), or half of ``min_drop``, whichever is larger.
    The rollback target is the latest checkpoint at or before the evaluation before the
    onset. The finding resolves once the median shortfall of the last three evaluations is
    back within the slack (not when one good evaluation drains ``S``); the CUSUM restarts
    from zero and a later drop is a new finding. Non-finite values are skipped.

    With ``suites``, the general suite is the named eval suites (``[[eval_suites]]`` in the
    config): each of their tags is judged as above, and only within one version of its
    suite. Where the run records that a suite changed version (a new suite file, a bumped
    ``version``), the values after the change are not compared with those before: the
    baseline (the first evaluations of the new version) and the noise start again, and the
    run's given baseline holds only for the version it started with.

    Parameters
    ----------
    metric : str, default "eval/general"
        The general suite: a tag, or a prefix whose tags are each judged on their own.
    suites : list of str or dict, default None
        The general suite as named eval suites: names (metrics under ``eval/<name>/``) or
        name → metric prefix (the bot passes the config's prefixes). Replaces ``metric``;
        numbers are compared only within one version of a suite.
    domain_metric : str or None, default None
        The domain eval (a tag or a prefix) that must improve meanwhile. ``None`` takes
        ``eval/loss``, ``eval/perplexity`` and every other ``eval/<suite>/…`` tag; name one
        when a run logs several suites and only one is the domain, or a top-level
        ``eval/<metric>`` such as ``eval/accuracy``.
    min_drop : float, default 0.01
        Smallest relative drop below the baseline worth reporting (0.01 = 1%): however
        precise the suite, an evaluation adds to the CUSUM only by what its shortfall
        exceeds half of it. Lower reports a slight erosion that replay may not be worth;
        higher waits for a clear loss.
    threshold : float, default 4.0
        Accumulated shortfall beyond the slack, in noise standard deviations, that fires
        (the CUSUM's decision interval). One evaluation adds at most half of it, so a
        single bad evaluation never fires alone. Lower alerts sooner on a small drop and
        raises more false alarms on a noisy suite; higher waits longer (on the seeded
        benchmark, 5 costs about one evaluation more on the weakest drops). A suite with 2%
        relative noise per evaluation and twenty evaluations raises a false alarm in about
        one run in twenty (11 of 200, with the ramp test; 10 with the CUSUM alone), mostly
        from its first few evaluations, whose noise and baseline are not known yet; 1%
        noise, in none of two hundred.
    slack : float, default 1.25
        Noise standard deviations of shortfall an evaluation may have before it adds to
        the CUSUM (the reference value ``k``, before the baseline's error is added). About
        half the drop to be found fastest. Lower finds a drop of one or two noise units
        sooner but lets a noisy suite's unlucky evaluations add up: on the seeded
        benchmark (four seeds, eight repeats), 0.75 raised six false alarms where 1.25
        raised none, for no shorter median delay.
    min_gain : float, default 0.01
        Relative improvement of the domain eval on its first evaluation that shows the
        run is learning its new task (0.01 = 1%). Higher asks for clearer domain progress
        before blaming it for the loss.
    ramp_threshold : float, default 4.5
        The ramp test's statistic, in standard deviations, that fires. Higher than the
        CUSUM's threshold because it tries eight onsets (those of the last ten that leave
        three evaluations to judge): at 4.5 the two tests together raised
        false alarms on 35 of 3,000 of the seeded benchmark's noisy general suites (the
        CUSUM alone, with the former noise prior: 28), and found a fall of 1% per
        evaluation 0.3 evaluation sooner on average. Lower finds a gradual fall sooner and
        raises more false alarms on a noisy suite; a very large value leaves the CUSUM
        alone.

    *False-positive guard*: the CUSUM is in units of the suite's own noise, estimated
    from the evaluations before the drop, with a prior and a floor so a short or very
    quiet history does not make every wobble significant; the slack covers the
    baseline's own error and half of ``min_drop``, so a suite wobbling within its noise
    (or drifting by less than half of ``min_drop``) drains the CUSUM instead of filling
    it; one evaluation adds at most half the threshold, so an evaluation glitch never
    fires alone; the ramp test needs ten differences of history before its onset, three
    evaluations from it, the last two both beyond the slack and a fitted shortfall of
    ``min_drop``, and clips each evaluation to a noise unit above the others' ramp, so a
    glitch seldom carries it either; and the domain eval must be improving, so a run that
    gets worse at everything (a divergence: ``spike``, ``plateau``) or does not learn its
    task is not reported as forgetting, nor is a run without a domain eval. There is no
    warm-up exclusion: the baseline is the first evaluations (or the base model's score), and
    forgetting often begins in the first epoch. The resolve rule (the median of three
    evaluations back within the slack) is stricter than a single good evaluation, so a
    suite hovering at the edge does not flap. A suite whose level itself swings slowly is
    not protected: a dip of 2% held for several evaluations is a real shortfall of twice
    ``min_drop`` (a slow ±1% sine fired in 13–16 of 50 simulated runs of 40–60 evaluations,
    ±2% in 37–48; the CUSUM alone at most one fewer); raise ``min_drop`` for such a suite.

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
    (1250, 1750, 'firing')
    >>> finding.rollback_to.step, finding.evidence["last_good_step"]
    (1000, 1000)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    eval/general/accuracy 0.62 at its first 5 evaluations (mean, steps 0–1000) → 0.593
    at step 1750, -4.4% (noise 0.8%), 4.0 noise units of shortfall over 3 evaluations,
    while eval/loss improved 2.10 → 1.25 (-40.3%)
    """

    signal = "forgetting"

    def __init__(self, metric: str = "eval/general", domain_metric: str | None = None,
                 min_drop: float = 0.01, threshold: float = 4.0, slack: float = 1.25,
                 min_gain: float = 0.01, ramp_threshold: float = 4.5,
                 suites: list[str] | dict[str, str] | None = None) -> None:
        check_metric(metric)
        check_suites(suites)
        if domain_metric is not None:
            if not isinstance(domain_metric, str) or not domain_metric:
                raise ValueError(f"domain_metric must be a tag name or None, "
                                 f"got {domain_metric!r}")
        check_real("min_drop", min_drop, 0.0, below=1.0)
        check_real("threshold", threshold, 0.0)
        check_real("slack", slack, 0.0, allow_equal=True)
        check_real("min_gain", min_gain, 0.0, allow_equal=True)
        check_real("ramp_threshold", ramp_threshold, 0.0)
        self.metric = metric
        self.domain_metric = domain_metric
        self.min_drop = min_drop
        self.threshold = threshold
        self.slack = slack
        self.min_gain = min_gain
        self.ramp_threshold = ramp_threshold
        self.suites = suites

    def detect(self, data: RunData) -> list[Finding]:
        tags = data.tags()
        in_suite = suite_tags(tags, suite_prefixes(self.suites)) if self.suites else {}
        general = list(in_suite) if self.suites else tags_under(tags, self.metric)
        if not general:
            return []
        if self.domain_metric is not None:
            domain = [t for t in tags_under(tags, self.domain_metric) if t not in general]
        else:
            domain = sorted(t for t in tags if _default_domain(t) and t not in general)
        baselines = data.meta.get(BASELINE_KEY) if isinstance(data.meta, dict) else None
        findings = []
        for tag in general:
            suite = in_suite.get(tag)
            pieces = version_pieces(finite(data.series(tag)),
                                    version_marks(data.meta, suite) if suite else [])
            for i, (version, series) in enumerate(pieces):
                findings += self._detect_tag(data, tag, series, domain,
                                             _baseline(baselines, tag) if i == 0 else None,
                                             {"suite": suite, "suite_version": version}
                                             if suite else {})
        return sorted(findings, key=lambda f: (f.onset_step, f.metric))

    def _detect_tag(self, data: RunData, tag: str, series: pd.Series, domain: list[str],
                    given: float | None, suite: dict[str, Any]) -> list[Finding]:
        """One general tag's findings over ``series`` (its finite values within one version
        of its suite, ``suite``: the name and version for the evidence)."""
        steps = series.index.to_numpy(dtype=np.int64)
        values = series.to_numpy(dtype=float)
        first_judged = 0 if given is not None else 1
        if len(values) < first_judged + 2:
            return []
        gain, which, progress = self._domain_progress(data, domain, steps)
        track, found = self._cusum(values, given, higher_is_better(tag), gain >= self.min_gain,
                                   first_judged)
        findings = []
        for episode in found:
            domain_now = progress[which[episode.fired]].at(int(steps[episode.fired]))
            findings.append(self._finding(data, tag, steps, values, track, given is not None,
                                          domain_now, episode, suite))
        return findings

    def _cusum(self, values: np.ndarray, given: float | None, higher: bool,
               learning: np.ndarray, first_judged: int) -> tuple[_Track, list[Episode]]:
        """The one-sided CUSUM of the shortfalls below the baseline, in noise units, and its
        episodes. The baseline and the noise are those of the evaluations before the
        current excursion (up to where the CUSUM was last zero), so a drop being judged
        does not lower its own baseline nor widen its own noise."""
        n = len(values)
        with np.errstate(over="ignore"):
            sums = np.concatenate(([0.0], np.cumsum(values)))
        used, spread = _difference_noise(values)
        # Python floats: an overflow is an inf, not a warning (and no ``**`` on a huge value).
        values_list, used_list, spread_list = values.tolist(), used.tolist(), spread.tolist()
        track = _Track(np.full(n, np.nan), np.zeros(n, dtype=int), np.zeros(n),
                       np.zeros(n), np.zeros(n), np.zeros(n), np.full(n, np.nan))
        cap = self.threshold / 2  # one evaluation adds at most half the threshold
        found, excess = [], []
        total, zero, fired = 0.0, first_judged - 1, None
        earliest = 0  # the ramp's first onset: after the last episode's resolve
        learning_list = learning.tolist()

        def judge(i: int, zero: int) -> float:
            """Evaluation ``i`` against the evaluations up to ``zero``: its excess over the
            slack, in noise units (and its track entries)."""
            if given is not None:
                baseline, m = given, 0
            else:
                m = min(zero + 1, _BASELINE_EVALUATIONS)
                baseline = float(sums[m] / m)
            scale = abs(baseline) if baseline != 0 else 1.0
            change = (values_list[i] - baseline) / scale
            drop = -change if higher else change
            j = zero if zero >= 0 and used_list[zero] >= _NOISE_PRIOR_WEIGHT else i
            noise = float(_noise(spread_list[j] / scale, used_list[j]))
            k = float(self._slack(m, noise))
            track.baseline[i], track.baseline_evaluations[i] = baseline, m
            track.drop[i], track.noise[i], track.slack[i] = drop, noise, k
            return drop / noise - k

        for i in range(first_judged, n):
            excess.append(judge(i, zero))
            if fired is not None and float(np.median(excess[-_RESOLVE_EVALUATIONS:])) <= 0:
                found.append(Episode(zero + 1, fired, i))
                total, zero, fired, earliest = 0.0, i, None, i + 1
            else:
                total = max(0.0, total + min(excess[-1], cap))
                if total == 0.0 and fired is None:  # an open finding keeps its onset
                    zero = i
                elif fired is None and total >= self.threshold and learning_list[i]:
                    fired = i
                if fired is None and learning_list[i]:
                    ramp = self._ramp(values, sums, used, spread, given, higher, i,
                                      earliest)
                    if ramp is not None:
                        onset, track.ramp[i] = ramp
                        zero, fired = onset - 1, i
                        excess[-1] = judge(i, zero)
            track.cusum[i] = total
        if fired is not None:
            found.append(Episode(zero + 1, fired, None))
        return track, found

    def _ramp(self, values: np.ndarray, sums: np.ndarray, used: np.ndarray,
              spread: np.ndarray, given: float | None, higher: bool,
              i: int, earliest: int) -> tuple[int, float] | None:
        """The ramp test at evaluation ``i``: for each onset ``t`` among the last
        ``_RAMP_ONSETS`` evaluations and from ``earliest`` on (a fall that resolved is not
        a new one's start; at least ``_RAMP_MIN_EVALUATIONS`` of them judged), the
        shortfalls ``z`` (in noise units) against the baseline and noise of the evaluations
        before ``t``, weighted by a ramp from ``t`` (1, 2, … n): ``sum(w·z)`` over its
        standard deviation ``sqrt(sum(w²) + sum(w)²/m)`` (the second term: the error of a
        baseline that is the mean of ``m`` evaluations). Each ``z`` counts at most
        ``_RAMP_CLIP`` above the ramp through the median slope (``z/w``) of the others, so
        one glitch cannot carry it. An onset passes when the statistic reaches the
        threshold, the last two evaluations both fall short by more than the slack, and
        the fitted ramp's shortfall at ``i`` is at least ``min_drop``. The passing onset
        with the largest statistic, and that statistic; None when none passes."""
        lo = max(i - _RAMP_ONSETS + 1, _RAMP_HISTORY + 1, earliest)
        hi = i - _RAMP_MIN_EVALUATIONS + 1
        if lo > hi:
            return None
        onsets = np.arange(lo, hi + 1)
        if given is not None:
            m = np.zeros(len(onsets))
            base = np.full(len(onsets), given)
        else:
            m = np.minimum(onsets, _BASELINE_EVALUATIONS).astype(float)
            base = sums[m.astype(int)] / m
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            scale = np.where(base != 0, np.abs(base), 1.0)
            noise = _noise(spread[onsets - 1] / scale, used[onsets - 1])
            weights = (np.arange(lo, i + 1)[None, :] - onsets[:, None] + 1).clip(0)
            change = (values[None, lo:i + 1] - base[:, None]) / scale[:, None]
            z = np.where(weights > 0, (-change if higher else change) / noise[:, None], 0.0)
            slopes = np.where(weights > 0, z / np.maximum(weights, 1), np.nan)
            others = np.repeat(slopes[:, None, :], slopes.shape[1], axis=1)
            others[:, np.eye(slopes.shape[1], dtype=bool)] = np.nan
            with warnings.catch_warnings():  # an all-NaN row (no other evaluation) is NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                slope = np.nanmedian(others, axis=-1)  # onset × evaluation: others' median
            z = np.where(weights > 0, np.minimum(z, weights * slope + _RAMP_CLIP), 0.0)
            total = (weights * z).sum(axis=1)
            w_sum, w_squares = weights.sum(axis=1), (weights * weights).sum(axis=1)
            sd = np.sqrt(w_squares + np.where(m > 0, w_sum * w_sum / np.maximum(m, 1), 0.0))
            statistic = total / sd
            now = total / w_squares * (i - onsets + 1) * noise
            k = self._slack(m, noise)
            passed = ((statistic >= self.ramp_threshold) & (now >= self.min_drop)
                      & (z[:, -1] >= k) & (z[:, -2] >= k))
        if not passed.any():
            return None
        best = int(np.argmax(np.where(passed, statistic, -np.inf)))
        return int(onsets[best]), float(statistic[best])

    def _slack(self, m: Any, noise: Any) -> Any:
        """The slack ``k`` in noise units: ``slack`` plus the error of a baseline that is
        the mean of ``m`` evaluations (none for a given one, ``m`` = 0), or half of
        ``min_drop``, whichever is larger (scalars or arrays)."""
        with np.errstate(divide="ignore"):
            error = np.where(np.asarray(m) > 0, 1 / np.sqrt(np.maximum(m, 1)), 0.0)
        return np.maximum(self.slack + error, self.min_drop / 2 / np.asarray(noise))

    def _domain_progress(self, data: RunData, domain: list[str],
                         steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[_Progress]]:
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
            level = moving_median(d_values[1:], _RESOLVE_EVALUATIONS, min_count=1)
            gains = improvement(d_values[0], level, higher_is_better(tag))
            ends = np.searchsorted(d_steps, steps, side="right") - 2  # index into level
            at = np.where(ends >= 0, gains[ends.clip(0)], -np.inf)
            better = at > best
            best[better] = at[better]
            which[better] = len(progress)
            progress.append(_Progress(tag, d_steps, d_values, level, gains))
        return best, which, progress

    def _finding(self, data: RunData, tag: str, steps: np.ndarray, values: np.ndarray,
                 track: _Track, given: bool, domain: dict[str, Any],
                 episode: Episode, suite: dict[str, Any]) -> Finding:
        onset, fired = episode.onset, episode.fired
        last_good = onset - 1 if onset > 0 else None
        change = -float(track.drop[fired])
        baseline = float(track.baseline[fired])
        if given:
            where = "the run's baseline"
        else:
            m = int(track.baseline_evaluations[fired])
            where = (f"its first evaluation (step {int(steps[0])})" if m == 1 else
                     f"its first {m} evaluations (mean, steps {int(steps[0])}–"
                     f"{int(steps[m - 1])})")
        ramp = float(track.ramp[fired])
        how = (f"a falling trend of {ramp:.1f} noise units (ramp test)" if math.isfinite(ramp)
               else f"{track.cusum[fired]:.1f} noise units of shortfall")
        summary = (f"{tag} {fmt_number(baseline)} at {where} → {fmt_number(values[fired])} at "
                   f"step {int(steps[fired])}, {percent(change)} (noise "
                   f"{100 * track.noise[fired]:.1f}%), {how} over {fired - onset + 1} "
                   f"evaluations, while {domain['tag']} "
                   f"improved {fmt_number(domain['first'])} → "
                   f"{fmt_number(domain['recent_median'])} "
                   f"({percent(_change(domain['first'], domain['recent_median']))})")
        shown = range(max(0, fired + 1 - _MAX_EVIDENCE_POINTS), fired + 1)
        evidence = {
            "baseline": baseline,
            "baseline_source": "meta" if given else "first evaluations",
            "baseline_step": None if given else int(steps[0]),
            "baseline_evaluations": int(track.baseline_evaluations[fired]),
            "value": float(values[fired]),
            "change": change,
            "noise": float(track.noise[fired]),
            "slack": float(track.slack[fired]),
            "cusum": float(track.cusum[fired]),
            "threshold": self.threshold,
            "ramp": ramp if math.isfinite(ramp) else None,
            "ramp_threshold": self.ramp_threshold,
            "dropped_evaluations": fired - onset + 1,
            "last_good_step": None if last_good is None else int(steps[last_good]),
            "domain": domain,
            "evaluations": [[int(steps[i]), float(values[i]), -float(track.drop[i]),
                             float(track.cusum[i])] for i in shown],
            **suite,
        }
        return self.finding(
            data, metric=tag, onset_step=int(steps[onset]), detected_step=int(steps[fired]),
            summary=summary, evidence=evidence,
            rollback_to=None if last_good is None else checkpoint_at_or_before(
                data.checkpoints, int(steps[last_good]),
                f"latest checkpoint at or before step {int(steps[last_good])}, the last "
                f"evaluation before {tag} began to fall short of its baseline"),
            resolved_step=None if episode.resolved is None else int(steps[episode.resolved]))


def _difference_noise(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At each position, from the values up to it: how many differences between
    consecutive values the noise estimate rests on (the last ``_NOISE_WINDOW``), and one
    evaluation's noise standard deviation (absolute) from them, their standard deviation
    over ``sqrt(2)`` (a steady trend does not count as noise). Each window is computed on
    its own, scaled by its largest difference, so a glitch leaves the estimate once it
    leaves the window and huge values do not overflow."""
    n = len(values)
    count = np.minimum(np.arange(n), _NOISE_WINDOW)  # diffs[i - count:i] known at position i
    used = np.where(count >= 2, count, 0).astype(float)
    spread = np.zeros(n)
    if n < 3:
        return used, spread
    diffs = np.diff(values)
    padded = np.concatenate((np.full(_NOISE_WINDOW - 1, np.nan), diffs))
    windows = sliding_window_view(padded, _NOISE_WINDOW)[1:]  # positions 2 … n - 1
    with np.errstate(invalid="ignore", over="ignore"):
        top = np.nanmax(np.abs(windows), axis=1)
        unit = np.where((top > 0) & np.isfinite(top), top, 1.0)
        scaled = windows / unit[:, None]
        centred = scaled - np.nanmean(scaled, axis=1)[:, None]
        sd = unit * np.sqrt(np.nansum(centred * centred, axis=1) / (count[2:] - 1) / 2)
    spread[2:] = np.where(np.isfinite(top), sd, np.inf)
    return used, spread


def _default_domain(tag: str) -> bool:
    """Whether ``tag`` is in the default domain eval: ``eval/loss``, ``eval/perplexity`` or
    an ``eval/<suite>/<metric>``; not the eval loop's own ``eval/runtime``,
    ``eval/samples_per_second`` and the like, which say nothing about the model."""
    parts = tag.split("/")
    return tag in _DEFAULT_DOMAIN_TAGS or (len(parts) >= 3 and parts[0] == "eval"
                                           and all(parts))


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


def _noise(relative: Any, count: Any) -> Any:
    """One evaluation's relative noise from ``count`` differences whose spread is
    ``relative``: pooled with the prior (``_NOISE_PRIOR``, worth ``_NOISE_PRIOR_WEIGHT``
    differences), never below ``_NOISE_FLOOR`` (scalars or arrays; an overflow is inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        pooled = ((_NOISE_PRIOR_WEIGHT * _NOISE_PRIOR ** 2 + count * relative * relative)
                  / (_NOISE_PRIOR_WEIGHT + count))
        return np.maximum(np.sqrt(pooled), _NOISE_FLOOR)


def _change(before: float, after: float) -> float:
    return (after - before) / abs(before) if before else after - before
