"""The store: one SQLite file through sqlite-utils, WAL mode, versioned schema. The only
place in ``bot/`` that speaks SQL, with :mod:`bot.pgstore` (``tests/test_layout.py`` checks):
callers say what they want (``store.open_alerts(run)``, ``store.silences_active(now)``,
``store.record_action(...)``), never how it is kept.

Every write that must stay consistent (points with their cursor, a finding with the outbox
row that announces it) happens in one transaction. One connection is shared by the
scheduler and the Slack handler threads, serialised by a lock. A method that writes in one
statement or one transaction of its own needs nothing of its caller; one whose first
parameter is ``db`` (a :data:`Transaction`) writes inside the caller's
``with store.transaction() as db:``, which is how the alert pipeline commits a run's new
alert states together with the outbox rows they call for. Callers pass that handle on to
store methods; they never query it.

One :class:`Store` class, its methods grouped by concern in mixins, one module each:

========================  ==========================================================  =====
module                    concern                                                     PG
========================  ==========================================================  =====
``bot.store`` (here)      schema and migrations; runs, points, cursors; the outbox    own
                          (queue, claim); run leases for several instances
:mod:`bot.store.runinfo`  sources' health, run metadata, generations, eval suite      yes
                          versions, rollback marks, retries, retention
:mod:`bot.store.alerts`   findings, alerts, groups and group messages, silences,      yes
                          acknowledgements, alert threads, sent posts
:mod:`bot.store.audit`    action requests (stop, rollback) and the audit log          yes
:mod:`bot.store.qa`       reads of points for people: charts (with the SQL            yes
                          envelope), answers, status, compare, digest, inspect
========================  ==========================================================  =====

PG: how :class:`bot.pgstore.PgStore` has the concern, with the same method signatures:
*yes*, it inherits the mixin, so the logic is written once (their SQL is what both
engines accept, through the transaction handle both give (``db.execute`` with ``?``,
``db.query``, ``db[table].insert/upsert/update``; on PostgreSQL a
:class:`bot.pgstore.PgTransaction`); *own*, each store has its own (the schema, the bulk
writes of points, leases judged by the server's clock). :func:`bot.pgstore.open_store` opens
the store a ``[store] url`` names.

Mixins, not a split into separate stores: the concerns share one connection, one lock and
one transaction (a reconcile writes alerts, findings and outbox rows atomically), and every
``from bot.store import Store`` keeps working. The schema stays here, in one list of
migrations, because a migration may touch several concerns' tables.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import sqlite_utils

from analyzers.base import METRIC_COLUMNS, Checkpoint, RunData
from bot.store.alerts import AlertStore
from bot.store.audit import AuditStore
from bot.store.qa import PointReads
from bot.store.runinfo import RunRecords


def _v1(db: sqlite_utils.Database) -> None:
    db["runs"].create({
        "name": str, "source": str, "log_path": str, "attempt": int, "total_steps": int,
        "config": str, "created_at": float, "updated_at": float, "last_point_at": float,
        "malformed_lines": int, "first_malformed_line": int, "first_malformed_error": str,
        "skipped_values": int, "last_notice": str,
    }, pk="name", defaults={"attempt": 1, "malformed_lines": 0, "skipped_values": 0})
    db["metrics"].create({"run": str, "attempt": int, "tag": str, "step": int, "value": float,
                          "wall_time": float}, pk=("run", "attempt", "tag", "step"))
    db["checkpoints"].create({"run": str, "step": int, "path": str, "wall_time": float},
                             pk=("run", "step"))
    db["findings"].create({
        "fingerprint": str, "run": str, "attempt": int, "signal": str, "metric": str,
        "severity": str, "state": str, "onset_step": int, "detected_step": int,
        "resolved_step": int, "summary": str, "data": str, "first_seen": float,
        "last_seen": float, "resolved_at": float,
    }, pk="fingerprint")
    db["findings"].create_index(["run", "state"])
    db["notifications"].create({"id": int, "fingerprint": str, "kind": str, "created_at": float,
                                "outbox_id": int}, pk="id")
    db["actions"].create({"id": int, "at": float, "run": str, "action": str, "actor": str,
                          "status": str, "detail": str}, pk="id")
    db["cursors"].create({"source_key": str, "run": str, "state": str, "updated_at": float},
                         pk="source_key")
    db["threads"].create({"channel": str, "ts": str, "run": str, "fingerprint": str,
                          "created_at": float}, pk=("channel", "ts"))
    db["threads"].create_index(["fingerprint"])
    db["outbox"].create({
        "id": int, "kind": str, "fingerprint": str, "run": str, "channel": str, "state": str,
        "attempts": int, "next_attempt_at": float, "last_error": str, "created_at": float,
        "sent_at": float, "response": str,
    }, pk="id", defaults={"state": "pending", "attempts": 0})
    db["outbox"].create_index(["state", "next_attempt_at"])


def _v2(db: sqlite_utils.Database) -> None:
    """Per-source health for `runwatch sources`."""
    db["sources"].create({
        "uri": str, "state": str, "runs": int, "last_ok_at": float, "last_error": str,
        "errors": int, "malformed_lines": int, "skipped_values": int, "updated_at": float,
    }, pk="uri", defaults={"errors": 0, "malformed_lines": 0, "skipped_values": 0, "runs": 0})


def _v3(db: sqlite_utils.Database) -> None:
    """Run metadata as the source has it (status, data version, environment, …)."""
    db["runs"].add_column("meta", str)


def _v4(db: sqlite_utils.Database) -> None:
    """Actions people ask for (rollback, stop).

    ``action_requests`` holds one row per request, keyed by its idempotency key, with its
    state (requested → confirmed → running → done / failed; or denied, cancelled, expired);
    ``actions`` (from v1) stays the append-only audit log, one row per transition.
    """
    db["action_requests"].create({
        "id": str, "run": str, "action": str, "params": str, "state": str,
        "requested_by": str, "channel": str, "thread_ts": str, "fingerprint": str,
        "confirmed_by": str, "backend": str, "result": str, "created_at": float,
        "updated_at": float, "followup": str,
    }, pk="id")
    db["action_requests"].create_index(["run", "state"])
    db["actions"].add_column("request_id", str)
    db["actions"].add_column("exit_status", int)
    db["actions"].add_column("output_tail", str)


def _alert_lifecycle(db: sqlite_utils.Database) -> None:
    """The alert lifecycle (bot.alerting.lifecycle): alert states, group messages, the notification
    log per group, silences and acknowledgements; outbox rows may name a group message."""
    db["alerts"].create({
        "fingerprint": str, "run": str, "attempt": int, "signal": str, "metric": str,
        "severity": str, "labels": str, "channel": str, "group_key": str, "state": str,
        "evaluations": int, "pending_since": float, "fired_at": float, "resolved_at": float,
        "message_id": int, "notified": str, "muted": str, "shown": str,
        "escalated_at": float, "updated_at": float,
    }, pk="fingerprint", defaults={"evaluations": 0})
    db["alerts"].create_index(["run", "state"])
    db["alerts"].create_index(["group_key"])
    db["alert_messages"].create({"id": int, "group_key": str, "run": str, "channel": str,
                                 "ts": str, "created_at": float, "posted_at": float},
                                pk="id")
    db["alert_groups"].create({"key": str, "run": str, "channel": str, "oncall": str,
                               "message_id": int, "notified_at": float, "firing": str,
                               "resolved": str}, pk="key")
    db["silences"].create({"id": int, "matchers": str, "starts_at": float, "ends_at": float,
                           "created_by": str, "reason": str, "created_at": float,
                           "expired_by": str}, pk="id")
    db["acknowledgements"].create({"fingerprint": str, "user": str, "at": float},
                                  pk="fingerprint")
    db["outbox"].add_column("message_id", int)
    _adopt_announced_findings(db)


def _adopt_announced_findings(db: sqlite_utils.Database) -> None:
    """Findings already announced before the lifecycle existed become firing alerts of a
    group message (their thread, or their queued post), so an upgrade posts nothing twice."""
    for f in list(db.query("SELECT * FROM findings WHERE state = 'firing'")):
        thread = next(db.query("SELECT * FROM threads WHERE fingerprint = ? ORDER BY "
                               "created_at LIMIT 1", (f["fingerprint"],)), None)
        queued = next(db.query("SELECT * FROM outbox WHERE fingerprint = ? AND kind = 'alert' "
                               "ORDER BY id DESC LIMIT 1", (f["fingerprint"],)), None)
        if thread is None and queued is None:
            continue
        channel = queued["channel"] if queued else thread["channel"]
        key = f"{f['run']}|{channel}"
        message_id = db["alert_messages"].insert({
            "group_key": key, "run": f["run"],
            "channel": thread["channel"] if thread else channel,
            "ts": thread["ts"] if thread else None, "created_at": f["first_seen"],
            "posted_at": thread["created_at"] if thread else None}).last_pk
        peak = str(json.loads(f["data"]).get("evidence", {}).get("peak", "")).lower()
        labels = {"run": f["run"], "attempt": str(f["attempt"]), "signal": f["signal"],
                  "metric": f["metric"], "severity": f["severity"],
                  "onset": str(f["onset_step"]),
                  "nonfinite": "true" if peak in ("nan", "inf", "-inf") else "false"}
        db["alerts"].insert({
            "fingerprint": f["fingerprint"], "run": f["run"], "attempt": f["attempt"],
            "signal": f["signal"], "metric": f["metric"], "severity": f["severity"],
            "labels": json.dumps(labels), "channel": channel, "group_key": key,
            "state": "firing", "evaluations": 1, "pending_since": f["first_seen"],
            "fired_at": f["first_seen"], "message_id": message_id, "notified": "firing",
            "shown": "firing", "updated_at": f["last_seen"]})
        db.execute("UPDATE outbox SET message_id = ? WHERE fingerprint = ? AND state = "
                   "'pending'", (message_id, f["fingerprint"]))


def _generations(db: sqlite_utils.Database) -> None:
    """Sample generations logged at evaluations (connectors.generations), by run and
    attempt, in the order they were read; ``probe`` is NULL where a line has no mark."""
    db["generations"].create({"id": int, "run": str, "attempt": int, "step": int,
                              "prompt": str, "output": str, "probe": int}, pk="id")
    db["generations"].create_index(["run", "attempt"])


def _last_wall_time(db: sqlite_utils.Database) -> None:
    """The latest wall time each run's current attempt logged, kept with the run so the
    watch loop can tell a silent run without reading its points."""
    db["runs"].add_column("last_wall_time", float)
    db.execute("UPDATE runs SET last_wall_time = (SELECT MAX(wall_time) FROM metrics WHERE "
               "metrics.run = runs.name AND metrics.attempt = runs.attempt)")


def _thread_messages(db: sqlite_utils.Database) -> None:
    """What people said in an alert's thread: part of the incident's history, searched when
    someone asks "have we seen this before?"."""
    db["thread_messages"].create({"id": int, "channel": str, "thread_ts": str, "ts": str,
                                  "fingerprint": str, "run": str, "user": str, "text": str,
                                  "at": float}, pk="id")
    db["thread_messages"].create_index(["fingerprint"])
    db["thread_messages"].create_index(["channel", "ts"], unique=True)


def _metrics_by_step(db: sqlite_utils.Database) -> None:
    """An attempt's points by step, whatever their tag: the highest step and the points
    logged since a step are then index lookups, not a scan of the attempt (a watcher asks
    both on every poll; on a million-step run the scan took over a second)."""
    db["metrics"].create_index(["run", "attempt", "step"], index_name="metrics_by_step",
                               if_not_exists=True)


def _source_error_time(db: sqlite_utils.Database) -> None:
    """When a source last failed: `runwatch sources` says how recent its last error is."""
    db["sources"].add_column("last_error_at", float)


def _unjudged(db: sqlite_utils.Database) -> None:
    """Runs stored since they were last judged: set with the points, cleared once the run's
    alerts are reconciled, so a bot killed between the two judges the run at its next start
    (a NaN stored just before a `kill -9` was never alerted: nothing new arrived after it)."""
    db["runs"].add_column("unjudged", int, not_null_default=0)


# The wall time is a scalar subquery, not a LEFT JOIN: SQLite evaluates it only for queries
# that select it (it kept the join, one lookup a point, for a chart's min/max: 2× slower).
METRICS_VIEW = """
CREATE VIEW metrics AS
SELECT a.run AS run, a.attempt AS attempt, t.name AS tag, p.step AS step, p.value AS value,
       (SELECT w.wall_time FROM steps w WHERE w.attempt_id = s.attempt_id AND w.step = p.step)
       AS wall_time
