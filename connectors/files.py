"""Log files: one JSON object per line, or CSV with a header, read incrementally.

A cursor (byte offset, line number, a digest of the first bytes, CSV header) says where the
last read stopped. Only complete lines are consumed: a partial last line waits for its
newline. A file that shrank, or whose beginning changed, is read again from the start with a
notice; a copy of the same log (rsync, rename) is read on from where it was.

Bad input never stops a read: a malformed line is counted with its line number and
skipped; ``nan``/``inf`` are values (a signal, not an error); a non-numeric value skips that
key only.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from analyzers.base import METRIC_COLUMNS, Checkpoint
from connectors.aliases import STEP, TIME, AliasTable
from connectors.base import Batch, RunReader, SourceMissing

LOG_SUFFIXES = (".jsonl", ".csv")
PREFERRED_LOG_NAMES = ("metrics.jsonl", "metrics.csv", "log.jsonl", "train.jsonl")
CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
NON_METRIC_KEYS = {"event", "path", "meta", STEP, TIME}
# The first bytes of a file identify its content: a log copied over by rsync or replaced by a
# rename with the same beginning is the same log, read on from where it was.
HEAD_BYTES = 4096


def _number(value: Any) -> float | None:
    """A float for numbers and numeric strings (``"nan"``, ``"inf"`` included), else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _step(value: Any) -> int | None:
    number = _number(value)
    if number is None or not math.isfinite(number) or number != int(number) or number < 0:
        return None
    return int(number)


class LogFile:
    """One run's metrics log (``.jsonl`` or ``.csv``)."""

    def __init__(self, path: str | os.PathLike[str], run: str, aliases: AliasTable | None = None,
                 *, discover_checkpoints: bool = True) -> None:
        self.path = Path(path)
        self.run = run
        self.aliases = aliases or AliasTable()
        self.discover_checkpoints = discover_checkpoints
        self.format = "csv" if self.path.suffix.lower() == ".csv" else "jsonl"

    @property
    def key(self) -> str:
        return f"file:{self.path.resolve()}"

    @property
    def uri(self) -> str:
        return str(self.path)

    def discover(self) -> list[RunReader]:
        """A single log file is a source holding one run."""
        if not self.path.is_file():
            raise SourceMissing(f"{self.path} does not exist (yet)")
        return [self]

    def __repr__(self) -> str:
        return f"LogFile({str(self.path)!r}, run={self.run!r})"

    def read(self, cursor: dict[str, Any] | None = None, *, final: bool = False) -> Batch:
        """New complete lines since ``cursor``; the returned batch carries the next cursor.

        ``final`` takes a last line without a newline too (a one-shot read of a finished log).
        """
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            raise SourceMissing(f"{self.path} does not exist") from None
        cursor = dict(cursor or {})
        notices: list[str] = []
        offset = cursor.get("offset", 0)
        with self.path.open("rb") as handle:
            head = _digest(handle.read(HEAD_BYTES)[: cursor.get("head_len", 0)])
            if cursor and (head != cursor.get("head") or stat.st_size < offset):
                why = (f"shrank to {stat.st_size} bytes from {offset}"
                       if stat.st_size < offset else "was replaced by another file")
                notices.append(f"{self.run}: {self.path.name} {why} (truncated or rotated); "
                               f"reading it again from the start")
                cursor = {}
                offset = 0
            handle.seek(offset)
            data = handle.read()
        line_no = cursor.get("line", 0)
        end = len(data) - 1 if final and data else data.rfind(b"\n")
        complete = data[: end + 1] if end >= 0 else b""
        rows: list[tuple[int, str, float, float | None]] = []
        batch = Batch(run=self.run, cursor={}, points=pd.DataFrame(columns=METRIC_COLUMNS),
                      notices=notices)
        header: list[str] | None = cursor.get("header")
        lines = complete.split(b"\n")
        for raw in lines if final else lines[:-1]:
            line_no += 1
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            if self.format == "csv":
                if header is None:
                    header = [h.strip() for h in next(csv.reader([text]))]
                    continue
                self._parse_csv(text, header, line_no, rows, batch)
            else:
                self._parse_json(text, line_no, rows, batch)
        new_offset = offset + len(complete)
        head_len = min(new_offset, HEAD_BYTES)
        with self.path.open("rb") as handle:
            batch.cursor = {"offset": new_offset, "line": line_no, "head_len": head_len,
                            "head": _digest(handle.read(head_len))}
        if header is not None:
            batch.cursor["header"] = header
        if rows:
            batch.points = pd.DataFrame(rows, columns=METRIC_COLUMNS)
        if self.discover_checkpoints:
            batch.checkpoints = self._merge_checkpoints(batch.checkpoints)
        return batch

    # parsing ------------------------------------------------------------------------------
    def _add_record(self, raw: dict[str, Any], line_no: int,
                    rows: list[tuple[int, str, float, float | None]], batch: Batch) -> None:
        record: dict[str, Any] = {}
        for key, value in raw.items():
            record.setdefault(self.aliases.canonical(key), value)
        if STEP not in record:
            batch.malformed.append((line_no, "no 'step' field (add an alias for the step key "
                                             "in [aliases] if it has another name)"))
            return
        step = _step(record[STEP])
        if step is None:
            batch.malformed.append((line_no, f"step {record[STEP]!r} is not a non-negative "
                                             f"integer"))
            return
        wall = _number(record.get(TIME))
        if record.get("event") == "checkpoint":
            path = record.get("path") or f"checkpoint-{step}"
            batch.checkpoints.append(Checkpoint(step, str(self.path.parent / path), wall))
            return
        for key, value in record.items():
            if key in NON_METRIC_KEYS:
                continue
            number = _number(value)
            if number is None:
                batch.skipped_values += 1
                continue
            rows.append((step, key, number, wall))

    def _parse_json(self, text: str, line_no: int,
                    rows: list[tuple[int, str, float, float | None]], batch: Batch) -> None:
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            batch.malformed.append((line_no, f"not JSON ({exc.msg})"))
            return
        if not isinstance(record, dict):
            batch.malformed.append((line_no, "not a JSON object"))
            return
        if "meta" in record and not any(self.aliases.canonical(k) == STEP for k in record):
            if isinstance(record["meta"], dict):
                batch.meta.update(record["meta"])
            else:
                batch.malformed.append((line_no, "'meta' is not an object"))
            return
        self._add_record(record, line_no, rows, batch)

    def _parse_csv(self, text: str, header: list[str], line_no: int,
                   rows: list[tuple[int, str, float, float | None]], batch: Batch) -> None:
        values = next(csv.reader([text]))
        if len(values) != len(header):
            batch.malformed.append((line_no, f"{len(values)} fields, the header has "
                                             f"{len(header)}"))
            return
        record = {k: v for k, v in zip(header, values, strict=True) if v.strip() != ""}
        self._add_record(record, line_no, rows, batch)

    def _merge_checkpoints(self, from_events: list[Checkpoint]) -> list[Checkpoint]:
        found = {c.step: c for c in iter_checkpoint_dirs(self.path.parent)}
        for c in from_events:
            found.setdefault(c.step, c)
        return sorted(found.values(), key=lambda c: c.step)


