"""How numbers are written in findings and messages: metric values, durations, changes and
shares. One helper per job; the analyzers and the bot both use these."""

from __future__ import annotations

import math


def fmt_number(value: float) -> str:
    """A metric value for a summary sentence: two decimals from 1 up, whole numbers with
    thousands separated from a million (bytes, a large reward), three significant digits
    below 1 and from 1e12 (a huge value stays short: ``1.41e+300``)."""
    magnitude = abs(value)
    if 1 <= magnitude < 1e6:
        return f"{value:.2f}"
    return f"{value:,.0f}" if 1e6 <= magnitude < 1e12 else f"{value:.3g}"


def fmt_duration(seconds: float | None) -> str:
    """Seconds as people read them: two units at most, a zero second unit left out.

    >>> [fmt_duration(s) for s in (0.4, 40, 125, 120, 5400, 7200, 90000, 200000, 172800)]
    ['0.4s', '40s', '2m 05s', '2m', '1h 30m', '2h', '25h', '2d 7h', '2d']
    >>> fmt_duration(None), fmt_duration(-3)
    ('unknown', '0s')
    """
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    seconds = max(0.0, seconds)
    if seconds < 10 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        big, small, unit, pad = whole // 60, whole % 60, ("m", "s"), 2
    elif whole < 2 * 86400:
        big, small, unit, pad = whole // 3600, whole % 3600 // 60, ("h", "m"), 2
    else:
        big, small, unit, pad = whole // 86400, whole % 86400 // 3600, ("d", "h"), 1
    return f"{big}{unit[0]}" + (f" {small:0{pad}d}{unit[1]}" if small else "")


def percent(change: float) -> str:
    """A relative change as a signed percentage: ``+6.6%``."""
    return f"{100 * change:+.1f}%" if math.isfinite(change) else "from zero"


def share(rate: float) -> str:
    """A rate as a whole percentage: ``45%``."""
    return f"{100 * rate:.0f}%"
