"""The source contract: every metric source, whatever it reads, hands runwatch the same thing.

A :class:`Source` is something configured (a file, a folder, a TensorBoard logdir, an MLflow
experiment…). ``discover()`` lists the runs it holds now; each is a :class:`RunReader` whose
``read(cursor)`` returns a :class:`Batch`: the points since the cursor as one long frame
(``step, tag, value, wall_time``, tags already canonical), in the order they were logged,
with the cursor to pass next time. Sources never touch the store; the bot persists the batch
and its cursor together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from analyzers.base import METRIC_COLUMNS, Checkpoint


class SourceMissing(FileNotFoundError):
    """The configured path does not exist (yet); the caller reports it once and retries."""


class SourceUnavailable(ConnectionError):
    """A server behind the source cannot be reached; the caller backs off and retries."""


_EMPTY_POINTS = pd.DataFrame(columns=METRIC_COLUMNS)


def empty_points() -> pd.DataFrame:
    """The frame of a read that found nothing; shared, since most polls find nothing and
    building a frame costs more than reading an unchanged file (treat it as read-only)."""
    return _EMPTY_POINTS


@dataclass
class Batch:
    """What one read produced: new points in logged order and everything learned on the way."""

    run: str
    cursor: dict[str, Any]
    points: pd.DataFrame = field(default_factory=empty_points)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    malformed: list[tuple[int, str]] = field(default_factory=list)
    skipped_values: int = 0
    notices: list[str] = field(default_factory=list)


class RunReader(Protocol):
    run: str

    @property
    def key(self) -> str:
        """Identifies the cursor in the store: stable across restarts, unique per run."""

    def read(self, cursor: dict[str, Any] | None = None, *, final: bool = False) -> Batch:
        """Points since ``cursor``. ``final``: the run is finished, take everything."""


class Source(Protocol):
    @property
    def uri(self) -> str:
        """How the source is shown to people (``runwatch sources``)."""

    def discover(self) -> list[RunReader]:
        """The runs it holds now; raises SourceMissing or SourceUnavailable."""
