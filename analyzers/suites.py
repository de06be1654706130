"""Eval suites as the analyzers judge them (seed §3.4, §5.3): a named suite whose metrics sit
under one prefix, and the versions it had over a run, so numbers are compared only within one
version of a suite.

A run's metadata says which version each suite had: ``eval_suite_versions`` (the store's
record: suite → ``[[step, version], ...]`` in order, the first step ``None`` when the version
was in force from the attempt's start) or, for a log read on its own, ``eval_suites`` (suite →
version, one for the whole run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analyzers.stats.metric import tags_under

VERSIONS_KEY = "eval_suite_versions"
DECLARED_KEY = "eval_suites"


def check_suites(suites: Any) -> None:
    """``suites``: None, a list of suite names, or a mapping of name → metric prefix.

    >>> check_suites(["mmlu"]); check_suites({"mmlu": "eval/mmlu/"}); check_suites(None)
    >>> check_suites([])
    Traceback (most recent call last):
    ValueError: suites is empty: name at least one eval suite, or leave suites out
    """
    if suites is None:
        return
    if isinstance(suites, Mapping):
        pairs = list(suites.items())
    elif isinstance(suites, Sequence) and not isinstance(suites, str):
        pairs = [(name, f"eval/{name}/") for name in suites]
    else:
        raise ValueError(f"suites must be a list of eval suite names, got {suites!r}")
    if not pairs:
        raise ValueError("suites is empty: name at least one eval suite, or leave suites out")
    for name, prefix in pairs:
        if not isinstance(name, str) or not name or not isinstance(prefix, str) \
                or not prefix.strip("/"):
            raise ValueError(f"suites: {name!r} → {prefix!r} is not an eval suite name with a "
                             f"metric prefix")


def suite_prefixes(suites: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    """Name → metric prefix: a mapping as given; a name alone has its metrics under
    ``eval/<name>/``.

    >>> suite_prefixes(["mmlu"]), suite_prefixes({"biz": "eval/business/"})
    ({'mmlu': 'eval/mmlu/'}, {'biz': 'eval/business/'})
    """
    if isinstance(suites, Mapping):
        return dict(suites)
    return {name: f"eval/{name}/" for name in suites}


def suite_tags(tags: Sequence[str], prefixes: Mapping[str, str]) -> dict[str, str]:
    """The tags that belong to a suite, tag → suite name (the first suite listed wins)."""
    found: dict[str, str] = {}
    for name, prefix in prefixes.items():
        for tag in tags_under(tags, prefix):
            found.setdefault(tag, name)
    return dict(sorted(found.items()))


def version_marks(meta: Mapping[str, Any] | None, suite: str) -> list[tuple[int | None, str]]:
    """The versions ``suite`` had in this attempt: ``(from step, version)`` in order (a step
    None: from the attempt's start); empty when none was recorded."""
    if not isinstance(meta, Mapping):
        return []
    recorded = meta.get(VERSIONS_KEY)
    if isinstance(recorded, Mapping) and isinstance(recorded.get(suite), list):
        return [(None if m[0] is None else int(m[0]), str(m[1]))
                for m in recorded[suite] if isinstance(m, (list, tuple)) and len(m) == 2]
    declared = meta.get(DECLARED_KEY)
    if isinstance(declared, Mapping) and declared.get(suite) is not None:
        return [(None, str(declared[suite]))]
    return []


def version_pieces(series: pd.Series, marks: list[tuple[int | None, str]]
                   ) -> list[tuple[str | None, pd.Series]]:
    """``series`` (by step) cut where the suite's version changed: one piece per version, in
    order, each with its version (None when no version is known). A piece without points is
    left out.

    >>> s = pd.Series([0.6, 0.61, 0.5, 0.52], index=[10, 20, 30, 40])
    >>> [(v, list(p.index)) for v, p in version_pieces(s, [(None, "a1"), (25, "c3")])]
    [('a1', [10, 20]), ('c3', [30, 40])]
    >>> [(v, len(p)) for v, p in version_pieces(s, [(None, "a1"), (25, "a1")])]
    [('a1', 4)]
    """
    if not marks:
        return [(None, series)]
    cuts: list[tuple[int | None, str]] = []
    for step, version in marks:
        if not cuts or cuts[-1][1] != version:
            cuts.append((step, version))
    steps = series.index.to_numpy(dtype=np.int64)
    pieces = []
    for i, (step, version) in enumerate(cuts):
        lo = 0 if i == 0 or step is None else int(np.searchsorted(steps, step, side="left"))
        nxt = cuts[i + 1][0] if i + 1 < len(cuts) else None
        hi = len(steps) if nxt is None else int(np.searchsorted(steps, nxt, side="left"))
        if hi > lo:
            pieces.append((version, series.iloc[lo:hi]))
    return pieces
