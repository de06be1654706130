"""Logged sample generations: tokens (CJK characters one each), per-evaluation grouping, and
the excerpts and examples a finding shows.

Pure functions of arrays or frames; nothing here knows about a signal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from analyzers.stats.trend import Episode

# A token is one CJK/kana character (those scripts do not separate words by spaces) or a run
# of letters and digits (any script); punctuation and spaces are not tokens.
_TOKEN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]"
                    r"|[^\W_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")



def tokens(text: str) -> list[str]:
    """Lower-cased word tokens; each CJK or kana character is a token of its own.

    >>> tokens("Hello, world! 你好世界 x_y 2024")
    ['hello', 'world', '你', '好', '世', '界', 'x', 'y', '2024']
    """
    return _TOKEN.findall(text.lower())


def evaluation_rows(generations: pd.DataFrame | None, probes_only: bool = False
                    ) -> list[tuple[int, list[str], list[str]]]:
    """The prompts and outputs of each evaluation step, ascending, in logged order;
    ``probes_only`` keeps the rows marked ``probe`` (all rows when no row carries the mark).

    >>> frame = pd.DataFrame({"step": [200, 100, 200], "prompt": ["a", "b", "c"],
    ...                       "output": ["x", "y", "z"]})
    >>> evaluation_rows(frame)
    [(100, ['b'], ['y']), (200, ['a', 'c'], ['x', 'z'])]
    """
    if generations is None or generations.empty:
        return []
    if probes_only and "probe" in generations.columns:
        generations = generations[generations["probe"].astype(bool)]
    steps = generations["step"].to_numpy(dtype=np.int64)
    order = np.argsort(steps, kind="stable")
    steps = steps[order]
    prompts = generations["prompt"].to_numpy()[order]
    outputs = generations["output"].to_numpy()[order]
    bounds = [0, *(np.flatnonzero(steps[1:] != steps[:-1]) + 1).tolist(), len(steps)]
    return [(int(steps[a]), prompts[a:b].tolist(), outputs[a:b].tolist())
            for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def excerpt(text: str, limit: int = 160) -> str:
    """The start of a text on one line, cut at ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def episode_steps(judged: Sequence[Any], episode: Episode) -> dict[str, int | None]:
    """An episode of judged evaluations (anything with a ``step``) as the steps a finding
    takes: ``onset_step``, ``detected_step`` and ``resolved_step``."""
    return {"onset_step": judged[episode.onset].step,
            "detected_step": judged[episode.fired].step,
            "resolved_step": (None if episode.resolved is None
                              else judged[episode.resolved].step)}


def shown_evaluations(judged: Sequence[Any], episode: Episode, limit: int) -> list[Any]:
    """The last ``limit`` judged evaluations up to the one that fired."""
    return list(judged[max(0, episode.fired + 1 - limit):episode.fired + 1])


def example_evidence(step: int, example: tuple[str, str] | None) -> dict[str, Any] | None:
    """A (prompt, output) example as evidence, both cut to an excerpt."""
    if example is None:
        return None
    return {"step": step, "prompt": excerpt(example[0]), "output": excerpt(example[1])}
