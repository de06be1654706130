"""The ``hf://`` scheme: a Hugging Face Trainer output folder, or one ``trainer_state.json``.

``hf://out`` is one run named after the folder, read from its newest ``trainer_state.json``
(a checkpoint's while training, the folder's own at the end) with its ``checkpoint-*``
folders; ``hf://out/checkpoint-500/trainer_state.json`` reads that file alone. A folder that
does not exist yet is watched until it does. Reading is :class:`connectors.files.HfOutputDir`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from connectors.aliases import AliasTable
from connectors.files import HfOutputDir, LogFile, run_name


def open_source(target: str | os.PathLike[str], run: str | None = None,
                aliases: AliasTable | None = None) -> HfOutputDir | LogFile:
    path = Path(target)
    if path.is_file() or path.suffix.lower() == ".json":
        return LogFile(path, run or run_name(path), aliases)
    return HfOutputDir(path, run or path.resolve().name, aliases)
