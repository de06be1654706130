"""The store's reads of points for people: what charts, answers (``bot.qa.retrieve``),
``/run status``, ``/run compare``, the digest and ``runwatch inspect`` ask of a run's
points, steps and tags, besides the whole attempt analyzers read (:meth:`Store.run_data`).

:class:`PointReads` is a mixin of :class:`bot.store.Store` and of :class:`bot.pgstore.PgStore`
(which keeps NaN as NULL too). Its reads go
through the ``metrics`` and ``run_steps`` views of the compact points layout. SQLite keeps
NaN as NULL: values come back as ``math.nan`` wherever a missing point and a NaN differ.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import sqlite_utils

# the finite doubles: NULL (NaN) and ±inf fall outside
FINITE = "value BETWEEN -1.7976931348623157e308 AND 1.7976931348623157e308"


def _value(value: float | None) -> float:
    return math.nan if value is None else value


class PointReads:
    db: sqlite_utils.Database  # these three are the store's (bot.store.Store)
    lock: threading.RLock
    query: Callable[..., list[dict[str, Any]]]

    # tags and steps -----------------------------------------------------------------------
    def tag_names(self, run: str) -> list[str]:
        """Every tag the run logged, in any attempt, sorted."""
        return [r["tag"] for r in self.query("SELECT DISTINCT tag FROM metrics WHERE run = ? "
                                             "ORDER BY tag", (run,))]

    def tag_summary(self, run: str) -> list[dict[str, Any]]:
        """Per tag (sorted): how many ``points``, ``first_step`` and ``last_step``."""
        return self.query("SELECT tag, COUNT(*) AS points, MIN(step) AS first_step, "
                          "MAX(step) AS last_step FROM metrics WHERE run = ? GROUP BY tag "
                          "ORDER BY tag", (run,))

    def step_span(self, run: str) -> tuple[int | None, int | None]:
        """The lowest and highest step any of the run's points has (None, None: none)."""
        [span] = self.query("SELECT MIN(step) AS lo, MAX(step) AS hi FROM metrics WHERE "
                            "run = ?", (run,))
        return span["lo"], span["hi"]

    def attempt_spans(self, run: str) -> list[dict[str, Any]]:
        """Per attempt: its ``first`` and ``last`` step and when it ``started`` and
        ``ended`` (wall times), in attempt order."""
        return self.query(
            "SELECT attempt, MIN(step) AS first, MAX(step) AS last, MIN(wall_time) AS started, "
            "MAX(wall_time) AS ended FROM run_steps WHERE run = ? GROUP BY attempt "
            "ORDER BY attempt", (run,))

    def recent_steps(self, run: str, attempt: int, limit: int = 50) -> list[dict[str, Any]]:
        """The attempt's last ``limit`` steps with their ``wall_time``, newest first."""
        return self.query(
            "SELECT step, MAX(wall_time) AS wall_time FROM run_steps WHERE run = ? AND "
            "attempt = ? GROUP BY step ORDER BY step DESC LIMIT ?", (run, attempt, limit))

    def wall_span(self, run: str, attempt: int) -> tuple[float | None, float | None]:
        """The earliest and latest wall time the attempt logged."""
        rows = self.query("SELECT MIN(wall_time) AS lo, MAX(wall_time) AS hi FROM run_steps "
                          "WHERE run = ? AND attempt = ?", (run, attempt))
        return (rows[0]["lo"], rows[0]["hi"]) if rows else (None, None)

    def wall_time_from(self, run: str, attempt: int, step: int) -> float | None:
        """The wall time of the attempt's first timed step at or after ``step``."""
        rows = self.query("SELECT wall_time FROM run_steps WHERE run = ? AND attempt = ? AND "
                          "step >= ? AND wall_time IS NOT NULL ORDER BY step LIMIT 1",
                          (run, attempt, step))
        return rows[0]["wall_time"] if rows else None

    def step_at_time(self, run: str, attempt: int, wall: float) -> int | None:
        """The attempt's first step logged at or after the wall time ``wall``."""
        rows = self.query("SELECT MIN(step) AS step FROM metrics WHERE run = ? AND "
                          "attempt = ? AND wall_time >= ?", (run, attempt, wall))
        return rows[0]["step"] if rows else None

    # values -------------------------------------------------------------------------------
    def series(self, run: str, attempt: int, tag: str) -> list[tuple[int, float]]:
        """One tag's points of an attempt as (step, value), by step."""
        rows = self.query("SELECT step, value FROM metrics WHERE run = ? AND attempt = ? AND "
                          "tag = ? ORDER BY step", (run, attempt, tag))
        return [(r["step"], _value(r["value"])) for r in rows]

    def nonfinite_points(self, run: str) -> list[dict[str, Any]]:
        """Every NaN (stored as NULL) or infinite point of the run: attempt, tag, step and
        ``value``, by attempt, tag and step."""
        rows = self.query("SELECT attempt, tag, step, value FROM metrics WHERE run = ? AND "
                          "(value IS NULL OR value > 1e308 OR value < -1e308) "
                          "ORDER BY attempt, tag, step", (run,))
        return [{**r, "value": _value(r["value"])} for r in rows]

    def value_at(self, run: str, attempt: int, tag: str, step: int) -> float | None:
        """The tag's value at ``step`` of the attempt; None when it logged none there."""
        rows = self.query("SELECT value FROM metrics WHERE run = ? AND attempt = ? AND "
                          "tag = ? AND step = ?", (run, attempt, tag, step))
        return _value(rows[0]["value"]) if rows else None

    def logged_values(self, run: str, attempt: int, tag: str) -> list[float]:
        """The tag's values of the attempt by step, NaN points left out."""
        return [r["value"] for r in self.query(
            "SELECT value FROM metrics WHERE run = ? AND attempt = ? AND tag = ? "
            "AND value IS NOT NULL ORDER BY step", (run, attempt, tag))]

    def first_step_with(self, run: str, attempt: int, tag: str, value: float) -> int | None:
        """The first step at which the tag had exactly ``value``."""
        return self.query("SELECT MIN(step) AS step FROM metrics WHERE run = ? AND "
                          "attempt = ? AND tag = ? AND value = ?",
                          (run, attempt, tag, value))[0]["step"]

    def lowest(self, run: str, attempt: int, tag: str,
               up_to: int | None = None) -> dict[str, Any] | None:
        """The tag's lowest non-NaN ``value`` (the earliest ``step`` of a tie), up to step
        ``up_to`` when given; None when it has none."""
        sql = ("SELECT step, value FROM metrics WHERE run = ? AND attempt = ? AND tag = ? "
               "AND value IS NOT NULL")
        params: tuple = (run, attempt, tag)
        if up_to is not None:
            sql, params = sql + " AND step <= ?", params + (up_to,)
        rows = self.query(sql + " ORDER BY value, step LIMIT 1", params)
        return rows[0] if rows else None

    def last_common_point(self, first: tuple[str, int], second: tuple[str, int],
                          tag: str) -> tuple[int, float, float] | None:
        """The highest step at which both (run, attempt)s logged ``tag``: (step, the first's
        value, the second's)."""
        (a, aa), (b, ba) = first, second
        rows = self.query(
            "SELECT x.step, x.value AS first, y.value AS second FROM metrics x JOIN metrics y "
            "ON y.run = ? AND y.attempt = ? AND y.tag = x.tag AND y.step = x.step "
            "WHERE x.run = ? AND x.attempt = ? AND x.tag = ? ORDER BY x.step DESC LIMIT 1",
            (b, ba, a, aa, tag))
        if not rows:
            return None
        return rows[0]["step"], _value(rows[0]["first"]), _value(rows[0]["second"])

    # charts -------------------------------------------------------------------------------
    def chart_points(self, run: str, *, attempt: int | None = None,
                     tags: Sequence[str] | None = None,
                     steps: tuple[int | None, int | None] = (None, None),
                     max_points: int | None = None
                     ) -> dict[int, dict[str, list[tuple[int, float]]]]:
        """A run's points by attempt and tag as (step, value) rows (a NaN's value None), of
        one ``attempt`` or all, of ``tags`` or all, within ``steps`` (inclusive). A series
        longer than ``max_points`` comes back reduced inside SQLite (:func:`_envelope_rows`),
        so a million points never cross into Python."""
        if tags is not None and not tags:
            return {}
        where, params = "run = ?", [run]
        if attempt is not None:
            where, params = where + " AND attempt = ?", params + [attempt]
        if tags is not None:
            where += f" AND tag IN ({','.join('?' * len(tags))})"
            params += list(tags)
        lo, hi = steps
        if lo is not None:
            where, params = where + " AND step >= ?", params + [lo]
        if hi is not None:
            where, params = where + " AND step <= ?", params + [hi]
        out: dict[int, dict[str, list[tuple[int, float]]]] = {}
        with self.lock:
            conn = self.db.conn
            groups = conn.execute(f"SELECT attempt, tag, COUNT(*), MIN(step), MAX(step) FROM "
                                  f"metrics WHERE {where} GROUP BY attempt, tag",
                                  params).fetchall()
            for att, tag, count, first, last in groups:
                one = ("run = ? AND attempt = ? AND tag = ?"
                       + (" AND step >= ?" if lo is not None else "")
                       + (" AND step <= ?" if hi is not None else ""))
                args = [run, att, tag] + [v for v in (lo, hi) if v is not None]
                if max_points is None or count <= max_points:
                    rows = conn.execute(f"SELECT step, value FROM metrics WHERE {one} "
                                        f"ORDER BY step", args).fetchall()
                else:
                    rows = _envelope_rows(conn, one, args, first, last, max_points)
                out.setdefault(att, {})[tag] = rows
        return out


