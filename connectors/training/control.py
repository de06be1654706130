"""The control protocol: how runwatch asks a training process to stop or roll back.

Two small JSON files sit in the run directory, next to the run's log:

* ``runwatch-control.json`` — the request, written by the bot::

      {"id": "a1b2", "action": "rollback", "checkpoint": "checkpoint-1500",
       "skip_batches": [1600, 1800], "lr_scale": 0.9, "requested_at": 1718000000.0}

  ``id`` is the idempotency key (a Slack retry or a double click sends the same id and runs
  nothing twice), ``action`` is ``"stop"`` or ``"rollback"``; ``checkpoint`` (required for a
  rollback, a path relative to the run directory and inside it), ``skip_batches`` (the
  inclusive step range ``[first, last]`` whose batches the resumed run leaves out) and
  ``lr_scale`` (``0 < x <= 1``) belong to rollbacks only.
* ``runwatch-control.ack.json`` — the training side's answer to the latest request::

      {"id": "a1b2", "action": "rollback", "status": "done", "step": 1500,
       "detail": "...", "acknowledged_at": 1718000042.5}

  ``status`` is ``"done"``, ``"refused"`` (the request was not carried out: invalid, expired,
  or not supported by this trainer) or ``"failed"`` (carrying it out went wrong); ``step`` is
  the training step at which the process acted.

Why files: the bot and the trainer often share nothing but a filesystem (a cluster's shared
storage), and a file needs no port, no daemon and no credentials. Both files are written to a
temporary name and renamed into place, so a reader sees a whole file or the previous one.
The training side calls :meth:`ControlChannel.poll` between steps; it costs one ``stat`` while
nothing changed, so it can run every step. Every field is validated on both sides, and no
value from a request ever reaches a shell: the training process only compares strings,
resolves a path inside its own run directory and reads numbers.

This module imports neither torch nor any trainer, so the bot can use it on its own.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

REQUEST_FILE = "runwatch-control.json"
ACK_FILE = "runwatch-control.ack.json"
ACTIONS = ("stop", "rollback")
STATUSES = ("done", "refused", "failed")
# A request is a few hundred bytes; a larger file is not one of ours and is not parsed.
MAX_FILE_BYTES = 64 * 1024
# A request nobody acted on for an hour (the training process was down) is refused rather than
# carried out by whatever process starts next in the same directory.
DEFAULT_MAX_AGE_S = 3600.0
# Rollback is a recovery step: it may lower the learning rate (OPT lowered it by 10 %), never
# raise it from a chat message.
MAX_LR_SCALE = 1.0
MAX_DETAIL_CHARS = 1000
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
_REQUEST_FIELDS = ("id", "action", "checkpoint", "skip_batches", "lr_scale", "requested_at")
_ACK_FIELDS = ("id", "action", "status", "step", "detail", "acknowledged_at")
_ROLLBACK_ONLY = ("checkpoint", "skip_batches", "lr_scale")

log = logging.getLogger(__name__)


class ControlError(ValueError):
    """A request or acknowledgement that breaks the protocol; the message says what to fix."""


class ControlBusy(ControlError):
    """Another request is waiting for the training process; it would be lost if replaced."""


class EventLog(Protocol):
    """Where an acknowledgement is also recorded as a ``control`` event (a RunLogger)."""

    def log(self, step: int, **metrics: object) -> None: ...


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_id(value: object) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise ControlError(f"id must be 1-128 characters of letters, digits and . _ : @ - "
                           f"starting with a letter or digit, got {value!r}")
    return value


@dataclass(frozen=True)
class ControlRequest:
    """One request from the bot; construction validates every field that needs no run dir."""

    id: str
    action: str
    checkpoint: str | None = None
    skip_batches: tuple[int, int] | None = None
    lr_scale: float | None = None
    requested_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        _check_id(self.id)
        if self.action not in ACTIONS:
            raise ControlError(f"action must be one of {', '.join(ACTIONS)}, got {self.action!r}")
        if self.action == "stop":
            given = [name for name in _ROLLBACK_ONLY if getattr(self, name) is not None]
            if given:
                raise ControlError(f"{', '.join(given)} only apply to a rollback, not to stop")
        elif not isinstance(self.checkpoint, str) or not self.checkpoint:
            raise ControlError(f"a rollback needs a checkpoint (a path inside the run "
                               f"directory), got {self.checkpoint!r}")
        if self.skip_batches is not None:
            pair = self.skip_batches
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2
                    and all(_is_int(v) for v in pair) and 0 <= pair[0] <= pair[1]):
                raise ControlError(f"skip_batches must be two integers [first, last] with "
                                   f"0 <= first <= last, got {pair!r}")
            object.__setattr__(self, "skip_batches", (pair[0], pair[1]))
        if self.lr_scale is not None:
            if not _is_number(self.lr_scale) or not 0 < self.lr_scale <= MAX_LR_SCALE:
                raise ControlError(f"lr_scale must be a number with 0 < lr_scale <= "
                                   f"{MAX_LR_SCALE:g}, got {self.lr_scale!r}")
            object.__setattr__(self, "lr_scale", float(self.lr_scale))
        if not _is_number(self.requested_at) or self.requested_at < 0:
            raise ControlError(f"requested_at must be a Unix time in seconds, got "
                               f"{self.requested_at!r}")
        object.__setattr__(self, "requested_at", float(self.requested_at))

    def to_json(self) -> dict[str, Any]:
        """The request as written to the file; fields that do not apply are left out."""
        data: dict[str, Any] = {"id": self.id, "action": self.action}
        if self.checkpoint is not None:
            data["checkpoint"] = self.checkpoint
        if self.skip_batches is not None:
            data["skip_batches"] = list(self.skip_batches)
        if self.lr_scale is not None:
            data["lr_scale"] = self.lr_scale
        data["requested_at"] = self.requested_at
        return data

    @classmethod
    def from_json(cls, data: object) -> ControlRequest:
        """Parse a decoded request file; unknown or missing fields raise :class:`ControlError`.

        Unknown fields are refused rather than ignored: a newer bot may send an option this
        trainer's runwatch does not know, and acting without it would do something else than
        what a person confirmed.
        """
        if not isinstance(data, dict):
            raise ControlError("a control request must be a JSON object")
        unknown = sorted(set(data) - set(_REQUEST_FIELDS))
        if unknown:
            raise ControlError(f"unknown field(s) {', '.join(map(repr, unknown))}; this "
                               f"runwatch understands {', '.join(_REQUEST_FIELDS)} (upgrade "
                               f"runwatch in the training environment)")
        missing = [name for name in ("id", "action", "requested_at") if name not in data]
        if missing:
            raise ControlError(f"missing field(s) {', '.join(missing)}")
        return cls(**data)

    def checkpoint_path(self, run_dir: str | os.PathLike[str]) -> Path | None:
        """The checkpoint as an absolute path inside ``run_dir`` (None for a stop)."""
        if self.checkpoint is None:
            return None
        return resolve_checkpoint(run_dir, self.checkpoint)


@dataclass(frozen=True)
class ControlAck:
    """The training side's answer to one request."""

    id: str
    action: str
    status: str
    step: int
    detail: str = ""
    acknowledged_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        _check_id(self.id)
        if self.action not in ACTIONS:
            raise ControlError(f"action must be one of {', '.join(ACTIONS)}, got {self.action!r}")
        if self.status not in STATUSES:
            raise ControlError(f"status must be one of {', '.join(STATUSES)}, got "
                               f"{self.status!r}")
        if not _is_int(self.step) or self.step < 0:
            raise ControlError(f"step must be a non-negative integer, got {self.step!r}")
        if not isinstance(self.detail, str):
            raise ControlError(f"detail must be a string, got {self.detail!r}")
        if not _is_number(self.acknowledged_at):
            raise ControlError(f"acknowledged_at must be a Unix time in seconds, got "
                               f"{self.acknowledged_at!r}")
        object.__setattr__(self, "detail", self.detail[:MAX_DETAIL_CHARS])
        object.__setattr__(self, "acknowledged_at", float(self.acknowledged_at))

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _ACK_FIELDS}

    @classmethod
    def from_json(cls, data: object) -> ControlAck:
        """Parse a decoded acknowledgement file (strictly: it is written by runwatch only)."""
        if not isinstance(data, dict) or set(data) != set(_ACK_FIELDS):
            raise ControlError(f"an acknowledgement is a JSON object with exactly the fields "
                               f"{', '.join(_ACK_FIELDS)}")
        return cls(**data)


