"""Sources by URI scheme: ``tb://logdir``, ``mlflow://host:port?experiment=…``, … or a path.

Built-in schemes are listed in :data:`SCHEMES` (scheme → module) and imported only when a
source uses them, so a heavy client library costs nothing to a team that does not use it.
Each module defines ``open_source(target, run, aliases) -> Source``; a plain path is a file
or a watched folder, its format detected from its contents.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from connectors.aliases import AliasTable
from connectors.base import Source
from connectors.formats import LinePattern

SCHEMES: dict[str, str] = {
    "file": "connectors.files",
    "hf": "connectors.hf",
    "tb": "connectors.tensorboard",
    "mlflow": "connectors.mlflow",
    "wandb": "connectors.wandb",
}


def known_schemes() -> list[str]:
    return sorted(SCHEMES)


def split_uri(uri: str) -> tuple[str, str]:
    """``("tb", "runs/")`` for ``tb://runs/``; a plain path is the ``file`` scheme."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return "file", uri
    return scheme.lower(), rest


def open_source(uri: str, run: str | None = None, aliases: AliasTable | None = None, *,
                patterns: Sequence[LinePattern] = ()) -> Source:
    """The source for ``uri``; an unknown scheme raises ``ValueError`` listing the known ones.
    ``patterns`` extend the text-log pattern table of file sources."""
    scheme, target = split_uri(uri)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown source scheme '{scheme}://' in {uri!r}; known schemes: "
                         f"{', '.join(s + '://' for s in known_schemes())}, or a plain path")
    module = importlib.import_module(SCHEMES[scheme])
    if scheme == "file":
        return module.open_source(target, run, aliases, patterns=patterns)
    return module.open_source(target, run, aliases)
