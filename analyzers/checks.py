"""Validation of analyzer parameters and metric names: one clear error that names the key."""

from __future__ import annotations

import math
from numbers import Integral, Real


def check_metric(metric: object, name: str = "metric") -> None:
    if not isinstance(metric, str) or not metric:
        raise ValueError(f"{name} must be a non-empty tag name, got {metric!r}")


def check_tags(name: str, value: object) -> None:
    """None, or a list (or tuple) of non-empty tag names."""
    if value is None:
        return
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of tags, got {value!r}")
    for tag in value:
        check_metric(tag, name)


def check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_real(name: str, value: object, minimum: float, *, allow_equal: bool = False,
               below: float | None = None) -> None:
    """A finite number above ``minimum`` (or equal, when allowed) and under ``below``."""
    ok = (not isinstance(value, bool) and isinstance(value, Real) and math.isfinite(value)
          and (value >= minimum if allow_equal else value > minimum)
          and (below is None or value < below))
    if not ok:
        relation = ">=" if allow_equal else ">"
        bound = f" and < {below}" if below is not None else ""
        raise ValueError(f"{name} must be a finite number {relation} {minimum}{bound}, "
                         f"got {value!r}")
