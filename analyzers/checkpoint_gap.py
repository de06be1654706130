"""Checkpoint gap: the run has gone far longer than its usual interval without saving."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from analyzers import register
from analyzers.base import Analyzer, Checkpoint, RunData
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding


@dataclass(frozen=True)
class _Gap:
    since: Checkpoint | None  # the last checkpoint; None: none yet in this attempt
    origin: int  # the step the gap is counted from
    limit: int  # steps allowed without a checkpoint
    median_interval: float | None
    onset: int  # the first logged step past the limit
    ended_by: Checkpoint | None  # the checkpoint that closed the gap


@register
class CheckpointGap(Analyzer):
    """Checkpoint gap: steps since the last checkpoint far above the run's interval.

    *Signal* (SIGNALS.md ``checkpoint_gap``). The gap allowed after a checkpoint is
    ``max_interval`` steps or ``factor`` times the median interval between the run's
    checkpoints, whichever is larger (with a single checkpoint, saved after the attempt's
    first logged step, the interval is the one from that step to the checkpoint). The finding
    fires at the first logged step of ``metric`` past that limit (onset and detection),
    and resolves when the next checkpoint appears (its step). With ``expect_checkpoints``,
    the stretch before this attempt's first checkpoint (or a run that has saved none) is
    judged too, from the first step it logged, against ``max_interval`` ("no checkpoint
    yet"); without it, gaps are only counted from a checkpoint. Every such gap in the
    history is reported, each against the checkpoints known at its time. There is no
    rollback target: nothing is wrong with the weights, the risk is losing them.

    Parameters
    ----------
    metric : str, default "train/loss"
        The tag whose logged steps show how far the run has got.
    max_interval : int, default 1000
        The floor of the limit, in steps (the top of 003 §5.3's advice: save every
        500–1000 steps). Lower warns sooner on runs that save rarely.
    factor : float, default 3.0
        Multiple of the run's own median interval allowed before warning. Lower catches
        a missed save or two sooner, and warns on a save that is merely slow.
    expect_checkpoints : bool, default False
        Whether a run that has logged no checkpoint at all is reported once it passes
        ``max_interval`` steps. Off by default: most logs runwatch reads cannot see where
        their checkpoints go (a bare log file), and a warning on every such run would be
        noise. Turn it on where the checkpoints sit beside the log, to catch a run that
        never saves.

    *False-positive guard*: the limit is never below ``max_interval`` and grows with the
    run's own habit (a run that has saved every 2000 steps is next judged against 6000);
    a resumed attempt is counted from the checkpoint it resumed from, or from its own
    first step, never from step 0; the gap is only judged on steps the run has logged (a
    run that stopped is ``stalled``'s to report); one finding per gap, resolved by the
    next checkpoint.

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import Checkpoint, RunData
    >>> saved = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (500, 1000, 1500)]
    >>> data = RunData.from_series("demo", {"train/loss": np.full(320, 2.0)},
    ...                            steps=10 * np.arange(1, 321), checkpoints=saved)
    >>> [finding] = CheckpointGap().detect(data)
    >>> finding.onset_step, finding.state, finding.severity, finding.rollback_to
    (3010, 'firing', 'warning', None)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    no checkpoint for 1510 steps at step 3010: the last is ckpt/checkpoint-1500 at step
    1500 (limit 1500 steps: 3 × the run's median interval of 500)
    """

    signal = "checkpoint_gap"

    def __init__(self, metric: str = "train/loss", max_interval: int = 1000,
                 factor: float = 3.0, expect_checkpoints: bool = False) -> None:
        check_metric(metric)
        check_int("max_interval", max_interval, 1)
        check_real("factor", factor, 1.0, allow_equal=True)
        if not isinstance(expect_checkpoints, bool):
            raise ValueError(f"expect_checkpoints must be true or false, "
                             f"got {expect_checkpoints!r}")
        self.metric = metric
        self.max_interval = max_interval
        self.factor = factor
        self.expect_checkpoints = expect_checkpoints

    def detect(self, data: RunData) -> list[Finding]:
        steps = data.series(self.metric).index.to_numpy(dtype=np.int64)
        if not steps.size:
            return []
        return [self._finding(data, gap, int(steps[-1])) for gap in self._gaps(steps, data)]

    def _gaps(self, steps: np.ndarray, data: RunData) -> list[_Gap]:
        by_step = {c.step: c for c in sorted(data.checkpoints, key=lambda c: c.step)}
        saved = [by_step[s] for s in sorted(by_step)]
        saved_steps = np.array([c.step for c in saved], dtype=np.int64)
        first, last = int(steps[0]), int(steps[-1])
        # The gaps to judge: from each checkpoint up to the next, and from the attempt's
        # first step when no checkpoint precedes it.
        known = int(np.searchsorted(saved_steps, first, side="right"))
        anchors: list[int | None] = [known - 1] if known else []
        if not known and self.expect_checkpoints:
            anchors.append(None)
        anchors += list(range(known, int(np.searchsorted(saved_steps, last, side="right"))))
        gaps = []
        for anchor in anchors:
            since = None if anchor is None else saved[anchor]
            origin = first if since is None else since.step
            following = 0 if anchor is None else anchor + 1
            ended_by = saved[following] if following < len(saved) else None
            if ended_by is not None and ended_by.step - origin <= self.max_interval:
                continue  # saved again within the shortest limit: no gap, whatever the median
            median = None
            if anchor is not None:
                # A run logged from before its first checkpoint saved it one interval in:
                # until a second checkpoint gives a real interval, that first one stands
                # for the run's habit, so a run that saves every 5000 steps is not held to
                # ``max_interval`` between its first and second checkpoints.
                marks = saved_steps[:anchor + 1]
                if anchor == 0 and saved_steps[0] > first:
                    marks = np.concatenate(([first], marks))
                if len(marks) >= 2:
                    median = float(statistics.median(np.diff(marks).tolist()))
            limit = self.max_interval
            if median is not None:
                limit = max(limit, int(self.factor * median))
            past = steps[np.searchsorted(steps, origin + limit, side="right"):][:1]
            if not past.size or (ended_by is not None and past[0] >= ended_by.step):
                continue
            gaps.append(_Gap(since, origin, limit, median, int(past[0]), ended_by))
        return gaps

    def _finding(self, data: RunData, gap: _Gap, latest: int) -> Finding:
        span = gap.onset - gap.origin
        if gap.since is None:
            summary = (f"no checkpoint yet after {span} steps at step {gap.onset} "
                       f"(this attempt started at step {gap.origin}; limit "
                       f"{gap.limit} steps)")
        else:
            summary = (f"no checkpoint for {span} steps at step {gap.onset}: the last is "
                       f"{gap.since.path} at step {gap.since.step} (limit {gap.limit} steps")
            if gap.median_interval is not None and gap.limit > self.max_interval:
                summary += (f": {self.factor:g} × the run's median interval of "
                            f"{gap.median_interval:g})")
            else:
                summary += ")"
        end = latest if gap.ended_by is None else gap.ended_by.step
        return self.finding(
            data,
            onset_step=gap.onset,
            detected_step=gap.onset,
            summary=summary,
            evidence={
                "last_checkpoint": (None if gap.since is None
                                    else [gap.since.step, gap.since.path]),
                "counted_from": gap.origin,
                "limit": gap.limit,
                "max_interval": self.max_interval,
                "median_interval": gap.median_interval,
                "checkpoints": len(data.checkpoints),
                "latest_step": latest,
                "gap": end - gap.origin,
                "ended_by": (None if gap.ended_by is None
                             else [gap.ended_by.step, gap.ended_by.path]),
            },
            rollback_to=None,
            resolved_step=None if gap.ended_by is None else gap.ended_by.step,
        )