def _envelope_rows(conn: Any, where: str, args: list[Any], first: int, last: int,
                   max_points: int) -> list[tuple[int, float]]:
    """:func:`bot.charts.envelope` in SQL, over buckets of steps: the first and last point,
    the minimum and maximum of each bucket (SQLite gives a bare column the row of its MIN or
    MAX; PostgreSQL has none, and picks the row with DISTINCT ON), and the first NaN, inf
    and -inf of each bucket."""
    width = max(1, -(-(last - first + 1) // max(1, max_points // 2)))
    bucket = f"(step - {int(first)}) / {int(width)}"
    rows: set[tuple[int, float]] = set()
    for pick, order in (("MIN", "ASC"), ("MAX", "DESC")):
        if getattr(conn, "dialect", "sqlite") == "postgresql":  # no bare columns: DISTINCT ON
            sql = (f"SELECT DISTINCT ON ({bucket}) step, value FROM metrics WHERE {where} AND "
                   f"{FINITE} ORDER BY {bucket}, value {order}, step")
        else:  # a window function instead reads the attempt twice as slowly
            sql = (f"SELECT step, {pick}(value) FROM metrics WHERE {where} AND {FINITE} "
                   f"GROUP BY {bucket}")
        rows.update(conn.execute(sql, args).fetchall())
    rows.update(conn.execute(
        f"SELECT MIN(step), CASE WHEN value IS NULL THEN 'nan' WHEN value > 0 THEN 'inf' "
        f"ELSE '-inf' END AS kind FROM metrics WHERE {where} AND NOT "
        f"({FINITE} AND value IS NOT NULL) GROUP BY {bucket}, kind", args).fetchall())
    rows.update(conn.execute(f"SELECT step, value FROM metrics WHERE {where} AND step IN (?, ?)",
                             [*args, first, last]).fetchall())
    return sorted((step, math.nan if value is None else float(value)) for step, value in rows)