FROM points p JOIN series s ON s.id = p.series JOIN attempts a ON a.id = s.attempt_id
JOIN tags t ON t.id = s.tag_id
"""

# The steps of each run's attempts with their wall time: what reads that need no values
# (progress, when an attempt ran) query, one row a step instead of one a point.
RUN_STEPS_VIEW = """
CREATE VIEW run_steps AS SELECT a.run AS run, a.attempt AS attempt, w.step AS step,
       w.wall_time AS wall_time FROM steps w JOIN attempts a ON a.id = w.attempt_id
"""

# Writes through the old name keep working (benchmarks bulk-load history this way). The
# statements avoid conflicts rather than resolve them: an outer INSERT OR REPLACE would
# otherwise give an existing attempt, tag or series a new id.
METRICS_INSERT = """
CREATE TRIGGER metrics_insert INSTEAD OF INSERT ON metrics BEGIN
  INSERT INTO attempts (run, attempt) SELECT NEW.run, NEW.attempt WHERE NOT EXISTS
    (SELECT 1 FROM attempts WHERE run = NEW.run AND attempt = NEW.attempt);
  INSERT INTO tags (name) SELECT NEW.tag WHERE NOT EXISTS (SELECT 1 FROM tags WHERE name = NEW.tag);
  INSERT INTO series (attempt_id, tag_id) SELECT a.id, t.id FROM attempts a, tags t
    WHERE a.run = NEW.run AND a.attempt = NEW.attempt AND t.name = NEW.tag AND NOT EXISTS
    (SELECT 1 FROM series WHERE attempt_id = a.id AND tag_id = t.id);
  DELETE FROM points WHERE step = NEW.step AND series = (SELECT s.id FROM series s
    JOIN attempts a ON a.id = s.attempt_id JOIN tags t ON t.id = s.tag_id
    WHERE a.run = NEW.run AND a.attempt = NEW.attempt AND t.name = NEW.tag);
  INSERT INTO points (series, step, value) SELECT s.id, NEW.step, NEW.value FROM series s
    JOIN attempts a ON a.id = s.attempt_id JOIN tags t ON t.id = s.tag_id
    WHERE a.run = NEW.run AND a.attempt = NEW.attempt AND t.name = NEW.tag;
  INSERT INTO steps (attempt_id, step, wall_time) SELECT a.id, NEW.step, NULL FROM attempts a
    WHERE a.run = NEW.run AND a.attempt = NEW.attempt AND NOT EXISTS
    (SELECT 1 FROM steps WHERE attempt_id = a.id AND step = NEW.step);
  UPDATE steps SET wall_time = NEW.wall_time WHERE NEW.wall_time IS NOT NULL
    AND (wall_time IS NULL OR wall_time < NEW.wall_time) AND step = NEW.step
    AND attempt_id = (SELECT id FROM attempts WHERE run = NEW.run AND attempt = NEW.attempt);