def resolve_checkpoint(run_dir: str | os.PathLike[str], checkpoint: str) -> Path:
    """``checkpoint`` (relative to ``run_dir``, or absolute) as a resolved path inside it.

    Symbolic links are followed before the check, so a link pointing out of the run directory
    is refused like a ``..`` path: a rollback may only load what the run itself saved.
    """
    root = Path(run_dir).resolve()
    try:
        target = (root / checkpoint).resolve()
    except (ValueError, OSError) as exc:  # an embedded NUL byte, a symlink loop
        raise ControlError(f"checkpoint {checkpoint!r} is not a usable path ({exc})") from None
    if target == root or not target.is_relative_to(root):
        raise ControlError(f"checkpoint {checkpoint!r} is not inside the run directory {root}; "
                           f"give a checkpoint saved by this run")
    return target


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write to a unique temporary name in the same folder, fsync, then rename over ``path``."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read_json(path: Path) -> object:
    """The decoded file, None if there is none; ControlError if it is not small JSON."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(raw) > MAX_FILE_BYTES:
        raise ControlError(f"{path.name} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ControlError(f"{path.name} is not valid JSON ({exc})") from None


def read_request(run_dir: str | os.PathLike[str]) -> ControlRequest | None:
    """The request in ``run_dir`` (acknowledged or not), or None if there is none."""
    data = _read_json(Path(run_dir) / REQUEST_FILE)
    return None if data is None else ControlRequest.from_json(data)


def read_ack(run_dir: str | os.PathLike[str]) -> ControlAck | None:
    """The latest acknowledgement in ``run_dir``, or None if the process has answered nothing.

    The bot compares its ``id`` with the request it is waiting for.
    """
    data = _read_json(Path(run_dir) / ACK_FILE)
    return None if data is None else ControlAck.from_json(data)


def write_request(run_dir: str | os.PathLike[str], request: ControlRequest, *,
                  replace_pending: bool = False,
                  checkpoint_root: str | os.PathLike[str] | None = None) -> Path:
    """Validate ``request`` against ``run_dir`` and write it atomically; return the file.

    The checkpoint is stored relative to the run directory, so the request still names the
    same checkpoint where the training host mounts the run directory elsewhere. Writing a
    request whose id is already there does nothing (a retry). Replacing a different request
    that the process has not acknowledged raises :class:`ControlBusy` unless
    ``replace_pending``: otherwise that request would silently never be answered.
    ``checkpoint_root`` is where the run's checkpoints live when the request goes to another
    folder (runwatch's launcher reads requests in ``<run_dir>/.runwatch-launch``).
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ControlError(f"run directory {root} does not exist")
    if request.checkpoint is not None:
        base = Path(checkpoint_root) if checkpoint_root is not None else root
        relative = resolve_checkpoint(base, request.checkpoint).relative_to(base.resolve())
        request = replace(request, checkpoint=relative.as_posix())
    try:
        current = read_request(root)
    except ControlError:
        current = None  # an unreadable request can never be acted on: replacing it loses nothing
    if current is not None:
        if current.id == request.id:
            return root / REQUEST_FILE
        ack = _ack_or_none(root)
        if not replace_pending and (ack is None or ack.id != current.id):
            raise ControlBusy(f"request {current.id!r} ({current.action}) is still waiting for "
                              f"the training process; wait for its answer or replace it on "
                              f"purpose")
    _write_json_atomic(root / REQUEST_FILE, request.to_json())
    return root / REQUEST_FILE


def _ack_or_none(run_dir: Path) -> ControlAck | None:
    try:
        return read_ack(run_dir)
    except ControlError as exc:
        log.warning("runwatch: ignoring %s: %s", run_dir / ACK_FILE, exc)
        return None


class ControlChannel:
    """The training side: picks up new requests between steps and answers them.

    Each request id is delivered at most once by :meth:`poll`; ids already answered in the
    acknowledgement file count as done, so a process restarted in the same directory does not
    act on an old request again. A request that cannot be carried out at all (invalid, or older
    than ``max_age_s``) is refused here, so the caller only sees requests worth acting on.
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, log: EventLog | None = None,
                 max_age_s: float | None = DEFAULT_MAX_AGE_S,
                 checkpoint_root: str | os.PathLike[str] | None = None) -> None:
        if max_age_s is not None and (not _is_number(max_age_s) or max_age_s <= 0):
            raise ValueError(f"max_age_s must be a positive number of seconds or None, got "
                             f"{max_age_s!r}")
        self.run_dir = Path(run_dir)
        # where a rollback's checkpoint must be (the run directory unless said otherwise)
        self.checkpoint_root = Path(checkpoint_root) if checkpoint_root is not None else \
            self.run_dir
        self.max_age_s = max_age_s
        self._log = log
        self._signature: tuple[int, int, int] | None = None
        ack = _ack_or_none(self.run_dir)
        self._handled: set[str] = {ack.id} if ack else set()

    def poll(self, step: int) -> ControlRequest | None:
        """A request not yet handled, or None; one ``stat`` when the file has not changed.

        ``step`` is where the loop is now: it is named in the refusal of a request that cannot
        be carried out.
        """
        path = self.run_dir / REQUEST_FILE
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            self._signature = None
            return None
        # A rename gives a new inode, so two requests written within one mtime tick differ too.
        signature = (stat.st_mtime_ns, stat.st_ino, stat.st_size)
        if signature == self._signature:
            return None
        self._signature = signature
        try:
            data = _read_json(path)
        except ControlError as exc:
            log.warning("runwatch: ignoring %s: %s", path, exc)
            return None
        if data is None:  # removed between stat and open
            return None
        raw_id = data.get("id") if isinstance(data, dict) else None
        if isinstance(raw_id, str) and raw_id in self._handled:
            return None
        try:
            request = ControlRequest.from_json(data)
            request.checkpoint_path(self.checkpoint_root)  # refuses one outside the run
        except ControlError as exc:
            self._refuse_unreadable(raw_id, data, step, str(exc))
            return None
        self._handled.add(request.id)
        age = time.time() - request.requested_at
        if self.max_age_s is not None and age > self.max_age_s:
            self.acknowledge(request, "refused", step,
                             f"expired: requested {age:.0f} s ago, more than the "
                             f"{self.max_age_s:.0f} s allowed; send it again if it still applies")
            return None
        return request

    def _refuse_unreadable(self, raw_id: object, data: object, step: int, why: str) -> None:
        """Answer an invalid request when it carries a usable id and action; else only warn."""
        action = data.get("action") if isinstance(data, dict) else None
        try:
            request_id = _check_id(raw_id)
        except ControlError:
            request_id = None
        if request_id is None or action not in ACTIONS:
            log.warning("runwatch: ignoring the control request in %s: %s", self.run_dir, why)
            return
        self._handled.add(request_id)
        self._answer(ControlAck(request_id, action, "refused", step, f"invalid request: {why}"))

    def acknowledge(self, request: ControlRequest, status: str, step: int,
                    detail: str = "") -> ControlAck:
        """Write the answer to ``request`` and log it as a ``control`` event; return it."""
        self._handled.add(request.id)
        return self._answer(ControlAck(request.id, request.action, status, step, detail))

    def _answer(self, ack: ControlAck) -> ControlAck:
        _write_json_atomic(self.run_dir / ACK_FILE, ack.to_json())
        if self._log is not None:
            self._log.log(ack.step, event="control",
                          control={"id": ack.id, "action": ack.action, "status": ack.status,
                                   "detail": ack.detail})
        return ack
