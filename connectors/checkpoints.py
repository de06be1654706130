"""The checkpoint registry: which checkpoints a run has, and whether each can be loaded.

A rollback is only as good as the checkpoint it restarts from. Before runwatch offers one it
checks that it still exists and is complete; a checkpoint is never offered past the onset
of the trouble (see :func:`choose`).

Layouts recognised:

* ``checkpoint-<step>/`` folders — HF Trainer's and runwatch's own
  (:mod:`connectors.training.torchloop`).
  Complete when nothing is missing: runwatch's ``state.pt``, or HF's ``trainer_state.json``
  with model weights (``model.safetensors``, ``pytorch_model.bin``, an adapter, or every
  shard a ``*.index.json`` lists). A ``.tmp-`` folder is a save in progress.
* Lightning ``*.ckpt`` files (``epoch=3-step=1500.ckpt``; the step comes from the name or
  from the checkpoint event the callback wrote) — complete when the file is a whole
  ``torch.save`` zip archive.
* Checkpoint events written by runwatch's callbacks, as the store holds them (a path and a
  step, pointing at either layout).

Nothing here loads a checkpoint: checking is reading a directory listing and, for a zip, its
central directory, so it is cheap enough to run before every offer.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

STEP_DIR = re.compile(r"^checkpoint-(\d+)$")
CKPT_STEP = re.compile(r"(?:^|[-_])step[=_-]?(\d+)")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors",
                "adapter_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
RUNWATCH_STATE = "state.pt"


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint on disk; ``problem`` says why it cannot be used (None: usable)."""

    step: int
    path: str
    problem: str | None = None

    @property
    def usable(self) -> bool:
        return self.problem is None


def check(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not a complete checkpoint, or None when it is.

    >>> check("/nonexistent/checkpoint-100")
    'missing: /nonexistent/checkpoint-100 does not exist'
    """
    p = Path(path)
    if not p.exists():
        return f"missing: {p} does not exist"
    if p.name.startswith(".tmp"):
        return f"incomplete: {p.name} is a save still in progress"
    if p.is_dir():
        return _check_folder(p)
    return _check_file(p)


def _check_folder(folder: Path) -> str | None:
    names = {entry.name for entry in folder.iterdir()}
    if not names:
        return f"incomplete: {folder} is empty"
    if RUNWATCH_STATE in names:
        return _check_file(folder / RUNWATCH_STATE)
    for index in INDEX_FILES:
        if index in names:
            try:
                shards = set(json.loads((folder / index).read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                return f"incomplete: {index} in {folder} is unreadable ({exc})"
            missing = sorted(shards - names)
            if missing:
                return f"incomplete: {folder} lacks weight shard(s) {', '.join(missing[:3])}"
            return None
    if any(name in names for name in WEIGHT_FILES):
        return None
    return (f"incomplete: {folder} has no model weights ({', '.join(WEIGHT_FILES[:2])}) and no "
            f"{RUNWATCH_STATE}")


def _check_file(file: Path) -> str | None:
    try:
        size = file.stat().st_size
    except OSError as exc:
        return f"missing: {file} cannot be read ({exc.strerror})"
    if size == 0:
        return f"incomplete: {file} is empty"
    if file.suffix in (".ckpt", ".pt", ".pth") or file.name == RUNWATCH_STATE:
        # torch.save writes a zip archive; a truncated copy has no central directory.
        try:
            with zipfile.ZipFile(file) as archive:
                if not any(n.endswith("data.pkl") for n in archive.namelist()):
                    return f"incomplete: {file} is a zip without a saved object"
        except (zipfile.BadZipFile, OSError):
            return f"incomplete: {file} is truncated or not a torch checkpoint"
    return None


def step_of(path: str | os.PathLike[str]) -> int | None:
    """The training step a checkpoint path names, or None.

    >>> step_of("out/checkpoint-1500"), step_of("ckpts/epoch=3-step=1200.ckpt")
    (1500, 1200)
    """
    p = Path(path)
    match = STEP_DIR.match(p.name)
    if match:
        return int(match.group(1))
    match = CKPT_STEP.search(p.stem)
    return int(match.group(1)) if match else None


def discover(run_dir: str | os.PathLike[str] | None,
             recorded: Iterable[tuple[int, str]] = ()) -> list[CheckpointInfo]:
    """Every checkpoint of a run, oldest first: folders and ``.ckpt`` files found under
    ``run_dir`` (four levels deep: Lightning keeps ``version_0/checkpoints/``) and the
    ``recorded`` ``(step, path)`` pairs from checkpoint events (or a source such as MLflow's
    local artifact folders), each checked. Without ``run_dir`` only the recorded ones count."""
    found: dict[str, int] = {}
    root = Path(run_dir) if run_dir is not None else Path.cwd()
    if run_dir is not None and root.is_dir():
        for entry in _walk(root, depth=4):
            step = step_of(entry)
            if step is not None and (entry.is_dir() and STEP_DIR.match(entry.name)
                                     or entry.suffix == ".ckpt"):
                found[str(entry)] = step
    for step, path in recorded:
        p = Path(path)
        if not p.is_absolute():
            p = root / p
        found.setdefault(str(p), int(step))
    infos = [CheckpointInfo(step, path, check(path)) for path, step in found.items()]
    return sorted(infos, key=lambda c: (c.step, c.path))


def _walk(root: Path, depth: int) -> Iterable[Path]:
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        yield entry
        if depth > 1 and entry.is_dir() and not STEP_DIR.match(entry.name):
            yield from _walk(entry, depth - 1)


class NoCheckpoint(LookupError):
    """No usable checkpoint fits the request; the message says what exists instead."""


def choose(checkpoints: list[CheckpointInfo], *, onset: int | None = None,
           step: int | None = None, margin: int = 1) -> CheckpointInfo:
    """The checkpoint to roll back to.

    ``step`` asks for one checkpoint by its step. ``onset`` (where the trouble began) is a
    bound never crossed: only checkpoints strictly before ``onset - margin`` qualify (the
    analyzers' margin: the checkpoint just before the onset may hold the bad update), and
    without ``step`` the latest of them is chosen.
    """
    usable = [c for c in checkpoints if c.usable]
    before = onset - margin if onset is not None else None
    if step is not None:
        if before is not None and step >= before:
            raise NoCheckpoint(f"step {step} is not at least {margin + 1} steps before the "
                               f"onset at step {onset}; choose an earlier checkpoint")
        exact = [c for c in checkpoints if c.step == step]
        if not exact:
            have = ", ".join(str(c.step) for c in usable[-5:]) or "none"
            raise NoCheckpoint(f"no checkpoint at step {step}; usable checkpoints: {have}")
        if not exact[-1].usable:
            raise NoCheckpoint(f"the checkpoint at step {step} cannot be used: "
                               f"{exact[-1].problem}")
        return exact[-1]
    candidates = [c for c in usable if before is None or c.step < before]
    if not candidates:
        broken = [c for c in checkpoints if not c.usable and (before is None or c.step < before)]
        why = f" ({broken[-1].problem})" if broken else ""
        where = f" before the onset at step {onset}" if onset is not None else ""
        raise NoCheckpoint(f"no usable checkpoint{where}{why}")
    return candidates[-1]
