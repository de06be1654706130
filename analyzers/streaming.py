"""Streaming state: an analyzer resumes from where it stopped on the last poll instead of
re-reading a run's whole history, so the cost of new points does not grow with history.

Analyzers stay pure functions of a run's data: the state only saves work. Each analyzer
keeps a :class:`Streams` (one entry per run and attempt) holding what it had settled after
the last analysed point (closed episodes, a position it can resume from, running
measures). Before the state is reused, the run's current history must start with exactly
the points it was built from (a CRC over steps and values, :meth:`RunData.digest`); a
history that was rewritten, shortened or belongs to another run of the same name is
recomputed from scratch, which gives the same findings as resuming.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from analyzers.base import RunData
from analyzers.stats.text import evaluation_rows

StateT = TypeVar("StateT")


@dataclass
class _Entry(Generic[StateT]):
    lengths: dict[str, int]
    digests: dict[str, int]
    state: StateT


class Streams(Generic[StateT]):
    """The settled state of one analyzer per (run, attempt), least recently used dropped
    beyond ``limit`` runs.

    >>> import numpy as np
    >>> streams = Streams()
    >>> data = RunData.from_series("r", {"train/loss": np.arange(5.0)})
    >>> streams.resume(data, ("train/loss",)) is None
    True
    >>> streams.save(data, ("train/loss",), {"seen": 5})
    >>> longer = RunData.from_series("r", {"train/loss": np.arange(8.0)})
    >>> streams.resume(longer, ("train/loss",))
    {'seen': 5}
    >>> rewritten = RunData.from_series("r", {"train/loss": np.arange(8.0)[::-1]})
    >>> streams.resume(rewritten, ("train/loss",)) is None
    True
    """

    def __init__(self, limit: int = 2048) -> None:  # a thousand-run team's every run
        self.limit = limit
        self._entries: OrderedDict[tuple[str, int], _Entry[StateT]] = OrderedDict()

    def resume(self, data: RunData, tags: tuple[str, ...]) -> StateT | None:
        """The state saved for this run and attempt, if its history of every tag in
        ``tags`` still starts with the points the state was built from; else None."""
        key = (data.run, data.attempt)
        entry = self._entries.get(key)
        if entry is None or set(entry.lengths) != set(tags):
            return None
        for tag in tags:
            if data.digest(tag, entry.lengths[tag]) != entry.digests[tag]:
                del self._entries[key]
                return None
        self._entries.move_to_end(key)
        return entry.state

    def save(self, data: RunData, tags: tuple[str, ...], state: StateT) -> None:
        """Keep ``state`` as built from the whole current history of ``tags``."""
        lengths = {tag: len(data.series(tag)) for tag in tags}
        digests = {tag: data.digest(tag, lengths[tag]) for tag in tags}
        self._entries[(data.run, data.attempt)] = _Entry(lengths, digests, state)
        self._entries.move_to_end((data.run, data.attempt))
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)


class FiniteIndex:
    """Maps the finite points of a series (numbered 0, 1, … skipping NaN/Inf) to their
    positions, learning the non-finite positions a poll at a time.

    >>> index = FiniteIndex()
    >>> index.extend(np.array([1.0, np.nan, 2.0, np.inf, 3.0]))
    3
    >>> index.positions(0, 3).tolist()
    [0, 2, 4]
    """

    def __init__(self) -> None:
        self.seen = 0
        self._gaps = np.empty(0, dtype=np.int64)  # positions of the non-finite points
        self._gap_index = np.empty(0, dtype=np.int64)

    @property
    def count(self) -> int:
        """The finite points among those seen."""
        return self.seen - len(self._gaps)

    def extend(self, values: np.ndarray) -> int:
        """Learn the points after the ones seen; the number of finite points in all."""
        new = self.seen + np.flatnonzero(~np.isfinite(values[self.seen:]))
        if new.size:
            self._gaps = np.concatenate((self._gaps, new))
            # The j-th gap sits just before finite index gaps[j] - j.
            self._gap_index = self._gaps - np.arange(len(self._gaps))
        self.seen = len(values)
        return self.count

    def positions(self, lo: int, hi: int) -> np.ndarray:
        """Series positions of finite points lo … hi - 1."""
        return self.position_of(np.arange(lo, hi))

    def position_of(self, k: np.ndarray) -> np.ndarray:
        """Series positions of the finite points numbered ``k`` (any shape).

        >>> index = FiniteIndex()
        >>> index.extend(np.array([1.0, np.nan, 2.0, 3.0]))
        3
        >>> index.position_of(np.array([[2, 0]])).tolist(), index.finite_before(
        ...     np.array([1, 2, 4])).tolist()
        ([[3, 0]], [1, 1, 3])
        """
        return k + np.searchsorted(self._gap_index, k, side="right")

    def finite_before(self, ends: np.ndarray) -> np.ndarray:
        """How many finite points lie among the first ``ends`` positions of the series."""
        return ends - np.searchsorted(self._gaps, ends, side="left")


class Buffer:
    """A one-dimensional array that grows by doubling, so appending a poll's values costs
    what they cost, not what the history does.

    >>> buffer = Buffer()
    >>> buffer.extend(np.array([1.0, 2.0]))
    >>> buffer.extend(np.array([3.0]))
    >>> buffer.view.tolist(), len(buffer), float(buffer[-1])
    ([1.0, 2.0, 3.0], 3, 3.0)
    """

    def __init__(self, dtype: type = float) -> None:
        self._data = np.empty(16, dtype=dtype)
        self.n = 0

    def extend(self, values: np.ndarray) -> None:
        end = self.n + len(values)
        if end > len(self._data):
            grown = np.empty(max(2 * len(self._data), 2 * end), dtype=self._data.dtype)
            grown[:self.n] = self._data[:self.n]
            self._data = grown
        self._data[self.n:end] = values
        self.n = end

    @property
    def view(self) -> np.ndarray:
        """The values so far (a view: valid until the next ``extend``)."""
        return self._data[:self.n]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        return self.view[index]

    def __setitem__(self, index: int, value: Any) -> None:
        self.view[index] = value


# An analyzer's evaluations of one run and attempt as of its last poll: the parameters they
# were judged with, and per step the rows' fingerprint and the evaluation (None: skipped).
EvaluationCache = tuple[Any, dict[int, tuple[tuple[int, int], Any]]]


def cached_evaluations(streams: Streams[EvaluationCache], data: RunData,
                       evaluate: Callable[[int, list[str], list[str]], Any | None],
                       params: Any, *, probes_only: bool = False) -> list[Any]:
    """``evaluate(step, prompts, outputs)`` of each evaluation of ``data.generations``
    (:func:`analyzers.stats.text.evaluation_rows`), ascending, leaving out the evaluations it
    returns None for, judging again only the evaluations whose rows changed since this run
    and attempt's last poll.

    A watcher's poll hands the attempt's whole generations again, so reading every output
    each time makes a poll's cost grow with the history. An evaluation is taken from the
    last poll when its step, row count and a hash of its prompts and outputs (in order)
    are the same and ``params`` (what ``evaluate`` depends on besides the rows) too; a
    poll then only hashes the older rows, at memory speed, and reads the new ones.
    """
    saved = streams.resume(data, ())
    known = saved[1] if saved is not None and saved[0] == params else {}
    cache: dict[int, tuple[tuple[int, int], Any]] = {}
    judged = []
    for step, prompts, outputs in evaluation_rows(data.generations, probes_only):
        key = (len(outputs), hash((tuple(prompts), tuple(outputs))))
        hit = known.get(step)
        result = hit[1] if hit is not None and hit[0] == key else evaluate(step, prompts,
                                                                          outputs)
        cache[step] = (key, result)
        if result is not None:
            judged.append(result)
    streams.save(data, (), (params, cache))
    return judged
