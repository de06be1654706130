"""Weights & Biases runs: local run folders, read incrementally, and the W&B API.

``wandb://PATH``: a ``wandb/`` folder (or the project folder holding it), one run folder
(``wandb/offline-run-20240101_120000-abc123/``) or one ``run-<id>.wandb`` file. Every run the
folder holds is a run named by its W&B run id (the display name goes into the run's meta); a
run resumed with the same id writes a new folder, and its folders are read in the order they
were made, as one run.
``wandb://ENTITY/PROJECT``: every run of a project, through the W&B API (network and an API
key needed). A target is a local path when it starts with ``/``, ``.`` or ``~``, ends with
``.wandb`` or exists; otherwise a two-part name is ``ENTITY/PROJECT``.

Why the local reader parses bytes: W&B writes a run (offline or online) to its transaction log
``run-<id>.wandb``, a LevelDB log: 32 KiB blocks of chunks (CRC32 seeded with the chunk type,
``uint16`` length, type FULL/FIRST/MIDDLE/LAST) after a 7-byte ``:W&B`` header, each whole
record a protobuf ``Record``. The pinned wandb has no Python reader (its reader is inside the
Go ``wandb-core`` binary), so the framing is read here and the ``Record`` classes come from the
pinned wandb: the format is internal, which is why the version is pinned. The cursor keeps a
byte offset per log file, so a poll reads only new bytes; a record whose chunks are not all
written yet is left for the next poll.

History rows become points: the step is a logged key that the alias table maps to ``step``
(HF logs ``train/global_step``, Lightning ``trainer/global_step``) or W&B's own ``_step``; the
wall time is ``_timestamp``; W&B's ``_``-keys and media (dicts) are not metrics. wandb is
imported only when a ``wandb://`` source is opened, so runwatch does not need it otherwise.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
from google.protobuf.message import DecodeError

from analyzers.base import METRIC_COLUMNS
from connectors.aliases import STEP, TIME, AliasTable
from connectors.base import Batch, RunReader, SourceMissing, SourceUnavailable
from connectors.formats import bad_step, to_step

PINNED_WANDB = "0.31.0"
INSTALL_HINT = f"pip install 'wandb=={PINNED_WANDB}'"

FILE_HEADER = b":W&B" + (0xBEE1).to_bytes(2, "little") + b"\x00"  # ident, magic, version 0
BLOCK_LEN = 32768
CHUNK_HEADER_LEN = 7  # uint32 CRC32, uint16 length, uint8 type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
# CRC32 of each chunk type byte: a chunk's CRC covers its type, then its data.
TYPE_CRC = {kind: zlib.crc32(bytes([kind])) for kind in (FULL, FIRST, MIDDLE, LAST)}

# The run id is the log's (a folder made in the same second as another gets a "-1" suffix).
RUN_FOLDER = re.compile(r"^(?:offline-)?run-(\d{8}_\d{6})-[\w-]+$")
RUN_LOG = re.compile(r"^run-([\w-]+)\.wandb$")
API_PATH = re.compile(r"^[\w.-]+/[\w.-]+$")
API_TIMEOUT_S = 30
API_PAGE = 1000

Row = tuple[int, str, float, float | None]


def _protos() -> ModuleType:
    """The pinned wandb's ``Record`` messages; a clear error when wandb is missing."""
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError:
        raise ValueError(f"wandb:// sources need the wandb package: {INSTALL_HINT}") from None
    return wandb_internal_pb2


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _add_history(row: dict[str, Any], where: int, aliases: AliasTable, rows: list[Row],
                 batch: Batch) -> None:
    """One history row (``{key: value}``, nested names joined with dots) as points."""
    step_value = next((v for k, v in row.items()
                       if v is not None and not k.startswith("_")
                       and aliases.canonical(k) == STEP), row.get("_step"))
    step = to_step(step_value) if _number(step_value) is not None else None
    if step is None:
        batch.malformed.append((where, bad_step(step_value)))
        return
    wall = _number(row.get("_timestamp"))
    for key, value in row.items():
        tag = aliases.canonical(key)
        if key.startswith("_") or tag in (STEP, TIME) or value is None or isinstance(value, dict):
            continue
        number = _number(value)
        if number is None:
            batch.skipped_values += 1
        else:
            rows.append((step, tag, number, wall))


