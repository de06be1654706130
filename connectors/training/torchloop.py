"""Logging and checkpoint helpers for hand-written PyTorch training loops.

A training script that uses :class:`RunLogger` writes exactly what runwatch reads:

* ``<run_dir>/metrics.jsonl`` — one JSON object per line. A run (or a resumed attempt)
  starts with a meta line ``{"meta": {"total_steps": ..., "config": {...},
  "started_at": ...}}``; every other line has ``step`` and ``time`` (unix seconds) plus
  metrics, or an ``event`` such as ``"checkpoint"``. Non-finite values are written as
  JSON's ``NaN`` / ``Infinity`` literals, which :func:`json.loads` reads back.
* with ``leakcheck={"train": path, "eval": path, "field": "text"}``, the meta line carries the
  result of the train/eval leakage check run at start (``budget_s``, default 30 s);
* with ``eval_suites={"mmlu": "evals/mmlu.jsonl", "business": "v4"}``, the meta line carries
  the version of each eval suite the run evaluates with (``{"eval_suites": {name: version}}``:
  a file's content hash, or the version given), so a suite that changed between attempts or
  runs is never compared across its versions;
* the meta line also carries the run's versions (data, model, code, environment;
  :mod:`connectors.training.versions`) and its change events, kept in
  ``<run_dir>/.runwatch-versions.json`` across attempts and restarts (under
  ``runwatch launch``, its record of a start replaces the launcher's);
* ``<run_dir>/checkpoint-<step>/state.pt`` — written into ``.tmp-checkpoint-<step>`` first
  and renamed into place, so a reader never sees a half-written checkpoint folder.

It also carries runwatch's control requests (:mod:`connectors.training.control`) to the loop, which
decides how to obey them; a stop and a rollback look like this::

    with RunLogger(run_dir, total_steps=steps) as logger:
        for step in range(start, steps + 1):
            ...  # train one step, logger.log(step, loss=...), logger.checkpoint(...)
            request = logger.control(step)
            if request is not None and request.action == "stop":
                logger.checkpoint(step, state())
                logger.acknowledge(request, "done", step, "stopped after a checkpoint")
                break
            if request is not None:  # rollback
                restored = load_checkpoint(request.checkpoint_path(run_dir))
                ...  # load the states, skip request.skip_batches, scale by request.lr_scale
                logger.acknowledge(request, "done", step, f"resumed at {restored['step']}")
"""

from __future__ import annotations

import json
import numbers
import os
import re
import shutil
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from connectors.training import versions as run_versions
from connectors.training.control import (
    DEFAULT_MAX_AGE_S,
    ControlAck,
    ControlChannel,
    ControlRequest,
)
from connectors.training.leakcheck import summary as leakcheck_summary

STATE_FILE = "state.pt"
_CHECKPOINT_DIR = re.compile(r"checkpoint-(\d+)")


def _plain(value: object) -> object:
    """A JSON-ready value: tensors and numpy scalars become ``float``, the rest is unchanged."""
    if isinstance(value, torch.Tensor):
        return float(value.item())
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, numbers.Real):  # numpy scalars register as numbers.Real
        return float(value)
    return value


