"""Metric files and watched folders: the ``file://`` scheme and every plain path.

A :class:`LogFile` is one run's log in any format of :mod:`connectors.formats`, detected on
the first read from its name and first bytes and kept in the cursor. Line formats are read
incrementally: the cursor (byte offset, line number, a digest of the first bytes, what the
parser must remember) says where the last read stopped; only complete lines are consumed, so
a partial last line waits for its newline. A file that shrank, or whose beginning changed, is
read again from the start with a notice; a copy of the same log (rsync, rename) is read on
from where it was. A poll that finds nothing new costs a ``stat`` and a read of the first
4 KiB. Documents (``trainer_state.json``) are parsed again only when their size or time
changes, and only entries past those already read become points.

A :class:`LogDirectory` is a watched folder: every log in it, and in its sub-folders, is a run
(a folder holding a ``trainer_state.json`` is an HF output folder, see :class:`HfOutputDir`),
and new runs are picked up on the next scan.

Bad input never stops a read: a malformed line is counted with its line number and skipped;
a line over :data:`MAX_LINE_BYTES` too, read past without being kept whole; ``nan``/``inf``
are values (a signal, not an error); a non-numeric value skips that key only. An unreadable
file raises :class:`PermissionError` saying what to do; a symbolic link loop, an ``OSError``
that says so.

A watched folder holds one run per real file: a second name for a file (a symbolic link) is
not a second run, and a link back to a folder already searched is not followed.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import logging
import os
import re
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import IO, Any

import pandas as pd

from analyzers.base import METRIC_COLUMNS, Checkpoint
from connectors import sidecars
from connectors.aliases import AliasTable
from connectors.base import Batch, RunReader, SourceMissing, SourceUnavailable
from connectors.formats import (
    BUILTIN_PATTERNS,
    FORMATS_BY_NAME,
    Context,
    Format,
    LinePattern,
    TextLines,
    assemble,
    csv_holds_metrics,
    read_document,
    sniff,
    text_family,
    unsupported,
)
from connectors.training.control import ACK_FILE, REQUEST_FILE

log = logging.getLogger("runwatch.connectors.files")

LOG_SUFFIXES = (".jsonl", ".csv", ".json", ".log", ".txt", ".out")
# Line logs that are a run's own metrics file: in a folder, they are the run (an HF output
# folder's trainer_state.json beside one is only rewritten at checkpoints, so it is not read).
PREFERRED_LOG_NAMES = ("metrics.jsonl", "metrics.csv", "log.jsonl", "train.jsonl",
                       "trainer_log.jsonl")
# Names that say nothing about the run: such a log's run is named after its folder.
GENERIC_LOG_NAMES = (*PREFERRED_LOG_NAMES, "trainer_state.json", "train.log", "training.log",
                     "main.log", "output.log", "log.txt")
TRAINER_STATE = "trainer_state.json"
CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
# Folders a watched tree never holds runs in (W&B's own folders belong to ``wandb://``).
SKIPPED_DIRS = {"__pycache__", "node_modules", "wandb"}
# Files that sit beside a run's log and are no run of their own: runwatch's control request
# and answer (connectors.training.control), and the run's sample generations
# (connectors.generations.GENERATIONS_FILE, which imports this module, hence the literal).
NOT_LOGS = {REQUEST_FILE, ACK_FILE, "generations.jsonl"}
# How deep a watched folder is searched: project/lightning_logs/version_0/metrics.csv.
MAX_DEPTH = 3
# The first bytes of a file identify its content: a log copied over by rsync or replaced by a
# rename with the same beginning is the same log, read on from where it was.
HEAD_BYTES = 4096
# A text log is recognised in a watched folder when a line within its first bytes matches
# (a pattern, or a step and values). Megatron-DeepSpeed prints some 300 KB of arguments,
# DeepSpeed config and model before its first iteration; a file is sniffed once per change.
SNIFF_BYTES = 1 << 20
# A longer line is no metrics line (a dumped tensor, a blob without newlines): it is counted
# as malformed, read past in pieces of this size, never kept whole or parsed, so a huge line
# costs a read no more memory than this.
MAX_LINE_BYTES = 1 << 20


def _digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _unreadable(path: Path, exc: OSError) -> PermissionError:
    return PermissionError(f"{path}: permission denied ({exc.strerror}); make it readable by "
                           f"the user running runwatch (e.g. chmod a+r)")


def _looped(path: Path) -> OSError:
    return OSError(f"{path}: a symbolic link loop (the link leads back to itself through "
                   f"other links); remove the link or point it at the log")


def _open(path: Path) -> IO[bytes]:
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise SourceMissing(f"{path} does not exist") from None
    except PermissionError as exc:
        raise _unreadable(path, exc) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _looped(path) from None
        raise


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except FileNotFoundError:
        raise SourceMissing(f"{path} does not exist") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _looped(path) from None
        raise


def complete_lines(handle: IO[bytes], final: bool) -> Iterator[tuple[bytes | None, int]]:
    """The complete lines from where ``handle`` is, each with its length in bytes (its
    newline included); a line over :data:`MAX_LINE_BYTES` comes as None. A last line
    without its newline is still being written and waits for it, unless ``final``."""
    while line := handle.readline(MAX_LINE_BYTES + 1):
        size = len(line)
        too_long = size > MAX_LINE_BYTES
        while too_long and not line.endswith(b"\n"):
            line = handle.readline(MAX_LINE_BYTES)
            size += len(line)
            if not line:
                break
        if not line.endswith(b"\n") and not final:
            return
        yield (None if too_long else line.removesuffix(b"\n")), size


def checkpoint_folder(log: Path) -> Path:
    """The run folder whose ``checkpoint-*`` sub-folders belong to ``log``'s run
    (``out/checkpoint-500/trainer_state.json`` belongs to ``out``)."""
    return log.parent.parent if CHECKPOINT_DIR.match(log.parent.name) else log.parent


class LogFile:
    """One run's metrics log, in any format :mod:`connectors.formats` recognises.

    ``patterns`` extend the text-log pattern table (tried before the built-in ones).
    """

    def __init__(self, path: str | os.PathLike[str], run: str, aliases: AliasTable | None = None,
                 *, discover_checkpoints: bool = True,
                 patterns: Sequence[LinePattern] = ()) -> None:
        self.path = Path(path)
        self.run = run
        self.aliases = aliases or AliasTable()
        self.discover_checkpoints = discover_checkpoints
        self.patterns = (*patterns, *BUILTIN_PATTERNS)
        self.format: str | None = None  # known after the first read

    @cached_property
    def key(self) -> str:
        # realpath: a link loop must not fail here (reading it says what is wrong)
        return f"file:{os.path.realpath(self.path)}"

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
        """What is new since ``cursor``; the returned batch carries the next cursor.

        ``final`` takes a last line without a newline too (a one-shot read of a finished log).
        """
        cursor = dict(cursor or {})
        stat = _stat(self.path)
        fmt = FORMATS_BY_NAME.get(cursor.get("format", ""))
        if fmt is not None and fmt.document is not None:
            return self._read_document(fmt, cursor, stat)
        notices: list[str] = []
        with _open(self.path) as handle:
            head = handle.read(HEAD_BYTES)
            offset = cursor.get("offset", 0)
            if cursor and (_digest(head[: cursor.get("head_len", 0)]) != cursor.get("head")
                           or stat.st_size < offset):
                why = (f"shrank to {stat.st_size} bytes from {offset}"
                       if stat.st_size < offset else "was replaced by another file")
                notices.append(f"{self.run}: {self.path.name} {why} (truncated or rotated); "
                               f"reading it again from the start")
                cursor, offset, fmt = {}, 0, None
            if cursor.get("unsupported"):
                return Batch(run=self.run, cursor=cursor)
            if fmt is None:
                fmt = sniff(self.path.name, head)
                if fmt is None:
                    return self._unsupported(head)
                if fmt.document is not None:
                    return self._read_document(fmt, {}, stat, notices)
            self.format = fmt.name
            checkpoints_cursor = self._folder_signature()
            if stat.st_size == offset and cursor.get("folder") == checkpoints_cursor:
                return Batch(run=self.run, cursor=cursor, notices=notices)
            handle.seek(offset)
            batch = Batch(run=self.run, cursor={}, notices=notices)
            ctx = Context(self.aliases, self.path, batch)
            # Every format without a line parser is a document, read above.
            parser = fmt.lines(ctx, _parser_state(cursor), self.patterns)
            line_no = cursor.get("line", 0)
            new_offset = offset
            for raw, size in complete_lines(handle, final):
                line_no += 1
                new_offset += size
                if raw is None:
                    ctx.malformed(line_no, f"a line of {size:,} bytes, over the "
                                           f"{MAX_LINE_BYTES:,} a metrics line may have; "
                                           f"skipped unread")
                    continue
                if b"\x00" in raw:  # padding left by a crash, or UTF-16: the rest is read
                    raw = raw.replace(b"\x00", b"")
                    if not raw.strip():
                        ctx.malformed(line_no, "only NUL bytes (padding left by a crash or a "
                                               "preallocated file); skipped")
                        continue
                text = raw.decode("utf-8", errors="replace")
                parser.feed(line_no, text.removeprefix("\ufeff") if line_no == 1 else text)
        parser.close()
        if final and isinstance(parser, TextLines) and parser.decided is None and line_no:
            batch.notices.append(f"{self.run}: " + unsupported(
                self.path.name, "no line matched a known log format or named a step and a "
                                "value"))
        head_len = min(new_offset, HEAD_BYTES)
        if len(head) < head_len:  # the file grew past the head while it was read
            with _open(self.path) as handle:
                head = handle.read(head_len)
        batch.cursor = {"format": fmt.name, "offset": new_offset, "line": line_no,
                        "head_len": head_len, "head": _digest(head[:head_len]),
                        "state": parser.state(), "folder": checkpoints_cursor}
        self._finish(batch, ctx, cursor)
        return batch

    def _read_document(self, fmt: Format, cursor: dict[str, Any], stat: os.stat_result,
                       notices: Sequence[str] = ()) -> Batch:
        """A document is parsed again only when its size or time changed."""
        self.format = fmt.name
        signature = [str(self.path), stat.st_size, stat.st_mtime_ns]
        folder = self._folder_signature()
        if cursor.get("format") == fmt.name and cursor.get("stat") == signature \
                and cursor.get("folder") == folder:
            return Batch(run=self.run, cursor=cursor, notices=list(notices))
        with _open(self.path) as handle:
            raw = handle.read()
        batch = Batch(run=self.run, cursor={}, notices=list(notices))
        ctx = Context(self.aliases, self.path, batch)
        document = read_document(fmt.document, raw, ctx, cursor.get("document", {}))
        batch.cursor = {"format": fmt.name, "stat": signature, "folder": folder,
                        "document": document}
        self._finish(batch, ctx, cursor)
        return batch

    def _finish(self, batch: Batch, ctx: Context, cursor: dict[str, Any]) -> None:
        """Records → points (see :func:`connectors.formats.assemble`), and checkpoints."""
        recent = {int(step): values for step, values in cursor.get("recent", [])}
        assembled = assemble(ctx.records, cursor.get("top"), recent)
        if assembled.rows:
            batch.points = pd.DataFrame(assembled.rows, columns=METRIC_COLUMNS)
        if assembled.duplicates:
            count = assembled.duplicates
            batch.notices.append(f"{self.run}: {count} record{'s' if count > 1 else ''} of "
                                 f"{self.path.name} repeated steps already read, with the same "
                                 f"values (two writers, or lines printed twice); kept once")
        batch.cursor["top"] = assembled.top
        batch.cursor["recent"] = [[step, values] for step, values in assembled.recent.items()]
        if self.discover_checkpoints:
            found = {c.step: c for c in iter_checkpoint_dirs(checkpoint_folder(self.path))}
            for c in batch.checkpoints:
                found.setdefault(c.step, c)
            batch.checkpoints = sorted(found.values(), key=lambda c: c.step)
            self._tracker_config(batch, cursor)

    def _tracker_config(self, batch: Batch, cursor: dict[str, Any]) -> None:
        """The run's config from what its tracker wrote beside the log
        (:mod:`connectors.sidecars`; for a ``checkpoint-N/trainer_state.json``, its output
        folder's too), read with the log's news when those files changed, or when the log
        sends its own config, whose keys win; and the versions, change events and start's
        leakage check of the run's history (``runwatch launch`` records them without the
        script's help) unless the log's meta line carries them. Only a log that owns its
        folder has them."""
        folder = self.path.parent
        folders = [folder, folder.parent] if CHECKPOINT_DIR.match(folder.name) else [folder]
        signature = sidecars.signature(folders)
        batch.cursor["sidecars"] = signature
        if not signature or (signature == cursor.get("sidecars") and "config" not in batch.meta):
            return
        config, notices = sidecars.read_config(folders)
        batch.notices += [f"{self.run}: {notice}" for notice in notices]
        history = sidecars.read_versions(folders)  # runwatch launch's, or a helper's
        for key in ("versions", "changes", "leakcheck"):
            if key in history and key not in batch.meta:
                batch.meta[key] = history[key]
        config = {**history.get("config", {}), **config}
        if config:
            batch.meta["config"] = {**config, **batch.meta.get("config", {})}

    def _folder_signature(self) -> int | None:
        """Changes when a checkpoint folder appears or goes: the run folder's mtime."""
        if not self.discover_checkpoints:
            return None
        try:
            return checkpoint_folder(self.path).stat().st_mtime_ns
        except OSError:
            return None

    def _unsupported(self, head: bytes) -> Batch:
        head_len = len(head)
        return Batch(run=self.run, cursor={"unsupported": True, "head_len": head_len,
                                           "head": _digest(head)},
                     notices=[f"{self.run}: " + unsupported(
                         self.path, "binary data, or JSON of another kind; it is read again if "
                                    "it is replaced")])


def _parser_state(cursor: dict[str, Any]) -> dict[str, Any]:
    """The parser's memory; cursors written before formats were detected kept a CSV header."""
    if "state" in cursor:
        return cursor["state"]
    return {"header": cursor["header"]} if "header" in cursor else {}


def iter_checkpoint_dirs(folder: Path) -> Iterator[Checkpoint]:
    """``checkpoint-<step>`` folders in ``folder`` (HF Trainer's and runwatch's layout)."""
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for entry in entries:
        match = CHECKPOINT_DIR.match(entry.name)
        if match and entry.is_dir():
            yield Checkpoint(int(match.group(1)), entry.path, entry.stat().st_mtime)


def trainer_states(folder: Path) -> list[Path]:
    """An HF output folder's ``trainer_state.json`` files: its own and its checkpoints'."""
    found = [folder / TRAINER_STATE] if (folder / TRAINER_STATE).is_file() else []
    found += [Path(c.path) / TRAINER_STATE for c in iter_checkpoint_dirs(folder)
              if (Path(c.path) / TRAINER_STATE).is_file()]
    return found


class HfOutputDir:
    """An HF Trainer output folder: one run, read from its newest ``trainer_state.json``.

    During training only ``checkpoint-<step>/trainer_state.json`` files are written (the
    folder's own one comes at the end), so the newest of them is read: each holds the whole
    log history up to its step, and the cursor keeps what was already read.
    """

    def __init__(self, folder: str | os.PathLike[str], run: str,
                 aliases: AliasTable | None = None) -> None:
        self.folder = Path(folder)
        self.run = run
        self.aliases = aliases or AliasTable()

    def __repr__(self) -> str:
        return f"HfOutputDir({str(self.folder)!r}, run={self.run!r})"

    @cached_property
    def key(self) -> str:
        return f"hf:{self.folder.resolve()}"

    @property
    def uri(self) -> str:
        return f"hf://{self.folder}"

    def discover(self) -> list[RunReader]:
        if not self.folder.is_dir():
            raise SourceMissing(f"{self.folder} does not exist (yet)")
        return [self]

    def newest_state(self) -> Path | None:
        """The most recently written ``trainer_state.json`` (the highest step on a tie)."""
        def written(path: Path) -> tuple[int, int]:
            match = CHECKPOINT_DIR.match(path.parent.name)
            return path.stat().st_mtime_ns, int(match.group(1)) if match else 1 << 62

        states = trainer_states(self.folder)
        return max(states, key=written) if states else None

    def read(self, cursor: dict[str, Any] | None = None, *, final: bool = False) -> Batch:
        state = self.newest_state()
        if state is None:
            if not self.folder.is_dir():
                raise SourceMissing(f"{self.folder} does not exist")
            checkpoints = sorted(iter_checkpoint_dirs(self.folder), key=lambda c: c.step)
            return Batch(run=self.run, cursor=dict(cursor or {}), checkpoints=checkpoints)
        return LogFile(state, self.run, self.aliases).read(cursor, final=final)


def export_run(path: Path) -> str | None:
    """The run a CSV export of one chart belongs to; None for any other file.

    * ``Wall time,Step,Value`` (TensorBoard's download, W&B's of a TensorBoard chart): from
      the name, TensorBoard's ``run-exp1-tag-val_loss.csv`` is ``exp1``'s, and a file named
      after its metric alone (``val_loss.csv``) is its folder's, ``""``;
    * ``Step,exp1 - train/loss,exp1 - train/loss__MIN,…`` (W&B's download of a chart of
      one run): ``exp1``'s, whatever the file is called.
    """
    if path.suffix.lower() != ".csv":
        return None
    try:
        with path.open("rb") as handle:
            first = handle.readline(4096).decode("utf-8", errors="replace").removeprefix("\ufeff")
        header = [h.strip() for h in next(iter(csv.reader([first])), [])]
    except (OSError, csv.Error):  # unreadable, or no CSV line (a bare \r in it)
        return None
    if [h.lower() for h in header] == ["wall time", "step", "value"]:
        return path.stem.split("-tag-", 1)[0].removeprefix("run-").strip(".") \
            if "-tag-" in path.stem else ""
    runs = {h.split(" - ", 1)[0] for h in header[1:] if " - " in h}
    if header[:1] == ["Step"] and len(runs) == 1 and all(" - " in h for h in header[1:]):
        return runs.pop()
    return None


class MetricCsvFolder:
    """A run exported one CSV per chart (see :func:`export_run`): ``train_loss.csv`` beside
    ``val_loss.csv`` is one run with both tags, so that the eval loss is judged against the
    training loss (overfit).

    Each file is read as a :class:`LogFile` with its own cursor; the points of a read are
    merged in step order, as the run logged them (file after file, the second metric's first
    step would look like a restart).
    """

    def __init__(self, folder: str | os.PathLike[str], names: Sequence[str], run: str,
                 aliases: AliasTable | None = None) -> None:
        self.folder = Path(folder)
        self.run = run
        self.files = {name: LogFile(self.folder / name, run, aliases, discover_checkpoints=False)
                      for name in sorted(names)}

    def __repr__(self) -> str:
        return f"MetricCsvFolder({str(self.folder)!r}, {sorted(self.files)}, run={self.run!r})"

    @cached_property
    def key(self) -> str:
        return f"csvs:{os.path.realpath(self.folder)}#{self.run}"

    @property
    def uri(self) -> str:
        return str(self.folder)

    def discover(self) -> list[RunReader]:
        if not self.folder.is_dir():
            raise SourceMissing(f"{self.folder} does not exist (yet)")
        return [self]

    def read(self, cursor: dict[str, Any] | None = None, *, final: bool = False) -> Batch:
        cursors = (cursor or {}).get("files", {})
        batch = Batch(run=self.run, cursor={"files": {}})
        frames = []
        for name, reader in self.files.items():
            part = reader.read(cursors.get(name), final=final)
            batch.cursor["files"][name] = part.cursor
            if not part.points.empty:
                frames.append(part.points)
            batch.malformed += [(line, f"{name}: {why}") for line, why in part.malformed]
            batch.skipped_values += part.skipped_values
            batch.notices += part.notices
            batch.meta.update(part.meta)
        if frames:
            batch.points = pd.concat(frames, ignore_index=True).sort_values(
                "step", kind="stable", ignore_index=True)
        return batch


def run_name(log: Path) -> str:
    """A run is named after its log file, or after its folder when the log has a generic name
    (``exp1/metrics.jsonl`` is ``exp1``; ``out/checkpoint-500/trainer_state.json`` is ``out``)."""
    if log.name in GENERIC_LOG_NAMES:
        folder = checkpoint_folder(log)
        if folder.name:
            return folder.name
    return log.stem


class LogDirectory:
    """A watched folder. Its runs, found again at every :meth:`discover`:

    * each log directly in it (named after the file, or after the folder for a generic name
      such as ``metrics.csv``);
    * each sub-folder (up to :data:`MAX_DEPTH` deep) holding logs: one log makes the
      sub-folder a run named by its path (``exp2``, ``lightning_logs/version_0``), several
      make one run each (``exp2/train``, ``exp2/finetune``);
    * each HF output folder (a ``trainer_state.json`` in it or in a ``checkpoint-*``), unless
      it holds a line log such as ``trainer_log.jsonl``, which is read instead;
    * one-metric CSV exports of the same run (``train_loss.csv`` beside ``val_loss.csv``, see
      :class:`MetricCsvFolder`) are one run, named after their folder (or after their run,
      ``run-exp1-tag-loss.csv``, when the folder holds other runs too).

    A ``.log``/``.txt`` file is a log once a line in its first MiB matches a pattern or
    names a step and a value (``step 10 | loss 2.3``); a
    ``.json`` file when it is a trainer state or Megatron golden values; a ``.csv`` file
    unless its rows are mostly text (a manifest, a dataset).

    Paths are compared by what they resolve to: a symbolic link to a log already found, or
    to a folder already searched (``ln -s . runs/loop``), adds no run, and real entries are
    taken before links, so a run keeps its real name. A log name whose link loops is still a
    run: reading it says what is wrong, and the others are read on.
    """

    def __init__(self, path: str | os.PathLike[str], aliases: AliasTable | None = None,
                 *, patterns: Sequence[LinePattern] = ()) -> None:
        self.path = Path(path)
        self.aliases = aliases or AliasTable()
        self.patterns = tuple(patterns)
        self._recognised: set[str] = set()
        self._exports: dict[str, str] = {}  # a one-chart CSV export → its run (export_run)
        self._rejected: dict[str, tuple[int, int]] = {}
        self._readers: dict[tuple[str, str, bool], RunReader] = {}
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        return f"LogDirectory({str(self.path)!r})"

    @property
    def rejected(self) -> list[str]:
        """The files with a log's suffix that the last scans found no log runwatch can read
        (binary, JSON of another kind, a table of text, text without a metric line)."""
        return sorted(self._rejected)

    @property
    def uri(self) -> str:
        return str(self.path)

    def discover(self) -> list[RunReader]:
        if not self.path.is_dir():
            raise SourceMissing(f"{self.path} is not a directory (yet)")
        found: list[RunReader] = []
        real = os.path.realpath(self.path)
        try:
            self._scan(self.path, real, "", 0, found, {real: str(self.path)})
        except PermissionError as exc:
            raise SourceUnavailable(f"{self.path}: permission denied ({exc.strerror}); make "
                                    f"the folder readable by the user running runwatch") from None
        return found

    def _scan(self, folder: Path, real: str, rel: str, depth: int, found: list[RunReader],
              seen: dict[str, str]) -> None:
        """Runs in ``folder`` (which resolves to ``real``) and below; ``seen`` maps each
        real path taken to its name."""
        with os.scandir(folder) as listing:
            entries = sorted((e for e in listing if not e.name.startswith(".")),
                             key=lambda e: (e.is_symlink(), e.name))
        kinds = {e.name: _kind(e) for e in entries}
        names = [e.name for e in entries if kinds[e.name] in ("file", "broken")
                 and self._is_log(e.path, e.name) and self._first(e, real, seen)]
        preferred = next((n for n in PREFERRED_LOG_NAMES if n in names), None)
        hf = not preferred and (TRAINER_STATE in names or any(
            CHECKPOINT_DIR.match(e.name) and os.path.isfile(os.path.join(e.path, TRAINER_STATE))
            for e in entries))
        if preferred or hf:
            names = [n for n in names if n != TRAINER_STATE]
        exports: dict[str, list[str]] = {}
        for name in names:
            group = self._exports.get(os.path.join(folder, name))
            if group is not None:
                exports.setdefault(group, []).append(name)
        exports = {group: members for group, members in exports.items() if len(members) > 1}
        names = [n for n in names if not any(n in members for members in exports.values())]
        owners = len(names) + hf + len(exports)
        own_name = rel or folder.name
        if hf:
            found.append(self._reader("hf", folder, own_name, True))
        for group, members in exports.items():
            run = own_name if owners == 1 or not group else f"{rel}/{group}" if rel else group
            found.append(self._reader("csvs", folder, run, True, tuple(members)))
        for name in names:
            if owners == 1 and (rel or name in GENERIC_LOG_NAMES):
                found.append(self._reader("file", folder / name, own_name, True))
            else:
                stem = os.path.splitext(name)[0]
                found.append(self._reader("file", folder / name,
                                          f"{rel}/{stem}" if rel else stem, False))
        if depth + 1 >= MAX_DEPTH:
            return
        for entry in entries:
            if entry.name in SKIPPED_DIRS or CHECKPOINT_DIR.match(entry.name) \
                    or kinds[entry.name] != "dir" or not self._first(entry, real, seen):
                continue
            try:
                self._scan(Path(entry.path), _real(entry, real),
                           f"{rel}/{entry.name}" if rel else entry.name, depth + 1, found, seen)
            except PermissionError as exc:
                if entry.path not in self._warned:
                    self._warned.add(entry.path)
                    log.warning("%s: permission denied (%s); its runs are not watched until it "
                                "is readable by the user running runwatch", entry.path,
                                exc.strerror)

    def _first(self, entry: os.DirEntry[str], folder: str, seen: dict[str, str]) -> bool:
        """Whether ``entry`` (in ``folder``, resolved) is the first name met for what it
        resolves to; a second name (a link) is said once."""
        real = _real(entry, folder)
        if real not in seen:
            seen[real] = entry.path
            return True
        if entry.path not in self._warned:
            self._warned.add(entry.path)
            log.info("%s is another name for %s (a symbolic link); it is read once, there",
                     entry.path, seen[real])
        return False

    def _reader(self, kind: str, path: Path, run: str, owns_folder: bool,
                members: tuple[str, ...] = ()) -> RunReader:
        """Readers are kept between scans, so a file's format is sniffed once."""
        key = (kind, f"{path}\0{run}", owns_folder, members)
        if key not in self._readers:
            self._readers[key] = (
                HfOutputDir(path, run, self.aliases) if kind == "hf" else
                MetricCsvFolder(path, members, run, self.aliases) if kind == "csvs" else
                LogFile(path, run, self.aliases, discover_checkpoints=owns_folder,
                        patterns=self.patterns))
        return self._readers[key]

    def _is_log(self, path: str, name: str) -> bool:
        """Whether a file is a log runwatch reads; the answer is kept until the file changes."""
        suffix = os.path.splitext(name)[1].lower()
        if suffix not in LOG_SUFFIXES or name in NOT_LOGS:
            return False
        if suffix == ".jsonl" or path in self._recognised:
            return True
        try:
            stat = os.stat(path)
            signature = (stat.st_size, stat.st_mtime_ns)
            if self._rejected.get(path) == signature:
                return False
            with open(path, "rb") as handle:
                head = handle.read(SNIFF_BYTES)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # unreadable, a link loop: reading it says what is wrong
        fmt = sniff(name, head[:HEAD_BYTES])
        if fmt is None:
            recognised = False
        elif fmt.name == "text":
            recognised = text_family(head, (*self.patterns, *BUILTIN_PATTERNS)) is not None
        else:
            recognised = suffix != ".csv" or csv_holds_metrics(head[:HEAD_BYTES])
        if recognised:
            self._recognised.add(path)
            self._rejected.pop(path, None)
            group = export_run(Path(path))
            if group is not None:
                self._exports[path] = group
        else:
            self._rejected[path] = signature
        return recognised


def _real(entry: os.DirEntry[str], folder: str) -> str:
    """What ``entry`` in ``folder`` (resolved) resolves to; only a link costs a lookup."""
    return os.path.realpath(entry.path) if entry.is_symlink() else os.path.join(folder,
                                                                                entry.name)


def _kind(entry: os.DirEntry[str]) -> str | None:
    """``file``, ``dir``, ``broken`` (what it links to cannot be known: a link loop), else
    None (a dangling link, a socket…)."""
    try:
        return "file" if entry.is_file() else "dir" if entry.is_dir() else None
    except OSError:
        return "broken"


def folder_run(folder: Path, run: str, aliases: AliasTable | None = None,
               patterns: Sequence[LinePattern] = ()) -> LogFile | HfOutputDir | MetricCsvFolder:
    """The run that lives in ``folder``: its own metrics log, else the HF output folder, else
    its one-metric CSV exports, else its first log; a folder without one yet gets
    ``metrics.jsonl`` when it appears."""
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    preferred = next((n for n in PREFERRED_LOG_NAMES if n in names), None)
    if preferred:
        return LogFile(folder / preferred, run, aliases, patterns=patterns)
    if trainer_states(folder):
        return HfOutputDir(folder, run, aliases)
    exports = [n for n in names if export_run(folder / n) is not None]
    if len(exports) > 1:
        return MetricCsvFolder(folder, exports, run, aliases)
    logs = sorted(folder / n for n in names if Path(n).suffix.lower() in (".jsonl", ".csv"))
    return LogFile(logs[0] if logs else folder / PREFERRED_LOG_NAMES[0], run, aliases,
                   patterns=patterns)


def open_source(path: str | os.PathLike[str], run: str | None = None,
                aliases: AliasTable | None = None, *, patterns: Sequence[LinePattern] = ()
                ) -> LogFile | LogDirectory | HfOutputDir | MetricCsvFolder:
    """The ``file://`` scheme, and every plain path. A file is one run (named ``run`` or
    after the file); a folder is watched for runs, unless ``run`` names it: then it is that
    run's folder and its log may appear later. ``patterns`` extend the text-log pattern table.

    An existing file that is no log raises ``ValueError``: binary data, JSON of another kind,
    or text under another suffix than :data:`LOG_SUFFIXES` in which no pattern matches.
    """
    target = Path(path)
    if target.is_dir():
        if run:
            return folder_run(target, run, aliases, patterns)
        return LogDirectory(target, aliases, patterns=patterns)
    if target.is_file():
        try:
            with target.open("rb") as handle:
                head = handle.read(SNIFF_BYTES)
        except PermissionError:
            return LogFile(target, run or run_name(target), aliases, patterns=patterns)
        fmt = sniff(target.name, head[:HEAD_BYTES])
        if fmt is not None and fmt.name == "text" and target.suffix.lower() not in LOG_SUFFIXES \
                and text_family(head, (*patterns, *BUILTIN_PATTERNS)) is None:
            fmt = None  # e.g. metrics.parquet: only known log names are trusted to be text
        if fmt is None:
            raise ValueError(unsupported(target, "binary data, JSON of another kind, or text "
                                                 "in which no line names a step and a value"))
        return LogFile(target, run or run_name(target), aliases, patterns=patterns)
    if target.suffix.lower() in LOG_SUFFIXES:
        return LogFile(target, run or run_name(target), aliases, patterns=patterns)
    if run:
        return LogFile(target / PREFERRED_LOG_NAMES[0], run, aliases, patterns=patterns)
    return LogDirectory(target, aliases, patterns=patterns)
