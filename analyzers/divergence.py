"""Divergence: an instability episode, several points in a row well above the loss's level,
recovering or not (a loss that keeps rising)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace

import bottleneck as bn
import numpy as np

from analyzers import register
from analyzers.base import Analyzer, RunData
from analyzers.checks import check_int, check_metric, check_real, check_tags
from analyzers.finding import Finding
from analyzers.fmt import fmt_number
from analyzers.spike import Spike, _median_before, _window_stats, _words
from analyzers.stats.robust import first_run
from analyzers.streaming import Streams

# Points of context shown before the onset, and the cap on evidence points.
_CONTEXT_BEFORE = 5
_MAX_EVIDENCE_POINTS = 30
# Fewest earlier runs of points the tail guard needs before it judges.
_MIN_TAIL = 10
# A short log is judged with a shorter window (a third of its points, never under this):
# a 20-point window would leave an 18-point log, or a 10-evaluation one, unjudged.
_MIN_WINDOW = 5
# A rise that holds for this many times ``points`` points is judged on their median (see
# the class): a noisy loss that steps up and stays up.
_HELD = 3
# Words of a tag that make it a loss watched when the run logs no ``metric`` (a log of
# eval perplexity only, an autoencoder's ``train_loss_Ph``), and words that do not.
_LOSS_WORDS = frozenset({"loss", "ppl", "perplexity"})
_NOT_LOSS_WORDS = frozenset({"scale", "reward", "rewards", "kl"})
# RL losses watched besides ``metric`` when logged (whichever names the reader kept):
# a burst of the actor's or the critic's loss is the same kind of instability.
RL_LOSSES = ("policy/loss", "critic/loss", "act_loss", "cri_loss", "actor_loss",
             "critic_loss", "policy_loss", "value_loss", "ppo/loss/policy", "ppo/loss/value",
             "loss/policy", "loss/value")


@dataclass(frozen=True)
class _Episode:
    onset: int  # index among the finite points
    detected: int
    end: int  # index after the last point above the resolve level
    resolved: int | None  # index of the last point of the resolving run
    reference: float
    limit: float


@dataclass
class _State:
    """What a poll settled for one tag: the first point judged (the warm-up's end), the
    closed episodes, the point the search may walk back to (after the last of them) and
    the first point not judged yet."""

    first: int
    warm: int  # the first point after the LR's warm-up
    floor: int
    resume: int
    closed: list[_Episode] = field(default_factory=list)


@register
class Divergence(Analyzer):
    """Divergence: several consecutive points well above the loss's level.

    *Signal* (SIGNALS.md ``divergence``). ``spike`` judges single points, and guards them
    against a noisy loss's own largest excursions; an *episode* of several points that rise
    together, each no jump against the one before (0.0011 → 0.0118 over five logged
    points, a summed CTC loss ≈ 890 → 2400 over eight logs, issue 22), passed it: by the
    time a point stands far out, its rolling window has followed the rise. The choice:
    both. ``spike`` keeps the single point and the NaN; this signal takes the episode,
    whether it recovers (a loss that comes back fifty points later) or not (a loss that
    keeps rising). It judges every point against the loss's *best level*: the lowest
    median of ``window`` points over the last ``memory`` points, so a rise that creeps
    up over many windows is measured from where it started, not from a window that has
    followed it. A finding needs ``points`` consecutive finite points above that level by
    the larger of ``min_rel`` of its magnitude and ``threshold`` robust standard deviations
    of the loss's noise (``1.4826 * MAD`` around the straight trend of the ``window``
    points before the first, less the risen points just before it that stand above the
    level by half ``min_rel``, so a first risen point that fell short of the margin does
    not widen the noise it is judged by; on a log scale too where that window is
    positive), all
    against the level frozen at the first. Scale and sign do not matter: the margin is a
    share of the level's magnitude and a multiple of its noise, the same at 1e-3, 1, 1e3
    and below zero. Onset: where the rise began (up to ``points`` points before the first
    high one, while they stood above the level plus half the margin); detection at the
    ``points``-th high point. It resolves once ``resolve_points`` points in a row are back
    under the level plus half the margin; a later episode is a new finding. ``critical``
    when the peak reaches ``critical_ratio`` times the level (measured on its magnitude),
    else ``warning``.

    A noisy loss that **steps up and stays up** (a LoRA loss near 0.04 with ±30% batch
    noise going to ≈0.065 for the rest of its log, issue 22's dev half) has no ``points``
    points in a row clear its noise margin, yet the rise holds: ``3 * points`` points
    from the first high ones, none back under the level plus half of ``min_rel``, whose
    median clears ``min_rel`` of the level and ``threshold`` standard errors of a median
    of that many points (``1.2533 * sd / sqrt(n)``, on the log scale too) are an episode
    as well, detected at the last of them (a burst seen sooner wins), and the tail guard
    compares its median with the highest median of as many points before it.

    RL losses are instability's first sign in PPO (issue 22: a DeepSpeed-Chat actor and
    critic loss bursting to 5–6× their level before the reward collapsed): the same rule
    runs on each of ``RL_LOSSES`` that a run logs (``act_loss``, ``cri_loss``, …), each
    finding naming its tag; ``reward_collapse`` reads the reward.

    Parameters
    ----------
    metric : str, default "train/loss"
        The loss watched (RL losses are watched besides it, see above). A run that logs
        none is judged on every tag it logs whose name says loss, ppl or perplexity (an
        eval perplexity alone, an autoencoder's ``train_loss_Ph``), not a reward or a
        loss scale; with ``other_metrics`` given, on those alone.
    window : int, default 20
        Points in the rolling median whose lowest value is the level, and whose noise
        scales the margin. Longer is steadier; shorter follows a loss that falls fast. A
        log shorter than three windows is judged with a window of a third of its points
        (at least 5), and the first window after the warm-up is judged against the 5 or
        more points it has.
    points : int, default 3
        Consecutive points above the margin an episode needs. More ignores shorter
        episodes (and reports later); 1 would be a spike rule without its guards.
    min_rel : float, default 0.5
        Rise over the level, as a share of its magnitude (0.5 = +50%, spike's own
        margin), every point must clear. Lower reports smaller episodes and more
        healthy wander.
    threshold : float, default 4.0
        Robust standard deviations of the loss's noise every point must also clear:
        on a noisy per-batch loss the margin is its noise, not ``min_rel``.
    grace_period : int, default 50
        Points from step 0 never judged when the run logs no LR (an LR warm-up bump: the
        loss rising while the LR climbs), but no more than ``grace_share`` of the points
        logged (and at least 5): a 50-point log is not all grace. A run that logs its LR
        is judged throughout, but until the LR's first peak a rise must reach
        ``critical_ratio`` times the level (see the guard).
    resolve_points : int, default 5
        Points in a row back near the level that resolve an episode.
    memory : int, default 500
        Points over which the lowest rolling median is the level; the tail guard reads
        the same span. Longer remembers a low level for longer.
    tail_factor : float, default 2.0
        The episode's height (its lowest point over the level, log scale where the
        level's window is positive) must be this many times the highest that any earlier
        run of ``points`` points reached over its level in the ``memory`` points before
        the rise, episodes left out (see the guard). 0 turns the guard off.
    critical_ratio : float, default 3.0
        A peak this many times the level (on its magnitude) is ``critical``.
    grace_share : float, default 0.02
        The most of the points logged that ``grace_period`` covers: the labelling
        protocol's warm-up (5 points or 2% of the run). A tenth hid a 180-point log's
        episode from its 14th point on (issue 22's dev half); ``reward_collapse`` keeps a
        tenth (a reward that starts near 0 has no level to fall from yet).
    other_metrics : list of str, optional
        Tags watched besides ``metric``; None (the default): the RL losses above that
        are logged; an empty list: ``metric`` alone.

    *False-positive guard*: while its LR still climbs to its first peak a healthy loss may
    bump up (by +50–100% on a short fine-tune), so until then a rise must reach
    ``critical_ratio`` times the level's magnitude rather than ``min_rel`` of it (a run
    whose LR ramps for its whole log and whose loss blows up tenfold on the way is still
    caught); without a logged LR, nothing in the first ``grace_period`` points from step 0
    is judged. The
    margin is never under the loss's own noise, on a log scale too for a positive loss
    (a per-batch loss near 0 that swings by factors); and a loss whose noise is
    autocorrelated (a smoothed export, a per-epoch average) drifts in runs of points, so
    an episode must stand ``tail_factor`` times higher than the highest run of ``points``
    points over the level in the ``memory`` points before the rise's foot (the last
    window whose median was within a quarter of the margin of the level; before it, so
    a slow climb is not measured against itself). An episode of ``metric`` that ``spike``
    reports first (its rule and defaults on the same tag: a jump or a NaN whose episode
    overlaps this one's onset to detection) is ``spike``'s: one blow-up, one alert (spike
    does not judge the RL losses' finite values, so their bursts are all this signal's); a
    spike inside an episode reported first is muted by the lifecycle's inhibition rule
    (a firing ``divergence`` mutes the finite ``spike`` alerts of its run and metric). The
    price: a slow rise still shorter than ``min_rel`` (a +30% drift) is not reported, nor
    one under ``critical_ratio`` times the level during the LR's warm-up.

    *Streaming*: judging a point needs the ``2 * (memory + window)`` points before it (its
    level, and the tail guard's history before the rise's foot); each poll re-reads that
    context before the first point it has not judged, after the closed episodes (an open
    one is judged again from its start), so a poll of a million-point run costs what its
    new points cost. The findings are those of the run analysed at once.

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import RunData
    >>> rng = np.random.default_rng(4)
    >>> loss = 0.0011 * np.exp(0.1 * rng.standard_normal(900))
    >>> loss[[100, 220, 330, 420, 470]] *= 12  # hard batches: spike's, then routine
    >>> loss[500:550] *= np.r_[np.geomspace(1.6, 10.7, 5), np.full(45, 10.7)]
    >>> data = RunData.from_series("demo", {"train/loss": loss})
    >>> [finding] = Divergence().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.severity, finding.resolved_step
    (501, 503, 'critical', 555)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    train/loss rose from its level 0.00101 to 0.0149 at step 518 (14.8x) and stayed above
    0.00151 for 50 points from step 501; back near its level from step 551
    """

    signal = "divergence"
    # Whether a rise that holds is judged on its median (see the class); reward_collapse,
    # which runs this rule on falls, turns it off.
    held_rises = True

    def __init__(self, metric: str = "train/loss", window: int = 20, points: int = 3,
                 min_rel: float = 0.5, threshold: float = 4.0, grace_period: int = 50,
                 resolve_points: int = 5, memory: int = 500, tail_factor: float = 2.0,
                 critical_ratio: float = 3.0, grace_share: float = 0.02,
                 other_metrics: list[str] | tuple[str, ...] | None = None) -> None:
        check_metric(metric)
        check_int("window", window, 3)
        check_int("points", points, 1)
        check_real("min_rel", min_rel, 0.0)
        check_real("threshold", threshold, 0.0, allow_equal=True)
        check_int("grace_period", grace_period, 0)
        check_int("resolve_points", resolve_points, 1)
        check_int("memory", memory, 1)
        check_real("tail_factor", tail_factor, 0.0, allow_equal=True)
        check_real("critical_ratio", critical_ratio, 1.0)
        check_real("grace_share", grace_share, 0.0, allow_equal=True)
        check_tags("other_metrics", other_metrics)
        self.metric = metric
        self.window = window
        self.points = points
        self.min_rel = min_rel
        self.threshold = threshold
        self.grace_period = grace_period
        self.resolve_points = resolve_points
        self.memory = memory
        self.tail_factor = tail_factor
        self.critical_ratio = critical_ratio
        self.grace_share = grace_share
        self.other_metrics = other_metrics
        self._spike = Spike(metric=metric, nonfinite_tags=[])
        self._streams: dict[tuple[str, float], Streams[_State]] = {}

    def detect(self, data: RunData) -> list[Finding]:
        others = RL_LOSSES if self.other_metrics is None else self.other_metrics
        tags = [self.metric] + [t for t in others if t != self.metric]
        if self.other_metrics is None and not len(data.series(self.metric)):
            tags += [t for t in data.tags() if t not in tags and _is_loss(t)]
        findings = []
        for tag in tags:
            steps, values, episodes = self.tag_episodes(data, tag)
            if not episodes:
                continue
            # spike watches the loss; an RL loss's burst is this signal's alone
            spans = self._spike.spans(data) if tag == self.metric else []
            for episode in episodes:
                lo, hi = int(steps[episode.onset]), int(steps[episode.detected])
                if any(start <= hi and (stop is None or stop >= lo) for start, stop in spans):
                    continue  # spike's to report
                findings.append(self._finding(data, tag, steps, values, episode))
        return sorted(findings, key=lambda f: (f.onset_step, f.metric))

    def tag_episodes(self, data: RunData, tag: str, sign: float = 1.0
                     ) -> tuple[np.ndarray, np.ndarray, list[_Episode]]:
        """The finite points of ``tag`` (times ``sign``: -1 judges falls as rises) and the
        episodes in them (positions among those points)."""
        series = data.series(tag)
        steps = series.index.to_numpy(dtype=np.int64)
        values = sign * series.to_numpy(dtype=float)
        finite = np.isfinite(values)
        steps, values = steps[finite], values[finite]
        window = min(self.window, max(_MIN_WINDOW, len(values) // 3))
        if window < self.window:  # a short log: its own rule, judged whole at every poll
            short = copy.copy(self)
            short.window, short._streams = window, {}
            return short._episodes_of(data, tag, sign, steps, values)
        return self._episodes_of(data, tag, sign, steps, values)

    def _episodes_of(self, data: RunData, tag: str, sign: float, steps: np.ndarray,
                     values: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[_Episode]]:
        if len(values) < _MIN_WINDOW + self.points:
            return steps, values, []
        first, warm = self._warm_up(data, steps)
        streams = self._streams.setdefault((tag, sign), Streams())
        state = streams.resume(data, (tag,))
        if state is None or (state.first, state.warm) != (first, warm):
            state = _State(first, warm, first, first)
        fresh = self._scan(values, state)
        if fresh and fresh[-1].resolved is None:  # judged again next poll, from its start
            floor = fresh[-2].resolved + 1 if len(fresh) > 1 else state.floor
            resume = floor if len(fresh) > 1 else state.resume
            settled = _State(first, warm, floor, resume, state.closed + fresh[:-1])
        else:
            floor = fresh[-1].resolved + 1 if fresh else state.floor
            # a rise judged on its held points waits for them: the last ones again
            settled = _State(first, warm, floor,
                             max(floor, len(values) - _HELD * self.points + 1),
                             state.closed + fresh)
        streams.save(data, (tag,), settled)
        return steps, values, state.closed + fresh

    # --- streaming ----------------------------------------------------------------
    # Judging a point reads the ``memory`` points before it for its level, and the tail
    # guard the ``memory`` before the rise's foot (itself within ``memory``): a poll
    # re-reads that context before the first point it has not judged.

    def _scan(self, values: np.ndarray, state: _State) -> list[_Episode]:
        """The episodes from ``state.resume`` on, in positions of the whole series."""
        # an onset walks back at most ``points`` before the first point judged
        lo = max(0, max(state.floor, state.resume - self.points)
                 - 2 * (self.memory + self.window))
        closed = [replace(e, onset=e.onset - lo, end=e.end - lo)
                  for e in state.closed if e.end + self.window > lo]
        found = self._episodes(values[lo:], max(0, state.first - lo), state.warm - lo,
                               state.resume - lo, state.floor - lo, closed,
                               grows=state.first >= lo)
        return [replace(e, onset=e.onset + lo, detected=e.detected + lo, end=e.end + lo,
                        resolved=None if e.resolved is None else e.resolved + lo)
                for e in found]

    def _warm_up(self, data: RunData, steps: np.ndarray) -> tuple[int, int]:
        """The first point judged, and the first after the LR's warm-up (points before it
        need a rise of ``critical_ratio``): for a run that logs an LR rising from its
        first value, every point, and the point after the LR's first peak (the first
        step where it stops rising); without an LR, what is left of ``grace_period``
        points counted from step 0, and no warm-up margin."""
        lr = data.series("lr")
        values = lr.to_numpy(dtype=float)
        if len(values) >= 2 and np.isfinite(values[:2]).all():
            if values[1] <= values[0]:
                return 0, 0  # no warm-up
            falls = np.flatnonzero(~(values[1:] > values[:-1]))
            peak = int(lr.index[falls[0]]) if falls.size else int(lr.index[-1])
            return 0, int(np.searchsorted(steps, peak, side="right"))
        grace = min(self.grace_period,
                    max(_MIN_WINDOW, math.ceil(self.grace_share * len(steps))))
        if len(steps) < 2 or steps[1] <= steps[0]:
            return grace, 0
        return max(0, grace - int(steps[0]) // int(steps[1] - steps[0]) + 1), 0

    # --- episodes -----------------------------------------------------------------

    def _episodes(self, values: np.ndarray, first: int, warm: int, start: int, floor: int,
                  closed: list[_Episode], grows: bool = True) -> list[_Episode]:
        """The episodes whose first high point is at or after ``start`` (an onset walks
        back no further than ``floor``), ``closed`` ones before it left out of the level;
        before ``warm`` (the LR's warm-up) a rise must reach ``critical_ratio``. With
        ``grows`` (``values`` start at or before ``first``), the ``window`` points after
        ``first`` are judged against the ``_MIN_WINDOW`` or more points since ``first``."""
        n = len(values)
        share = np.full(n, self.min_rel)
        share[:max(0, warm)] = max(self.min_rel, self.critical_ratio - 1)
        median = _median_before(values, self.window)
        since = first if grows else None
        if grows:
            for k in range(first + _MIN_WINDOW, min(n, first + self.window)):
                median[k] = np.median(values[first:k])
        usable = np.zeros(n, dtype=bool)  # windows after the warm-up, free of episodes
        usable[first:] = True
        for episode in closed:
            usable[max(0, episode.onset):max(0, episode.end + self.window)] = False
        episodes: list[_Episode] = []
        while start + self.points <= n:
            level = self._levels(median, usable, since)
            with np.errstate(invalid="ignore"):
                rough = values > level + share * np.abs(level)
            rough[:start] = False
            counts = np.concatenate(([0], np.cumsum(rough)))
            runs = np.flatnonzero(counts[self.points:] - counts[:-self.points] == self.points)
            episode = None
            for i in runs.tolist():
                if episode is not None and i + self.points - 1 >= episode.detected:
                    break  # a held rise, and no burst after it is seen sooner
                found = self._judge(values, median, level, usable, i, floor,
                                    float(share[i]), since)
                if found is not None and (episode is None or found.detected < episode.detected):
                    episode = found
                    if found.detected == i + self.points - 1:
                        break  # a burst: seen as soon as it can be
            if episode is None:
                break
            episodes.append(episode)
            if episode.resolved is None:
                break
            usable[episode.onset:episode.end + self.window] = False
            start = floor = episode.resolved + 1
        return episodes

    def _levels(self, median: np.ndarray, usable: np.ndarray,
                since: int | None) -> np.ndarray:
        """The best level before each point: the lowest rolling median, over the last
        ``memory`` points, of the windows that lie after the warm-up and touch no episode
        (NaN where there is none yet)."""
        clean = np.where(usable, median, np.nan)
        counted = np.concatenate(([0], np.cumsum(~usable)))
        starts = np.maximum(np.arange(len(median)) - self.window, since or 0)
        clean[counted[np.arange(len(median))] - counted[starts] > 0] = np.nan
        return bn.move_min(clean, min(self.memory, len(clean)), min_count=1)

    def _judge(self, values: np.ndarray, median: np.ndarray, level: np.ndarray,
               usable: np.ndarray, i: int, start: int, share: float,
               since: int | None = None) -> _Episode | None:
        """The episode whose first high point is ``i``, if its ``points`` points all clear
        the margin (``share`` of the level's magnitude, or its noise) over the level frozen
        at ``i`` and the tail guard; else None."""
        reference = float(level[i])
        lo = i - self.window if since is None else max(since, i - self.window)
        if not math.isfinite(reference) or lo < 0 or i - lo < _MIN_WINDOW:
            return None
        # the noise of the points before the rise began: a first risen point that fell
        # just short of the margin would widen it (a short window most of all)
        foot = i
        while foot - lo > _MIN_WINDOW and values[foot - 1] > reference + share * abs(
                reference) / 2:
            foot -= 1
        _, _, noise, _, log_noise, positive = (
            float(v[0]) for v in _window_stats(values[lo:foot][None, :]))
        margin = max(share * abs(reference), self.threshold * noise)
        limit = reference + margin
        body = values[i:i + self.points]
        log_scale = bool(positive and reference > 0)
        detected = i + self.points - 1
        if (body > limit).all() and not (log_scale and not (
                np.log(body) > math.log(reference) + self.threshold * log_noise).all()):
            height = self._height(body, reference, log_scale)
        else:  # not a burst: a rise that holds (see the class)?
            held = None if not self.held_rises else self._held(
                values[i:i + _HELD * self.points], reference, share, noise, log_noise,
                log_scale)
            if held is None:
                return None
            height, margin = held
            limit = reference + margin
            detected = i + _HELD * self.points - 1
        # the level is a median of the last ``memory`` points: the foot lies among them
        back = max(0, i - self.memory)
        near = np.flatnonzero(median[back:i] <= reference + margin / 4)
        foot = back + int(near[-1]) if near.size else i
        if not self._beyond_tail(values, level, usable, foot, height,
                                 bool(positive and reference > 0),
                                 detected - i + 1 > self.points):
            return None
        settle = reference + margin / 2
        onset = i  # back to where the rise began: then only while it climbed, to where it
        # left the level's noise (a slow climb's first raised point)
        while onset > max(start, i - self.points) and values[onset - 1] > settle:
            onset -= 1
        while onset > start and values[onset - 1] <= values[onset] \
                and values[onset - 1] > reference + self._noise_before(values, onset - 1, since):
            onset -= 1
        resolved = first_run(values, detected + 1, self.resolve_points,
                             lambda v: v <= settle)
        end = len(values) if resolved is None else resolved - self.resolve_points + 1
        return _Episode(onset, detected, end, resolved, reference, limit)

    def _held(self, body: np.ndarray, reference: float, share: float, noise: float,
              log_noise: float, log_scale: bool) -> tuple[float, float] | None:
        """A rise too noisy for ``points`` points in a row to clear the noise margin, but
        that holds: ``_HELD * points`` points, none back under the level plus half of
        ``share``, whose median clears ``share`` of the level and ``threshold`` standard
        errors of a median of that many points (``1.2533 * sd / sqrt(n)``, on the log
        scale too). Its height (for the tail guard) and margin, or None."""
        count = _HELD * self.points
        if len(body) < count or not (body > reference + share * abs(reference) / 2).all():
            return None
        middle = float(np.median(body))
        error = self.threshold * 1.2533 / math.sqrt(count)
        margin = max(share * abs(reference), error * noise)
        if middle <= reference + margin:
            return None
        if log_scale and math.log(middle / reference) <= error * log_noise:
            return None
        return (math.log(middle / reference) if log_scale else middle - reference), margin

    def _noise_before(self, values: np.ndarray, k: int, since: int | None) -> float:
        """``threshold`` robust standard deviations of the ``window`` points before ``k``
        (infinite where fewer than ``_MIN_WINDOW`` lie after ``since``)."""
        lo = max(since or 0, k - self.window)
        if k - lo < _MIN_WINDOW:
            return math.inf
        return self.threshold * float(_window_stats(values[lo:k][None, :])[2][0])

    def _height(self, body: np.ndarray, reference: float, log_scale: bool) -> float:
        if log_scale:
            return float(np.log(body.min() / reference))
        return float(body.min() - reference)

    def _beyond_tail(self, values: np.ndarray, level: np.ndarray, usable: np.ndarray,
                     i: int, height: float, log_scale: bool, held: bool = False) -> bool:
        """Whether ``height`` is ``tail_factor`` times the highest that any run of
        ``points`` clean points stood over its own best level in the ``memory`` points
        before ``i`` (the foot of the rise: the last window whose median was still near
        the level, so a slow climb is not its own history); for a ``held`` rise, whose
        height is its median's, the highest median of any run of as many points."""
        if not self.tail_factor:
            return True
        lo = max(0, i - self.memory)
        history, levels = values[lo:i], level[lo:i]
        ok = usable[lo:i] & np.isfinite(levels)
        if log_scale:
            ok &= (history > 0) & (levels > 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                residual = np.log(np.where(ok, history, 1.0) / np.where(ok, levels, 1.0))
        else:
            residual = history - np.where(ok, levels, 0.0)
        residual = np.where(ok, residual, -np.inf)
        width = _HELD * self.points if held else self.points
        if np.count_nonzero(ok) < _MIN_TAIL + width:
            return True
        if held:
            runs = bn.move_median(np.where(ok, residual, np.nan), width)
        else:
            runs = bn.move_min(residual, width) if width > 1 else residual
        highest = float(np.nanmax(runs[width - 1:])) if len(runs) >= width \
            and not np.isnan(runs[width - 1:]).all() else -math.inf
        return highest <= 0 or height > self.tail_factor * highest

    # --- the finding --------------------------------------------------------------

    def _finding(self, data: RunData, tag: str, steps: np.ndarray, values: np.ndarray,
                 episode: _Episode) -> Finding:
        body = values[episode.onset:episode.end]
        peak_at = episode.onset + int(np.argmax(body))
        peak, reference = float(values[peak_at]), episode.reference
        ratio = peak / reference if reference > 0 else None
        above = int(np.count_nonzero(body > episode.limit))
        onset_step = int(steps[episode.onset])
        text = (f"{tag} rose from its level {fmt_number(reference)} to {fmt_number(peak)} at "
                f"step {int(steps[peak_at])}"
                + (f" ({ratio:.1f}x)" if ratio is not None else "")
                + f" and stayed above {fmt_number(episode.limit)} for {above} points from "
                  f"step {onset_step}")
        if episode.resolved is None:
            text += "; it has not come back"
        else:
            text += f"; back near its level from step {int(steps[episode.end])}"
        critical = reference != 0 and peak >= reference + (
            self.critical_ratio - 1) * abs(reference)
        first = max(0, episode.onset - _CONTEXT_BEFORE)
        end = len(values) if episode.resolved is None else episode.resolved + 1
        shown = range(first, min(end, first + _MAX_EVIDENCE_POINTS))
        return self.finding(
            data, severity="critical" if critical else "warning", metric=tag,
            onset_step=onset_step, detected_step=int(steps[episode.detected]), summary=text,
            evidence={"reference": reference, "reference_window": self.window,
                      "limit": episode.limit, "peak": peak, "peak_step": int(steps[peak_at]),
                      "ratio": ratio, "points_above": above,
                      "points": [[int(steps[k]), float(values[k])] for k in shown]},
            resolved_step=None if episode.resolved is None else int(steps[episode.resolved]))


def _is_loss(tag: str) -> bool:
    """Whether ``tag`` is a loss watched in place of a ``metric`` the run does not log."""
    words = _words(tag)
    return bool(words & _LOSS_WORDS) and not words & _NOT_LOSS_WORDS and tag not in RL_LOSSES