END
"""


def _compact_points(db: sqlite_utils.Database) -> None:
    """Points by integer ids, in a clustered table: 24-26 bytes a point instead of 80-130.

    ``series`` names a (run, attempt, tag) once; ``points`` is keyed by (series, step)
    WITHOUT ROWID, so the key is the table and no second index repeats it; the wall time is
    kept once per step in ``steps`` (the latest any point of the step logged), which is also
    what the highest step and "points since step N" are read from. ``metrics`` stays, as a
    view with the old columns (and an INSERT trigger), for the readers that query it;
    ``run_steps`` (run, attempt, step, wall_time) serves those that need no values.
    """
    for sql in (
        "CREATE TABLE attempts (id INTEGER PRIMARY KEY, run TEXT NOT NULL, "
        "attempt INTEGER NOT NULL, UNIQUE (run, attempt))",
        "CREATE TABLE tags (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)",
        "CREATE TABLE series (id INTEGER PRIMARY KEY, attempt_id INTEGER NOT NULL, "
        "tag_id INTEGER NOT NULL, UNIQUE (attempt_id, tag_id))",
        "CREATE TABLE points (series INTEGER NOT NULL, step INTEGER NOT NULL, value REAL, "
        "PRIMARY KEY (series, step)) WITHOUT ROWID",
        "CREATE TABLE steps (attempt_id INTEGER NOT NULL, step INTEGER NOT NULL, "
        "wall_time REAL, PRIMARY KEY (attempt_id, step)) WITHOUT ROWID",
        "INSERT INTO attempts (run, attempt) SELECT DISTINCT run, attempt FROM metrics "
        "ORDER BY run, attempt",
        "INSERT INTO tags (name) SELECT DISTINCT tag FROM metrics ORDER BY tag",
        "INSERT INTO series (attempt_id, tag_id) SELECT DISTINCT a.id, t.id FROM metrics m "
        "JOIN attempts a ON a.run = m.run AND a.attempt = m.attempt JOIN tags t ON t.name = m.tag "
        "ORDER BY a.id, t.id",
        "INSERT INTO points (series, step, value) SELECT s.id, m.step, m.value FROM metrics m "
        "JOIN attempts a ON a.run = m.run AND a.attempt = m.attempt JOIN tags t ON t.name = m.tag "
        "JOIN series s ON s.attempt_id = a.id AND s.tag_id = t.id ORDER BY s.id, m.step",
        "INSERT INTO steps (attempt_id, step, wall_time) SELECT a.id, m.step, MAX(m.wall_time) "
        "FROM metrics m JOIN attempts a ON a.run = m.run AND a.attempt = m.attempt "
        "GROUP BY a.id, m.step ORDER BY a.id, m.step",
        "DROP TABLE metrics",
        METRICS_VIEW, METRICS_INSERT, RUN_STEPS_VIEW,
    ):
        db.execute(sql)


def _leases(db: sqlite_utils.Database) -> None:
    """Several instances on one database: each run is owned by one instance through a lease
    it renews every poll; an outbox row is claimed by the instance that sends it."""
    db["instances"].create({"id": str, "seen_at": float}, pk="id")
    db["leases"].create({"run": str, "owner": str, "acquired_at": float, "expires_at": float},
                        pk="run")
    db["outbox"].add_column("claimed_by", str)


def _resume_after(db: sqlite_utils.Database) -> None:
    """A rollback runwatch carried out, until the resumed run logs: when the old process
    was stopped; points logged after it are the next attempt (see :meth:`Store.begin_attempt`)."""
    db["runs"].add_column("resume_after", float)


def _thinned(db: sqlite_utils.Database) -> None:
    """When a finished run's points were thinned to envelopes (retention)."""
    db["runs"].add_column("thinned_at", float)


