"""The store's records about runs besides their points: sources' health, run metadata,
sample generations, eval suite versions, checkpoints forgotten, rollbacks' marks, retries
queued and retention.

:class:`RunRecords` is a mixin of :class:`bot.store.Store` and of
:class:`bot.pgstore.PgStore`: its SQL is what both engines accept, and it writes through
the transaction handle both give (``db.query``, ``db.execute``, ``db[table]``).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import sqlite_utils

from analyzers.base import Checkpoint

if TYPE_CHECKING:
    from bot.store import IngestResult


class RunRecords:
    db: sqlite_utils.Database  # these are the store's (bot.store.Store, bot.pgstore.PgStore)
    lock: threading.RLock
    query: Callable[..., list[dict[str, Any]]]
    transaction: Callable[[], AbstractContextManager[sqlite_utils.Database]]
    enqueue: Callable[..., int]

    def run_names(self) -> list[str]:
        return [r["name"] for r in self.query("SELECT name FROM runs ORDER BY name")]

    def run(self, name: str) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM runs WHERE name = ?", (name,))
        return rows[0] if rows else None

    def cursors(self) -> dict[str, dict[str, Any]]:
        """Where reading each source stopped, by source key."""
        return {r["source_key"]: json.loads(r["state"])
                for r in self.query("SELECT source_key, state FROM cursors")}

    def cursor(self, source_key: str) -> dict[str, Any] | None:
        """Where reading one source stopped (None: not read yet)."""
        rows = self.query("SELECT state FROM cursors WHERE source_key = ?", (source_key,))
        return json.loads(rows[0]["state"]) if rows else None

    def unjudged(self) -> list[str]:
        """Runs stored since their alerts were last reconciled."""
        return [r["name"] for r in self.query("SELECT name FROM runs WHERE unjudged = 1")]

    def checkpoints(self, run: str) -> list[Checkpoint]:
        return [Checkpoint(r["step"], r["path"], r["wall_time"]) for r in
                self.query("SELECT * FROM checkpoints WHERE run = ? ORDER BY step", (run,))]

    def _ensure_run(self, db: Any, name: str, source: str, log_path: str,
                    now: float) -> dict[str, Any]:
        """The run's row, made first if it is new (inside the caller's transaction)."""
        rows = list(db.query("SELECT * FROM runs WHERE name = ?", (name,)))
        if rows:
            return rows[0]
        row = {"name": name, "source": source, "log_path": log_path, "attempt": 1,
               "created_at": now, "updated_at": now, "malformed_lines": 0, "skipped_values": 0}
        db["runs"].insert(row)
        return row


    def ingest_generations(self, *, run: str, source: str, log_path: str, cursor_key: str,
                           cursor: dict[str, Any], rows: pd.DataFrame, notices: list[str],
                           now: float | None = None) -> IngestResult:
        """Store new sample generations of one run (``step, prompt, output, probe``, in
        file order) for its current attempt, with their cursor, in one transaction."""
        from bot.store import IngestResult

        now = time.time() if now is None else now
        result = IngestResult(run=run, notices=list(notices))
        with self.transaction() as db:
            attempt = self._ensure_run(db, run, source, log_path, now)["attempt"]
            records = [{"run": run, "attempt": attempt, "step": int(r["step"]),
                        "prompt": r["prompt"], "output": r["output"],
                        "probe": None if r["probe"] is None or pd.isna(r["probe"])
                        else int(bool(r["probe"]))}
                       for r in rows.to_dict("records")]
            if records:
                db["generations"].insert_all(records, batch_size=500)
            update: dict[str, Any] = {"updated_at": now}
            if records:
                update["unjudged"] = 1
            if notices:
                update["last_notice"] = notices[-1]
            db["runs"].update(run, update)
            db["cursors"].insert({"source_key": cursor_key, "run": run,
                                  "state": json.dumps(cursor), "updated_at": now}, replace=True)
        result.new_generations = len(records)
        result.attempt = attempt
        return result


    def source_health(self, uri: str, *, now: float, runs: int | None = None,
                      error: str | None = None, state: str | None = None, malformed: int = 0,
                      skipped: int = 0) -> None:
        """Record how a source is doing: reachable with N runs, or why not; bad input counts.

        Each ``error`` is one failure: counted, and kept as the last error with its time.
        ``state`` None leaves the state as it is (a new source starts ``ok``): counting bad
        lines, or listing the runs, says nothing about whether the reads succeed.
        """
        with self.transaction() as db:
            rows = list(db.query("SELECT * FROM sources WHERE uri = ?", (uri,)))
            row = rows[0] if rows else {"uri": uri, "state": "ok", "errors": 0,
                                        "malformed_lines": 0, "skipped_values": 0, "runs": 0}
            row.update(updated_at=now, malformed_lines=row["malformed_lines"] + malformed,
                       skipped_values=row["skipped_values"] + skipped)
            if state is not None:
                row["state"] = state
            if runs is not None:
                row["runs"] = runs
            if error is not None:
                row.update(last_error=error, last_error_at=now, errors=row["errors"] + 1)
            elif state == "ok":
                row["last_ok_at"] = now
            db["sources"].insert(row, replace=True)


    def sources(self) -> list[dict[str, Any]]:
        return self.query("SELECT * FROM sources ORDER BY uri")


    def update_run_meta(self, run: str, values: dict[str, Any]) -> bool:
        """Merge ``values`` into the run's metadata and have the run judged again (what
        the analyzers read of it changed), in one transaction; False when there is no such
        run."""
        with self.transaction() as db:
            rows = list(db.query("SELECT meta FROM runs WHERE name = ?", (run,)))
            if not rows:
                return False
            meta = {**json.loads(rows[0]["meta"] or "{}"), **values}
            db["runs"].update(run, {"meta": json.dumps(meta, sort_keys=True, default=str),
                                    "unjudged": 1})
        return True


    def activity(self, run: str | None = None) -> list[dict[str, Any]]:
        """Per run (or one): its current ``attempt``, when runwatch first recorded it
        (``created_at``) and the latest wall time its current attempt logged
        (``last_wall``; None when its points carry none)."""
        sql = "SELECT name AS run, attempt, created_at, last_wall_time AS last_wall FROM runs"
        return self.query(sql + " WHERE name = ?", (run,)) if run is not None \
            else self.query(sql)


    def record_suite_versions(self, run: str, attempt: int, step: int | None,
                              suites: list[dict[str, Any]], now: float | None = None
                              ) -> list[dict[str, Any]]:
        """Record which version of each suite the run's evaluations use from ``step`` on
        (``suites``: dicts of ``suite``, ``version``, ``prefix``, ``source`` — ``"log"`` when
        the run's log declared it, ``"config"`` when it is the config's version now).

        A suite gets a row the first time it is seen in an attempt, and again when the
        log declares another version mid-attempt. At a new attempt a version the log
        declared before carries over unless the log declares another: the config's
        version stands only for suites the log never declared. Returns the rows written
        whose version differs from the suite's previous one (the change events)."""
        now = time.time() if now is None else now
        changed = []
        with self.transaction() as db:
            for item in suites:
                last = next(iter(db.query(
                    "SELECT attempt, version, source FROM eval_suite_versions WHERE run = ? AND "
                    "suite = ? ORDER BY id DESC LIMIT 1", (run, item["suite"]))), None)
                version, source = item["version"], item["source"]
                if last is not None and last["source"] == "log" and source == "config":
                    version, source = last["version"], "log"
                if last is not None and last["attempt"] == attempt and (
                        source == "config" or last["version"] == version):
                    continue
                row = {"run": run, "attempt": attempt, "suite": item["suite"],
                       "version": version, "step": step, "prefix": item["prefix"],
                       "source": source, "recorded_at": now}
                db["eval_suite_versions"].insert(row)
                if last is not None and last["version"] != version:
                    changed.append({**row, "before": last["version"]})
        return changed


    def suite_history(self, run: str) -> list[dict[str, Any]]:
        """Every recorded suite version of a run, oldest first."""
        return self.query("SELECT * FROM eval_suite_versions WHERE run = ? ORDER BY id",
                          (run,))


    def suite_marks(self, run: str, attempt: int) -> dict[str, list[list[Any]]]:
        """Suite → ``[[from step, version], ...]`` for one attempt, as analyzers read it
        (:mod:`analyzers.suites`): the first from the attempt's start (step None)."""
        marks: dict[str, list[list[Any]]] = {}
        for row in self.query("SELECT suite, version, step FROM eval_suite_versions WHERE "
                              "run = ? AND attempt = ? ORDER BY id", (run, attempt)):
            found = marks.setdefault(row["suite"], [])
            found.append([None if not found else row["step"], row["version"]])
        return marks


    def forget_checkpoints(self, run: str, steps: list[int]) -> None:
        with self.transaction() as db:
            for step in steps:
                db.execute("DELETE FROM checkpoints WHERE run = ? AND step = ?", (run, step))


    def latest(self, run: str, attempt: int, tag: str) -> dict[str, Any] | None:
        rows = self.query("SELECT step, value, wall_time FROM metrics WHERE run = ? AND "
                          "attempt = ? AND tag = ? ORDER BY step DESC LIMIT 1",
                          (run, attempt, tag))
        if not rows:
            return None
        if rows[0]["value"] is None:  # NaN is kept as NULL
            rows[0]["value"] = math.nan
        return rows[0]


    def begin_attempt(self, run: str, stopped_at: float) -> None:
        """A rollback runwatch carried out, done at ``stopped_at`` (unix time: the old process
        stopped, or the training loop answered that it rolled back): the first point logged
        after it begins the next attempt, even when no
        step goes back (a resume that skipped every batch past the old attempt's last step).
        Points the old process logged before it stopped stay in the old attempt, whenever
        they are read. Points without a wall time are judged by their steps alone."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET resume_after = ? WHERE name = ?", (stopped_at, run))


    def enqueue_retry(self, *, kind: str, fingerprint: str, run: str, channel: str,
                      now: float, due: float, error: str,
                      message_id: int | None = None) -> int:
        """Queue a message whose first try (made outside the queue) failed with ``error``:
        one attempt counted, sent again from ``due``; in one transaction."""
        with self.transaction() as db:
            outbox_id = self.enqueue(db, kind=kind, fingerprint=fingerprint, run=run,
                                     channel=channel, now=now, message_id=message_id, due=due)
            db["outbox"].update(outbox_id, {"attempts": 1, "last_error": error})
        return outbox_id


    def thin_finished(self, keep_days: float, *, now: float | None = None,
                      every: float = 3600.0, buckets: int = 500) -> int:
        """Retention: a run that stored nothing for ``keep_days`` days is finished; its
        series longer than ``4 * buckets`` points keep only their :func:`envelope`. Once per
        run, checked at most once per ``every`` seconds. Returns the points removed."""
        from bot.store import envelope

        now = time.time() if now is None else now
        if now - getattr(self, "_thinned_check", -math.inf) < every:
            return 0
        self._thinned_check = now
        removed = 0
        for run in self.query("SELECT name FROM runs WHERE thinned_at IS NULL AND "
                              "last_point_at < ?", (now - keep_days * 86400,)):
            with self.transaction() as db:
                for series in list(db.query(
                        "SELECT s.id FROM series s JOIN attempts a ON a.id = s.attempt_id "
                        "WHERE a.run = ?", (run["name"],))):
                    series_id = series["id"]
                    rows = list(db.query("SELECT step, value FROM points WHERE series = ? "
                                         "ORDER BY step", (series_id,)))
                    if len(rows) <= 4 * buckets:
                        continue
                    steps = np.array([r["step"] for r in rows], dtype=np.int64)
                    values = np.array([r["value"] for r in rows], dtype=float)  # NULL: NaN
                    drop = steps[~envelope(steps, values, buckets)]
                    db.conn.executemany("DELETE FROM points WHERE series = ? AND step = ?",
                                        ((series_id, int(step)) for step in drop))
                    removed += len(drop)
                db.execute("DELETE FROM steps WHERE attempt_id IN (SELECT id FROM attempts "
                           "WHERE run = ?) AND NOT EXISTS (SELECT 1 FROM points p JOIN series "
                           "s ON s.id = p.series WHERE s.attempt_id = steps.attempt_id AND "
                           "p.step = steps.step)", (run["name"],))
                db.execute("UPDATE runs SET thinned_at = ? WHERE name = ?", (now, run["name"]))
        return removed

    def _run_parts(self, run: str, attempt: int, info: dict[str, Any]) -> dict[str, Any]:
        """What :meth:`run_data` gives analyzers besides the points: checkpoints, the run's
        metadata (with its eval suites' versions) and the attempt's generations."""
        from analyzers.base import generations_frame
        from analyzers.suites import VERSIONS_KEY

        meta = {**json.loads(info.get("meta") or "{}"), "total_steps": info.get("total_steps")}
        if info.get("config"):
            meta["config"] = json.loads(info["config"])
        marks = self.suite_marks(run, attempt)
        if marks:
            meta[VERSIONS_KEY] = marks
        generations = pd.DataFrame(self.query(
            "SELECT step, prompt, output, probe FROM generations WHERE run = ? AND "
            "attempt = ? ORDER BY id", (run, attempt)),
            columns=["step", "prompt", "output", "probe"])
        return {"checkpoints": self.checkpoints(run), "meta": meta,
                "generations": generations_frame(generations), "now": None}
