"""PostgreSQL as the shared store, for several runwatch instances on one database server.

Owns the PostgreSQL schema and the store methods that instances share: runs, points (the
compact layout of :mod:`bot.store`: integer series ids, one row per point, the wall time
once per step), cursors, the outbox with claims, and run leases. The methods and their
meaning are those of :class:`bot.store.Store`; ``tests/bot/test_shared_store.py`` runs one
suite against both. Leases are judged by the database server's clock, so instances on
machines whose clocks drift still agree on who owns a run.

The other concerns (:mod:`bot.store.alerts`, :mod:`bot.store.audit`, :mod:`bot.store.qa`,
:mod:`bot.store.runinfo`) are the mixins :class:`bot.store.Store` has, inherited: their
methods write through ``db`` (a :class:`PgTransaction`, the sqlite-utils surface they use)
and read through :meth:`PgStore.query`, both taking SQLite's ``?`` placeholders, so each
concern's logic is written once. ``runwatch serve`` runs the whole bot on one; a second
``serve`` on the same database is refused (:class:`ServeLock`): the full bot takes no
leases yet, so several instances are :mod:`bot.shared_watch`'s.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd

from analyzers.base import METRIC_COLUMNS, Checkpoint, RunData
from bot.store import (
    IngestResult,
    LeaseLost,
    Store,
    attempt_segments,
    is_postgres,
    run_update,
)
from bot.store.alerts import AlertStore
from bot.store.audit import AuditStore
from bot.store.qa import PointReads
from bot.store.runinfo import RunRecords

SCHEMA = [
    """CREATE TABLE runs (name text PRIMARY KEY, source text, log_path text,
        attempt integer NOT NULL DEFAULT 1, total_steps bigint, config text, meta text,
        created_at double precision, updated_at double precision,
        last_point_at double precision, last_wall_time double precision,
        malformed_lines integer NOT NULL DEFAULT 0, first_malformed_line integer,
        first_malformed_error text, skipped_values integer NOT NULL DEFAULT 0,
        last_notice text, unjudged integer NOT NULL DEFAULT 0)""",
    """CREATE TABLE attempts (id serial PRIMARY KEY, run text NOT NULL,
        attempt integer NOT NULL, UNIQUE (run, attempt))""",
    "CREATE TABLE tags (id serial PRIMARY KEY, name text NOT NULL UNIQUE)",
    """CREATE TABLE series (id serial PRIMARY KEY, attempt_id integer NOT NULL,
        tag_id integer NOT NULL, UNIQUE (attempt_id, tag_id))""",
    """CREATE TABLE points (series integer NOT NULL, step bigint NOT NULL,
        value double precision, PRIMARY KEY (series, step))""",
    """CREATE TABLE steps (attempt_id integer NOT NULL, step bigint NOT NULL,
        wall_time double precision, PRIMARY KEY (attempt_id, step))""",
    """CREATE VIEW metrics AS SELECT a.run, a.attempt, t.name AS tag, p.step, p.value,
        w.wall_time FROM points p JOIN series s ON s.id = p.series
        JOIN attempts a ON a.id = s.attempt_id JOIN tags t ON t.id = s.tag_id
        LEFT JOIN steps w ON w.attempt_id = s.attempt_id AND w.step = p.step""",
    """CREATE TABLE checkpoints (run text, step bigint, path text,
        wall_time double precision, PRIMARY KEY (run, step))""",
    """CREATE TABLE cursors (source_key text PRIMARY KEY, run text, state text,
        updated_at double precision)""",
    """CREATE TABLE outbox (id bigserial PRIMARY KEY, kind text, fingerprint text, run text,
        channel text, state text NOT NULL DEFAULT 'pending',
        attempts integer NOT NULL DEFAULT 0, next_attempt_at double precision,
        last_error text, created_at double precision, sent_at double precision,
        response text, message_id bigint, claimed_by text)""",
    "CREATE INDEX outbox_due ON outbox (state, next_attempt_at)",
    """CREATE TABLE notifications (id bigserial PRIMARY KEY, fingerprint text, kind text,
        created_at double precision, outbox_id bigint)""",
    "CREATE TABLE instances (id text PRIMARY KEY, seen_at double precision)",
    """CREATE TABLE leases (run text PRIMARY KEY, owner text NOT NULL,
        acquired_at double precision, expires_at double precision)""",
    # the alert concern (bot.store.alerts)
    """CREATE TABLE findings (fingerprint text PRIMARY KEY, run text, attempt integer,
        signal text, metric text, severity text, state text, onset_step bigint,
        detected_step bigint, resolved_step bigint, summary text, data text,
        first_seen double precision, last_seen double precision,
        resolved_at double precision)""",
    "CREATE INDEX findings_run_state ON findings (run, state)",
    """CREATE TABLE alerts (fingerprint text PRIMARY KEY, run text, attempt integer,
        signal text, metric text, severity text, labels text, channel text, group_key text,
        state text, evaluations integer DEFAULT 0, pending_since double precision,
        fired_at double precision, resolved_at double precision, message_id bigint,
        notified text, muted text, shown text, escalated_at double precision,
        updated_at double precision)""",
    "CREATE INDEX alerts_run_state ON alerts (run, state)",
    "CREATE INDEX alerts_group_key ON alerts (group_key)",
    """CREATE TABLE alert_messages (id bigserial PRIMARY KEY, group_key text, run text,
        channel text, ts text, created_at double precision, posted_at double precision)""",
    """CREATE TABLE alert_groups (key text PRIMARY KEY, run text, channel text, oncall text,
        message_id bigint, notified_at double precision, firing text, resolved text)""",
    """CREATE TABLE silences (id bigserial PRIMARY KEY, matchers text,
        starts_at double precision, ends_at double precision, created_by text, reason text,
        created_at double precision, expired_by text)""",
    """CREATE TABLE acknowledgements (fingerprint text PRIMARY KEY, "user" text,
        at double precision)""",
    """CREATE TABLE threads (channel text, ts text, run text, fingerprint text,
        created_at double precision, PRIMARY KEY (channel, ts))""",
    "CREATE INDEX threads_fingerprint ON threads (fingerprint)",
    """CREATE TABLE thread_messages (id bigserial PRIMARY KEY, channel text, thread_ts text,
        ts text, fingerprint text, run text, "user" text, text text, at double precision,
        UNIQUE (channel, ts))""",
    "CREATE INDEX thread_messages_fingerprint ON thread_messages (fingerprint)",
    # the action concern (bot.store.audit)
    """CREATE TABLE actions (id bigserial PRIMARY KEY, at double precision, run text,
        action text, actor text, status text, detail text, request_id text,
        exit_status integer, output_tail text)""",
    """CREATE TABLE action_requests (id text PRIMARY KEY, run text, action text, params text,
        state text, requested_by text, channel text, thread_ts text, fingerprint text,
        confirmed_by text, backend text, result text, created_at double precision,
        updated_at double precision, followup text)""",
    "CREATE INDEX action_requests_run_state ON action_requests (run, state)",
    # the reads of points for people (bot.store.qa)
    """CREATE VIEW run_steps AS SELECT a.run, a.attempt, w.step, w.wall_time FROM steps w
        JOIN attempts a ON a.id = w.attempt_id""",
    # the records about runs (bot.store.runinfo)
    """CREATE TABLE sources (uri text PRIMARY KEY, state text, runs integer DEFAULT 0,
        last_ok_at double precision, last_error text, errors integer DEFAULT 0,
        malformed_lines integer DEFAULT 0, skipped_values integer DEFAULT 0,
        updated_at double precision, last_error_at double precision)""",
    """CREATE TABLE generations (id bigserial PRIMARY KEY, run text, attempt integer,
        step bigint, prompt text, output text, probe integer)""",
    "CREATE INDEX generations_run_attempt ON generations (run, attempt)",
    """CREATE TABLE eval_suite_versions (id bigserial PRIMARY KEY, run text, attempt integer,
        suite text, version text, step bigint, prefix text, source text,
        recorded_at double precision)""",
    "CREATE INDEX eval_suite_versions_run_suite ON eval_suite_versions (run, suite)",
    "ALTER TABLE runs ADD COLUMN resume_after double precision",
    "ALTER TABLE runs ADD COLUMN thinned_at double precision",
]

# The key of each table the mixins write through ``db[table]`` (:class:`PgTransaction`).
KEYS: dict[str, tuple[str, ...]] = {
    "findings": ("fingerprint",), "alerts": ("fingerprint",), "alert_groups": ("key",),
    "alert_messages": ("id",), "silences": ("id",), "acknowledgements": ("fingerprint",),
    "threads": ("channel", "ts"), "thread_messages": ("id",), "actions": ("id",),
    "action_requests": ("id",), "outbox": ("id",), "runs": ("name",),
    "cursors": ("source_key",), "checkpoints": ("run", "step"), "sources": ("uri",),
    "generations": ("id",), "eval_suite_versions": ("id",),
}

CLOCK = "extract(epoch from clock_timestamp())::double precision"

# a string literal (left as it is) or a ``?`` placeholder (made ``%s``)
_PLACEHOLDER = re.compile(r"'[^']*'|\?")


def pg_sql(sql: str) -> str:
    """The store's SQL with SQLite's ``?`` placeholders as psycopg's ``%s``.

    >>> pg_sql("SELECT * FROM alerts WHERE run = ? AND state = '?' LIMIT ?")
    "SELECT * FROM alerts WHERE run = %s AND state = '?' LIMIT %s"
    """
    return _PLACEHOLDER.sub(lambda m: "%s" if m.group() == "?" else m.group(), sql)


def _quoted(column: str) -> str:
    return f'"{column}"'


class PgTable:
    """``db[table]`` of a :class:`PgTransaction`: the writes of a sqlite-utils table the
    store's mixins use, with SQLite's meaning (``replace``: the whole row is replaced)."""

    def __init__(self, db: PgTransaction, name: str) -> None:
        self.db, self.name = db, name
        self.key = KEYS[name]
        self.last_pk: Any = None

    def _where(self, values: tuple) -> tuple[str, tuple]:
        return " AND ".join(f"{_quoted(k)} = %s" for k in self.key), values

    def insert(self, row: dict[str, Any], *, replace: bool = False,
               ignore: bool = False) -> PgTable:
        if replace:  # SQLite's INSERT OR REPLACE: the old row goes, columns not named too
            where, params = self._where(tuple(row[k] for k in self.key))
            self.db.execute(f"DELETE FROM {self.name} WHERE {where}", params)
        columns = ", ".join(_quoted(c) for c in row)
        sql = (f"INSERT INTO {self.name} ({columns}) VALUES ({', '.join(['%s'] * len(row))})"
               + (" ON CONFLICT DO NOTHING" if ignore else "")
               + f" RETURNING {', '.join(_quoted(k) for k in self.key)}")
        found = self.db.execute(sql, tuple(row.values())).fetchone()
        self.last_pk = None if found is None else (
            found[self.key[0]] if len(self.key) == 1 else tuple(found[k] for k in self.key))
        return self

    def insert_all(self, rows: list[dict[str, Any]], *, replace: bool = False,
                   batch_size: int | None = None) -> PgTable:
        """Rows with the same columns; ``batch_size`` is sqlite-utils' and means nothing here."""
        if replace:
            for row in rows:
                self.insert(row, replace=True)
        elif rows:
            columns = list(rows[0])
            self.db.executemany(
                f"INSERT INTO {self.name} ({', '.join(_quoted(c) for c in columns)}) VALUES "
                f"({', '.join(['%s'] * len(columns))})", [tuple(r[c] for c in columns)
                                                          for r in rows])
        return self

    def upsert(self, row: dict[str, Any], *, pk: str) -> PgTable:
        """Insert the row, or update the columns it names of the one by its key."""
        assert (pk,) == self.key, (pk, self.key)
        sets = ", ".join(f"{_quoted(c)} = excluded.{_quoted(c)}" for c in row if c != pk)
        self.db.execute(
            f"INSERT INTO {self.name} ({', '.join(_quoted(c) for c in row)}) VALUES "
            f"({', '.join(['%s'] * len(row))}) ON CONFLICT ({_quoted(pk)}) DO "
            + (f"UPDATE SET {sets}" if sets else "NOTHING"), tuple(row.values()))
        self.last_pk = row[pk]
        return self

    def update(self, key: Any, values: dict[str, Any]) -> PgTable:
        if values:
            where, params = self._where(key if isinstance(key, tuple) else (key,))
            self.db.execute(f"UPDATE {self.name} SET "
                            f"{', '.join(f'{_quoted(c)} = %s' for c in values)} WHERE {where}",
                            (*values.values(), *params))
        self.last_pk = key
        return self