# local transaction logs ---------------------------------------------------------------------
class _Chunks:
    """Whole records in a transaction log after an offset, and where the next one starts."""

    def __init__(self, data: bytes, offset: int) -> None:
        self.records: list[tuple[int, bytes]] = []
        self.damage: list[tuple[int, str]] = []
        self.end = offset
        self._scan(data, offset)

    def _scan(self, data: bytes, offset: int) -> None:
        """Chunks of ``data`` (the file's bytes from ``offset``) joined into records.

        A chunk cut off by the end of the data is still being written. A chunk whose CRC or
        type is wrong makes the rest of its block unreadable (LevelDB's own recovery rule):
        the record it belonged to is dropped and reading goes on at the next block.
        """
        size = offset + len(data)
        pos = start = offset
        parts: list[bytes] = []
        while True:
            room = BLOCK_LEN - pos % BLOCK_LEN
            if room < CHUNK_HEADER_LEN:  # the writer pads a block's last bytes with zeros
                if pos + room > size:
                    break
                pos += room
                continue
            if pos + CHUNK_HEADER_LEN > size:
                break
            at = pos - offset
            crc = int.from_bytes(data[at:at + 4], "little")
            length = int.from_bytes(data[at + 4:at + 6], "little")
            kind = data[at + 6]
            body_end = pos + CHUNK_HEADER_LEN + length
            if body_end > size and length <= room - CHUNK_HEADER_LEN:
                break
            body = data[at + CHUNK_HEADER_LEN:body_end - offset]
            if (kind not in TYPE_CRC or length > room - CHUNK_HEADER_LEN
                    or zlib.crc32(body, TYPE_CRC[kind]) != crc):
                self.damage.append((pos, f"corrupt chunk at byte {pos}; skipped the rest of "
                                         f"its {BLOCK_LEN}-byte block"))
                parts = []
                pos = start = pos + room
                continue
            chunk_at, pos = pos, body_end
            if kind in (FULL, FIRST):
                if parts:
                    self.damage.append((start, f"record at byte {start} lost its last chunks; "
                                               f"skipped"))
                parts, start = [body], chunk_at
            elif parts:
                parts.append(body)
            else:
                self.damage.append((chunk_at, f"chunk at byte {chunk_at} continues no record; "
                                              f"skipped"))
                start = pos
                continue
            if kind in (FULL, LAST):
                self.records.append((start, b"".join(parts)))
                parts, start = [], pos
        self.end = start