def _digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def iter_checkpoint_dirs(folder: Path) -> Iterator[Checkpoint]:
    """``checkpoint-<step>`` folders in ``folder`` (HF Trainer's and runwatch's layout)."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for entry in entries:
        match = CHECKPOINT_DIR.match(entry.name)
        if match and entry.is_dir():
            yield Checkpoint(int(match.group(1)), entry.path, entry.stat().st_mtime)


def _log_in(folder: Path) -> Path | None:
    for name in PREFERRED_LOG_NAMES:
        if (folder / name).is_file():
            return folder / name
    logs = sorted(p for p in folder.iterdir() if p.suffix.lower() in LOG_SUFFIXES and p.is_file())
    return logs[0] if logs else None


class LogDirectory:
    """A watched folder: each ``*.jsonl``/``*.csv`` in it, and each sub-folder holding one,
    is a run (named after the file or the sub-folder). New runs appear on the next scan."""

    def __init__(self, path: str | os.PathLike[str], aliases: AliasTable | None = None) -> None:
        self.path = Path(path)
        self.aliases = aliases or AliasTable()

    def __repr__(self) -> str:
        return f"LogDirectory({str(self.path)!r})"

    @property
    def uri(self) -> str:
        return str(self.path)

    def discover(self) -> list[RunReader]:
        if not self.path.is_dir():
            raise SourceMissing(f"{self.path} is not a directory (yet)")
        found: list[RunReader] = []
        for entry in sorted(self.path.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.is_file() and entry.suffix.lower() in LOG_SUFFIXES:
                found.append(LogFile(entry, entry.stem, self.aliases, discover_checkpoints=False))
            elif entry.is_dir() and not CHECKPOINT_DIR.match(entry.name):
                log = _log_in(entry)
                if log is not None:
                    found.append(LogFile(log, entry.name, self.aliases))
        return found


def run_name(log: Path) -> str:
    """A run is named after its log file, or after its folder when the log has a generic name
    (``exp1/metrics.jsonl`` is ``exp1``)."""
    return log.parent.name if log.name in PREFERRED_LOG_NAMES and log.parent.name else log.stem


def open_source(path: str | os.PathLike[str], run: str | None = None,
                aliases: AliasTable | None = None) -> LogFile | LogDirectory:
    """The ``file://`` scheme, and every plain path. A file is one run (named ``run`` or
    after the file); a folder is watched for runs, unless ``run`` names it: then it is that
    run's folder and its log may appear later."""
    target = Path(path)
    if run and target.suffix.lower() not in LOG_SUFFIXES:
        log = _log_in(target) if target.is_dir() else None
        return LogFile(log or target / PREFERRED_LOG_NAMES[0], run, aliases)
    if target.is_dir():
        return LogDirectory(target, aliases)
    if target.suffix.lower() not in LOG_SUFFIXES:
        if not target.exists():
            return LogDirectory(target, aliases)
        raise ValueError(f"{target}: unsupported log format; use .jsonl (one JSON object per "
                         f"line) or .csv with a header")
    return LogFile(target, run or run_name(target), aliases)
