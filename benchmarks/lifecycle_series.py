"""Compact series in the notation of Prometheus rule tests, for behaviour tests and benches.

``'2.1-0.01x200 9.5 2.0x50'`` is 2.1, 2.09, …, 0.1 (201 values), then 9.5, then 2.0 51
times. Terms, separated by spaces:

- ``a`` one value; ``NaN``, ``Inf`` and ``-Inf`` are values too;
- ``a+bxn`` / ``a-bxn``: ``a`` and ``n`` more values, each ``b`` above (below) the last;
- ``axn``: ``a`` repeated, ``n + 1`` values (``a+0xn``);
- ``_`` a step with no value, ``_xn`` ``n`` of them.
"""

from __future__ import annotations

import re

_TERM = re.compile(r"^(?P<start>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?|[-+]?Inf|NaN)"
                   r"(?:(?P<sign>[-+])(?P<step>\d+(?:\.\d*)?(?:e[-+]?\d+)?))?"
                   r"(?:x(?P<times>\d+))?$", re.I)


def expand_series(text: str) -> list[float | None]:
    """Expand a series; ``None`` is a step without a value.

    >>> expand_series("1+1x3 _ NaN 5x1")
    [1.0, 2.0, 3.0, 4.0, None, nan, 5.0, 5.0]
    >>> len(expand_series("2.1-0.01x200 9.5 2.0x50"))
    253
    """
    values: list[float | None] = []
    for term in text.split():
        if term == "_":
            values.append(None)
            continue
        if term.startswith("_x"):
            if not term[2:].isdigit():
                raise ValueError(f"bad term {term!r} in series {text!r}")
            values.extend([None] * int(term[2:]))
            continue
        match = _TERM.match(term)
        if match is None:
            raise ValueError(f"bad term {term!r} in series {text!r}; write e.g. 1+0.5x10, "
                             f"2x5, NaN or _")
        start = float(match["start"])
        step = float(match["step"] or 0) * (-1 if match["sign"] == "-" else 1)
        if match["sign"] and match["times"] is None:
            raise ValueError(f"bad term {term!r}: a slope needs a count, e.g. {term}x10")
        times = int(match["times"] or 0)
        # rounded like the series a person wrote: 2.1 - 0.01 * 3 is 2.07, not 2.0699999
        values.extend(round(start + step * i, 12) for i in range(times + 1))
    return values
