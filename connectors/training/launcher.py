"""The ``process`` action backend: runwatch starts and owns the training command.

``runwatch launch --run exp1 --run-dir out -- python train.py --out out`` runs a small
supervisor in the foreground. It starts the command as a child in its own process group,
copies its output to the terminal and to ``<run_dir>/.runwatch-launch/output.log``, and
answers control requests (:mod:`connectors.training.control`) that the bot writes into
``<run_dir>/.runwatch-launch/``:

* ``stop`` — SIGTERM to the command's process group, then SIGKILL after ``grace_s``;
* ``rollback`` — stop as above, then start the command again with the resume arguments,
  rendered from argv templates given at launch: ``resume_args`` (required for a rollback,
  e.g. ``--resume-from {checkpoint}``), ``skip_args`` (``--skip-batches {skip_first}-{skip_last}``)
  and ``lr_args`` (``--lr-scale {lr_scale}``), each used only when the request asks for it.

Templates are argv lists written by the person who launched the run; only the placeholders
below are substituted, each with a value validated here (an integer, a number in (0, 1], a
checkpoint path resolved inside the run directory), and the result is passed to
:class:`subprocess.Popen` as a list: nothing reaches a shell.

At each start, and each restart after a rollback, it records the run's versions
(:mod:`connectors.training.versions`) without the script doing anything: the settings of its
command line (:func:`argv_config`, and the rollback's ``skip_batches`` and ``lr_scale``), the
data and base model it was told of (``--data``, ``--eval-data``, ``--model``), the script's
git commit and whether its tree is dirty, and the environment of the Python running the
launcher; with both datasets, the leakage check that the overfit alert reads
(:func:`connectors.training.leakcheck.summary`, once, within its budget). A restart whose
settings differ is a change event at the checkpoint's step, in
``<run_dir>/.runwatch-versions.json``, where the bot reads it beside the run's log; a script
that records its own (``RunLogger``, the HF and Lightning callbacks) replaces the launcher's
record of the same start, told apart by :data:`connectors.training.versions.LAUNCH_ENV`.

The supervisor's state is in ``launch.json`` beside the requests (its pid, the command's pid,
the argv, whether the command is running and its exit status), so the bot can tell a live
launcher from a dead one without a database. The supervisor exits with the command's status
once the command has ended and ``linger_s`` has passed without a rollback.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from connectors.checkpoints import check as check_checkpoint
from connectors.checkpoints import step_of
from connectors.training import versions as run_versions
from connectors.training.control import (
    ControlChannel,
    ControlError,
    ControlRequest,
    _write_json_atomic,
)

LAUNCH_DIR = ".runwatch-launch"
STATE_FILE = "launch.json"
OUTPUT_FILE = "output.log"
PLACEHOLDERS = ("checkpoint", "step", "skip_first", "skip_last", "lr_scale", "run")
TAIL_LINES = 20
POLL_S = 0.2


class TemplateError(ValueError):
    """A template or a value for it that runwatch will not run; the message says which."""


def check_template(name: str, template: Sequence[str]) -> list[str]:
    """An argv template: a list of strings whose ``{placeholders}`` are known and plain.

    >>> check_template("resume_args", ["--resume-from", "{checkpoint}"])
    ['--resume-from', '{checkpoint}']
    >>> check_template("resume_args", ["{checkpoint!r}"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    connectors.training.launcher.TemplateError: resume_args: '{checkpoint!r}' uses a conversion...
    """
    if isinstance(template, str) or not all(isinstance(a, str) for a in template):
        raise TemplateError(f"{name} must be a list of strings (argv), got {template!r}")
    for arg in template:
        try:
            parts = list(string.Formatter().parse(arg))
        except ValueError as exc:
            raise TemplateError(f"{name}: {arg!r} is not a valid template ({exc})") from None
        for _, field_name, spec, conversion in parts:
            if field_name is None:
                continue
            if spec or conversion:
                raise TemplateError(f"{name}: {arg!r} uses a conversion or format spec; write "
                                    f"the bare {{name}}")
            if field_name not in PLACEHOLDERS and not field_name.isidentifier():
                raise TemplateError(f"{name}: {{{field_name}}} in {arg!r} is not a placeholder")
    return list(template)


def render(template: Sequence[str], values: dict[str, Any], *, allowed: Sequence[str] = (),
           name: str = "template") -> list[str]:
    """Substitute validated ``values`` into each argument of ``template``.

    Every value must be an int, a finite float or a string without control characters; a
    placeholder without a value is an error, never an empty string.

    >>> render(["--resume-from", "{checkpoint}", "--skip={skip_first}-{skip_last}"],
    ...        {"checkpoint": "/r/checkpoint-100", "skip_first": 101, "skip_last": 152})
    ['--resume-from', '/r/checkpoint-100', '--skip=101-152']
    """
    check_template(name, template)
    known = set(PLACEHOLDERS) | set(allowed)
    out = []
    for arg in template:
        pieces = []
        for literal, field_name, _, _ in string.Formatter().parse(arg):
            pieces.append(literal)
            if field_name is None:
                continue
            if field_name not in known:
                raise TemplateError(f"{name}: {{{field_name}}} is not a placeholder runwatch "
                                    f"fills ({', '.join(sorted(known))})")
            if field_name not in values:
                raise TemplateError(f"{name}: no value for {{{field_name}}}")
            pieces.append(_plain(field_name, values[field_name]))
        out.append("".join(pieces))
    return out


def _plain(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TemplateError(f"{{{name}}}: {value!r} is not a number or a string")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise TemplateError(f"{{{name}}}: {value!r} is not finite")
        return repr(value)
    text = str(value)
    if any(ord(c) < 32 or c == "\x7f" for c in text):
        raise TemplateError(f"{{{name}}}: control characters are not allowed")
    return text


@dataclass
class Templates:
    resume_args: list[str] = field(default_factory=list)
    skip_args: list[str] = field(default_factory=list)
    lr_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("resume_args", "skip_args", "lr_args"):
            setattr(self, name, check_template(name, getattr(self, name)))

    @classmethod
    def from_strings(cls, resume: str | None, skip: str | None, lr: str | None) -> Templates:
        """Templates given on the command line as one string each (split like a shell)."""
        return cls(*(shlex.split(text) if text else [] for text in (resume, skip, lr)))

    def resume_argv(self, base: Sequence[str], request: ControlRequest, checkpoint: Path,
                    step: int, run: str) -> list[str]:
        """``base`` plus the arguments that resume from ``checkpoint`` as ``request`` asks."""
        if not self.resume_args:
            raise TemplateError("this run was launched without --resume-args, so runwatch "
                                "does not know how to resume it; launch it again with e.g. "
                                "--resume-args '--resume-from {checkpoint}'")
        values: dict[str, Any] = {"checkpoint": str(checkpoint), "step": step, "run": run}
        argv = list(base) + render(self.resume_args, values, name="resume_args")
        if request.skip_batches is not None:
            if not self.skip_args:
                raise TemplateError("skipping batches was asked for, but this run was launched "
                                    "without --skip-args; roll back without skipping or "
                                    "launch with e.g. --skip-args '--skip-batches "
                                    "{skip_first}-{skip_last}'")
            values.update(skip_first=request.skip_batches[0], skip_last=request.skip_batches[1])
            argv += render(self.skip_args, values, name="skip_args")
        if request.lr_scale is not None and request.lr_scale != 1.0:
            if not self.lr_args:
                raise TemplateError("an LR scale was asked for, but this run was launched "
                                    "without --lr-args; launch with e.g. --lr-args "
                                    "'--lr-scale {lr_scale}'")
            values["lr_scale"] = request.lr_scale
            argv += render(self.lr_args, values, name="lr_args")
        return argv


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def argv_config(argv: Sequence[str]) -> dict[str, Any]:
    """The settings a command line gives: each ``--name value`` or ``--name=value`` (``-`` in
    names as ``_``, numbers as numbers), a bare ``--flag`` as true, and the ``command`` before
    the first of them; other words after it are ``args``.

    >>> argv_config(["python", "train.py", "--lr", "3e-4", "--bf16", "--out=runs/a",
    ...              "--warmup-steps", "100", "extra"])  # doctest: +NORMALIZE_WHITESPACE
    {'command': ['python', 'train.py'], 'lr': 0.0003, 'bf16': True, 'out': 'runs/a',
     'warmup_steps': 100, 'args': ['extra']}
    """
    config: dict[str, Any] = {}
    command: list[str] = []
    args: list[str] = []
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--") and len(word) > 2:
            name, eq, text = word[2:].partition("=")
            key = name.replace("-", "_")
            if eq:
                config[key] = _value(text)
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                config[key] = _value(words[i + 1])
                i += 1
            else:
                config[key] = True
        elif config:
            args.append(word)
        else:
            command.append(word)
        i += 1
    out: dict[str, Any] = {"command": command, **config}
    if args:
        out["args"] = args
    return out


def script_dir(argv: Sequence[str]) -> Path:
    """The folder of the script a command runs (its first ``.py`` or ``.sh`` argument that is
    a file), whose git commit is the run's code; the working directory otherwise."""
    for word in argv:
        path = Path(word)
        if path.suffix in (".py", ".sh") and path.is_file():
            return path.resolve().parent
    return Path.cwd()


def launch_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / LAUNCH_DIR


def read_state(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The launcher's ``launch.json`` for a run directory, or None when it has none."""
    try:
        return json.loads((launch_dir(run_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def launcher_alive(state: dict[str, Any]) -> bool:
    """Whether the launcher that wrote ``state`` still runs (same host only)."""
    if state.get("host") != socket.gethostname() or state.get("finished"):
        return False
    try:
        os.kill(int(state["launcher_pid"]), 0)
    except (ProcessLookupError, KeyError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def tail(path: Path, lines: int = TAIL_LINES, max_chars: int = 800) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])[-max_chars:]


class Launcher:
    """Runs ``argv`` and obeys the bot's stop and rollback requests for run ``run``."""

    def __init__(self, run: str, argv: Sequence[str], run_dir: str | os.PathLike[str], *,
                 templates: Templates | None = None, grace_s: float = 30.0,
                 linger_s: float = 0.0, echo: TextIO | None = sys.stdout,
                 log: Callable[[str], None] | None = None, versions: bool = True,
                 data: str | os.PathLike[str] | None = None,
                 eval_data: str | os.PathLike[str] | None = None,
                 model: str | os.PathLike[str] | None = None,
                 leak_field: str = "text", leak_budget_s: float = 30.0) -> None:
        if not argv:
            raise ValueError("nothing to launch: give the training command after --")
        self.run = run
        self.base_argv = list(argv)
        self.run_dir = Path(run_dir).resolve()
        self.dir = launch_dir(self.run_dir)
        self.templates = templates or Templates()
        self.grace_s = grace_s
        self.linger_s = linger_s
        self.echo = echo
        self._log = log or (lambda text: print(f"runwatch launch [{self.run}]: {text}",
                                               file=sys.stderr, flush=True))
        self.child: subprocess.Popen[bytes] | None = None
        self.argv: list[str] = list(argv)
        self.exit_status: int | None = None
        self.ended_at: float | None = None
        self._pump: threading.Thread | None = None
        self._recent: deque[str] = deque(maxlen=TAIL_LINES)
        self.versions = versions
        self.inputs = {"data": data, "eval_data": eval_data, "model": model}
        self.leak = {"train": data, "eval": eval_data, "field": leak_field,
                     "budget_s": leak_budget_s} if data and eval_data else None
        self._leak_result: dict[str, Any] | None = None

    # process ------------------------------------------------------------------------------
    def start(self, argv: Sequence[str] | None = None, *, step: int | None = None,
              settings: dict[str, Any] | None = None) -> None:
        """Start the command (``argv``, the base command by default), resuming at ``step``
        with the rollback's ``settings`` (``skip_batches``, ``lr_scale``) when it restarts."""
        self.argv = list(argv or self.base_argv)
        self.dir.mkdir(parents=True, exist_ok=True)
        env = None
        if self.versions:
            start_id = uuid.uuid4().hex
            self.record_versions(step, settings or {}, start_id)
            env = {**os.environ, run_versions.LAUNCH_ENV: start_id}
        out = open(self.dir / OUTPUT_FILE, "ab")
        out.write(f"--- runwatch launch {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                  f"{shlex.join(self.argv)}\n".encode())
        out.flush()
        self.child = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                      env=env)
        self.exit_status = None
        self.ended_at = None
        self._pump = threading.Thread(target=self._copy_output, args=(self.child, out),
                                      daemon=True)
        self._pump.start()
        self._log(f"started pid {self.child.pid}: {shlex.join(self.argv)}")
        self._save_state()

    def record_versions(self, step: int | None, settings: dict[str, Any],
                        start_id: str) -> dict[str, Any] | None:
        """Record this start's versions in the run's history; return its change event. A
        failure is said and the command starts all the same."""
        config = {**argv_config(self.base_argv), **settings}
        try:
            captured = run_versions.capture(code_dir=script_dir(self.base_argv),
                                            **self.inputs)
            if self.leak is not None and self._leak_result is None:  # once: the same data
                from connectors.training.leakcheck import summary as leakcheck_summary

                self._leak_result = leakcheck_summary(**self.leak)
            extra = {"leakcheck": self._leak_result} if self._leak_result else None
            return run_versions.record_attempt(self.run_dir, config, captured, step,
                                               source="launch", launch=start_id, extra=extra)
        except (OSError, ValueError) as exc:
            self._log(f"versions not recorded: {exc}")
            return None

    def _copy_output(self, child: subprocess.Popen[bytes], out: Any) -> None:
        assert child.stdout is not None
        with out:
            for line in iter(child.stdout.readline, b""):
                out.write(line)
                out.flush()
                text = line.decode("utf-8", "replace").rstrip("\n")
                self._recent.append(text)
                if self.echo is not None:
                    print(text, file=self.echo, flush=True)

    def running(self) -> bool:
        return self.child is not None and self.child.poll() is None

    def _reap(self) -> None:
        if self.child is not None and self.exit_status is None and self.child.poll() is not None:
            self.exit_status = self.child.returncode
            self.ended_at = time.time()
            if self._pump is not None:
                self._pump.join(timeout=5)
            self._log(f"pid {self.child.pid} exited with status {self.exit_status}")
            self._save_state()

    def stop_child(self) -> tuple[int, str]:
        """SIGTERM the command's process group, SIGKILL after the grace period; return the
        exit status and how it ended."""
        assert self.child is not None
        pgid = self.child.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.child.wait(timeout=self.grace_s)
            how = "stopped with SIGTERM"
        except subprocess.TimeoutExpired:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.child.wait()
            how = f"did not stop within {self.grace_s:g} s of SIGTERM; killed with SIGKILL"
        self._reap()
        return self.child.returncode, how

    # requests -----------------------------------------------------------------------------
    def handle(self, request: ControlRequest, channel: ControlChannel) -> None:
        self._reap()
        if request.action == "stop":
            if not self.running():
                channel.acknowledge(request, "failed", 0,
                                    f"the process had already exited with status "
                                    f"{self.exit_status}; nothing to stop")
                return
            status, how = self.stop_child()
            channel.acknowledge(request, "done", 0,
                                f"pid {self.child.pid} {how} (exit status {status})\n"
                                f"{self.output_tail()}")
            return
        checkpoint = request.checkpoint_path(self.run_dir)
        step = _checkpoint_step(checkpoint)
        problem = check_checkpoint(checkpoint)
        if problem is not None:  # refuse before stopping anything
            channel.acknowledge(request, "refused", step, f"checkpoint {problem}")
            return
        try:
            argv = self.templates.resume_argv(self.base_argv, request, checkpoint, step,
                                              self.run)
        except TemplateError as exc:
            channel.acknowledge(request, "refused", step, str(exc))
            return
        stopped = ""
        if self.running():
            status, how = self.stop_child()
            stopped = f"pid {self.child.pid} {how} (exit status {status}); "
        settings: dict[str, Any] = {}
        if request.skip_batches is not None:
            settings["skip_batches"] = list(request.skip_batches)
        if request.lr_scale is not None and request.lr_scale != 1.0:
            settings["lr_scale"] = request.lr_scale
        try:
            self.start(argv, step=step, settings=settings)
        except OSError as exc:
            channel.acknowledge(request, "failed", step,
                                f"{stopped}relaunch failed: {exc.strerror or exc}")
            return
        channel.acknowledge(request, "done", step,
                            f"{stopped}relaunched as pid {self.child.pid} from "
                            f"{checkpoint.name}: {shlex.join(argv)}")

    def output_tail(self) -> str:
        return "\n".join(self._recent)[-800:]

    def _save_state(self, finished: bool = False) -> None:
        _write_json_atomic(self.dir / STATE_FILE, {
            "run": self.run, "host": socket.gethostname(), "launcher_pid": os.getpid(),
            "pid": self.child.pid if self.child else None, "argv": self.argv,
            "base_argv": self.base_argv, "running": self.running(),
            "exit_status": self.exit_status, "finished": finished, "updated_at": time.time(),
            "templates": {"resume_args": self.templates.resume_args,
                          "skip_args": self.templates.skip_args,
                          "lr_args": self.templates.lr_args},
        })

    def serve(self, should_exit: Callable[[], bool] = lambda: False) -> int:
        """Start the command and supervise it until it has ended and ``linger_s`` passed."""
        self.dir.mkdir(parents=True, exist_ok=True)
        channel = ControlChannel(self.dir, checkpoint_root=self.run_dir, max_age_s=600)
        self.start()
        try:
            while not should_exit():
                request = channel.poll(0)
                if request is not None:
                    try:
                        self.handle(request, channel)
                    except (ControlError, OSError) as exc:
                        channel.acknowledge(request, "failed", 0, str(exc))
                self._reap()
                if (not self.running() and self.ended_at is not None
                        and time.time() - self.ended_at >= self.linger_s):
                    break
                time.sleep(POLL_S)
        finally:
            if self.running():
                self.stop_child()
            self._reap()
            self._save_state(finished=True)
        return self.exit_status if self.exit_status is not None else 1


def _checkpoint_step(path: Path) -> int:
    step = step_of(path)
    return step if step is not None else 0
