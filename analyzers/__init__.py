"""Analyzers: one signal per module, registered through one path.

Built-ins are listed in :data:`DEFAULT_ANALYZERS` and registered exactly as a third-party
module would be: importing the module runs :func:`register` on its class.
"""

from __future__ import annotations

import importlib
from typing import Any

from analyzers.base import Analyzer, Checkpoint, RunData
from analyzers.finding import Finding, Fix, RollbackTarget

DEFAULT_ANALYZERS = ("analyzers.spike", "analyzers.divergence", "analyzers.plateau",
                     "analyzers.grad_norm", "analyzers.throughput_drop", "analyzers.memory",
                     "analyzers.checkpoint_gap", "analyzers.overfit",
                     "analyzers.diminishing_returns", "analyzers.lr_schedule",
                     "analyzers.oscillation", "analyzers.forgetting", "analyzers.business_flat",
                     "analyzers.reward_hacking", "analyzers.reward_collapse",
                     "analyzers.stalled", "analyzers.repetition", "analyzers.role_confusion",
                     "analyzers.over_refusal")

REGISTRY: dict[str, type[Analyzer]] = {}


def register(cls: type[Analyzer]) -> type[Analyzer]:
    """Class decorator: make an analyzer available under its ``signal`` id."""
    if not getattr(cls, "signal", None):
        raise TypeError(f"{cls.__name__} must set a 'signal' id")
    REGISTRY[cls.signal] = cls
    return cls


def load(modules: tuple[str, ...] | list[str] = DEFAULT_ANALYZERS) -> dict[str, type[Analyzer]]:
    for name in modules:
        importlib.import_module(name)
    return dict(REGISTRY)


def build(settings: dict[str, dict[str, Any]] | None = None,
          modules: tuple[str, ...] | list[str] = DEFAULT_ANALYZERS) -> list[Analyzer]:
    """One instance per registered signal, with per-signal parameters from configuration.

    An unknown signal or parameter raises ``ValueError`` naming it.
    """
    settings = settings or {}
    registry = load(modules)
    unknown = sorted(set(settings) - set(registry))
    if unknown:
        raise ValueError(f"unknown analyzer {unknown[0]!r}; known: {', '.join(sorted(registry))}")
    analyzers = []
    for signal, cls in sorted(registry.items()):
        params = dict(settings.get(signal, {}))
        enabled = params.pop("enabled", True)
        if not enabled:
            continue
        try:
            analyzers.append(cls(**params))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"analyzers.{signal}: {exc}") from exc
    return analyzers


__all__ = ["Analyzer", "Checkpoint", "Finding", "Fix", "RollbackTarget", "RunData",
           "REGISTRY", "DEFAULT_ANALYZERS", "build", "load", "register"]
