"""The analyzer contract: a run's data in (:class:`RunData`, its checkpoints and
generations), findings (:mod:`analyzers.finding`) out.

Analyzers are pure: ``detect(data)`` reads a :class:`RunData` and returns every finding
(firing or already resolved) that the current attempt's history supports. They never
touch the store, Slack or a process; a fix is a *request* that only ``connectors`` can
carry out after a person confirms.
"""

from __future__ import annotations

import math
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from analyzers.catalog import CATALOG
from analyzers.finding import Finding, RollbackTarget, Severity

METRIC_COLUMNS = ["step", "tag", "value", "wall_time"]
# Logged sample generations: one row per output; ``probe`` (optional) marks the rows of a
# fixed benign probe set.
GENERATION_COLUMNS = ["step", "prompt", "output"]


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str
    wall_time: float | None = None


def generations_frame(rows: pd.DataFrame | list[dict[str, Any]] | None = None) -> pd.DataFrame:
    """Sample generations as analyzers read them: ``step`` (int), ``prompt`` and ``output``
    (text; a missing one is empty), and ``probe`` (bool) when any row has it.

    A row without a usable step (a non-negative whole number below 2**63) is dropped; rows
    that lack ``probe`` (missing or null) while others have it are not probes, and when no
    row has it there is no ``probe`` column. A row that repeats an earlier one (same step,
    prompt, output and ``probe``) is dropped, so a log read or concatenated twice counts
    once: different outputs to one prompt at one step are samples and all count, but
    identical samples of one prompt count once, as they cannot be told from a row read
    twice.

    >>> frame = generations_frame([{"step": 2, "prompt": "hi", "output": "hello"},
    ...                            {"step": "1", "output": None, "probe": True}])
    >>> frame.to_dict("records")  # doctest: +NORMALIZE_WHITESPACE
    [{'step': 2, 'prompt': 'hi', 'output': 'hello', 'probe': False},
     {'step': 1, 'prompt': '', 'output': '', 'probe': True}]
    """
    frame = pd.DataFrame(rows if rows is not None else [])
    has_probe = "probe" in frame.columns and bool(frame["probe"].notna().any())
    for column in GENERATION_COLUMNS:
        if column not in frame.columns:
            frame[column] = pd.Series(dtype=object)
    steps = pd.to_numeric(frame["step"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        keep = (np.isfinite(steps) & (steps >= 0) & (steps < 2.0**63)
                & (steps == np.round(steps)))
    out = pd.DataFrame({
        "step": steps[keep].astype("int64"),
        "prompt": pd.Series([_text(v) for v in frame["prompt"].to_numpy()[keep]], dtype=object),
        "output": pd.Series([_text(v) for v in frame["output"].to_numpy()[keep]], dtype=object),
    })
    if has_probe:
        out["probe"] = [_flag(v) for v in frame["probe"].to_numpy()[keep]]
    return out.drop_duplicates(ignore_index=True)


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value if isinstance(value, str) else str(value)


def _flag(value: Any) -> bool:
    """``true``/``1``/``yes`` (any case) and non-zero numbers; everything else is false."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "y")
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return isinstance(value, Real) and math.isfinite(value) and value != 0


def _room(points: int) -> int:
    """A column's capacity for ``points``: a quarter more (at least 64) for the points later
    polls append, so a thousand cached runs do not hold twice their history.

    >>> _room(10), _room(2000)
    (74, 2500)
    """
    return points + max(64, points // 4)


class _Column:
    """One tag's points of a live attempt, ascending by step, in buffers that grow by
    doubling, so appending a poll's points costs what they cost, not what the history does.

    Columns are forked from one :class:`RunData` to the next; the newest fork owns the
    buffers and appends in place (older forks only ever see their own first ``n`` points);
    anything else that must write copies first.
    """

    __slots__ = ("steps", "values", "walls", "n", "wall_max", "_owner")

    def __init__(self, steps: np.ndarray, values: np.ndarray, walls: np.ndarray) -> None:
        capacity = _room(len(steps))
        self.steps = np.empty(capacity, dtype=np.int64)
        self.values = np.empty(capacity, dtype=float)
        self.walls = np.empty(capacity, dtype=float)
        self.n = len(steps)
        self.steps[:self.n], self.values[:self.n], self.walls[:self.n] = steps, values, walls
        finite = walls[np.isfinite(walls)]
        self.wall_max = float(finite.max()) if len(finite) else -math.inf
        self._owner = [self]

    def fork(self) -> _Column:
        child = object.__new__(_Column)
        child.steps, child.values, child.walls = self.steps, self.values, self.walls
        child.n, child.wall_max = self.n, self.wall_max
        if self._owner[0] is self:  # the newest fork writes in place; a second one copies
            child._owner = self._owner
            self._owner[0] = child
        else:
            child._owner = [None]
        return child

    def _writable(self, capacity: int) -> None:
        if self._owner[0] is self and capacity <= len(self.steps):
            return
        size = _room(capacity)
        for name in ("steps", "values", "walls"):
            old = getattr(self, name)
            new = np.empty(size, dtype=old.dtype)
            new[:self.n] = old[:self.n]
            setattr(self, name, new)
        self._owner = [self]

    def append(self, steps: np.ndarray, values: np.ndarray, walls: np.ndarray) -> int | None:
        """Add points (ascending, unique steps) logged after the column's; a first step
        equal to the last one logged replaces it. Returns the index of the first point that
        changed (``n`` when nothing before was touched), or None when the points go back
        before the last step (the caller reads the attempt again)."""
        if not len(steps):
            return self.n
        first = self.n
        if self.n and steps[0] <= self.steps[self.n - 1]:
            if steps[0] < self.steps[self.n - 1]:
                return None
            same = (values[0] == self.values[self.n - 1]
                    or (math.isnan(values[0]) and math.isnan(self.values[self.n - 1])))
            same_wall = (walls[0] == self.walls[self.n - 1]
                         or (math.isnan(walls[0]) and math.isnan(self.walls[self.n - 1])))
            if same and same_wall:
                steps, values, walls = steps[1:], values[1:], walls[1:]
            else:
                first = self.n - 1
                self._owner = [None]  # the point older forks hold changes: copy first
        end = first + len(steps)
        self._writable(end)
        self.steps[first:end], self.values[first:end], self.walls[first:end] = \
            steps, values, walls
        self.n = end
        finite = walls[np.isfinite(walls)]
        if len(finite):
            self.wall_max = max(self.wall_max, float(finite.max()))
        return first


def _sorted_unique(steps: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """Points ordered by step; a repeated step keeps its last value."""
    if steps.size > 1 and not bool(np.all(steps[1:] > steps[:-1])):
        order = np.argsort(steps, kind="stable")
        steps = steps[order]
        columns = tuple(c[order] for c in columns)
        last = np.ones(len(steps), dtype=bool)
        last[:-1] = steps[1:] != steps[:-1]
        steps = steps[last]
        columns = tuple(c[last] for c in columns)
    return (steps, *columns)


@dataclass
class RunData:
    """The current attempt of one run, as the store hands it to analyzers.

    ``metrics`` is the normalised long frame (``step, tag, value, wall_time``) of this
    attempt only; non-finite values are kept, they are a signal. ``generations`` holds the
    sample generations logged at evaluations (see :func:`generations_frame`). ``now`` is
    the wall-clock time (Unix seconds) of the analysis, passed by a live watcher; it is
    ``None`` for a finished log analysed after the fact, and then nothing time-based (a
    stall) is judged.
    """

    run: str
    metrics: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=METRIC_COLUMNS))
    attempt: int = 1
    checkpoints: list[Checkpoint] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    generations: pd.DataFrame = field(default_factory=generations_frame)
    now: float | None = None
    _series: dict[str, pd.Series] = field(default_factory=dict, init=False, repr=False,
                                          compare=False)
    _walls: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False,
                                          compare=False)
    _rows: dict[str, np.ndarray | slice] | None = field(default=None, init=False, repr=False,
                                                compare=False)
    _digests: dict[tuple[str, int], int] = field(default_factory=dict, init=False, repr=False,
                                                 compare=False)
    # A live attempt (see :meth:`extended`) keeps its points per tag; its long frame is
    # only built when something asks for ``metrics``.
    _columns: dict[str, _Column] | None = field(default=None, init=False, repr=False,
                                                compare=False)

    @classmethod
    def from_series(
        cls,
        run: str,
        series: dict[str, list[float] | np.ndarray | pd.Series],
        *,
        steps: list[int] | np.ndarray | None = None,
        checkpoints: list[Checkpoint] | None = None,
        meta: dict[str, Any] | None = None,
        generations: pd.DataFrame | list[dict[str, Any]] | None = None,
        now: float | None = None,
    ) -> RunData:
        """Build run data from plain sequences; steps default to 1, 2, 3, …

        ``generations`` is a list of ``{"step", "prompt", "output"[, "probe"]}`` dicts (or
        a frame with those columns).
        """
        frames = []
        for tag, values in series.items():
            if isinstance(values, pd.Series):
                frames.append(pd.DataFrame({"step": values.index, "tag": tag,
                                            "value": values.to_numpy(dtype=float)}))
                continue
            values = np.asarray(values, dtype=float)
            idx = (np.arange(1, len(values) + 1) if steps is None
                   else np.asarray(steps)[: len(values)])
            frames.append(pd.DataFrame({"step": idx, "tag": tag, "value": values}))
        frame = (pd.concat(frames, ignore_index=True) if frames
                 else pd.DataFrame(columns=METRIC_COLUMNS))
        frame["wall_time"] = np.nan
        return cls(run=run, metrics=frame[METRIC_COLUMNS], checkpoints=checkpoints or [],
                   meta=meta or {}, generations=generations_frame(generations), now=now)

    def tags(self) -> list[str]:
        if self._columns is not None:
            return sorted(t for t, c in self._columns.items() if c.n)
        return sorted(self._tag_rows())

    def series(self, tag: str) -> pd.Series:
        """Values of one tag indexed by step, ascending; a repeated step keeps its last value.

        Run data is read-only once built, so each tag is extracted once, from one grouping
        of the frame's rows by tag (several analyzers ask for the same tags on every poll,
        and comparing a million-row text column once per tag costs more than analysing it).
        """
        cached = self._series.get(tag)
        if cached is not None:
            return cached
        if self._columns is not None:
            column = self._columns.get(tag)
            n = column.n if column is not None else 0
            steps = column.steps[:n] if column is not None else np.empty(0, dtype=np.int64)
            values = column.values[:n] if column is not None else np.empty(0)
            walls = column.walls[:n] if column is not None else np.empty(0)
        else:
            rows = self._tag_rows().get(tag, slice(0, 0))
            steps = self.metrics["step"].to_numpy()[rows].astype("int64", copy=False)
            values = self.metrics["value"].to_numpy(dtype=float)[rows]
            walls = self.metrics["wall_time"].to_numpy(dtype=float)[rows] \
                if "wall_time" in self.metrics else np.full(len(steps), np.nan)
            steps, values, walls = _sorted_unique(steps, values, walls)
        series = pd.Series(values, index=pd.Index(steps, dtype="int64", name="step", copy=False),
                           dtype=float, copy=False)
        self._series[tag] = series
        self._walls[tag] = walls
        return series

    @property
    def live(self) -> bool:
        """Whether this is a watcher's attempt extended poll by poll (:meth:`extended`): its
        points are kept per tag, each tag ascending by step; otherwise the long frame as
        it was built (rows in any order, a step may repeat)."""
        return self._columns is not None and self.__dict__.get("_frame") is None

    def wall_times(self, tag: str) -> np.ndarray:
        """The wall time (Unix seconds, NaN when unknown) of each point of :meth:`series`."""
        self.series(tag)
        return self._walls[tag]

    def last_wall(self) -> float | None:
        """The latest wall time logged in this attempt, or None."""
        if self._columns is not None:
            latest = max((c.wall_max for c in self._columns.values()), default=-math.inf)
            return latest if math.isfinite(latest) else None
        walls = self.metrics["wall_time"].to_numpy(dtype=float)
        walls = walls[np.isfinite(walls)]
        return float(walls.max()) if len(walls) else None

    def extended(self, points: pd.DataFrame, **changes: Any) -> RunData | None:
        """This attempt with ``points`` (``step, tag, value, wall_time``) logged since: a
        new run data that shares the history already read, so a watcher's poll costs what
        its new points do, however long the run. ``changes`` replace other fields
        (``checkpoints``, ``meta``, ``generations``, ``now``).

        A point may repeat the last step of its tag (the newer value wins); one before it
        means the history was rewritten: returns None, read the attempt again. Checksums of
        unchanged history prefixes (:meth:`digest`) carry over.

        >>> data = RunData.from_series("r", {"loss": [3.0, 2.0]})
        >>> more = pd.DataFrame({"step": [2, 3], "tag": "loss", "value": [1.5, 1.0],
        ...                      "wall_time": float("nan")})
        >>> data.extended(more).series("loss").tolist()
        [3.0, 1.5, 1.0]
        >>> data.extended(more.assign(step=[1, 3])) is None
        True
        """
        columns = {tag: column.fork() for tag, column in self._own_columns().items()}
        first_changed: dict[str, int] = {}
        if len(points):
            frame = points.sort_values(["tag", "step"], kind="stable")
            tags = frame["tag"].to_numpy()
            bounds = np.flatnonzero(tags[1:] != tags[:-1]) + 1
            steps_all = frame["step"].to_numpy().astype(np.int64)
            values_all = frame["value"].to_numpy(dtype=float)
            walls_all = frame["wall_time"].to_numpy(dtype=float)
            for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(frame)], strict=True):
                tag = str(tags[lo])
                steps, values, walls = _sorted_unique(steps_all[lo:hi], values_all[lo:hi],
                                                      walls_all[lo:hi])
                if tag not in columns:
                    columns[tag] = _Column(steps, values, walls)
                    first_changed[tag] = 0
                    continue
                changed = columns[tag].append(steps, values, walls)
                if changed is None:
                    return None
                first_changed[tag] = changed
        fields = {"run": self.run, "attempt": self.attempt, "checkpoints": self.checkpoints,
                  "meta": self.meta, "generations": self.generations, "now": self.now}
        fields.update(changes)
        out = RunData(metrics=None, **fields)  # type: ignore[arg-type]
        out._columns = columns
        for tag in columns:
            if tag not in first_changed and tag in self._series:
                out._series[tag], out._walls[tag] = self._series[tag], self._walls[tag]
        # The checksums still true, the two longest per tag (a poll's analyzers ask for
        # the lengths the previous poll saved; older ones would only pile up).
        kept = sorted((n, tag) for tag, n in self._digests if n <= first_changed.get(tag, n))
        per_tag: dict[str, int] = {}
        for n, tag in reversed(kept):
            per_tag[tag] = per_tag.get(tag, 0) + 1
            if per_tag[tag] <= 2:
                out._digests[(tag, n)] = self._digests[(tag, n)]
        return out

    def _own_columns(self) -> dict[str, _Column]:
        """The points per tag as columns (built once from the frame of a stored attempt)."""
        if self._columns is None:
            self._columns = {tag: _Column(self.series(tag).index.to_numpy(),
                                          self.series(tag).to_numpy(), self.wall_times(tag))
                             for tag in self.tags()}
        return self._columns

    def _tag_rows(self) -> dict[str, np.ndarray | slice]:
        """The frame's rows of each tag, in frame order (computed once): a slice when the
        frame is grouped by tag, as the store and :meth:`from_series` build it."""
        if self._rows is None:
            codes, names = pd.factorize(self.metrics["tag"], use_na_sentinel=True)
            codes = np.asarray(codes)
            grouped = bool(np.all(codes[1:] >= codes[:-1]))
            order = None if grouped else np.argsort(codes, kind="stable")
            ordered = codes if order is None else codes[order]
            bounds = np.searchsorted(ordered, np.arange(len(names) + 1)).tolist()
            self._rows = {str(name): (slice(bounds[k], bounds[k + 1]) if order is None
                                      else order[bounds[k]:bounds[k + 1]])
                          for k, name in enumerate(names)}
        return self._rows

    def digest(self, tag: str, points: int) -> int:
        """A checksum of the first ``points`` points (steps and values) of :meth:`series`
        (-1 when there are fewer).

        Streaming analyzers compare it with the checksum of the history they analysed last
        time, so a history that was rewritten rather than extended is recomputed. It reads
        the history at memory speed, once per tag and length for every analyzer, and
        continues from a shorter prefix already summed (a CRC-32 extends).
        """
        key = (tag, points)
        cached = self._digests.get(key)
        if cached is not None:
            return cached
        series = self.series(tag)
        if points > len(series):
            return -1
        known = [n for (t, n) in self._digests if t == tag and n <= points]
        start = max(known, default=0)
        crc_steps, crc_values = divmod(self._digests[(tag, start)], 1 << 32) if start else (0, 0)
        steps = np.ascontiguousarray(series.index.to_numpy(dtype=np.int64)[start:points])
        values = np.ascontiguousarray(series.to_numpy(dtype=float)[start:points])
        cached = (zlib.crc32(steps, crc_steps) << 32) | zlib.crc32(values, crc_values)
        self._digests[key] = cached
        return cached

    def points(self) -> int:
        """How many points the attempt holds, over every tag (cheap: no frame is built)."""
        if self._columns is not None:
            return sum(c.n for c in self._columns.values())
        return len(self.metrics)

    def last_step(self) -> int | None:
        if self._columns is not None:
            last = [int(c.steps[c.n - 1]) for c in self._columns.values() if c.n]
            return max(last) if last else None
        return int(self.metrics["step"].max()) if len(self.metrics) else None


def _get_metrics(self: RunData) -> pd.DataFrame:
    frame = self.__dict__.get("_frame")
    if frame is None:
        columns = self._columns or {}
        parts = [pd.DataFrame({"step": c.steps[:c.n].copy(), "tag": tag,
                               "value": c.values[:c.n].copy(), "wall_time": c.walls[:c.n].copy()})
                 for tag, c in sorted(columns.items()) if c.n]
        frame = (pd.concat(parts, ignore_index=True) if parts
                 else pd.DataFrame(columns=METRIC_COLUMNS))
        self.__dict__["_frame"] = frame
    return frame


def _set_metrics(self: RunData, frame: pd.DataFrame | None) -> None:
    self.__dict__["_frame"] = frame


# ``metrics`` is a dataclass field (passed to the constructor) read through a property: a
# live attempt built by :meth:`RunData.extended` has no long frame until one is asked for.
RunData.metrics = property(_get_metrics, _set_metrics,  # type: ignore[assignment]
                           doc="The attempt's long frame (step, tag, value, wall_time).")


def rollback_target(checkpoints: list[Checkpoint], onset_step: int,
                    margin: int = 1) -> RollbackTarget | None:
    """The latest checkpoint strictly before ``onset_step - margin``.

    The loss logged at step ``s`` was computed with the weights that the update of step
    ``s - 1`` produced, so with the default margin of one step neither the checkpoint at
    the onset nor the one just before it (which may hold the update that caused the
    trouble, e.g. a too-large learning rate) is offered.

    >>> cps = [Checkpoint(100, "ckpt/checkpoint-100"), Checkpoint(200, "ckpt/checkpoint-200")]
    >>> rollback_target(cps, 250).step
    200
    >>> rollback_target(cps, 201).step
    100
    >>> rollback_target(cps, 101) is None
    True
    """
    limit = onset_step - margin
    before = [c for c in checkpoints if c.step < limit]
    if not before:
        return None
    best = max(before, key=lambda c: c.step)
    return RollbackTarget(
        step=best.step,
        path=best.path,
        reason=(f"latest checkpoint at least {margin + 1} steps before the onset at step "
                f"{onset_step}" if margin else
                f"latest checkpoint before the onset at step {onset_step}"),
    )


def checkpoint_at_or_before(checkpoints: list[Checkpoint], step: int,
                            reason: str) -> RollbackTarget | None:
    """The latest checkpoint at or before ``step`` (a known-good evaluation), with the reason
    it is offered; None when there is none.

    >>> cps = [Checkpoint(100, "ckpt/checkpoint-100"), Checkpoint(200, "ckpt/checkpoint-200")]
    >>> checkpoint_at_or_before(cps, 200, "best eval").step
    200
    >>> checkpoint_at_or_before(cps, 99, "best eval") is None
    True
    """
    at_or_before = [c for c in checkpoints if c.step <= step]
    if not at_or_before:
        return None
    best = max(at_or_before, key=lambda c: c.step)
    return RollbackTarget(step=best.step, path=best.path, reason=reason)


BEFORE_ONSET = object()  # Analyzer.finding's default: roll back to before the onset


REJUDGE_MAX_POINTS = 50


class Analyzer(ABC):
    """Base class: subclasses set ``signal`` and implement :meth:`detect`.

    Constructor parameters are stored unchanged under their own names; bad values raise
    ``ValueError`` at construction, naming the parameter.
    """

    signal: ClassVar[str]
    metric: str
    # A watcher judges the signal again once the attempt has this share more points than
    # when it last judged it (at most REJUDGE_MAX_POINTS more): a slow signal whose scan
    # costs the whole look-back, judged every poll on a thousand runs, would cost the most
    # and change the least. 0: every poll. (A finished log is judged whole, as always.)
    rejudge_share: ClassVar[float] = 0.0

    @abstractmethod
    def detect(self, data: RunData) -> list[Finding]:
        """Every finding the current attempt supports, firing or resolved, oldest first."""

    def finding(self, data: RunData, *, onset_step: int, detected_step: int, summary: str,
                evidence: dict[str, Any], resolved_step: int | None = None,
                severity: Severity = "warning", metric: str | None = None,
                rollback_to: RollbackTarget | None | object = BEFORE_ONSET,
                eval_only: bool = False) -> Finding:
        """A finding of this signal: identity from the run, fixes, kind and source from the
        catalog (its ``eval_fixes`` when ``eval_only``: the trouble is in an evaluation
        metric alone), state from ``resolved_step``; the rollback target defaults to the
        latest checkpoint before the onset (pass ``None`` where rolling back would not
        help)."""
        spec = CATALOG[self.signal]
        return Finding(
            run=data.run, attempt=data.attempt, signal=self.signal, severity=severity,
            metric=metric or self.metric, onset_step=onset_step, detected_step=detected_step,
            summary=summary, evidence=evidence,
            fixes=list(spec.eval_fixes if eval_only else spec.fixes), kind=spec.kind,
            source=spec.source,
            rollback_to=(rollback_target(data.checkpoints, onset_step)
                         if rollback_to is BEFORE_ONSET else rollback_to),
            state="firing" if resolved_step is None else "resolved",
            resolved_step=resolved_step)

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}
