"""TensorBoard logdirs (``tb://LOGDIR``), read incrementally from the event files' bytes.

Every folder under LOGDIR that holds ``events.out.tfevents.*`` files is a run, named by its
path relative to LOGDIR (``exp1``, ``exp1/train``); event files directly in LOGDIR make a run
named after LOGDIR. Runs that appear later are found by the next ``discover()``. A trainer
that restarts writes a new event file beside the old ones: a run's files are read in the order
they were created, each from its own byte offset (the cursor is ``{file name: offset}``).

Why the record framing is read here: an event file is a TFRecord file (a little-endian
``uint64`` length, its masked CRC32C, an ``Event`` proto, the proto's masked CRC32C), and
TensorBoard's own loaders cannot resume at an offset without TensorFlow installed (the stub
record reader refuses ``start_offset``), so every poll would re-read every file from the start.
The ``Event`` proto and the tensor decoding are TensorBoard's. Checksums use ``google-crc32c``
(C): TensorBoard's pure-Python CRC32C alone takes longer than the rest of a read. Nothing is
sampled: ``EventAccumulator`` keeps 10k points per tag by default, this reader every point.

Scalars come as ``simple_value`` (PyTorch's ``SummaryWriter``, TF1) or as a 0-d numeric tensor
(TF2, ``add_scalar(new_style=True)``); other summaries (images, histograms, text) are skipped.
Hyperparameters written with ``add_hparams`` become the run's ``config``.

A record still being written is left for the next poll. A corrupt record is counted as
malformed (with its file and byte offset) and skipped; the rest of the file is still read. A
partial record at the end of a file is counted and skipped once the file can no longer grow:
on a ``final`` read, or when a newer event file in the same folder shows the writer moved on
(TensorBoard itself stops following a file then).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import google_crc32c
import pandas as pd
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util import tensor_util

from analyzers.base import METRIC_COLUMNS
from connectors.aliases import AliasTable
from connectors.base import Batch, RunReader, SourceMissing
from connectors.files import CHECKPOINT_DIR, iter_checkpoint_dirs

EVENT_FILE_PREFIX = "events.out.tfevents."
HEADER_LEN = 12  # uint64 record length + uint32 masked CRC32C of it
FOOTER_LEN = 4  # uint32 masked CRC32C of the record
# Bytes examined at a time when looking for the next record after a corrupt header.
RESYNC_WINDOW = 1 << 16
CRC_MASK_DELTA = 0xA282EAD8

Row = tuple[int, str, float, float]


def _event_files(folder: Path) -> list[str]:
    """Event files in creation order: by the Unix time in their name, then by name."""
    try:
        names = [e.name for e in os.scandir(folder)
                 if e.name.startswith(EVENT_FILE_PREFIX) and e.is_file()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(names, key=_creation_key)


def _creation_key(name: str) -> tuple[int, str]:
    stamp = name[len(EVENT_FILE_PREFIX):].partition(".")[0]
    return (int(stamp) if stamp.isdigit() else 0, name)


def _crc_ok(data: bytes, crc: bytes) -> bool:
    """TFRecord's masked CRC32C: rotated and offset, so a CRC stored inside data is no CRC."""
    value = google_crc32c.value(data)
    masked = (((value >> 15) | (value << 17)) + CRC_MASK_DELTA) & 0xFFFFFFFF
    return masked == int.from_bytes(crc, "little")


@dataclass
class _Scan:
    """The whole records found after an offset, the damage met on the way, and where to resume."""

    records: list[tuple[int, bytes]] = field(default_factory=list)
    damage: list[tuple[int, str]] = field(default_factory=list)
    end: int = 0


