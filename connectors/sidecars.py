"""What a run's tracker wrote beside its log, read as the run's config (issue 26 part 1), so
`/run changes` and `/run compare` see the settings of runs that no runwatch helper logged:

* Lightning's ``hparams.yaml`` (CSV and TensorBoard loggers) — the module's hyper-parameters;
* ``training_args.json`` (HF ``TrainingArguments.to_json_string()``) and
  ``training_args.yaml`` (LLaMA-Factory) — the trainer's arguments;
* ``config.json`` — the model's config when it names a ``model_type`` or ``architectures``
  (what ``save_pretrained`` writes), kept under ``model``; otherwise a training script's
  own config, taken as it is.

and what runwatch's own helpers kept beside the run, :func:`read_versions`: the versions
and change events in ``.runwatch-versions.json`` (:mod:`connectors.training.versions`), which
``runwatch launch`` writes at each start even when the script logs nothing of runwatch's.

HF's ``training_args.bin`` is a pickle: it is never read (unpickling a file can run any code).
YAML is read with ``safe_load``, so a Python object tag in it is refused, not built. A file
over :data:`MAX_BYTES`, or one that is not a mapping, is said in a notice and left out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from connectors.training.versions import HISTORY_FILE
from connectors.training.versions import recorded as recorded_versions

MAX_BYTES = 1 << 20
HPARAMS = "hparams.yaml"
TRAINING_ARGS = ("training_args.json", "training_args.yaml")
MODEL_CONFIG = "config.json"
NAMES = (HPARAMS, *TRAINING_ARGS, MODEL_CONFIG, HISTORY_FILE)
_MODEL_VALUE_CHARS = 200  # a model config's entries longer than this (label maps…) are left out


def signature(folders: Iterable[Path]) -> list[list[Any]]:
    """The size and modification time of each tracker file present: a read is needed only
    when this changes."""
    found = []
    for folder in folders:
        for name in NAMES:
            try:
                stat = os.stat(folder / name)
            except OSError:
                continue
            found.append([str(folder / name), stat.st_size, stat.st_mtime_ns])
    return found


def _load(path: Path) -> Any:
    if path.stat().st_size > MAX_BYTES:
        raise ValueError(f"over {MAX_BYTES:,} bytes")
    text = path.read_text(encoding="utf-8", errors="replace")
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def _model_part(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items()
            if len(json.dumps(v, default=str)) <= _MODEL_VALUE_CHARS}


def read_config(folders: Iterable[Path]) -> tuple[dict[str, Any], list[str]]:
    """The config the tracker files in ``folders`` hold (the first folder's win), and a
    notice for each file that could not be used.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "hparams.yaml").write_text("lr: 0.001\\nlayers: 4\\n")
    >>> _ = (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
    >>> _ = (folder / "training_args.bin").write_bytes(b"\\x80\\x04 pickle, never read")
    >>> read_config([folder])
    ({'model': {'model_type': 'llama', 'hidden_size': 64}, 'lr': 0.001, 'layers': 4}, [])
    """
    config: dict[str, Any] = {}
    notices: list[str] = []
    for folder in reversed(list(folders)):
        for name in (MODEL_CONFIG, *TRAINING_ARGS, HPARAMS):
            path = folder / name
            if not path.is_file():
                continue
            try:
                data = _load(path)
            except (OSError, ValueError, yaml.YAMLError) as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                notices.append(f"{path} not read as the run's config: {reason}")
                continue
            if not isinstance(data, dict):
                notices.append(f"{path} not read as the run's config: not a mapping")
                continue
            if name == MODEL_CONFIG and ("model_type" in data or "architectures" in data):
                config["model"] = _model_part(data)
            else:
                config.update(data)
    return config, notices


def read_versions(folders: Iterable[Path]) -> dict[str, Any]:
    """The versions, change events and (for a start only ``runwatch launch`` recorded) config
    of the first folder holding a run history; empty when none does."""
    for folder in folders:
        if (folder / HISTORY_FILE).is_file():
            return recorded_versions(folder)
    return {}
