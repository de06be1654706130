"""Stalled: the run has logged nothing for far longer than its usual interval."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzers import register
from analyzers.base import Analyzer, Checkpoint, RunData
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import fmt_duration
from analyzers.stats.metric import config_number
from analyzers.streaming import Buffer, Streams

# Intervals whose median is the run's usual interval: the last ones before the silence.
_INTERVAL_WINDOW = 100
# ``meta["status"]`` as trackers write it (MLflow FAILED/KILLED/FINISHED, W&B crashed/failed
# (exit code 1)/finished, …): a run that ended badly, or one that ended well.
_FAILED = re.compile(r"fail|crash|kill|error|preempt|abort|cancel", re.IGNORECASE)
_FINISHED = re.compile(r"finish|complete|success|succeed|done", re.IGNORECASE)


@dataclass(frozen=True)
class _Silence:
    before: int  # index into the activity timeline of the last point before the silence
    after: int | None  # index of the first point after it; None: still silent
    length: float  # seconds
    usual: float  # the usual interval between logged points, seconds
    longest: float  # the longest silence the run came back from before, seconds
    limit: float  # seconds allowed


@dataclass
class _Timeline:
    """The run's activity as far as the last poll read it: each distinct wall time with the
    highest step logged then (any tag), the distinct wall times of the heartbeat metric,
    the times a new highest step first appeared (the heartbeat without one), how many
    points of each tag were read, and the silences already judged (every gap between
    points read is judged once, against what the run had shown before it). Kept in
    growing buffers: a poll costs what its new points cost."""

    times: Buffer = field(default_factory=Buffer)
    time_steps: Buffer = field(default_factory=lambda: Buffer(np.int64))
    beats: Buffer = field(default_factory=Buffer)
    step_beats: Buffer = field(default_factory=Buffer)
    read: dict[str, int] = field(default_factory=dict)
    last_walls: dict[str, float] = field(default_factory=dict)  # of each tag's last point
    metric: str = ""
    own_beats: bool = False
    judged: int = 0
    judged_step: int | None = None  # the step from which silences are judged
    longest: float = 0.0
    silences: list[_Silence] = field(default_factory=list)
    # The highest step before the last time, and whether the last time is a step beat.
    top_before_last: int = -(2**62)
    last_is_step_beat: bool = False

    def extend(self, data: RunData, tags: tuple[str, ...]) -> bool:
        """Add the points logged since the last read; False when one is older than the
        activity already read (out of order: judge the run again from scratch)."""
        walls, steps, own = [np.empty(0)], [np.empty(0, dtype=np.int64)], [np.empty(0)]
        for tag in tags:
            start = self.read.get(tag, 0)
            logged = data.wall_times(tag)
            if start and not _same(logged[start - 1], self.last_walls[tag]):
                return False  # the last point read was logged again, later: read afresh
            at = logged[start:]
            if len(logged):
                self.last_walls[tag] = float(logged[-1])
            timed = np.isfinite(at)
            walls.append(at[timed])
            steps.append(data.series(tag).index.to_numpy()[start:][timed])
            if tag == self.metric:
                own.append(at[timed])
            self.read[tag] = start + len(at)
        return self._add(np.concatenate(walls), np.concatenate(steps), np.concatenate(own))

    def build(self, data: RunData) -> None:
        """The whole activity of the long frame's rows at once (a later live poll of the
        same attempt goes on from its points per tag)."""
        frame = data.metrics
        self.read = {tag: len(data.series(tag)) for tag in data.tags()}
        self.last_walls = {tag: float(data.wall_times(tag)[-1]) for tag, n in self.read.items()
                           if n}
        walls = frame["wall_time"].to_numpy(dtype=float)
        timed = np.isfinite(walls)
        own = timed & (frame["tag"].to_numpy() == self.metric)
        self._add(walls[timed], frame["step"].to_numpy()[timed], walls[own])

    def _add(self, walls: np.ndarray, steps: np.ndarray, own: np.ndarray) -> bool:
        """Points with a wall time (any tag; ``own``: the heartbeat metric's wall times)
        that come after the activity already read; False when one is older."""
        if not len(walls):
            return True
        if len(self.times) and walls.min() < self.times[-1]:
            return False
        steps = steps.astype(np.int64)
        order = np.lexsort((steps, walls))
        walls, steps = walls[order], steps[order]
        last_of_time = np.flatnonzero(np.append(walls[1:] != walls[:-1], True))
        walls, steps = walls[last_of_time], steps[last_of_time]
        if len(self.times) and walls[0] == self.times[-1]:
            self.time_steps[-1] = max(int(self.time_steps[-1]), int(steps[0]))
            if not self.last_is_step_beat and self.time_steps[-1] > self.top_before_last:
                self.step_beats.extend(self.times.view[-1:])
                self.last_is_step_beat = True
            walls, steps = walls[1:], steps[1:]
        if len(walls):
            # A new highest step: above every step logged at an earlier time.
            top = self.top_before_last
            if len(self.times):
                top = max(top, int(self.time_steps[-1]))
            before = np.maximum.accumulate(np.concatenate(([top], steps[:-1])))
            new_step = steps > before
            if not len(self.times):
                new_step[0] = True
            self.step_beats.extend(walls[new_step])
            self.top_before_last = int(before[-1])
            self.last_is_step_beat = bool(new_step[-1])
            self.times.extend(walls)
            self.time_steps.extend(steps)
        beats = np.unique(own)
        if len(self.beats):
            beats = beats[beats > self.beats[-1]]
        self.beats.extend(beats)
        return True

    @property
    def top(self) -> int:
        """The highest step logged."""
        return max(self.top_before_last, int(self.time_steps[-1]))


@register
class Stalled(Analyzer):
    """Stalled: the run stopped advancing (crash, pre-emption, hang).

    *Signal* (SIGNALS.md ``stalled``; time-based). Only judged when the run data carries
    ``now`` (a live watcher passes the time of the poll); a finished log analysed after
    the fact never claims a stall. The run's activity is the wall time of every point it
    logged, any tag. Its *usual interval* is the median of the last 100 intervals between
    points of ``metric`` (or between new steps, when ``metric`` is not logged). A silence
    is too long when it exceeds the limit: the largest of ``min_silence``, ``factor``
    times the usual interval, and ``gap_margin`` times the longest silence the run has
    come back from before (an evaluation or checkpoint pause). A silence that starts at a
    step where the run's config schedules an evaluation or a save (``eval_steps``,
    ``save_steps`` in ``meta["config"]``, as Hugging Face's TrainingArguments and
    ``trainer_state.json`` carry them) before the run has been judged through one such
    step is allowed ``scheduled_pause`` at least: the first evaluation's length is not
    known yet.

    The current silence (from the last point to ``now``) fires a finding whose onset and
    detection are the last logged step; its evidence names the latest checkpoint to
    resume from (not from scratch). It is ``critical`` when the run's status
    (``meta["status"]``) says it failed, crashed or was killed: then the limit is
    ``factor`` times the usual interval alone, the process being known to be gone. A run
    whose status says it finished, that has an end time (``meta["ended_at"]``), or that
    reached ``meta["total_steps"]``, has not stalled. Earlier silences that exceeded the
    limit of their time, after which the run went on, are reported resolved at the first
    step logged after them; so a firing stall resolves as soon as new points arrive.
    There is no rollback target: nothing is wrong with the weights.

    Parameters
    ----------
    metric : str, default "train/loss"
        The tag whose points set the usual interval (the run's heartbeat).
    min_silence : float, default 900.0
        The floor of the limit, in seconds. Lower reports a dead run sooner, and also a
        long evaluation or checkpoint save the first time the run does one.
    factor : float, default 10.0
        Multiple of the usual interval allowed. Lower catches a hang of a slow run (one
        point every few minutes) sooner, and warns on a slow node.
    gap_margin : float, default 1.5
        Multiple of the longest silence the run has come back from that is allowed: a run
        that has paused 20 minutes for an evaluation is next judged against 30 (the first
        such pause is reported, and resolved when the run goes on, unless the config says
        it was due: ``scheduled_pause``). The price: a run that once hung for an hour and
        recovered is next judged against an hour and a half, unless its status says it
        failed. Lower warns on every pause that runs a little long.
    scheduled_pause : float, default 3600.0
        The floor of the limit, in seconds, for a silence that starts at the first step
        with a scheduled evaluation or save the run reaches once judged. Higher lets a
        long first evaluation pass; the price is that a run that hangs in its first
        evaluation is reported that much later. 0 turns the allowance off.
    min_points : int, default 5
        Points of ``metric`` (or steps) with a wall time needed before the run is judged:
        its usual interval is unknown before, and start-up (compilation, loading data)
        is slow: a silence before then neither fires nor raises the limit later. Lower
        also judges runs that died right after starting.

    *False-positive guard*: nothing without ``now`` or wall times; ``min_points``
    excludes the start-up; the limit grows with the run's own interval and pauses, and a
    first scheduled evaluation or save may take ``scheduled_pause``; a run
    that finished is not stalled; and the finding disappears (resolves) with the next
    point. Earlier silences are judged causally, against what the run had shown before
    them.

    Examples
    --------
    >>> import numpy as np
    >>> from analyzers import Checkpoint, RunData
    >>> steps = np.arange(1, 201)
    >>> data = RunData.from_series("demo", {"train/loss": np.full(200, 2.0)}, steps=steps,
    ...                            checkpoints=[Checkpoint(150, "ckpt/checkpoint-150")],
    ...                            now=1_700_000_000.0 + 2000 + 1800)
    >>> data.metrics["wall_time"] = 1_700_000_000.0 + 10.0 * data.metrics["step"]
    >>> [finding] = Stalled().detect(data)
    >>> finding.onset_step, finding.severity, finding.state, finding.rollback_to
    (200, 'warning', 'firing', None)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    no new point for 30m since step 200 (usual interval 10s; limit 15m); resume from
    the latest checkpoint, ckpt/checkpoint-150 at step 150
    >>> data.meta["status"] = "FAILED"
    >>> Stalled().detect(data)[0].severity
    'critical'
    >>> data.now = None  # a finished log read after the fact: no claim
    >>> Stalled().detect(data)
    []
    """

    signal = "stalled"

    def __init__(self, metric: str = "train/loss", min_silence: float = 900.0,
                 factor: float = 10.0, gap_margin: float = 1.5, min_points: int = 5,
                 scheduled_pause: float = 3600.0) -> None:
        check_metric(metric)
        check_real("min_silence", min_silence, 0.0)
        check_real("factor", factor, 1.0, allow_equal=True)
        check_real("gap_margin", gap_margin, 1.0, allow_equal=True)
        check_int("min_points", min_points, 2)
        check_real("scheduled_pause", scheduled_pause, 0.0, allow_equal=True)
        self.metric = metric
        self.min_silence = min_silence
        self.factor = factor
        self.gap_margin = gap_margin
        self.min_points = min_points
        self.scheduled_pause = scheduled_pause
        self._streams: Streams[_Timeline] = Streams()

    def detect(self, data: RunData) -> list[Finding]:
        now = data.now
        if now is None or not math.isfinite(now):
            return []
        tags = tuple(data.tags())
        state = self._streams.resume(data, tags) if data.live else None
        if state is None or not state.extend(data, tags):
            state = _Timeline(metric=self.metric)
            if data.live:
                state.extend(data, tags)
            else:  # a frame built at once: every row it has, in whatever order
                state.build(data)
        self._streams.save(data, tags, state)
        if not len(state.times):
            return []
        own = len(state.beats) >= self.min_points
        beats = (state.beats if own else state.step_beats).view
        if own != state.own_beats:  # the heartbeat changed: judge the silences again
            state.own_beats, state.judged, state.longest, state.silences = own, 0, 0.0, []
            state.judged_step = None
        if len(beats) < self.min_points:
            return []
        status = _status(data.meta)
        due = _Due(_scheduled(data.meta), self.scheduled_pause)
        self._settle(state, beats, due)
        times, time_steps = state.times.view, state.time_steps.view
        current = self._current_silence(data, now, times, state.top, beats, state.longest,
                                        status, due.floor(state.top, state.judged_step))
        findings = [self._finding(data, times, time_steps, s, now, status)
                    for s in state.silences]
        if current is not None:
            findings.append(self._finding(data, times, time_steps, current, now, status))
        return sorted(findings, key=lambda f: (f.onset_step, f.detected_step))

    def _settle(self, state: _Timeline, beats: np.ndarray, due: _Due) -> None:
        """Judge the silences between points logged since the last poll, each against the
        limit of its time (what the run had shown before it): settled for good."""
        times = state.times.view
        gaps = np.diff(times[max(0, state.judged - 1):])
        offset = max(0, state.judged - 1)
        # A silence counts as one the run came back from (a pause that raises the limit)
        # only once the run is judged: a slow start-up (compilation, loading data) is
        # excluded as it is from judgement, or one two-hour load would allow three hours
        # of silence for the rest of the run. The run is judged from its min_points-th
        # heartbeat (the first time its usual interval is known).
        judged_from = float(beats[self.min_points - 1])
        if state.judged_step is None:
            state.judged_step = int(state.time_steps[int(np.searchsorted(times, judged_from))])
        counted = np.where(times[offset:offset + len(gaps)] >= judged_from, gaps, 0.0)
        # Only silences above the floor can exceed the limit.
        for j in np.flatnonzero(gaps > self.min_silence).tolist():
            i = offset + j
            longest_before = max(state.longest, float(counted[:j].max()) if j else 0.0)
            usual = self._usual(beats, float(times[i]))
            if usual is None:
                continue
            limit = max(self._limit(usual, longest_before),
                        due.floor(int(state.time_steps[i]), state.judged_step))
            if gaps[j] > limit:
                state.silences.append(_Silence(i, i + 1, float(gaps[j]), usual,
                                               longest_before, limit))
        if len(gaps):
            state.longest = max(state.longest, float(counted.max()))
        state.judged = len(times)

    def _limit(self, usual: float, longest: float) -> float:
        return max(self.min_silence, self.factor * usual, self.gap_margin * longest)

    def _usual(self, beats: np.ndarray, at: float) -> float | None:
        """The median of the last intervals between heartbeats that ended by ``at``."""
        end = int(np.searchsorted(beats, at, side="right"))  # beats[:end] are by ``at``
        known = np.diff(beats[max(0, end - 1 - _INTERVAL_WINDOW):end])  # distinct: all > 0
        return float(np.median(known)) if len(known) >= self.min_points - 1 else None

    def _current_silence(self, data: RunData, now: float, times: np.ndarray, top: int,
                         beats: np.ndarray, longest: float,
                         status: str | None, due_floor: float) -> _Silence | None:
        if status == "finished" or _reached_total(data.meta, top):
            return None
        length = now - float(times[-1])
        usual = self._usual(beats, float(times[-1]))
        if usual is None:
            return None
        limit = (self.factor * usual if status == "failed"
                 else max(self._limit(usual, longest), due_floor))
        if length <= limit:
            return None
        return _Silence(len(times) - 1, None, length, usual, longest, limit)

    def _finding(self, data: RunData, times: np.ndarray, time_steps: np.ndarray,
                 silence: _Silence, now: float, status: str | None) -> Finding:
        step = int(time_steps[silence.before])
        latest = _latest_checkpoint(data.checkpoints, step)
        summary = (f"no new point for {fmt_duration(silence.length)} since step {step} (usual "
                   f"interval {fmt_duration(silence.usual)}; limit {fmt_duration(silence.limit)})")
        resumed_at = None
        if silence.after is None:
            summary += ("; resume from the latest checkpoint, "
                        f"{latest.path} at step {latest.step}" if latest is not None
                        else "; no checkpoint is known to resume from")
            if status == "failed":
                summary += f"; the run's status is {data.meta.get('status')!r}"
        else:
            resumed_at = int(time_steps[silence.after])
            summary += f"; it went on at step {resumed_at}"
        evidence: dict[str, Any] = {
            "last_step": step,
            "last_wall_time": float(times[silence.before]),
            "silence_s": silence.length,
            "usual_interval_s": silence.usual,
            "longest_earlier_pause_s": silence.longest,
            "limit_s": silence.limit,
            "latest_checkpoint": None if latest is None else [latest.step, latest.path],
        }
        if silence.after is None:
            evidence.update(now=now, status=data.meta.get("status"))
        else:
            evidence["resumed_at_step"] = resumed_at
        return self.finding(
            data, severity="critical" if silence.after is None and status == "failed"
            else "warning",
            onset_step=step, detected_step=step, summary=summary, evidence=evidence,
            rollback_to=None,
            resolved_step=None if resumed_at is None else max(resumed_at, step))


@dataclass(frozen=True)
class _Due:
    """The steps at which the config schedules a pause (every ``every[k]`` steps), and the
    limit's floor for a silence that starts at one of them."""

    every: tuple[int, ...]
    allowance: float

    def floor(self, step: int, judged_step: int | None) -> float:
        """``allowance`` when ``step`` is scheduled and the run has not been judged through
        an earlier scheduled step of the same kind (its pause is not known yet), else 0."""
        if judged_step is None:
            return 0.0
        return self.allowance if any(step % e == 0 and step - e < judged_step
                                     for e in self.every) else 0.0


def _scheduled(meta: dict[str, Any]) -> tuple[int, ...]:
    """The evaluation and save intervals the config declares, in steps (``eval_steps`` /
    ``save_steps``, numbers or numbers as text as MLflow stores params; a value under 1 is
    a share of ``total_steps``, as Hugging Face reads it); anything else is ignored."""
    config = meta.get("config") if isinstance(meta, dict) else None
    if not isinstance(config, dict):
        return ()
    total = config_number(meta.get("total_steps"))
    every = []
    for key in ("eval_steps", "save_steps"):
        value = config_number(config.get(key))
        if value is not None and 0 < value < 1 and total is not None:
            value = math.ceil(value * total)
        if value is not None and value >= 1 and value == int(value):
            every.append(int(value))
    return tuple(every)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _status(meta: dict[str, Any]) -> str | None:
    """``failed``, ``finished`` or None (running, or unknown) from the run's metadata."""
    status = meta.get("status") if isinstance(meta, dict) else None
    if isinstance(status, str) and _FAILED.search(status):
        return "failed"
    if isinstance(status, str) and _FINISHED.search(status):
        return "finished"
    if isinstance(meta, dict) and meta.get("ended_at"):
        return "finished"
    return None


def _reached_total(meta: dict[str, Any], last_step: int) -> bool:
    total = meta.get("total_steps") if isinstance(meta, dict) else None
    return (isinstance(total, (int, float)) and not isinstance(total, bool)
            and math.isfinite(total) and total > 0 and last_step >= total)


def _latest_checkpoint(checkpoints: list[Checkpoint], step: int) -> Checkpoint | None:
    before = [c for c in checkpoints if c.step <= step]
    return max(before, key=lambda c: c.step) if before else None