class LocalRun:
    """One W&B run: its transaction logs, one per folder it was run (or resumed) in."""

    def __init__(self, base: Path, logs: list[str], run_id: str, run: str,
                 aliases: AliasTable | None = None) -> None:
        self.base = base
        self.logs = logs  # relative to base, in the order they were written
        self.run_id = run_id
        self.run = run
        self.aliases = aliases or AliasTable()
        self._pb = _protos()

    def __repr__(self) -> str:
        return f"LocalRun({str(self.base)!r}, {self.logs!r}, run={self.run!r})"

    @property
    def key(self) -> str:
        return f"wandb:{self.base / self.run_id}"

    def read(self, cursor: dict[str, Any] | None = None, *, final: bool = False) -> Batch:
        """Records past each log's offset in ``cursor`` (``{"offsets": {log: offset},
        "config": {...}}``; the config is kept because W&B logs only its changes)."""
        cursor = cursor or {}
        offsets: dict[str, int] = dict(cursor.get("offsets", {}))
        config: dict[str, Any] = dict(cursor.get("config", {}))
        batch = Batch(run=self.run, cursor={})
        rows: list[Row] = []
        for index, name in enumerate(self.logs):
            path = self.base / name
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            offset = offsets.get(name, 0)
            if offset < 0 or size <= offset:  # negative: not a transaction log, reported
                continue
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read(size - offset)
            if offset == 0:
                if len(data) < len(FILE_HEADER) and not final:
                    continue
                if not data.startswith(FILE_HEADER):
                    batch.malformed.append((0, f"{name}: not a W&B transaction log of the "
                                               f"version runwatch reads; {INSTALL_HINT} "
                                               f"wherever runs are written, or use wandb://"
                                               f"ENTITY/PROJECT"))
                    offsets[name] = -1
                    continue
                offset = len(FILE_HEADER)
                data = data[offset:]
            chunks = _Chunks(data, offset)
            settled = final or index < len(self.logs) - 1  # a resumed folder follows it
            if settled and chunks.end < size:
                chunks.damage.append((chunks.end, f"truncated record at byte {chunks.end}: "
                                                  f"the last {size - chunks.end} bytes are "
                                                  f"unreadable"))
                chunks.end = size
            batch.malformed.extend((pos, f"{name}: {why}") for pos, why in chunks.damage)
            for pos, payload in chunks.records:
                self._record(name, pos, payload, config, rows, batch)
            offsets[name] = chunks.end
        batch.cursor = {"offsets": offsets, "config": config}
        if rows:
            batch.points = pd.DataFrame(rows, columns=METRIC_COLUMNS)
        return batch

    def _record(self, name: str, pos: int, payload: bytes, config: dict[str, Any],
                rows: list[Row], batch: Batch) -> None:
        try:
            self._apply(self._pb.Record.FromString(payload), pos, config, rows, batch)
        except (DecodeError, ValueError, RecursionError) as exc:  # a value that is not JSON
            batch.malformed.append((pos, f"{name}: record at byte {pos} cannot be read "
                                         f"({exc})"))

    def _apply(self, record: Any, pos: int, config: dict[str, Any], rows: list[Row],
               batch: Batch) -> None:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            _add_history(_history_row(record.history.item), pos, self.aliases, rows, batch)
        elif kind == "run":
            info = record.run
            batch.meta.update({k: v for k, v in (("run_id", info.run_id),
                                                 ("project", info.project),
                                                 ("entity", info.entity),
                                                 ("display_name", info.display_name)) if v})
            self._config(info.config, config, batch)
        elif kind == "config":
            self._config(record.config, config, batch)
        elif kind == "exit":
            code = record.exit.exit_code
            batch.meta["status"] = "finished" if code == 0 else f"failed (exit code {code})"

    @staticmethod
    def _config(update: Any, config: dict[str, Any], batch: Batch) -> None:
        for item in update.update:
            key = item.key or ".".join(item.nested_key)
            if key != "_wandb":  # W&B's own bookkeeping, not the run's configuration
                config[key] = json.loads(item.value_json)
        for item in update.remove:
            config.pop(item.key or ".".join(item.nested_key), None)
        batch.meta["config"] = dict(config)


def _history_row(items: Any) -> dict[str, Any]:
    """History items as the API returns a row: nested keys joined with dots, media (a value
    with a ``_type``, flattened by W&B into one item per field) left out."""
    fields = [(tuple(item.nested_key) or (item.key,), item.value_json) for item in items]
    media = {path[:-1] for path, _ in fields if len(path) > 1 and path[-1] == "_type"}
    return {".".join(path): json.loads(value) for path, value in fields
            if not any(path[:i] in media for i in range(1, len(path)))}


def _run_logs(folder: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(folder) if RUN_LOG.match(e.name) and e.is_file())
    except (FileNotFoundError, NotADirectoryError):
        return []


class WandbFolder:
    """Local W&B runs under a folder, or one run folder or transaction log."""

    def __init__(self, path: Path, run: str | None = None,
                 aliases: AliasTable | None = None) -> None:
        self.path = path
        self.run = run
        self.aliases = aliases or AliasTable()

    def __repr__(self) -> str:
        return f"WandbFolder({str(self.path)!r})"

    @property
    def uri(self) -> str:
        return f"wandb://{self.path}"

    def discover(self) -> list[RunReader]:
        if self.path.is_file():
            return self._one_run(self.path.parent, [self.path.name])
        if not self.path.is_dir():
            raise SourceMissing(f"W&B folder {self.path} does not exist (yet)")
        here = _run_logs(self.path)
        if here or self.run is not None:
            return self._one_run(self.path, here)
        root = self.path / "wandb" if (self.path / "wandb").is_dir() else self.path
        runs: dict[str, list[tuple[str, str, str]]] = {}
        for entry in os.scandir(root):
            match = RUN_FOLDER.match(entry.name)
            # ``latest-run`` and other symlinks point at folders that are listed anyway
            if match and entry.is_dir(follow_symlinks=False):
                for log in _run_logs(Path(entry)):
                    runs.setdefault(RUN_LOG.match(log).group(1), []).append(
                        (match.group(1), entry.name, f"{entry.name}/{log}"))
        return [LocalRun(root, [log for *_, log in sorted(logs)], run_id, run_id, self.aliases)
                for run_id, logs in sorted(runs.items())]

    def _one_run(self, folder: Path, logs: list[str]) -> list[RunReader]:
        if not logs:
            return []
        match = RUN_LOG.match(logs[0])
        run_id = match.group(1) if match else Path(logs[0]).stem
        return [LocalRun(folder.parent, [f"{folder.name}/{log}" for log in logs], run_id,
                         self.run or run_id, self.aliases)]


