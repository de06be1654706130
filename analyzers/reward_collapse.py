"""Reward collapse: the RL policy's reward falls away from the level it had reached."""

from __future__ import annotations

import numpy as np

from analyzers import register
from analyzers.base import Analyzer, RunData
from analyzers.checks import check_metric, check_real
from analyzers.divergence import RL_LOSSES, Divergence, _Episode
from analyzers.finding import Finding
from analyzers.fmt import fmt_number

# Names a reader may keep for the policy's reward when no alias maps it to ``reward``
# (DeepSpeed-Chat prints "average reward score", TRL logs ``ppo/mean_scores`` or
# ``objective/scores``): the first one logged is read.
REWARD_NAMES = ("average reward score", "average_reward_score", "reward_score",
                "rewards/mean", "reward/mean", "ppo/mean_scores", "objective/scores",
                "env/reward_mean")
# Points shown in the evidence before the onset, and the cap on them.
_CONTEXT_BEFORE = 5
_MAX_EVIDENCE_POINTS = 30


@register
class RewardCollapse(Analyzer):
    """Reward collapse: the reward falls by a large share of the level it had reached.

    *Signal* (SIGNALS.md ``reward_collapse``). PPO's reward can fall away within a few
    updates after an unstable one (issue 22: a DeepSpeed-Chat step-3 run whose actor and
    critic losses burst to 5–6× their level, then its ``average reward score`` halved).
    It is ``divergence``'s episode rule on the reward turned upside down (one mechanism,
    see :class:`analyzers.divergence.Divergence`): ``points`` points in a row below the
    reward's best level (the highest median of ``window`` points over the last ``memory``
    points) by the larger of ``min_drop`` of its magnitude and ``threshold`` robust
    standard deviations of its noise (on a log scale too where the reward is negative
    throughout, where a fall multiplies it), against that level frozen at the first, with
    the tail guard against a reward whose own noise wanders in runs. It resolves once
    ``resolve_points`` points in a row are back above the level less half the margin.
    ``critical`` when the reward fell by its level's whole magnitude (a positive reward
    at or below 0, a negative one doubled), else ``warning``. When an RL loss (actor or
    critic: ``divergence``'s ``RL_LOSSES``) had an episode that began within the
    ``window`` reward points before the onset, or since, the finding names it: the burst
    that usually comes first.

    The reward is ``metric``; when the run logs none, the first of ``REWARD_NAMES`` it
    logs (DeepSpeed-Chat's ``average reward score``, TRL's ``ppo/mean_scores``, …).

    Parameters
    ----------
    metric : str, default "reward"
        The policy's reward (the reward model's score of its samples).
    window : int, default 20
        Points in the rolling median whose highest value is the level.
    min_drop : float, default 0.5
        Fall below the level, as a share of its magnitude (0.5: the reward halved).
    threshold : float, default 4.0
        Robust standard deviations of the reward's noise the fall must also exceed.
    critical_drop : float, default 1.0
        A fall of this share of the level's magnitude is ``critical``.

    *False-positive guard*: the divergence rule's (warm-up, noise floor, tail guard), and
    a reward must have risen before it can collapse: its best level must stand above its
    first ``window`` points' median by half the margin. DPO's implicit reward of the
    chosen answers (``rewards/chosen``) drifts down from 0 from the start in healthy runs;
    it never rose, so it is not reported. The price: a run whose reward falls from its
    very start is not this signal's (it is not learning: ``plateau``'s and the eval
    signals' business).

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import RunData
    >>> rng = np.random.default_rng(0)
    >>> reward = np.minimum(np.arange(600) / 200, 1.0) + 2.0 + 0.05 * rng.standard_normal(600)
    >>> reward[400:] -= np.r_[np.linspace(0, 2.0, 10), np.full(190, 2.0)]
    >>> [finding] = RewardCollapse().detect(RunData.from_series("demo", {"reward": reward}))
    >>> finding.onset_step, finding.detected_step, finding.severity, finding.state
    (402, 410, 'warning', 'firing')
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    reward fell from its level 3.01 to 0.805 at step 479 (-73%) and stayed below 1.51 for
    193 points from step 402; it has not come back
    """

    signal = "reward_collapse"

    def __init__(self, metric: str = "reward", window: int = 20, min_drop: float = 0.5,
                 threshold: float = 4.0, critical_drop: float = 1.0) -> None:
        check_metric(metric)
        check_real("min_drop", min_drop, 0.0)
        check_real("critical_drop", critical_drop, 0.0)
        self.metric = metric
        self.window = window
        self.min_drop = min_drop
        self.threshold = threshold
        self.critical_drop = critical_drop
        # The episode rule (its checks name window and threshold); RL losses' bursts too.
        self._rule = Divergence(metric=metric, window=window, min_rel=min_drop,
                                threshold=threshold, critical_ratio=1.0 + critical_drop,
                                grace_share=0.1, other_metrics=[])
        # A fall must clear the noise in ``points`` points in a row: the median rule for a
        # noisy loss that steps up and holds is not calibrated on rewards (on a DPO log's
        # ``rewards/chosen`` it reported the chosen reward drifting down).
        self._rule.held_rises = False

    def detect(self, data: RunData) -> list[Finding]:
        tag = self.metric
        if not len(data.series(tag)):
            tag = next((t for t in REWARD_NAMES if len(data.series(t))), self.metric)
        steps, values, episodes = self._rule.tag_episodes(data, tag, sign=-1.0)
        if not episodes:
            return []
        start = -float(np.median(values[:self.window]))
        bursts = [(t, s, e) for t in RL_LOSSES
                  for s, _, e in [self._rule.tag_episodes(data, t)] if e]
        findings = []
        for episode in episodes:
            best = -episode.reference
            margin = episode.limit - episode.reference
            if best - start < margin / 2:
                continue  # it never rose: nothing to collapse from
            findings.append(self._finding(data, tag, steps, -values, episode, bursts))
        return findings

    def _finding(self, data: RunData, tag: str, steps: np.ndarray, reward: np.ndarray,
                 episode: _Episode,
                 bursts: list[tuple[str, np.ndarray, list[_Episode]]]) -> Finding:
        best, floor = -episode.reference, -episode.limit
        body = reward[episode.onset:episode.end]
        low_at = episode.onset + int(np.argmin(body))
        low = float(reward[low_at])
        onset_step = int(steps[episode.onset])
        drop = (best - low) / abs(best) if best else None
        text = (f"{tag} fell from its level {fmt_number(best)} to {fmt_number(low)} at step "
                f"{int(steps[low_at])}" + (f" ({-100 * drop:.0f}%)" if drop is not None else "")
                + f" and stayed below {fmt_number(floor)} for "
                  f"{int(np.count_nonzero(body < floor))} points from step {onset_step}")
        text += ("; it has not come back" if episode.resolved is None else
                 f"; back near its level from step {int(steps[episode.end])}")
        since = int(steps[max(0, episode.onset - self.window)])
        before = []
        for loss_tag, loss_steps, loss_episodes in bursts:
            for e in loss_episodes:
                at = int(loss_steps[e.onset])
                if since <= at <= int(steps[episode.detected]):
                    before.append({"metric": loss_tag, "onset_step": at,
                                   "level": e.reference})
        if before:
            text += "; after a burst of " + ", ".join(
                f"{b['metric']} from step {b['onset_step']}" for b in before)
        first = max(0, episode.onset - _CONTEXT_BEFORE)
        end = len(reward) if episode.resolved is None else episode.resolved + 1
        shown = range(first, min(end, first + _MAX_EVIDENCE_POINTS))
        critical = drop is not None and drop >= self.critical_drop
        return self.finding(
            data, severity="critical" if critical else "warning", metric=tag,
            onset_step=onset_step, detected_step=int(steps[episode.detected]), summary=text,
            evidence={"level": best, "floor": floor, "low": low,
                      "low_step": int(steps[low_at]), "drop": drop, "loss_bursts": before,
                      "points": [[int(steps[k]), float(reward[k])] for k in shown]},
            resolved_step=None if episode.resolved is None else int(steps[episode.resolved]))