def _eval_suite_versions(db: sqlite_utils.Database) -> None:
    """Which version of each eval suite a run's evaluations used (issue 26 part 4): a row
    when a suite is first seen in an attempt, and when its version changes; ``source`` says
    whether the run's log declared it or it was the config's at the time."""
    db["eval_suite_versions"].create({
        "id": int, "run": str, "attempt": int, "suite": str, "version": str, "step": int,
        "prefix": str, "source": str, "recorded_at": float,
    }, pk="id")
    db["eval_suite_versions"].create_index(["run", "suite"])


# Append only: a migration, once released, is never edited.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_v1, _v2, _v3, _v4, _alert_lifecycle,
                                                             _generations, _last_wall_time,
                                                             _thread_messages, _metrics_by_step,
                                                             _source_error_time, _unjudged,
                                                             _compact_points, _leases,
                                                             _thinned, _resume_after,
                                                             _eval_suite_versions]


def run_update(row: dict[str, Any], *, attempt: int, stored: int, latest_wall: float | None,
               meta: dict[str, Any], malformed: list[tuple[int, str]], skipped_values: int,
               notices: list[str], now: float) -> dict[str, Any]:
    """What an ingest changes in the run's row (``row``: as it was before)."""
    update: dict[str, Any] = {"attempt": attempt, "updated_at": now}
    if stored:
        update["last_point_at"] = now
        update["unjudged"] = 1
    if attempt != row["attempt"]:
        update["last_wall_time"] = latest_wall
    elif latest_wall is not None:
        update["last_wall_time"] = max(latest_wall, row.get("last_wall_time") or -math.inf)
    if meta.get("total_steps") is not None:
        update["total_steps"] = int(meta["total_steps"])
    if "config" in meta:
        update["config"] = json.dumps(meta["config"], sort_keys=True, default=str)
    extra = {k: v for k, v in meta.items() if k not in ("config", "total_steps")}
    if extra:
        merged = {**json.loads(row.get("meta") or "{}"), **extra}
        update["meta"] = json.dumps(merged, sort_keys=True, default=str)
    if malformed:
        update["malformed_lines"] = row["malformed_lines"] + len(malformed)
        if not row.get("first_malformed_line"):
            update["first_malformed_line"] = malformed[0][0]
            update["first_malformed_error"] = malformed[0][1]
    if skipped_values:
        update["skipped_values"] = row["skipped_values"] + skipped_values
    if notices:
        update["last_notice"] = notices[-1]
    return update