# the W&B API --------------------------------------------------------------------------------
class ApiRun:
    """One run of a project, read through the W&B API's history scan."""

    def __init__(self, project: str, api_run: Any, aliases: AliasTable,
                 errors: tuple[type[Exception], ...]) -> None:
        self.project = project
        self.api_run = api_run
        self.run = api_run.id
        self.aliases = aliases
        self._errors = errors

    def __repr__(self) -> str:
        return f"ApiRun({self.project!r}, run={self.run!r})"

    @property
    def key(self) -> str:
        return f"wandb:{self.project}/{self.run}"

    def read(self, cursor: dict[str, Any] | None = None, *, final: bool = False) -> Batch:
        """History rows past the last ``_step`` read (``{"_step": n}``)."""
        last = (cursor or {}).get("_step", -1)
        batch = Batch(run=self.run, cursor={"_step": last})
        rows: list[Row] = []
        try:
            # no cache: a cached history would hide the rows a running run logged since
            for row in self.api_run.scan_history(min_step=last + 1, page_size=API_PAGE,
                                                 use_cache=False):
                _add_history(row, row.get("_step", -1), self.aliases, rows, batch)
                last = max(last, row.get("_step", last))
        except self._errors as exc:
            raise SourceUnavailable(f"W&B API: reading {self.key} failed ({exc}); "
                                    f"runwatch tries again next poll") from exc
        batch.cursor = {"_step": last}
        batch.meta = {"config": {k: v for k, v in dict(self.api_run.config).items()
                                 if not k.startswith("_")},
                      "display_name": self.api_run.name, "status": self.api_run.state,
                      "url": self.api_run.url}
        if rows:
            batch.points = pd.DataFrame(rows, columns=METRIC_COLUMNS)
        return batch


class WandbProject:
    """Every run of ``ENTITY/PROJECT`` on the W&B server, discovered on each poll."""

    def __init__(self, project: str, aliases: AliasTable | None = None,
                 api: Any | None = None) -> None:
        self.project = project
        self.aliases = aliases or AliasTable()
        self._api = api

    def __repr__(self) -> str:
        return f"WandbProject({self.project!r})"

    @property
    def uri(self) -> str:
        return f"wandb://{self.project}"

    def discover(self) -> list[RunReader]:
        import wandb

        errors = (wandb.errors.Error, OSError)
        try:
            if self._api is None:
                self._api = wandb.Api(timeout=API_TIMEOUT_S)
            runs = list(self._api.runs(self.project, per_page=API_PAGE))
        except wandb.errors.UsageError as exc:
            raise SourceUnavailable(
                f"W&B API for {self.uri}: {exc} Set WANDB_API_KEY (or run `wandb login`), or "
                f"for offline runs point wandb:// at the local wandb/ folder") from exc
        except errors as exc:
            raise SourceUnavailable(
                f"W&B API for {self.uri} cannot be reached ({exc}); runwatch retries every "
                f"poll. Without network, point wandb:// at the local wandb/ folder") from exc
        return [ApiRun(self.project, r, self.aliases, errors) for r in runs]


def _is_local(target: str) -> bool:
    return (target.startswith(("/", ".", "~")) or target.endswith(".wandb")
            or os.path.exists(target) or not API_PATH.match(target))


def open_source(target: str, run: str | None = None,
                aliases: AliasTable | None = None) -> WandbFolder | WandbProject:
    """``wandb://PATH`` (local runs; with ``run``, PATH is that one run's folder) or
    ``wandb://ENTITY/PROJECT`` (the W&B API)."""
    if not target:
        raise ValueError("wandb:// needs a local wandb/ folder (wandb:///abs/wandb, "
                         "wandb://./wandb) or ENTITY/PROJECT for the W&B API")
    _protos()
    if _is_local(target):
        return WandbFolder(Path(target).expanduser().resolve(), run, aliases)
    if run is not None:
        raise ValueError(f"wandb://{target} follows every run of the project; 'run' names a "
                         f"single local run folder (wandb://./wandb/offline-run-…)")
    return WandbProject(target, aliases)
