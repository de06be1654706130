"""Action backends: how a confirmed stop or rollback reaches a training process.

* :class:`ControlFileBackend` writes a control request (:mod:`connectors.training.control`)
  and waits for the answer. Pointed at the run directory it talks to runwatch's training-side
  callbacks (the ``control`` backend); pointed at ``<run_dir>/.runwatch-launch`` it talks to
  the supervisor of ``runwatch launch`` (the ``process`` backend).
* :class:`CommandBackend` runs an argv template (``scancel {job_id}``, ``sbatch … {checkpoint}``,
  ``kubectl …``) with validated values and no shell, and reports its exit status and the tail
  of its output.

A backend gets an :class:`ActionSpec` whose values the bot has already checked (the
checkpoint exists, is complete and lies before the onset) and returns an :class:`Outcome`;
it never raises for anything the training side or the command does.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from connectors.training.control import REQUEST_FILE as CONTROL_REQUEST_FILE
from connectors.training.control import (
    ControlBusy,
    ControlError,
    ControlRequest,
    read_ack,
    read_request,
    write_request,
)
from connectors.training.launcher import TemplateError, render, tail

OUTPUT_TAIL_CHARS = 800


@dataclass(frozen=True)
class ActionSpec:
    id: str
    action: str  # "stop" or "rollback"
    run: str
    checkpoint: str | None = None  # absolute path, inside the run directory
    checkpoint_step: int | None = None
    skip_batches: tuple[int, int] | None = None
    lr_scale: float | None = None


@dataclass(frozen=True)
class Outcome:
    status: str  # "done", "failed" or "refused"
    detail: str
    step: int | None = None
    exit_status: int | None = None
    output_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "done"


class Backend(Protocol):
    name: str

    def describe(self, spec: ActionSpec) -> str:
        """What carrying out ``spec`` would do, in one line (for dry runs and confirmations)."""

    def execute(self, spec: ActionSpec) -> Outcome: ...


class ControlFileBackend:
    def __init__(self, directory: str | os.PathLike[str], *,
                 checkpoint_root: str | os.PathLike[str], timeout_s: float = 120.0,
                 name: str = "control", poll_s: float = 0.2) -> None:
        self.directory = Path(directory)
        self.checkpoint_root = Path(checkpoint_root)
        self.timeout_s = timeout_s
        self.name = name
        self.poll_s = poll_s

    def _request(self, spec: ActionSpec) -> ControlRequest:
        return ControlRequest(id=spec.id, action=spec.action, checkpoint=spec.checkpoint,
                              skip_batches=spec.skip_batches, lr_scale=spec.lr_scale)

    def describe(self, spec: ActionSpec) -> str:
        who = "runwatch's launcher" if self.name == "process" else "the training process"
        return (f"write {self._request(spec).to_json()} to {self.directory / CONTROL_REQUEST_FILE}"
                f" for {who} to act on")

    def execute(self, spec: ActionSpec) -> Outcome:
        try:
            write_request(self.directory, self._request(spec),
                          checkpoint_root=self.checkpoint_root)
        except ControlBusy as exc:
            return Outcome("failed", str(exc))
        except (ControlError, OSError) as exc:
            return Outcome("failed", f"could not write the control request: {exc}")
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:
                ack = read_ack(self.directory)
            except ControlError:
                ack = None
            if ack is not None and ack.id == spec.id:
                detail, _, rest = ack.detail.partition("\n")
                return Outcome(ack.status, detail, step=ack.step, output_tail=rest)
            time.sleep(self.poll_s)
        self._withdraw(spec.id)
        who = ("runwatch's launcher" if self.name == "process"
               else "the training process (is it running with runwatch's callback?)")
        return Outcome("failed", f"no answer from {who} within {self.timeout_s:g} s; the "
                                 f"request was withdrawn, nothing was done")

    def _withdraw(self, request_id: str) -> None:
        """Remove our unanswered request, so a process started later does not act on it."""
        try:
            current = read_request(self.directory)
        except ControlError:
            return
        if current is not None and current.id == request_id:
            (self.directory / CONTROL_REQUEST_FILE).unlink(missing_ok=True)


class CommandBackend:
    """Runs the configured argv template for the action; placeholders are validated values."""

    name = "command"

    def __init__(self, templates: dict[str, list[str]], values: dict[str, str], *,
                 cwd: str | os.PathLike[str] | None = None, timeout_s: float = 300.0) -> None:
        self.templates = templates
        self.values = dict(values)
        self.cwd = cwd
        self.timeout_s = timeout_s

    def argv(self, spec: ActionSpec) -> list[str]:
        template = self.templates.get(spec.action) or []
        if not template:
            raise TemplateError(f"no {spec.action} command is configured for run {spec.run!r} "
                                f"(actions.runs … {spec.action} = [argv])")
        values: dict[str, object] = {**self.values, "run": spec.run}
        if spec.checkpoint is not None:
            values["checkpoint"] = spec.checkpoint
        if spec.checkpoint_step is not None:
            values["step"] = spec.checkpoint_step
        if spec.skip_batches is not None:
            values["skip_first"], values["skip_last"] = spec.skip_batches
        values["lr_scale"] = spec.lr_scale if spec.lr_scale is not None else 1.0
        return render(template, values, allowed=tuple(self.values), name=spec.action)

    def describe(self, spec: ActionSpec) -> str:
        try:
            return "run " + " ".join(self.argv(spec))
        except TemplateError as exc:
            return f"nothing: {exc}"

    def execute(self, spec: ActionSpec) -> Outcome:
        try:
            argv = self.argv(spec)
        except TemplateError as exc:
            return Outcome("refused", str(exc))
        try:
            done = subprocess.run(argv, cwd=self.cwd, capture_output=True, timeout=self.timeout_s,
                                  stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError:
            return Outcome("failed", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"") + (exc.stderr or b"")
            return Outcome("failed", f"{argv[0]} did not finish within {self.timeout_s:g} s",
                           output_tail=_tail_text(out))
        except OSError as exc:
            return Outcome("failed", f"{argv[0]} could not be started: {exc.strerror or exc}")
        out = _tail_text(done.stdout + done.stderr)
        if done.returncode != 0:
            return Outcome("failed", f"{argv[0]} exited with status {done.returncode}",
                           exit_status=done.returncode, output_tail=out)
        return Outcome("done", f"ran {' '.join(argv)}", step=spec.checkpoint_step,
                       exit_status=0, output_tail=out)


def _tail_text(data: bytes) -> str:
    return data.decode("utf-8", "replace").strip()[-OUTPUT_TAIL_CHARS:]


__all__ = ["ActionSpec", "Backend", "CommandBackend", "ControlFileBackend", "Outcome", "tail"]