def _scan(handle: BinaryIO, offset: int, size: int) -> _Scan:
    """Whole TFRecords in ``handle`` from ``offset`` up to ``size``.

    A record that does not fit before ``size`` is still being written: the scan ends at its
    start. A header whose checksum fails leaves the record's length unknown, so the scan looks
    for the next valid header; a body whose checksum fails is skipped by its (valid) length.
    """
    scan = _Scan(end=offset)
    pos = offset
    handle.seek(pos)
    while size - pos >= HEADER_LEN:
        header = handle.read(HEADER_LEN)
        if len(header) < HEADER_LEN:
            break
        if not _crc_ok(header[:8], header[8:]):
            found = _next_header(handle, pos + 1, size)
            if found is None:
                break
            scan.damage.append((pos, f"corrupt record header at byte {pos}; skipped "
                                     f"{found - pos} bytes to the next record"))
            pos = found
            handle.seek(pos)
            continue
        length = int.from_bytes(header[:8], "little")
        end = pos + HEADER_LEN + length + FOOTER_LEN
        if end > size:
            break
        body = handle.read(length + FOOTER_LEN)
        if len(body) < length + FOOTER_LEN:
            break
        if _crc_ok(body[:length], body[length:]):
            scan.records.append((pos, body[:length]))
        else:
            scan.damage.append((pos, f"record at byte {pos} fails its checksum; skipped"))
        pos = end
    scan.end = pos
    return scan


def _next_header(handle: BinaryIO, start: int, size: int) -> int | None:
    """The offset of the next valid record header at or after ``start``, None if none yet.

    A 32-bit checksum over the 8 length bytes makes a false match vanishingly rare. Finding
    none, the caller stops before the damage and looks again when the file has grown, so the
    damage is counted once, when a later record shows where it ends.
    """
    pos = start
    while size - pos >= HEADER_LEN:
        handle.seek(pos)
        window = handle.read(min(RESYNC_WINDOW, size - pos))
        for i in range(len(window) - HEADER_LEN + 1):
            if _crc_ok(window[i:i + 8], window[i + 8:i + HEADER_LEN]):
                return pos + i
        pos += len(window) - HEADER_LEN + 1
    return None


def _scalar(value: Any) -> float | None:
    """The number a summary value holds when it is a scalar, else None."""
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind != "tensor":
        return None
    # TF2 writes a tag's plugin metadata with its first point only; later points carry a bare
    # tensor. A 0-d numeric tensor is a scalar for every built-in plugin, so no per-tag state
    # (which an offset-based read would lose) is needed.
    plugin = value.metadata.plugin_data.plugin_name
    if plugin not in ("", scalar_metadata.PLUGIN_NAME) or value.tensor.tensor_shape.dim:
        return None
    try:
        array = tensor_util.make_ndarray(value.tensor)
    except (TypeError, ValueError):
        return None
    if array.ndim != 0 or array.dtype.kind not in "fiu":
        return None
    return float(array)


def _hparams(value: Any) -> dict[str, Any] | None:
    """The hyperparameters of an ``add_hparams`` session-start summary, else None."""
    if value.metadata.plugin_data.plugin_name != hparams_metadata.PLUGIN_NAME:
        return None
    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    if not data.HasField("session_start_info"):
        return None
    return {name: json_format.MessageToDict(v)
            for name, v in data.session_start_info.hparams.items()}