class PgTransaction:
    """What ``with store.transaction() as db`` yields on PostgreSQL: the surface of a
    sqlite-utils Database the store's methods use (``execute`` with ``?`` or ``%s``
    placeholders, rows as dicts; ``db[table].insert/upsert/update``), on one cursor of the
    transaction."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        self.conn = self  # sqlite-utils' ``db.conn.executemany``

    def execute(self, sql: str, params: tuple | list | dict = ()) -> Any:
        return self.cursor.execute(pg_sql(sql), params or None)

    def query(self, sql: str, params: tuple | list | dict = ()) -> Iterator[dict[str, Any]]:
        yield from self.execute(sql, params).fetchall()

    def executemany(self, sql: str, rows: Iterable[tuple]) -> Any:
        self.cursor.executemany(pg_sql(sql), list(rows))
        return self.cursor

    def __getitem__(self, table: str) -> PgTable:
        return PgTable(self, table)


class _TupleRows:
    """``store.db.conn`` on PostgreSQL: ``execute`` gives rows as tuples, as sqlite3's."""

    dialect = "postgresql"

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: tuple | list = ()) -> Any:
        from psycopg.rows import tuple_row

        return self.conn.cursor(row_factory=tuple_row).execute(pg_sql(sql), params or None)


class _Database:
    """``store.db`` on PostgreSQL: what :class:`bot.store.qa.PointReads` reads through."""

    def __init__(self, conn: Any) -> None:
        self.conn = _TupleRows(conn)


