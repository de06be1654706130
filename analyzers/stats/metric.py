"""What a metric's name and numbers mean: its direction (lower or higher is better), the
tags under a prefix, a number from a config, and how an improvement or a share is written.

Pure functions of arrays or frames; nothing here knows about a signal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

# Name parts that make a metric lower-is-better.
_LOWER_IS_BETTER = ("loss", "perplexity", "ppl")


def higher_is_better(tag: str) -> bool:
    """Whether a larger value of ``tag`` is better: anything but a loss or a perplexity.

    >>> higher_is_better("eval/general/accuracy"), higher_is_better("eval/business/loss")
    (True, False)
    >>> higher_is_better("eval/loss"), higher_is_better("eval/general/wiki_ppl")
    (False, False)
    """
    name = tag.rsplit("/", 1)[-1].lower()
    return not any(part in name for part in _LOWER_IS_BETTER)


def has_direction(tag: str) -> bool:
    """Whether a move of ``tag`` is better or worse by its name alone: a loss or perplexity,
    or an eval score — not the grad norm, the learning rate or throughput.

    >>> has_direction("train/loss"), has_direction("eval/general/accuracy"), has_direction("lr")
    (True, True, False)
    """
    return not higher_is_better(tag) or tag.lower().startswith("eval/")


def config_number(value: Any) -> float | None:
    """A finite number from a run's config (MLflow stores params as text), or None.

    >>> config_number("500"), config_number(2e-4), config_number(True), config_number("x")
    (500.0, 0.0002, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value):
        return float(value)
    return None


def tags_under(tags: Iterable[str], prefix: str) -> list[str]:
    """The tags equal to ``prefix`` or below it (``eval/general`` holds
    ``eval/general/accuracy``, not ``eval/generalist``), sorted."""
    return sorted(t for t in tags if t == prefix or t.startswith(prefix.rstrip("/") + "/"))


def improvement(reference: float | np.ndarray, value: float | np.ndarray,
                higher: bool) -> np.ndarray:
    """Relative improvement of ``value`` on ``reference`` (positive: better); on a zero
    reference, the plain difference."""
    reference = np.asarray(reference, dtype=float)
    change = np.asarray(value, dtype=float) - reference
    if not higher:
        change = -change
    scale = np.abs(reference)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale > 0, change / np.where(scale > 0, scale, 1.0), change)