def attempt_segments(run: str, attempt: int, last: dict[str, int], points: pd.DataFrame,
                     notices: list[str], resume_after: float | None = None
                     ) -> Iterator[tuple[pd.DataFrame, int]]:
    """Split points in file order where a tag's step goes back below that tag's highest step
    of the attempt so far (``last``: each tag's highest stored step): each part is the next
    attempt. Judged per tag: two tags on two step counters (interleaved, see
    ``connectors.formats.assemble``) are no rewind; one tag going back is.

    >>> notices = []
    >>> frame = pd.DataFrame({"step": [5, 1, 6, 2, 3], "tag": ["a", "b", "a", "b", "a"]})
    >>> [(list(part.step), n) for part, n in attempt_segments("r", 1, {}, frame, notices)]
    [([5, 1, 6, 2], 1), ([3], 2)]
    >>> notices
    ['r: step went back from 6 to 3; recording attempt 2 (earlier attempts kept)']
    """
    steps = points["step"].to_numpy(dtype=np.int64)
    tags = points["tag"].to_numpy()
    walls = points["wall_time"].to_numpy(dtype=float, na_value=np.nan) \
        if "wall_time" in points else np.full(len(steps), np.nan)
    start = 0
    while start < len(steps):
        part, part_tags = steps[start:], tags[start:]
        end, was = len(steps), None
        for tag in pd.unique(part_tags):
            where = np.flatnonzero(part_tags == tag)
            series = part[where]
            prior = last.get(tag)
            high = np.maximum.accumulate(series)
            if prior is not None:
                high = np.maximum(high, prior)
            before = np.concatenate(([series[0] if prior is None else prior], high[:-1]))
            back = np.flatnonzero(series < before)
            if len(back) and start + int(where[back[0]]) < end:
                end, was = start + int(where[back[0]]), int(before[back[0]])
        if resume_after is not None:
            # a rollback runwatch did (``resume_after``: when it stopped the old process):
            # the first point logged after it begins the next attempt, even when no step
            # goes back (the resumed run skipped every batch past the old attempt's last
            # step); the old process's last points stay in the old attempt
            if end < len(steps):
                resume_after = None  # a step went back: that is the boundary
            else:
                # by time, not by position: rows come step-sorted, so an old point of one
                # tag can follow a new point of another (the old loss at step 41 after the
                # new attempt's skipped batch at step 31)
                later = walls[start:] > resume_after
                if later.any() and (not later.all() or last):
                    rest = points.iloc[start:]
                    if not later.all():
                        yield rest[~later], attempt
                    notices.append(f"{run}: resumed after a rollback at step "
                                   f"{int(rest['step'][later].min())}; recording attempt "
                                   f"{attempt + 1} (earlier attempts kept)")
                    yield rest[later], attempt + 1
                    return
                if later.any():
                    resume_after = None
        if end > start:
            yield points.iloc[start:end], attempt
        if end < len(steps):
            attempt += 1
            notices.append(f"{run}: step went back from {was} to {int(steps[end])}; "
                           f"recording attempt {attempt} (earlier attempts kept)")
            last = {}
        start = end