class RunLogger:
    """Appends metric lines to ``run_dir/metrics.jsonl`` and saves atomic checkpoints.

    Use it as a context manager (or call :meth:`close`). Each line is written with one
    ``write`` call on an unbuffered append-mode file, so a concurrent reader sees either
    nothing or the whole line (``"\\n"`` included) once the call returns.

    :meth:`control` and :meth:`acknowledge` carry runwatch's control requests; a request
    older than ``control_max_age_s`` seconds (None: no limit) is refused, not delivered.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        total_steps: int | None = None,
        config: dict[str, Any] | None = None,
        log_name: str = "metrics.jsonl",
        control_max_age_s: float | None = DEFAULT_MAX_AGE_S,
        versions: bool = True,
        data: Any = None,
        eval_data: Any = None,
        model: Any = None,
        step: int | None = None,
        leakcheck: dict[str, Any] | None = None,
        eval_suites: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / log_name
        self._control = ControlChannel(self.run_dir, log=self, max_age_s=control_max_age_s)
        self._file = open(self.path, "ab", buffering=0)
        self._versions = versions
        self._inputs = {"data": data, "eval_data": eval_data, "model": model}
        self._leakcheck = leakcheck
        self._eval_suites = dict(eval_suites or {})
        self.start_attempt(total_steps=total_steps, config=config, step=step)

    def start_attempt(self, *, total_steps: int | None = None,
                      config: dict[str, Any] | None = None, step: int | None = None,
                      eval_suites: dict[str, Any] | None = None, **inputs: Any) -> None:
        """Write a meta line: the run (or, after a rollback, its new attempt) starts here, at
        ``step`` when it resumes, with this configuration. Unless ``versions=False`` was
        given, the line also carries what :func:`connectors.training.versions.capture` finds (data,
        model, code, environment; ``inputs`` replace the constructor's ``data``,
        ``eval_data``, ``model``) and every change event of the run so far: an attempt whose
        config or versions differ from the previous attempt's is one, at its step.
        ``eval_suites`` (name → suite file or declared version) replaces the constructor's;
        their versions (:func:`connectors.training.versions.suite_versions`) go in the line
        even with ``versions=False``: the bot compares eval numbers only within one."""
        meta: dict[str, Any] = {"total_steps": total_steps, "config": config or {},
                                "started_at": time.time()}
        if self._versions:
            self._inputs.update({k: v for k, v in inputs.items() if k in self._inputs})
            captured = run_versions.capture(**self._inputs)
            run_versions.record_attempt(self.run_dir, config, captured, step,
                                        launch=os.environ.get(run_versions.LAUNCH_ENV))
            meta["versions"] = captured
            meta["changes"] = run_versions.change_events(self.run_dir)
        if eval_suites is not None:
            self._eval_suites = dict(eval_suites)
        if self._eval_suites:
            meta["eval_suites"] = run_versions.suite_versions(self._eval_suites)
        if self._leakcheck:
            meta["leakcheck"] = leakcheck_summary(**self._leakcheck)
        self._write({"meta": meta})

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the log file; further logging raises ``ValueError``."""
        self._file.close()

    def _write(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, allow_nan=True, default=str) + "\n").encode("utf-8")
        written = self._file.write(data)
        # A regular file takes the whole line in one call; only a full disk or a signal
        # can cut it short, and then the rest must still follow.
        while written < len(data):
            data = data[written:]
            written = self._file.write(data)

    def log(self, step: int, **metrics: object) -> None:
        """Write one line ``{"step": step, "time": <now>, **metrics}`` and flush it.

        Tensors and numpy scalars are converted to ``float``; strings pass through (event
        lines use them). ``time`` is set here and cannot be given as a metric.
        """
        if "time" in metrics:
            raise ValueError("'time' is set by RunLogger.log and cannot be a metric name")
        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        record.update({name: _plain(value) for name, value in metrics.items()})
        self._write(record)

    def checkpoint(self, step: int, state: dict[str, Any]) -> Path:
        """Save ``state`` to ``run_dir/checkpoint-<step>/state.pt`` atomically; return the folder.

        The state is written and fsynced in ``.tmp-checkpoint-<step>``, then the folder is
        renamed into place. An existing checkpoint of the same step (a resumed run passing
        the step again) is moved aside first and deleted afterwards, so the name points
        at a complete checkpoint or at nothing, never at a partial one. A ``checkpoint``
        event line is logged once the folder is in place.
        """
        name = f"checkpoint-{int(step)}"
        final = self.run_dir / name
        tmp = self.run_dir / f".tmp-{name}"
        if tmp.exists():  # left over by a process killed while saving
            shutil.rmtree(tmp)
        tmp.mkdir()
        with open(tmp / STATE_FILE, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        old = None
        if final.exists():
            old = self.run_dir / f".old-{name}-{time.time_ns()}"
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old)
        self.log_checkpoint(step, final)
        return final

    def log_checkpoint(self, step: int, path: str | os.PathLike[str]) -> None:
        """Log a ``checkpoint`` event for a checkpoint saved at ``path`` (by any trainer).

        The path is written relative to the run directory when it is inside it, so the log
        stays valid where the run directory is mounted elsewhere; otherwise it is absolute.
        """
        # abspath, not resolve: a link such as Lightning's last.ckpt keeps its own name.
        target = Path(os.path.abspath(path))
        root = Path(os.path.abspath(self.run_dir))
        shown = target.relative_to(root).as_posix() if target.is_relative_to(root) else target
        self.log(step, event="checkpoint", path=str(shown))

    def control(self, step: int) -> ControlRequest | None:
        """A new control request from runwatch, or None; cheap enough to call every step.

        ``step`` is the step the loop is at. Each request is returned once; answer it with
        :meth:`acknowledge`. Invalid or expired requests are refused without reaching the loop.
        """
        return self._control.poll(step)

    def acknowledge(self, request: ControlRequest, status: str, step: int,
                    detail: str = "") -> ControlAck:
        """Tell runwatch what became of ``request`` (``done``, ``refused`` or ``failed``).

        Writes the acknowledgement file and a ``control`` event line at ``step``.
        """
        return self._control.acknowledge(request, status, step, detail)


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as ``(step, folder)``, oldest first.

    Only folders named ``checkpoint-<int>`` that contain ``state.pt`` count; temporary
    ``.tmp-checkpoint-*`` folders and anything else are ignored.
    """
    root = Path(run_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _CHECKPOINT_DIR.fullmatch(entry.name)
        if match and (entry / STATE_FILE).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> tuple[int, Path] | None:
    """The newest complete checkpoint as ``(step, folder)``, or ``None`` if there is none."""
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint saved by :meth:`RunLogger.checkpoint`.

    ``path`` is a checkpoint folder or its ``state.pt`` file.
    """
    file = Path(path)
    if file.is_dir():
        file = file / STATE_FILE
    # weights_only=True: the states we save hold only tensors, numbers, strings, None and
    # containers of them (state_dicts, RNG state as a uint8 tensor, a plain config dict),
    # and this loader never runs pickled code, so a tampered checkpoint cannot execute
    # anything in the process that loads it.
    return torch.load(file, map_location="cpu", weights_only=True)