class EventFolder:
    """One run: the event files directly in one folder."""

    def __init__(self, folder: Path, run: str, aliases: AliasTable | None = None) -> None:
        self.folder = folder
        self.run = run
        self.aliases = aliases or AliasTable()

    def __repr__(self) -> str:
        return f"EventFolder({str(self.folder)!r}, run={self.run!r})"

    @property
    def key(self) -> str:
        return f"tb:{self.folder}"

    def read(self, cursor: dict[str, Any] | None = None, *, final: bool = False) -> Batch:
        """Points from every event file past its offset in ``cursor`` (``{file name: offset}``).

        ``final``: the run is finished, so a partial record at the end of a file is damage.
        """
        offsets: dict[str, int] = dict(cursor or {})
        batch = Batch(run=self.run, cursor=offsets)
        rows: list[Row] = []
        names = _event_files(self.folder)
        for index, name in enumerate(names):
            path = self.folder / name
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            offset = offsets.get(name, 0)
            if size < offset:
                # Event files only grow, so what is missing was read already and is kept; a
                # writer appending again starts its next record at the new end.
                batch.notices.append(f"{self.run}: {name} shrank to {size} bytes from {offset} "
                                     f"(truncated); points already read are kept")
                offsets[name] = size
                continue
            if size == offset:
                continue
            with path.open("rb") as handle:
                scan = _scan(handle, offset, size)
            settled = final or index < len(names) - 1
            if settled and scan.end < size:
                scan.damage.append((scan.end, f"truncated or corrupt record at byte {scan.end}: "
                                              f"the last {size - scan.end} bytes are unreadable"))
                scan.end = size
            batch.malformed.extend((pos, f"{name}: {why}") for pos, why in scan.damage)
            self._decode(name, scan.records, rows, batch)
            offsets[name] = scan.end
        if rows:
            batch.points = pd.DataFrame(rows, columns=METRIC_COLUMNS)
        batch.checkpoints = sorted(iter_checkpoint_dirs(self.folder), key=lambda c: c.step)
        return batch

    def _decode(self, name: str, records: list[tuple[int, bytes]], rows: list[Row],
                batch: Batch) -> None:
        for pos, payload in records:
            try:
                event = event_pb2.Event.FromString(payload)
            except DecodeError:
                batch.malformed.append((pos, f"{name}: record at byte {pos} is not an Event"))
                continue
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                number = _scalar(value)
                if number is not None:
                    rows.append((event.step, self.aliases.canonical(value.tag), number,
                                 event.wall_time))
                    continue
                hparams = _hparams(value)
                if hparams is not None:
                    batch.meta["config"] = hparams


class TensorBoardLogdir:
    """A logdir watched for runs: every folder holding event files is one."""

    def __init__(self, logdir: Path, run: str | None = None,
                 aliases: AliasTable | None = None) -> None:
        self.logdir = logdir
        self.run = run
        self.aliases = aliases or AliasTable()

    def __repr__(self) -> str:
        return f"TensorBoardLogdir({str(self.logdir)!r})"

    @property
    def uri(self) -> str:
        return f"tb://{self.logdir}"

    def discover(self) -> list[RunReader]:
        """The runs under the logdir now; ``checkpoint-*`` and hidden folders are not searched
        (they hold model files, never event files, and can be large)."""
        if not self.logdir.is_dir():
            raise SourceMissing(f"TensorBoard logdir {self.logdir} does not exist (yet)")
        if self.run is not None:
            return [EventFolder(self.logdir, self.run, self.aliases)] \
                if _event_files(self.logdir) else []
        found: list[RunReader] = []
        for folder, subfolders, files in os.walk(self.logdir):
            subfolders[:] = sorted(d for d in subfolders
                                   if not d.startswith(".") and not CHECKPOINT_DIR.match(d))
            if any(f.startswith(EVENT_FILE_PREFIX) for f in files):
                relative = Path(folder).relative_to(self.logdir)
                name = relative.as_posix() if relative.parts else self.logdir.name
                found.append(EventFolder(Path(folder), name, self.aliases))
        return found


def open_source(target: str, run: str | None = None,
                aliases: AliasTable | None = None) -> TensorBoardLogdir:
    """``tb://LOGDIR``. With ``run``, LOGDIR is that one run's folder (its event files may
    appear later) and sub-folders are not searched."""
    if not target:
        raise ValueError("tb:// needs a TensorBoard logdir, e.g. tb://runs/ or tb:///abs/runs")
    logdir = Path(target).expanduser().resolve()
    if logdir.is_file():
        raise ValueError(f"{logdir} is a file; point tb:// at the folder that holds the event "
                         f"files: tb://{logdir.parent}")
    return TensorBoardLogdir(logdir, run, aliases)