def envelope(steps: np.ndarray, values: np.ndarray, buckets: int = 500,
             spike_mads: float = 6.0) -> np.ndarray:
    """Which points of one series (``steps`` ascending) an envelope keeps: per bucket of
    steps its lowest, highest and last point, every NaN or infinite one, and every point
    more than ``spike_mads`` median absolute deviations from its bucket's median (a second
    spike in a bucket is kept too). Returns a boolean mask.

    >>> steps = np.arange(10_000); values = np.full(10_000, 2.0)
    >>> values[[123, 130]] = [9.0, 8.0]; values[5000] = np.nan
    >>> kept = envelope(steps, values, buckets=100)
    >>> bool(kept[[123, 130, 5000, 9999]].all()), int(kept.sum()) < 400
    (True, True)
    """
    keep = ~np.isfinite(values)
    width = max(1, -(-(int(steps[-1]) - int(steps[0]) + 1) // buckets))
    bucket = (steps - steps[0]) // width
    edges = np.flatnonzero(np.diff(bucket)) + 1
    for lo, hi in zip(np.concatenate(([0], edges)), np.concatenate((edges, [len(steps)])),
                      strict=True):
        part = values[lo:hi]
        finite = np.isfinite(part)
        keep[hi - 1] = True
        if not finite.any():
            continue
        index = np.flatnonzero(finite)
        keep[lo + index[np.argmin(part[finite])]] = True
        keep[lo + index[np.argmax(part[finite])]] = True
        median = np.median(part[finite])
        deviation = np.abs(part[finite] - median)
        # a mostly constant bucket has no MAD: its mean deviation stands in
        scale = np.median(deviation) or np.mean(deviation)
        if scale > 0:
            keep[lo:hi] |= finite & (np.abs(part - median) > spike_mads * scale)
    return keep


# What ``Store.transaction()`` yields: pass it to the store methods that take ``db``.
Transaction = sqlite_utils.Database

WAL_LIMIT_BYTES = 64 * 2**20
CHECKPOINT_EVERY_S = 30.0


@dataclass
class IngestResult:
    run: str
    new_points: int = 0
    attempt: int = 1
    new_generations: int = 0
    notices: list[str] = field(default_factory=list)


def is_postgres(url: str) -> bool:
    """Whether ``[store] url`` names a PostgreSQL database rather than a SQLite file."""
    return url.startswith(("postgresql://", "postgres://"))


def require_sqlite(path: str) -> None:
    """Refuse a PostgreSQL URL where a command reads the SQLite file itself, in one line."""
    if is_postgres(path):
        from bot.config import ConfigError

        raise ConfigError("store.url: this command reads a SQLite store file; a "
                          "postgresql:// store is opened by `runwatch serve` and the commands "
                          "that use bot.pgstore.open_store")


class LeaseLost(RuntimeError):
    """This instance no longer holds the run's lease: another one may be writing it."""


class UnknownRun(LookupError):
    """No run by that name: the message lists the runs there are."""

    def __init__(self, run: str, known: list[str]) -> None:
        self.run = run
        self.known = known
        names = ", ".join(known) if known else "none yet — check the sources in runwatch.toml"
        super().__init__(f"unknown run '{run}'; known runs: {names}")


class Store(AlertStore, AuditStore, PointReads, RunRecords):
    def __init__(self, path: str) -> None:
        require_sqlite(path)
        self.path = path
        conn = sqlite3.connect(path, check_same_thread=False, timeout=30,
                               isolation_level=None)
        self.db = sqlite_utils.Database(conn)
        self.lock = threading.RLock()
        if path != ":memory:":
            self.db.enable_wal()
            # A checkpoint that resets the WAL also cuts the file back to this size.
            self.db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
            # No sync per commit, one per checkpoint: a power cut can undo the last commits,
            # each of which holds the points with their cursor, so they are read again.
            self.db.execute("PRAGMA synchronous = NORMAL")
        self._checkpointed_at = time.monotonic()
        self.migrate()

    # schema -------------------------------------------------------------------------------
    @property
    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        with self.transaction():
            current = self.schema_version
            if current > len(MIGRATIONS):
                raise RuntimeError(f"{self.path} has schema version {current}, newer than this "
                                   f"runwatch ({len(MIGRATIONS)}); upgrade runwatch")
            for version, migration in enumerate(MIGRATIONS[current:], start=current + 1):
                migration(self.db)
                self.db.execute(f"PRAGMA user_version = {version}")
        if current and _compact_points in MIGRATIONS[current:] and self.path != ":memory:":
            # the old points' pages are free but still in the file: give them back, once
            self.db.execute("VACUUM")
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    @contextmanager
    def transaction(self) -> Iterator[sqlite_utils.Database]:
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def query(self, sql: str, params: tuple | dict = ()) -> list[dict[str, Any]]:
        """Rows of any SQL: for the store's methods, tests and benchmarks; code in ``bot/``
        asks a named method instead (``tests/test_layout.py``)."""
        with self.lock:
            return list(self.db.query(sql, params))

    def close(self) -> None:
        with self.lock:
            self.db.close()

    def checkpoint(self, *, every: float = CHECKPOINT_EVERY_S) -> None:
        """Copy the WAL into the database and truncate it, at most once per ``every`` s.

        SQLite's automatic checkpoints never shrink the file; a reader in another process
        (``runwatch status``) can make one incomplete, in which case the next one catches up.
        """
        if self.path == ":memory:" or time.monotonic() - self._checkpointed_at < every:
            return
        with self.lock:
            if not self.db.conn.in_transaction:
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self._checkpointed_at = time.monotonic()

    # ingest -------------------------------------------------------------------------------
    def ingest(self, *, run: str, source: str, log_path: str, cursor_key: str,
               cursor: dict[str, Any], points: pd.DataFrame, checkpoints: list[Checkpoint],
               meta: dict[str, Any], malformed: list[tuple[int, str]], skipped_values: int,
               notices: list[str], now: float | None = None,
               owner: str | None = None) -> IngestResult:
        """Store new points of one run with their cursor, in one transaction.

        ``points`` are in file order. A step lower than the highest step already seen in
        the current attempt starts a new attempt; earlier attempts are kept. ``owner``: the
        instance that must hold the run's lease (:class:`LeaseLost` otherwise).
        """
        now = time.time() if now is None else now
        result = IngestResult(run=run, notices=list(notices))
        with self.transaction() as db:
            if owner is not None:
                self.hold_lease(db, run, owner)
            row = self._ensure_run(db, run, source, log_path, now)
            attempt = row["attempt"]
            latest_wall = None  # of the last attempt written
            stored = 0
            resume_after = row.get("resume_after")
            for segment, segment_attempt in attempt_segments(
                    run, attempt, self._last_steps(run, attempt), points[METRIC_COLUMNS],
                    result.notices, resume_after):
                attempt = segment_attempt
                stored += self._write_points(run, attempt, segment)
                wall = segment["wall_time"].to_numpy(dtype=float, na_value=math.nan)
                wall = wall[np.isfinite(wall)]
                latest_wall = float(wall.max()) if len(wall) else None
            # the rollback's mark is spent once the run logged after it (its next attempt
            # began, or began by a step going back)
            if resume_after is not None and (attempt != row["attempt"]
                                             or (points["wall_time"] > resume_after).any()):
                db.execute("UPDATE runs SET resume_after = NULL WHERE name = ?", (run,))
            if checkpoints:
                db["checkpoints"].insert_all(
                    [{"run": run, "step": c.step, "path": c.path, "wall_time": c.wall_time}
                     for c in checkpoints], replace=True)
            update = run_update(row, attempt=attempt, stored=stored, latest_wall=latest_wall,
                                meta=meta, malformed=malformed, skipped_values=skipped_values,
                                notices=result.notices, now=now)
            db["runs"].update(run, update)
            db["cursors"].insert({"source_key": cursor_key, "run": run,
                                  "state": json.dumps(cursor), "updated_at": now}, replace=True)
        result.new_points = stored
        result.attempt = attempt
        self.checkpoint()
        return result

    def _attempt_id(self, run: str, attempt: int, *, create: bool = False) -> int | None:
        sql = "SELECT id FROM attempts WHERE run = ? AND attempt = ?"
        found = self.db.execute(sql, (run, attempt)).fetchone()
        if found is None and create:
            self.db.execute("INSERT INTO attempts (run, attempt) VALUES (?, ?)", (run, attempt))
            found = self.db.execute(sql, (run, attempt)).fetchone()
        return None if found is None else found[0]

    def _series_ids(self, attempt_id: int, tags: list[str]) -> dict[str, int]:
        self.db.conn.executemany("INSERT OR IGNORE INTO tags (name) VALUES (?)",
                                 [(t,) for t in tags])
        self.db.conn.executemany(
            "INSERT OR IGNORE INTO series (attempt_id, tag_id) SELECT ?, id FROM tags "
            "WHERE name = ?", [(attempt_id, t) for t in tags])
        marks = ",".join("?" * len(tags))
        return dict(self.db.execute(
            f"SELECT t.name, s.id FROM series s JOIN tags t ON t.id = s.tag_id "
            f"WHERE s.attempt_id = ? AND t.name IN ({marks})", (attempt_id, *tags)).fetchall())

    def _write_points(self, run: str, attempt: int, points: pd.DataFrame) -> int:
        """Write one attempt's points (a step and tag seen again: the newer value) and the
        steps' wall times (the latest of a step's points). Returns how many were given."""
        if points.empty:
            return 0
        attempt_id = self._attempt_id(run, attempt, create=True)
        assert attempt_id is not None
        codes, tags = pd.factorize(points["tag"])
        ids = self._series_ids(attempt_id, [str(t) for t in tags])
        series = np.array([ids[str(t)] for t in tags], dtype=np.int64)[codes]
        steps = points["step"].to_numpy(dtype=np.int64)
        values = points["value"].to_numpy(dtype=float, na_value=math.nan)
        # In key order, and the last of a repeated (series, step) last: B-tree pages are
        # filled in turn, and the newer value of a point logged twice is the one kept.
        order = np.lexsort((np.arange(len(steps)), steps, series))
        self.db.conn.executemany("INSERT OR REPLACE INTO points (series, step, value) "
                                 "VALUES (?, ?, ?)",
                                 zip(series[order].tolist(), steps[order].tolist(),
                                     values[order].tolist(), strict=True))
        walls = pd.Series(points["wall_time"].to_numpy(dtype=float, na_value=math.nan),
                          index=steps).groupby(level=0, sort=False).max()
        self.db.conn.executemany(
            "INSERT INTO steps (attempt_id, step, wall_time) VALUES (?, ?, ?) "
            "ON CONFLICT (attempt_id, step) DO UPDATE SET wall_time = CASE "
            "WHEN excluded.wall_time IS NULL THEN wall_time WHEN wall_time IS NULL "
            "THEN excluded.wall_time ELSE MAX(wall_time, excluded.wall_time) END",
            ((attempt_id, step, None if math.isnan(wall) else wall)
             for step, wall in zip(walls.index.tolist(), walls.tolist(), strict=True)))
        return len(points)

    def _last_steps(self, run: str, attempt: int) -> dict[str, int]:
        """Each tag's highest stored step in the attempt (a seek per series on the key)."""
        return dict(self.db.execute(
            "SELECT t.name, MAX(p.step) FROM series s JOIN tags t ON t.id = s.tag_id "
            "JOIN points p ON p.series = s.id WHERE s.attempt_id = (SELECT id FROM attempts "
            "WHERE run = ? AND attempt = ?) GROUP BY t.name", (run, attempt)).fetchall())

    def _last_step(self, run: str, attempt: int) -> int | None:
        return self.db.execute(
            "SELECT MAX(step) FROM steps WHERE attempt_id = (SELECT id FROM attempts "
            "WHERE run = ? AND attempt = ?)", (run, attempt)).fetchone()[0]

    def judged(self, run: str, *, owner: str | None = None,
               queue: dict[str, Any] | None = None) -> None:
        """The run's alerts are reconciled: it is judged again once new points arrive.

        ``owner``: the instance that must hold the run's lease (:class:`LeaseLost`
        otherwise); ``queue``: a message (:meth:`enqueue`'s keywords) queued with it, in the
        same transaction, unless one for its fingerprint is queued already.
        """
        if owner is None and queue is None:
            with self.lock:
                self.db.execute("UPDATE runs SET unjudged = 0 WHERE name = ?", (run,))
            return
        with self.transaction() as db:
            if owner is not None:
                self.hold_lease(db, run, owner)
            if queue is not None and db.execute("SELECT 1 FROM outbox WHERE fingerprint = ?",
                                                (queue["fingerprint"],)).fetchone() is None:
                self.enqueue(db, **queue)
            db.execute("UPDATE runs SET unjudged = 0 WHERE name = ?", (run,))

    def run_data(self, run: str, attempt: int | None = None, *,
                 since: RunData | None = None) -> RunData:
        """The given (default: current) attempt of a run, for analyzers.

        ``since``: the same attempt as read on an earlier poll; only the points logged from
        its last step on are read and added to it (:meth:`RunData.extended`), so a watcher's
        poll does not re-read a long run. It is read whole when ``since`` is another attempt
        or its history no longer matches.
        """
        info = self.run(run)
        if info is None:
            raise KeyError(run)
        attempt = info["attempt"] if attempt is None else attempt
        with self.lock:
            if since is not None and since.run == run and since.attempt == attempt:
                last = since.last_step()
                frame = self._points(run, attempt, -1 if last is None else last)
            else:
                since = None
                frame = self._points(run, attempt)
        parts = self._run_parts(run, attempt, info)
        if since is not None:
            data = since.extended(frame, **parts)
            if data is not None:
                return data
            return self.run_data(run, attempt)
        return RunData(run=run, metrics=frame, attempt=attempt, **parts)  # type: ignore[arg-type]

    def _points(self, run: str, attempt: int, since_step: int | None = None) -> pd.DataFrame:
        """An attempt's points (from ``since_step`` on) by tag and step, with their step's
        wall time: one range read per tag and one of the steps, joined here."""
        attempt_id = self._attempt_id(run, attempt)
        low = -(2**63) if since_step is None else since_step
        series = self.db.execute(
            "SELECT s.id, t.name FROM series s JOIN tags t ON t.id = s.tag_id "
            "WHERE s.attempt_id = ? ORDER BY t.name", (attempt_id,)).fetchall()
        parts = []
        for series_id, tag in series:
            rows = self.db.execute("SELECT step, value FROM points WHERE series = ? AND "
                                   "step >= ? ORDER BY step", (series_id, low)).fetchall()
            if rows:
                part = pd.DataFrame(rows, columns=["step", "value"])
                part.insert(1, "tag", tag)
                parts.append(part)
        if not parts:
            return pd.DataFrame({"step": pd.Series(dtype="int64"),
                                 "tag": pd.Series(dtype=object),
                                 "value": pd.Series(dtype=float),
                                 "wall_time": pd.Series(dtype=float)})
        frame = pd.concat(parts, ignore_index=True)
        frame["value"] = frame["value"].astype(float)  # SQLite keeps NaN as NULL
        walls = dict(self.db.execute("SELECT step, wall_time FROM steps WHERE attempt_id = ? "
                                     "AND step >= ?", (attempt_id, low)).fetchall())
        frame["wall_time"] = frame["step"].map(walls).astype(float)
        return frame

    # outbox (the same in bot.pgstore) -----------------------------------------------------
    def enqueue(self, db: sqlite_utils.Database, *, kind: str, fingerprint: str, run: str,
                channel: str, now: float, message_id: int | None = None,
                due: float | None = None) -> int:
        """Queue one message; ``message_id`` names the group message it posts, redraws or
        answers in, ``due`` holds it back (a group's wait)."""
        outbox_id = db["outbox"].insert({
            "kind": kind, "fingerprint": fingerprint, "run": run, "channel": channel,
            "state": "pending", "attempts": 0, "next_attempt_at": now if due is None else due,
            "created_at": now, "message_id": message_id,
        }).last_pk
        db["notifications"].insert({"fingerprint": fingerprint, "kind": kind, "created_at": now,
                                    "outbox_id": outbox_id})
        return outbox_id

    def last_step(self, run: str, attempt: int) -> int | None:
        with self.lock:
            return self._last_step(run, attempt)

    def pending_outbox(self) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM outbox WHERE state = 'pending' ORDER BY id")

    def sending_outbox(self) -> list[dict[str, Any]]:
        """Rows claimed for sending and not yet recorded as sent (a crash, or another
        instance, may have left them so), oldest first."""
        return self.query("SELECT * FROM outbox WHERE state = 'sending' ORDER BY id")

    # several instances: leases and claims (the same in bot.pgstore) ----------------------
    def clock(self) -> float:
        """The time leases are judged by (the database server's, on PostgreSQL)."""
        return time.time()

    def acquire_leases(self, instance: str, runs: list[str], *, ttl: float) -> list[str]:
        """Renew this instance's leases and take free or expired ones, up to a fair share of
        ``runs`` among the live instances (an instance over it hands the excess back).
        Returns the runs this instance owns now, sorted."""
        with self.transaction() as db:
            now = self.clock()
            db.execute("INSERT INTO instances (id, seen_at) VALUES (?, ?) ON CONFLICT (id) "
                       "DO UPDATE SET seen_at = excluded.seen_at", (instance, now))
            live = db.execute("SELECT COUNT(*) FROM instances WHERE seen_at > ?",
                              (now - ttl,)).fetchone()[0]
            share = -(-len(runs) // max(live, 1))
            owned = [r for (r,) in db.execute(
                "UPDATE leases SET expires_at = ? WHERE owner = ? RETURNING run",
                (now + ttl, instance)).fetchall()]
            owned.sort()
            for run in owned[share:]:
                db.execute("DELETE FROM leases WHERE run = ? AND owner = ?", (run, instance))
            owned = owned[:share]
            for run in sorted(set(runs) - set(owned)):
                if len(owned) >= share:
                    break
                taken = db.execute(
                    "INSERT INTO leases (run, owner, acquired_at, expires_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (run) DO UPDATE SET owner = excluded.owner, acquired_at = "
                    "excluded.acquired_at, expires_at = excluded.expires_at "
                    "WHERE leases.expires_at < ? RETURNING run",
                    (run, instance, now, now + ttl, now)).fetchall()
                owned += [r for (r,) in taken]
            return sorted(owned)

    def hold_lease(self, db: sqlite_utils.Database, run: str, owner: str) -> None:
        """Inside a transaction: raise :class:`LeaseLost` unless ``owner`` holds the run's
        unexpired lease (the write lock keeps it so until the transaction ends)."""
        if db.execute("SELECT 1 FROM leases WHERE run = ? AND owner = ? AND expires_at >= ?",
                      (run, owner, self.clock())).fetchone() is None:
            raise LeaseLost(f"{owner} no longer holds the lease on run {run}")

    def release_leases(self, instance: str) -> None:
        """Hand every run back at once (a clean stop), for another instance to take now."""
        with self.transaction() as db:
            db.execute("DELETE FROM leases WHERE owner = ?", (instance,))
            db.execute("DELETE FROM instances WHERE id = ?", (instance,))

    def lease_owners(self) -> dict[str, str]:
        """Run → the instance holding an unexpired lease on it."""
        return {r["run"]: r["owner"] for r in self.query(
            "SELECT run, owner FROM leases WHERE expires_at >= ?", (self.clock(),))}

    def instances(self) -> dict[str, float]:
        """Instance → when it last renewed its leases (:meth:`clock` time)."""
        return {r["id"]: r["seen_at"] for r in self.query("SELECT id, seen_at FROM instances")}

    def claim_outbox(self, outbox_id: int, instance: str, *,
                     in_doubt_of: str | None = None) -> bool:
        """Mark a pending row as being sent by this instance: of two instances claiming the
        same row, exactly one gets True. ``in_doubt_of``: take over a row that instance (now
        gone) marked as sending, to settle it (ask the transport whether it arrived)."""
        with self.transaction() as db:
            if in_doubt_of is None:
                cursor = db.execute("UPDATE outbox SET state = 'sending', claimed_by = ? "
                                    "WHERE id = ? AND state = 'pending'", (instance, outbox_id))
            else:
                cursor = db.execute("UPDATE outbox SET claimed_by = ? WHERE id = ? AND "
                                    "state = 'sending' AND claimed_by IS ?",
                                    (instance, outbox_id, in_doubt_of))
            return cursor.rowcount == 1

    def update_outbox(self, outbox_id: int, **values: Any) -> None:
        with self.transaction() as db:
            db["outbox"].update(outbox_id, values)