class StoreUnavailable(RuntimeError):
    """The PostgreSQL store cannot be opened (no psycopg, or the server cannot be reached):
    the message is one line saying what to check."""


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # an optional dependency
        raise StoreUnavailable("a postgresql:// store needs psycopg: pip install "
                               "'psycopg[binary]'") from exc
    return psycopg


class PgStore(AlertStore, AuditStore, PointReads, RunRecords):
    """The shared store on PostgreSQL (``url``: ``postgresql://user@host:port/db``)."""

    def __init__(self, url: str) -> None:
        psycopg = _psycopg()
        from psycopg.rows import dict_row

        self.path = url
        try:
            self.conn = psycopg.connect(url, row_factory=dict_row, autocommit=True)
        except psycopg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreUnavailable(f"cannot reach the PostgreSQL store at {_safe(url)}: "
                                   f"{first}; is the server running, and the [store] url "
                                   "right?") from exc
        self.lock = threading.RLock()
        self.db = _Database(self.conn)
        self.migrate()

    # schema -------------------------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        rows = self.query("SELECT version FROM runwatch_schema")
        return rows[0]["version"] if rows else 0

    def migrate(self) -> None:
        with self.transaction() as db:
            # one instance creates the schema; the others wait here, then find it made
            db.execute("SELECT pg_advisory_xact_lock(2727)")
            db.execute("CREATE TABLE IF NOT EXISTS runwatch_schema (version integer)")
            found = db.execute("SELECT version FROM runwatch_schema").fetchone()
            version = 0 if found is None else found["version"]
            if version > len(SCHEMA):
                raise RuntimeError(f"{_safe(self.path)} has schema version {version}, newer "
                                   f"than this runwatch ({len(SCHEMA)}); upgrade runwatch")
            # SCHEMA is append only: a database made by an older runwatch gets the rest
            for sql in SCHEMA[version:]:
                db.execute(sql)
            if found is None:
                db.execute("INSERT INTO runwatch_schema VALUES (%s)", (len(SCHEMA),))
            else:
                db.execute("UPDATE runwatch_schema SET version = %s", (len(SCHEMA),))

    @contextmanager
    def transaction(self) -> Iterator[PgTransaction]:
        """One transaction; yields its :class:`PgTransaction` (``?`` or ``%s`` placeholders)."""
        with self.lock, self.conn.transaction(), self.conn.cursor() as cursor:
            yield PgTransaction(cursor)

    def query(self, sql: str, params: tuple | dict = ()) -> list[dict[str, Any]]:
        with self.lock, self.conn.cursor() as cursor:
            return list(cursor.execute(pg_sql(sql), params or None).fetchall())

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    def serve_lock(self) -> ServeLock:
        """The database's one ``runwatch serve``: the full bot does not share runs with
        another (it takes no leases), so a second one on the same database is refused."""
        return ServeLock(self)

    def checkpoint(self, *, every: float = 0.0) -> None:
        """Nothing to do: the server manages its own write-ahead log."""

    def ingest(self, *, run: str, source: str, log_path: str, cursor_key: str,
               cursor: dict[str, Any], points: pd.DataFrame, checkpoints: list[Checkpoint],
               meta: dict[str, Any], malformed: list[tuple[int, str]], skipped_values: int,
               notices: list[str], now: float | None = None,
               owner: str | None = None) -> IngestResult:
        """As :meth:`bot.store.Store.ingest`: points with their cursor, in one transaction."""
        now = time.time() if now is None else now
        result = IngestResult(run=run, notices=list(notices))
        with self.transaction() as db:
            if owner is not None:
                self.hold_lease(db, run, owner)
            db.execute("INSERT INTO runs (name, source, log_path, created_at, updated_at) "
                       "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
                       (run, source, log_path, now, now))
            row = db.execute("SELECT * FROM runs WHERE name = %s FOR UPDATE",
                             (run,)).fetchone()
            attempt = row["attempt"]
            latest_wall, stored = None, 0
            resume_after = row["resume_after"]
            for segment, segment_attempt in attempt_segments(
                    run, attempt, self._last_steps(db, run, attempt), points[METRIC_COLUMNS],
                    result.notices, resume_after):
                attempt = segment_attempt
                stored += self._write_points(db, run, attempt, segment)
                wall = segment["wall_time"].to_numpy(dtype=float, na_value=math.nan)
                wall = wall[np.isfinite(wall)]
                latest_wall = float(wall.max()) if len(wall) else None
            # the rollback's mark is spent once the run logged after it
            if resume_after is not None and (attempt != row["attempt"]
                                             or (points["wall_time"] > resume_after).any()):
                db.execute("UPDATE runs SET resume_after = NULL WHERE name = %s", (run,))
            if checkpoints:
                db.executemany(
                    "INSERT INTO checkpoints (run, step, path, wall_time) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (run, step) DO UPDATE SET path = excluded.path, "
                    "wall_time = excluded.wall_time",
                    [(run, c.step, c.path, c.wall_time) for c in checkpoints])
            update = run_update(row, attempt=attempt, stored=stored, latest_wall=latest_wall,
                                meta=meta, malformed=malformed, skipped_values=skipped_values,
                                notices=result.notices, now=now)
            db.execute(f"UPDATE runs SET {', '.join(f'{k} = %s' for k in update)} "
                       "WHERE name = %s", (*update.values(), run))
            db.execute("INSERT INTO cursors (source_key, run, state, updated_at) VALUES "
                       "(%s, %s, %s, %s) ON CONFLICT (source_key) DO UPDATE SET "
                       "run = excluded.run, state = excluded.state, "
                       "updated_at = excluded.updated_at",
                       (cursor_key, run, json.dumps(cursor), now))
        result.new_points = stored
        result.attempt = attempt
        return result

    def _attempt_id(self, db: Any, run: str, attempt: int, *, create: bool = False
                    ) -> int | None:
        if create:
            db.execute("INSERT INTO attempts (run, attempt) VALUES (%s, %s) "
                       "ON CONFLICT DO NOTHING", (run, attempt))
        found = db.execute("SELECT id FROM attempts WHERE run = %s AND attempt = %s",
                           (run, attempt)).fetchone()
        return None if found is None else found["id"]

    def _write_points(self, db: Any, run: str, attempt: int, points: pd.DataFrame) -> int:
        if points.empty:
            return 0
        attempt_id = self._attempt_id(db, run, attempt, create=True)
        codes, tags = pd.factorize(points["tag"])
        names = [str(t) for t in tags]
        db.execute("INSERT INTO tags (name) SELECT unnest(%s::text[]) ON CONFLICT DO NOTHING",
                   (names,))
        db.execute("INSERT INTO series (attempt_id, tag_id) SELECT %s, id FROM tags "
                   "WHERE name = ANY(%s) ON CONFLICT DO NOTHING", (attempt_id, names))
        ids = {r["name"]: r["id"] for r in db.execute(
            "SELECT t.name, s.id FROM series s JOIN tags t ON t.id = s.tag_id "
            "WHERE s.attempt_id = %s AND t.name = ANY(%s)", (attempt_id, names)).fetchall()}
        frame = pd.DataFrame({"series": np.array([ids[n] for n in names], dtype=np.int64)[codes],
                              "step": points["step"].to_numpy(dtype=np.int64),
                              "value": points["value"].to_numpy(dtype=float, na_value=math.nan)})
        # one row per key, the last logged value of a point written twice
        frame = frame.drop_duplicates(["series", "step"], keep="last")
        # a NaN is kept as NULL, as SQLite keeps it (the reads of bot.store.qa count on it)
        db.execute("INSERT INTO points (series, step, value) SELECT s, st, "
                   "NULLIF(v, 'NaN'::double precision) FROM "
                   "unnest(%s::integer[], %s::bigint[], %s::double precision[]) AS u(s, st, v) "
                   "ON CONFLICT (series, step) DO UPDATE SET value = excluded.value",
                   (frame["series"].tolist(), frame["step"].tolist(), frame["value"].tolist()))
        walls = pd.Series(points["wall_time"].to_numpy(dtype=float, na_value=math.nan),
                          index=points["step"].to_numpy(dtype=np.int64)
                          ).groupby(level=0, sort=True).max()
        db.execute(
            "INSERT INTO steps (attempt_id, step, wall_time) SELECT %s, * FROM "
            "unnest(%s::bigint[], %s::double precision[]) ON CONFLICT (attempt_id, step) DO "
            "UPDATE SET wall_time = GREATEST(steps.wall_time, excluded.wall_time)",
            (attempt_id, walls.index.tolist(),
             [None if math.isnan(w) else w for w in walls.tolist()]))
        return len(points)

    def _last_steps(self, db: Any, run: str, attempt: int) -> dict[str, int]:
        rows = db.execute("SELECT t.name AS tag, MAX(p.step) AS step FROM series s JOIN tags t "
                          "ON t.id = s.tag_id JOIN points p ON p.series = s.id WHERE "
                          "s.attempt_id = (SELECT id FROM attempts WHERE run = %s AND "
                          "attempt = %s) GROUP BY t.name", (run, attempt)).fetchall()
        return {row["tag"]: row["step"] for row in rows}

    def _last_step(self, db: Any, run: str, attempt: int) -> int | None:
        row = db.execute("SELECT MAX(step) AS step FROM steps WHERE attempt_id = (SELECT id "
                         "FROM attempts WHERE run = %s AND attempt = %s)",
                         (run, attempt)).fetchone()
        return row["step"]

    def last_step(self, run: str, attempt: int) -> int | None:
        with self.transaction() as db:
            return self._last_step(db, run, attempt)

    def run_data(self, run: str, attempt: int | None = None, *,
                 since: RunData | None = None) -> RunData:
        """As :meth:`bot.store.Store.run_data` (``since``: read only what was logged since)."""
        info = self.run(run)
        if info is None:
            raise KeyError(run)
        attempt = info["attempt"] if attempt is None else attempt
        live = since is not None and since.run == run and since.attempt == attempt
        last = since.last_step() if live and since is not None else None
        with self.transaction() as db:
            attempt_id = self._attempt_id(db, run, attempt)
            low = -(2**63) if not live else (-1 if last is None else last)
            rows = db.execute(
                "SELECT p.step, t.name AS tag, p.value, w.wall_time FROM series s "
                "JOIN tags t ON t.id = s.tag_id JOIN points p ON p.series = s.id "
                "LEFT JOIN steps w ON w.attempt_id = s.attempt_id AND w.step = p.step "
                "WHERE s.attempt_id = %s AND p.step >= %s ORDER BY t.name, p.step",
                (attempt_id, low)).fetchall()
        frame = pd.DataFrame(rows, columns=["step", "tag", "value", "wall_time"])
        frame = frame.astype({"step": "int64", "value": float, "wall_time": float})
        parts = self._run_parts(run, attempt, info)
        if live and since is not None:
            data = since.extended(frame, **parts)
            if data is not None:
                return data
            return self.run_data(run, attempt)
        return RunData(run=run, metrics=frame, attempt=attempt, **parts)  # type: ignore[arg-type]

    def judged(self, run: str, *, owner: str | None = None,
               queue: dict[str, Any] | None = None) -> None:
        """As :meth:`bot.store.Store.judged` (``owner``: under the run's lease; ``queue``: a
        message queued with it unless one for its fingerprint is)."""
        with self.transaction() as db:
            if owner is not None:
                self.hold_lease(db, run, owner)
            if queue is not None and db.execute("SELECT 1 FROM outbox WHERE fingerprint = %s",
                                                (queue["fingerprint"],)).fetchone() is None:
                self.enqueue(db, **queue)
            db.execute("UPDATE runs SET unjudged = 0 WHERE name = %s", (run,))

    # outbox ---------------------------------------------------------------------------------
    def enqueue(self, db: Any, *, kind: str, fingerprint: str, run: str, channel: str,
                now: float, message_id: int | None = None, due: float | None = None) -> int:
        """Queue one message, inside the caller's transaction (``db``: its cursor)."""
        outbox_id = db.execute(
            "INSERT INTO outbox (kind, fingerprint, run, channel, next_attempt_at, created_at, "
            "message_id) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (kind, fingerprint, run, channel, now if due is None else due, now,
             message_id)).fetchone()["id"]
        db.execute("INSERT INTO notifications (fingerprint, kind, created_at, outbox_id) "
                   "VALUES (%s, %s, %s, %s)", (fingerprint, kind, now, outbox_id))
        return outbox_id

    def pending_outbox(self) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM outbox WHERE state = 'pending' ORDER BY id")

    def sending_outbox(self) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM outbox WHERE state = 'sending' ORDER BY id")

    def update_outbox(self, outbox_id: int, **values: Any) -> None:
        with self.transaction() as db:
            db.execute(f"UPDATE outbox SET {', '.join(f'{k} = %s' for k in values)} "
                       "WHERE id = %s", (*values.values(), outbox_id))

    # several instances: leases and claims -----------------------------------------------------
    def clock(self) -> float:
        return self.query(f"SELECT {CLOCK} AS now")[0]["now"]

    def acquire_leases(self, instance: str, runs: list[str], *, ttl: float) -> list[str]:
        """As :meth:`bot.store.Store.acquire_leases`; rows another instance is changing at
        the same moment are skipped (taken on a later poll), never waited for."""
        with self.transaction() as db:
            now = db.execute(f"SELECT {CLOCK} AS now").fetchone()["now"]
            db.execute("INSERT INTO instances (id, seen_at) VALUES (%s, %s) ON CONFLICT (id) "
                       "DO UPDATE SET seen_at = excluded.seen_at", (instance, now))
            live = db.execute("SELECT COUNT(*) AS n FROM instances WHERE seen_at > %s",
                              (now - ttl,)).fetchone()["n"]
            share = -(-len(runs) // max(live, 1))
            owned = sorted(r["run"] for r in db.execute(
                "UPDATE leases SET expires_at = %s WHERE owner = %s RETURNING run",
                (now + ttl, instance)).fetchall())
            if owned[share:]:
                db.execute("DELETE FROM leases WHERE owner = %s AND run = ANY(%s)",
                           (instance, owned[share:]))
            owned = owned[:share]
            wanted = sorted(set(runs) - set(owned))
            if wanted and len(owned) < share:
                free = [r["run"] for r in db.execute(
                    "SELECT w.run FROM unnest(%s::text[]) AS w(run) LEFT JOIN leases l "
                    "ON l.run = w.run WHERE l.run IS NULL OR l.expires_at < %s "
                    "ORDER BY w.run LIMIT %s", (wanted, now, share - len(owned))).fetchall()]
                for run in free:
                    taken = db.execute(
                        "INSERT INTO leases (run, owner, acquired_at, expires_at) VALUES "
                        "(%s, %s, %s, %s) ON CONFLICT (run) DO UPDATE SET owner = "
                        "excluded.owner, acquired_at = excluded.acquired_at, expires_at = "
                        "excluded.expires_at WHERE leases.expires_at < %s RETURNING run",
                        (run, instance, now, now + ttl, now)).fetchall()
                    owned += [r["run"] for r in taken]
            return sorted(owned)

    def hold_lease(self, db: Any, run: str, owner: str) -> None:
        """As :meth:`bot.store.Store.hold_lease`; the row stays locked until the transaction
        ends, so a taker waits for this write and then reads its cursor."""
        if db.execute(f"SELECT 1 FROM leases WHERE run = %s AND owner = %s AND expires_at >= "
                      f"{CLOCK} FOR UPDATE", (run, owner)).fetchone() is None:
            raise LeaseLost(f"{owner} no longer holds the lease on run {run}")

    def release_leases(self, instance: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM leases WHERE owner = %s", (instance,))
            db.execute("DELETE FROM instances WHERE id = %s", (instance,))

    def lease_owners(self) -> dict[str, str]:
        return {r["run"]: r["owner"] for r in self.query(
            f"SELECT run, owner FROM leases WHERE expires_at >= {CLOCK}")}

    def instances(self) -> dict[str, float]:
        return {r["id"]: r["seen_at"] for r in self.query("SELECT id, seen_at FROM instances")}

    def claim_outbox(self, outbox_id: int, instance: str, *,
                     in_doubt_of: str | None = None) -> bool:
        """As :meth:`bot.store.Store.claim_outbox`: one atomic UPDATE, so of two instances
        exactly one gets the row."""
        with self.transaction() as db:
            if in_doubt_of is None:
                cursor = db.execute("UPDATE outbox SET state = 'sending', claimed_by = %s "
                                    "WHERE id = %s AND state = 'pending'", (instance, outbox_id))
            else:
                cursor = db.execute("UPDATE outbox SET claimed_by = %s WHERE id = %s AND "
                                    "state = 'sending' AND claimed_by IS NOT DISTINCT FROM %s",
                                    (instance, outbox_id, in_doubt_of))
            return cursor.rowcount == 1


class ServeLock:
    """:class:`bot.instance.InstanceLock` for a PostgreSQL store: a session advisory lock
    on the store's connection, free again when it closes (or its process dies)."""

    KEY = 2728

    def __init__(self, store: PgStore) -> None:
        self.store = store
        self.held = False

    def acquire(self) -> ServeLock:
        from bot.instance import AlreadyRunning

        if not self.store.query("SELECT pg_try_advisory_lock(%s) AS ok", (self.KEY,))[0]["ok"]:
            raise AlreadyRunning(f"another runwatch is already serving {_safe(self.store.path)}"
                                 "; stop it first (several instances on one database are "
                                 "python -m bot.shared_watch for now)")
        self.held = True
        return self

    def release(self) -> None:
        if self.held and not self.store.conn.closed:
            self.store.query("SELECT pg_advisory_unlock(%s)", (self.KEY,))
        self.held = False


def open_store(url: str) -> Store | PgStore:
    """The store ``url`` names: a :class:`PgStore` for a ``postgresql://`` URL (one line,
    :class:`StoreUnavailable`, when the server cannot be reached), a SQLite
    :class:`bot.store.Store` for anything else."""
    return PgStore(url) if is_postgres(url) else Store(url)


def _safe(url: str) -> str:
    """The URL without its password, for messages and logs."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
