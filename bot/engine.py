"""The watch loop: sources → store → analyzers → alert pipeline → transport.

One :meth:`Engine.poll` is what the scheduler runs every ``poll_interval``: read new points
and sample generations from every source, analyse only the runs that got new data, reconcile
their findings with the stored ones and send what the outbox holds.

A stall is news precisely when nothing arrives, so the time-based signals
(:data:`TIME_BASED`) are also judged, alone, on the watched runs that got nothing new: only
once a run has been silent for the analyzer's floor (``min_silence``), and then again after a
tenth of its silence, so an idle poll stays a dictionary lookup per run. A run that had
already gone quiet when runwatch first recorded it is history (an archive of finished logs),
not a stall: it is judged like a finished log until it logs again.

At scale (issue 27) a pass keeps to its poll. It first reads every run's new lines without
storing them (a read is cheap: about a millisecond for ten lines; storing and judging are
not), so what is critical is found in the whole folder at once (the *fast lane*: a
non-finite value, a failure in the run's status); those runs are stored and judged for it
first, and the sender is woken at once. The other runs' news is then stored for at most
:data:`STORE_SHARE` of the poll interval (a run read for the first time is stored whole),
taking turns across passes: a run not stored keeps its cursor and is read again, with its
newer lines, by the next pass, which begins where this one stopped. Their heavy analysis
takes at most :data:`ANALYSIS_SHARE` of the interval, and the runs it did not reach wait in
a queue that the next pass serves first.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

import analyzers
from analyzers.base import REJUDGE_MAX_POINTS
from analyzers.finding import Finding
from analyzers.stats.metric import tags_under
from analyzers.suites import DECLARED_KEY as DECLARED_SUITES
from bot.alerting.notify import Notifier
from bot.alerting.outbox import Outbox
from bot.alerting.pipeline import Change, reconcile, tick
from bot.config import Settings
from bot.pgstore import open_store
from bot.services.changes import change_line, run_changes
from bot.store import IngestResult, Store
from connectors.aliases import AliasTable
from connectors.base import Batch, RunReader, Source, SourceMissing, SourceUnavailable
from connectors.files import HfOutputDir, LogFile
from connectors.generations import GENERATIONS_FILE, generations_path, read_generations
from connectors.registry import open_source

log = logging.getLogger("runwatch.engine")

# Signals judged against the clock: analysed on every poll, also for runs with nothing new.
TIME_BASED = frozenset({"stalled"})
# A silent run is judged again after this share of its silence has passed once more: a stall
# is reported at most a tenth of its length late, and a long silence costs few checks.
RECHECK_SHARE = 0.1
# Runs whose last read attempt is kept in memory, so that a poll reads only new points: a
# thousand-run team's every run, up to LIVE_POINTS points in all (about 30 bytes each), the
# least recently judged dropped first (a run dropped is read whole again when next judged):
# memory stays flat however long the runs grow.
LIVE_RUNS = 2048
LIVE_POINTS = 3_000_000
# A pass judges runs until it has run for this share of the poll interval, so that it ends
# before the next poll is due; and, however long its reads took, until it has judged for
# ANALYSIS_FLOOR of the interval, so that the analysis always moves on. The runs it does not
# reach are judged first by the next pass: none starves however many there are.
ANALYSIS_SHARE = 0.6
ANALYSIS_FLOOR = 0.1
# A pass stores runs (not urgent ones: those always) until it has run for this share of the
# poll interval, and at least until it has stored for STORE_FLOOR of it; the runs left wait
# for the next pass, which stores them first.
STORE_SHARE = 0.4
STORE_FLOOR = 0.1
# New points a pass holds in memory between reading a run and storing it; a run read past
# this (a history being caught up) is read again when its turn to be stored comes.
HELD_POINTS = 200_000
# A status or error in a run's metadata that says it failed: judged in the fast lane.
FAILED_STATUS = ("fail", "crash", "error", "killed", "out of memory", "oom")
FAST_LANE_FAILURE = frozenset({"memory", "stalled"})
FAST_LANE_NONFINITE = frozenset({"spike"})


def _describe(exc: Exception) -> str:
    """An error in one line: an OS error says itself; anything else (a reader's bug) is
    named by its type too."""
    return str(exc) if isinstance(exc, OSError) and str(exc) else f"{type(exc).__name__}: {exc}"


@dataclass
class _Activity:
    """What the engine remembers of a run between polls to judge it without reading it."""

    attempt: int
    created_at: float  # when runwatch first recorded the run
    last_wall: float | None  # the latest wall time its current attempt logged
    due: float = 0.0  # when the time-based signals are next judged if nothing arrives


@dataclass
class PollReport:
    ingested: dict[str, IngestResult] = field(default_factory=dict)
    catching_up: set[str] = field(default_factory=set)  # runs read for the first time
    analysed: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    sent: int = 0
    seconds: float = 0.0
    stopped: bool = False  # a stop was asked for: the pass ended after the run it was on
    fast_lane: list[str] = field(default_factory=list)  # runs judged at once while read
    deferred: int = 0  # runs with news left to the next pass (the analysis budget was spent)
    dispatched_at: int | None = None  # len(changes) when the fast lane last sent
    fast_signals: dict[str, frozenset[str]] = field(default_factory=dict)  # judged per run


class Engine:
    def __init__(self, settings: Settings, *, store: Store | None = None,
                 notifier: Notifier | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store or open_store(settings.db_path)
        self.clock = clock
        self.aliases = AliasTable(settings.config.aliases)
        patterns = [p.line_pattern() for p in settings.config.patterns]
        self.sources: list[Source] = [
            open_source(s.path, s.run, self.aliases, patterns=patterns)
            for s in settings.config.sources]
        self.analyzers = analyzers.build(settings.config.analyzer_settings())
        self.channel = settings.config.slack.channel
        self.outbox = (Outbox(self.store, notifier, settings.config.outbox, clock)
                       if notifier is not None else None)
        self._present_at_start: set[str] | None = None
        # source → (state, runs) as the store has them: loaded at the first need, then
        # written only when they change or a failure is counted
        self._health: dict[str, tuple[str, int]] | None = None
        self._unlisted: set[str] = set()  # sources whose last discovery failed (said once)
        self._unreadable: set[tuple[str, str, str]] = set()  # (source, run, what) failing
        self._stop = threading.Event()
        # This engine is the only writer of cursors: one query at start, then memory, so a
        # poll that finds nothing new across many files costs file stats, not queries.
        self._cursors: dict[str, dict] | None = None
        # generations files by reader key (None: the reader has none), and the (size, mtime)
        # each had when last read: an unchanged or absent file costs one stat per poll
        self._generation_files: dict[str, tuple[str, str] | None] = {}
        self._generations_seen: dict[str, tuple[int, int]] = {}
        self._watched: set[str] = set()  # runs the sources held at the last ingest
        self._meta_seen: dict[str, dict] = {}  # reader key → the metadata it last sent
        self._suites_seen: set[tuple[str, int, str]] = set()  # (run, attempt, suite) recorded
        self._activity: dict[str, _Activity] | None = None  # loaded at the first need
        self._live: dict[str, analyzers.RunData] = {}  # run → its attempt as last read
        self._live_points = 0  # the points the runs in _live hold
        self._time_based = [a for a in self.analyzers if a.signal in TIME_BASED]
        self._silence_floor = min((float(getattr(a, "min_silence", 0.0))
                                   for a in self._time_based), default=0.0)
        self._poll_lock = threading.Lock()  # a poll reads and advances cursors: one at a time
        self._unjudged: set[str] | None = None  # runs stored but not judged when we started
        # called after each poll (the bot posts rollback follow-ups); failures are logged
        self.after_poll: list[Callable[[], None]] = []
        # called when the fast lane queued an alert (the scheduler wakes its sender)
        self.on_urgent: list[Callable[[], None]] = []
        self._urgent: dict[str, frozenset[str]] = {}  # run → signals to judge at once
        # (run, signal) → (attempt, points) when a slow signal was last judged live
        self._judged_at: dict[tuple[str, str], tuple[int, int]] = {}
        self._backlog: dict[str, None] = {}  # runs with news not judged yet, oldest first
        self._catching_up: set[str] = set()  # runs whose first read history is not judged
        self._pass_started, self._judging = 0.0, 0.0  # the running pass: start, judging time
        self._turn: str | None = None  # the reader key the next pass begins storing at
        keep = settings.config.store.keep_points_days
        if keep is not None:  # retention: finished runs thinned to envelopes, hourly
            self.after_poll.append(lambda: self.store.thin_finished(keep, now=self.clock()))

    def request_stop(self) -> None:
        """End the running pass after the run it is on, and start no other (SIGTERM).

        A run is read, stored (its points with its cursor, in one transaction) and judged
        (its alerts with their outbox rows) before the next one is begun, so a pass that
        stops leaves nothing half done: the runs it did not reach keep their cursors and are
        read by the next start, and the alerts it queued are sent from the outbox then. The
        outbox stops too, after the message it is sending.
        """
        self._stop.set()
        if self.outbox is not None:
            self.outbox.request_stop()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no poll and no send is running (None: as long as it takes); False if
        one still was after ``timeout`` seconds. Call :meth:`request_stop` first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        locks = [self._poll_lock] + ([self.outbox.lock] if self.outbox is not None else [])
        for lock in locks:
            left = -1 if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not lock.acquire(timeout=left):
                return False
            lock.release()
        return True

    def readers(self) -> list[tuple[str, RunReader]]:
        """Every run the sources hold now, with its source's URI; a source that cannot be
        listed is recorded (see :meth:`_source_failed`) and the others are listed on."""
        return self._discover()[0]

    def _discover(self) -> tuple[list[tuple[str, RunReader]], set[str]]:
        """The runs, and the sources that listed them. A source listed again after it was
        missing or unreachable is ``ok``; one degraded by failed reads stays so until a pass
        reads all its runs (a look at its folder cannot tell)."""
        readers: list[tuple[str, RunReader]] = []
        listed: set[str] = set()
        now = self.clock()
        for source in self.sources:
            key = source.uri
            try:
                found = source.discover()
            except Exception as exc:  # one source must not stop the others
                self._source_failed(key, exc, now)
                continue
            listed.add(key)
            if key in self._unlisted:
                log.info("%s is there now; watching it", key)
                self._unlisted.discard(key)
            state, runs = self._health_of(key)
            back = state in (None, "missing", "unavailable")
            if back or runs != len(found):  # write only what changed
                self._record_health(key, now=now, runs=len(found), state="ok" if back else None)
            readers.extend((key, reader) for reader in found)
        if self._present_at_start is None:
            self._present_at_start = {r.key for _, r in readers}
        return readers, listed

    def _source_failed(self, key: str, exc: Exception, now: float) -> None:
        """A source that could not be listed: said once until it can be; each failure is
        counted with its error and time, except a path that does not exist yet (waiting for
        a run to start is no failure: recorded once)."""
        state = ("missing" if isinstance(exc, SourceMissing) else
                 "unavailable" if isinstance(exc, SourceUnavailable) else "degraded")
        error = str(exc) if isinstance(exc, (SourceMissing, SourceUnavailable)) \
            else f"{key}: could not list its runs: {_describe(exc)}"
        first = key not in self._unlisted
        if first:
            self._unlisted.add(key)
            log.warning("%s; will look again every poll", error)
            log.debug("%s: discovery failed", key, exc_info=exc)
        if first or state != "missing":
            self._record_health(key, now=now, state=state, error=error)

    def _health_of(self, key: str) -> tuple[str | None, int | None]:
        if self._health is None:
            self._health = {row["uri"]: (row["state"], row["runs"])
                            for row in self.store.sources()}
        return self._health.get(key, (None, None))

    def _record_health(self, key: str, *, now: float, runs: int | None = None,
                       state: str | None = None, error: str | None = None) -> None:
        self.store.source_health(key, now=now, runs=runs, state=state, error=error)
        old_state, old_runs = self._health_of(key)
        self._health[key] = (state or old_state or "ok", old_runs if runs is None else runs)

    def ingest(self, catching_up: set[str] | None = None, *,
               final: bool = False) -> dict[str, IngestResult]:
        """Read every source: the runs with new points or new sample generations, with what
        was stored. Runs whose history is read for the first time since runwatch started go
        into ``catching_up``. ``final`` reads finished logs to their last byte."""
        results: dict[str, IngestResult] = {}
        for _ in self._read_runs(results, catching_up, final, budgeted=False):
            pass
        return results

    def _read_runs(self, results: dict[str, IngestResult], catching_up: set[str] | None,
                   final: bool, *, budgeted: bool = True) -> Iterator[str]:
        """Read the runs, yielding each run's name once what it had new is stored (see
        :meth:`ingest`): every run is read first (:meth:`_scout`), the runs with urgent news
        are stored first, then the others in turn, while ``budgeted`` only until
        :meth:`_may_store` says the pass has had its share. A run that cannot be read is
        recorded (see :meth:`_read_failed`) and the next is read; a stop ends the pass
        before the next."""
        if self._cursors is None:
            self._cursors = self.store.cursors()
        self._watched = set()
        readers, listed = self._discover()
        held = self._scout(readers, final)
        failed: set[str] = set()
        stored_since = time.perf_counter()
        next_turn: str | None = None
        for source_uri, reader in self._store_order(readers):
            if self.stopping:
                return
            # the budget is for news: a run read for the first time is stored whole at once
            # (what it logged before runwatch started is its history, told as such)
            if budgeted and reader.run not in self._urgent and reader.key in self._cursors \
                    and not self._may_store(stored_since):
                next_turn = next_turn or reader.key  # the next pass begins here
                continue
            try:
                if reader.key not in self._cursors and catching_up is not None \
                        and reader.key in (self._present_at_start or ()):
                    catching_up.add(reader.run)
                self._read_points(source_uri, reader, results, final,
                                  held.pop(reader.key, None))
            except Exception as exc:  # one run must not stop the others
                failed.add(source_uri)
                self._read_failed(source_uri, reader.run, "metrics", exc)
                continue
            self._read_again(source_uri, reader.run, "metrics")
            self._watched.add(reader.run)
            try:
                self._read_generations(source_uri, reader, results, final)
            except Exception as exc:
                failed.add(source_uri)
                self._read_failed(source_uri, reader.run, "sample generations", exc)
            else:
                self._read_again(source_uri, reader.run, "sample generations")
            yield reader.run
        self._turn = next_turn
        now = self.clock()
        for key in listed - failed:  # every run read: whatever failed before reads again
            if self._health_of(key)[0] != "ok":
                log.info("%s: every run is read again", key)
                self._record_health(key, now=now, state="ok")

    def _scout(self, readers: list[tuple[str, RunReader]],
               final: bool) -> dict[str, Batch]:
        """Read every run's new points without storing them; mark the runs whose news is
        urgent (:meth:`_urgent_signals`) and count the runs with nothing new as watched (a
        run with news left unstored by the budget is not judged silent). Returns the
        batches read, by reader key, up to :data:`HELD_POINTS` points in all; a run that
        fails to read here is read again, and recorded, when its turn comes. A run never
        read is not read here: its history is read once, when it is stored whole."""
        held: dict[str, Batch] = {}
        points = 0
        for _, reader in readers:
            if self.stopping:
                break
            cursor = self._cursors.get(reader.key)
            if cursor is None:  # read for the first time: its whole history, read in its turn
                continue
            try:
                batch = reader.read(cursor, final=final)
            except Exception:  # read again (and recorded) in its turn
                continue
            if batch.cursor == cursor and batch.points.empty:
                self._watched.add(reader.run)  # nothing new: watched, whether stored or not
            meta = batch.meta if batch.meta and self._meta_seen.get(reader.key) != batch.meta \
                else {}
            urgent = self._urgent_signals(batch.points, meta)
            if urgent:
                self._urgent[reader.run] = self._urgent.get(reader.run, frozenset()) | urgent
            if points + len(batch.points) <= HELD_POINTS:
                held[reader.key] = batch
                points += len(batch.points)
        return held

    def _store_order(self, readers: list[tuple[str, RunReader]]
                     ) -> list[tuple[str, RunReader]]:
        """The runs with urgent news first, then every other run in turn from where the
        last budgeted pass stopped (:attr:`_turn`), so none waits for more than its turn."""
        keys = [reader.key for _, reader in readers]
        start = keys.index(self._turn) if self._turn in keys else 0
        turn = readers[start:] + readers[:start]
        return ([pair for pair in turn if pair[1].run in self._urgent]
                + [pair for pair in turn if pair[1].run not in self._urgent])

    def _may_store(self, stored_since: float) -> bool:
        """Whether the running pass may store another run that has no urgent news
        (:data:`STORE_SHARE`, :data:`STORE_FLOOR`)."""
        interval = self.settings.config.poll_interval
        now = time.perf_counter()
        return (now - self._pass_started < STORE_SHARE * interval
                or now - stored_since - self._judging < STORE_FLOOR * interval)

    def _read_failed(self, source_uri: str, run: str, what: str, exc: Exception) -> None:
        """A run whose metrics or generations could not be read: each failure is counted
        as its source's, with the error and its time (`runwatch sources`); it is said once,
        until it reads again."""
        error = f"run {run}: could not read its {what}: {_describe(exc)}"
        if (source_uri, run, what) not in self._unreadable:
            self._unreadable.add((source_uri, run, what))
            log.warning("%s; the other runs are read on, this one again every poll", error)
            log.debug("run %s: reading its %s failed", run, what, exc_info=exc)
        self._record_health(source_uri, now=self.clock(), state="degraded", error=error)

    def _read_again(self, source_uri: str, run: str, what: str) -> None:
        if (source_uri, run, what) in self._unreadable:
            self._unreadable.discard((source_uri, run, what))
            log.info("run %s: its %s can be read again", run, what)

    def _read_points(self, source_uri: str, reader: RunReader,
                     results: dict[str, IngestResult], final: bool,
                     batch: Batch | None = None) -> None:
        """Store what is new in one run's metrics (``batch``: as :meth:`_scout` read it); a
        failed read raises."""
        cursor = self._cursors.get(reader.key)
        if batch is None:
            batch = reader.read(cursor, final=final)
        if batch.malformed or batch.skipped_values:
            self.store.source_health(source_uri, now=self.clock(),
                                     malformed=len(batch.malformed),
                                     skipped=batch.skipped_values)
        if batch.cursor == cursor and batch.points.empty and not (
                batch.checkpoints or batch.meta or batch.malformed or batch.notices
                or batch.skipped_values):
            return  # nothing new: no write
        for line_no, error in batch.malformed[:3]:
            log.warning("run %s: %s line %d skipped: %s", reader.run, reader.key, line_no,
                        error)
        result = self.store.ingest(
            run=reader.run, source=reader.key.partition(":")[0], log_path=reader.key,
            cursor_key=reader.key, cursor=batch.cursor, points=batch.points,
            checkpoints=batch.checkpoints, meta=batch.meta, malformed=batch.malformed,
            skipped_values=batch.skipped_values, notices=batch.notices, now=self.clock())
        self._cursors[reader.key] = json.loads(json.dumps(batch.cursor))  # as stored
        # a run's status or total can end a stall without a new point (some sources send
        # their metadata with every read: only a change counts)
        changed_meta = bool(batch.meta) and self._meta_seen.get(reader.key) != batch.meta
        if changed_meta:
            self._meta_seen[reader.key] = batch.meta
        self._record_suites(reader.run, result.attempt, batch.points,
                            batch.meta if changed_meta else {})
        self._stored(result, judge_again=changed_meta)
        for notice in result.notices:
            log.warning(notice)
        urgent = self._urgent_signals(batch.points, batch.meta if changed_meta else {})
        if urgent:  # (found by the scout too, unless it could not read or hold the batch)
            self._urgent[reader.run] = self._urgent.get(reader.run, frozenset()) | urgent
        if result.new_points:
            self._forget_deleted_checkpoints(reader.run)
            results[reader.run] = result

    def _record_suites(self, run: str, attempt: int, points, meta: dict) -> None:
        """Which version of each eval suite the run's new evaluations use, from the first
        point of this read (or the step after the last one, when it read none): the
        version its log declares (``meta``), else the config's
        (the suite file's hash now, or its declared version) when the suite's metrics are
        first seen in this attempt."""
        declared = meta.get(DECLARED_SUITES)
        declared = declared if isinstance(declared, dict) else {}
        tags = points["tag"].unique().tolist() if not points.empty else []
        suites = []
        for suite in self.settings.config.eval_suites:
            if suite.name in declared or (run, attempt, suite.name) in self._suites_seen \
                    or not tags_under(tags, suite.prefix):
                continue
            version = suite.current_version()
            if version is None:  # a metric prefix without a version, or a file gone
                self._suites_seen.add((run, attempt, suite.name))
                if suite.file is not None:
                    log.warning("run %s: eval suite %s has no version: its file %s cannot be "
                                "read", run, suite.name, suite.file)
                continue
            suites.append({"suite": suite.name, "version": version, "prefix": suite.prefix,
                           "source": "config"})
        for name, version in declared.items():
            suite = self.settings.config.suite(str(name))
            suites.append({"suite": str(name), "version": str(version),
                           "prefix": suite.prefix if suite else f"eval/{name}/",
                           "source": "log"})
        if not suites:
            return
        if not points.empty:
            step = int(points["step"].min())
        else:  # a meta line alone: the version holds from the next step logged
            last = self.store.last_step(run, attempt)
            step = None if last is None else last + 1
        for change in self.store.record_suite_versions(run, attempt, step, suites,
                                                       now=self.clock()):
            log.info("run %s: eval suite %s changed version %s → %s at step %s", run,
                     change["suite"], change["before"], change["version"], change["step"])
        self._suites_seen.update((run, attempt, s["suite"]) for s in suites)

    def _urgent_signals(self, points, meta: dict) -> frozenset[str]:
        """The signals a run's new data makes urgent: a non-finite value is a critical
        ``spike`` at once; a status or error that says the run failed (out of memory, a
        crash) is judged by ``memory`` and ``stalled`` at once."""
        urgent: frozenset[str] = frozenset()
        if not points.empty and not np.isfinite(points["value"].to_numpy(dtype=float)).all():
            urgent |= FAST_LANE_NONFINITE
        said = " ".join(str(meta.get(k) or "") for k in ("status", "error")).lower()
        if said and any(word in said for word in FAILED_STATUS):
            urgent |= FAST_LANE_FAILURE
        return urgent & {a.signal for a in self.analyzers}

    def _read_generations(self, source_uri: str, reader: RunReader,
                          results: dict[str, IngestResult], final: bool) -> None:
        """Store the sample generations a file-based run logged since the last read; a
        failed read raises."""
        found = self._generations_file(reader)
        if found is None:
            return
        path, key = found
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return  # most runs log none
        signature = (stat.st_size, stat.st_mtime_ns)
        if self._generations_seen.get(key) == signature:
            return
        cursor = self._cursors.get(key)
        batch = read_generations(path, cursor, final=final, aliases=self.aliases)
        if batch.malformed:
            self.store.source_health(source_uri, now=self.clock(), malformed=len(batch.malformed))
        if batch.cursor != cursor or not batch.rows.empty or batch.notices:
            result = self.store.ingest_generations(
                run=reader.run, source=reader.key.partition(":")[0], log_path=reader.key,
                cursor_key=key, cursor=batch.cursor, rows=batch.rows,
                notices=[f"{reader.run}: {n}" for n in batch.notices], now=self.clock())
            self._cursors[key] = json.loads(json.dumps(batch.cursor))  # as stored
            self._stored(result)
            for notice in result.notices:
                log.warning(notice)
            if result.new_generations:
                merged = results.setdefault(reader.run, IngestResult(run=reader.run))
                merged.attempt = result.attempt
                merged.new_generations += result.new_generations
                merged.notices += result.notices
        self._generations_seen[key] = signature

    def _generations_file(self, reader: RunReader) -> tuple[str, str] | None:
        """A run's generations file and its cursor key: only a run that owns its folder
        has one (several logs in one folder are several runs; the file is no one's)."""
        if reader.key not in self._generation_files:
            path = (generations_path(reader.path) if isinstance(reader, LogFile)
                    and reader.discover_checkpoints else
                    reader.folder / GENERATIONS_FILE if isinstance(reader, HfOutputDir)
                    else None)
            self._generation_files[reader.key] = (
                None if path is None else (str(path), f"generations:{path.resolve()}"))
        return self._generation_files[reader.key]

    def _forget_deleted_checkpoints(self, run: str) -> None:
        """A checkpoint deleted on disk (e.g. HF ``save_total_limit``) is never offered."""
        gone = [c.step for c in self.store.checkpoints(run) if not os.path.exists(c.path)]
        if gone:
            log.info("run %s: checkpoints at steps %s were deleted; no longer offered", run,
                     ", ".join(map(str, gone)))
            self.store.forget_checkpoints(run, gone)

    def analyze(self, run: str, *, live: bool = False,
                signals: set[str] | frozenset[str] | None = None,
                judged: set[str] | None = None) -> list[Finding]:
        """Every finding the run's current attempt supports (of ``signals`` only, if given);
        ``judged`` receives the signals that were judged.

        ``live`` (the watch loop) judges the time-based signals against the engine's clock,
        and a slow signal only once the attempt has grown enough since it was last judged
        (:attr:`analyzers.Analyzer.rejudge_share`); otherwise, and for a run that had gone
        quiet before runwatch first recorded it, the data is a finished log and carries no
        time.
        """
        before = self._live.pop(run, None)
        data = self.store.run_data(run, since=before)
        self._live[run] = data  # the next poll reads only what is logged after it
        self._live_points += data.points() - (before.points() if before is not None else 0)
        while len(self._live) > 1 and (len(self._live) > LIVE_RUNS
                                       or self._live_points > LIVE_POINTS):
            self._live_points -= self._live.pop(next(iter(self._live))).points()
        activity = self._activity_of(run) if live else None
        if activity is not None:
            activity.attempt = data.attempt
            activity.last_wall = data.last_wall()
            if not self._is_history(activity):
                data.now = self.clock()
        findings: list[Finding] = []
        points = data.points()
        for analyzer in self.analyzers:
            if signals is not None and analyzer.signal not in signals:
                continue
            if live and not self._due(run, data.attempt, analyzer, points):
                continue
            if judged is not None:
                judged.add(analyzer.signal)
            try:
                findings.extend(analyzer.detect(data))
            except Exception:  # one broken analyzer must not silence the others
                log.exception("run %s: analyzer %s failed", run, analyzer.signal)
        if findings:
            self._say_what_changed(run, findings)
        return findings

    def _due(self, run: str, attempt: int, analyzer: analyzers.Analyzer, points: int) -> bool:
        """Whether a live judgement of ``analyzer`` is due on the attempt, now ``points``
        long (always, unless the analyzer asks to wait for the attempt to grow); counted as
        judged when it is."""
        if not analyzer.rejudge_share:
            return True
        key = (run, analyzer.signal)
        last = self._judged_at.get(key)
        if last is not None and last[0] == attempt and points - last[1] < min(
                analyzer.rejudge_share * last[1], REJUDGE_MAX_POINTS):
            return False
        self._judged_at[key] = (attempt, points)
        return True

    def _say_what_changed(self, run: str, findings: list[Finding]) -> None:
        """Each finding's "changed since the previous attempt" line (``changed_before``)
        from the changes service, as ``/run changes`` and the digest see them: the training
        side's change events and the eval suites' new versions."""
        try:
            changes = run_changes(self.store, run)
        except Exception:  # the line is a courtesy: never a reason to lose the alert
            log.exception("run %s: what changed before the findings could not be read", run)
            return
        for finding in findings:
            line = change_line(changes, finding.onset_step)
            evidence = {k: v for k, v in finding.evidence.items() if k != "changed_before"}
            finding.evidence = {**evidence, "changed_before": line} if line else evidence

    def poll(self, *, dispatch: bool = True) -> PollReport:
        """One pass; ``dispatch=False`` leaves sending to the scheduler's outbox job. After
        :meth:`request_stop` it returns at once (``stopped``)."""
        with self._poll_lock:
            if self.stopping:
                return PollReport(stopped=True)
            return self._poll(dispatch)

    def _poll(self, dispatch: bool) -> PollReport:
        """Each run is read and then judged before the next is read, so that a stop
        (:meth:`request_stop`) between two runs leaves no run stored but not judged (a run
        left to the next pass stays marked unjudged in the store, so a restart judges it).
        A run whose new data is urgent is judged for that first (the fast lane) and its
        alerts sent (``dispatch``) or the sender woken (:attr:`on_urgent`). Once the
        analysis has had its share of the poll interval, the runs with news wait in the
        backlog, which is served first, oldest first, from the next pass on."""
        started = time.perf_counter()
        self._pass_started, self._judging = started, 0.0
        report = PollReport()
        signals = {a.signal for a in self.analyzers}
        if self._unjudged is None:  # stored by an earlier process that died before judging
            self._unjudged = set(self.store.unjudged())
        backlog = self._backlog
        for run in self._read_runs(report.ingested, report.catching_up, final=False):
            if run in report.catching_up:
                self._catching_up.add(run)  # until judged, if that waits for a later pass
            elif run in report.ingested:
                # news logged after the history was read is no history, even unjudged (an
                # episode it begins and ends must be told; the history's may be told too)
                self._catching_up.discard(run)
            if run in self._urgent:
                self._fast_lane(run, report, dispatch)
            if run in report.analysed or (run not in report.ingested
                                          and run not in self._unjudged):
                continue
            if backlog or not self._may_judge():
                backlog[run] = None
                continue
            self._judge(run, report, signals)
        for run in list(backlog):
            if self.stopping or not self._may_judge():
                break
            del backlog[run]
            if run not in report.analysed:
                self._judge(run, report, signals)
        report.deferred = len(backlog)
        if self._time_based and not self.stopping:
            report.changes += self._judge_silent_runs(set(report.ingested))
        if self.stopping:  # the rest is done again by the next pass, at the next start
            report.stopped = True
            report.seconds = time.perf_counter() - started
            return report
        tick(self.store, now=self.clock(), alerting=self.settings.config.alerting)
        for hook in self.after_poll:
            try:
                hook()
            except Exception:
                log.exception("after-poll hook %r failed", hook)
        if dispatch and self.outbox is not None and (report.dispatched_at is None or any(
                c.transition != "updated" for c in report.changes[report.dispatched_at:])):
            report.sent += self.outbox.dispatch()  # (once a pass, unless news came after)
        report.seconds = time.perf_counter() - started
        return report

    def _may_judge(self) -> bool:
        """Whether the running pass may judge another run (:data:`ANALYSIS_SHARE`)."""
        interval = self.settings.config.poll_interval
        return (time.perf_counter() - self._pass_started < ANALYSIS_SHARE * interval
                or self._judging < ANALYSIS_FLOOR * interval)

    def _judge(self, run: str, report: PollReport, signals: set[str]) -> None:
        """Every analyzer on ``run`` (but those its fast lane judged in this pass: an alert
        rule's evaluations count passes); its alerts reconciled and the run marked judged."""
        started = time.perf_counter()
        signals = signals - report.fast_signals.get(run, frozenset())
        judged: set[str] = set()  # a slow signal not due keeps its alerts as they are
        findings = self.analyze(run, live=True, signals=signals, judged=judged)
        report.analysed.append(run)
        attempt = (report.ingested[run].attempt if run in report.ingested
                   else self.store.run(run)["attempt"])
        report.changes += self._reconcile(run, attempt, findings, judged,
                                          catching_up=run in self._catching_up)
        self._catching_up.discard(run)
        self.store.judged(run)  # after: judging twice is harmless, never judging is not
        self._unjudged.discard(run)
        self._backlog.pop(run, None)
        self._judging += time.perf_counter() - started

    def _fast_lane(self, run: str, report: PollReport, dispatch: bool) -> None:
        """Judge the urgent signals of a run just read, alone, and send what they queued:
        a NaN's critical alert does not wait for the heavy analyzers or the other runs."""
        urgent = self._urgent.pop(run)
        attempt = report.ingested[run].attempt if run in report.ingested \
            else self.store.run(run)["attempt"]
        findings = self.analyze(run, live=True, signals=urgent)
        changes = self._reconcile(run, attempt, findings, set(urgent),
                                  catching_up=run in self._catching_up)
        report.changes += changes
        report.fast_lane.append(run)
        report.fast_signals[run] = report.fast_signals.get(run, frozenset()) | urgent
        if not any(c.transition != "updated" for c in changes):
            return
        log.info("run %s: %s judged at once (fast lane)", run, ", ".join(sorted(urgent)))
        if self.outbox is not None:
            self.outbox.urgent()  # a send under way starts over at the critical rows
        if dispatch and self.outbox is not None:
            report.sent += self.outbox.dispatch()
            report.dispatched_at = len(report.changes)
        for hook in self.on_urgent:
            try:
                hook()
            except Exception:
                log.exception("urgent hook %r failed", hook)

    def _reconcile(self, run: str, attempt: int, findings: list[Finding], signals: set[str],
                   *, catching_up: bool = False) -> list[Change]:
        changes = reconcile(self.store, run, attempt, findings, signals=signals,
                            channel=self.channel, now=self.clock(), catching_up=catching_up,
                            alerting=self.settings.config.alerting)
        for change in changes:
            if change.transition != "updated":
                log.info("run %s: %s %s", run, change.signal, change.transition)
        self._schedule_next_check(run, findings)
        return changes

    def _judge_silent_runs(self, analysed: set[str]) -> list[Change]:
        """The time-based signals, alone, on each watched run that got nothing new and is
        due; only those signals' alerts are reconciled, the others stay as they are."""
        now = self.clock()
        signals = {a.signal for a in self._time_based}
        changes: list[Change] = []
        for run in sorted(self._watched - analysed):
            if self.stopping:
                break
            activity = self._activity_of(run, load=False)
            if activity is None or now < activity.due:
                continue
            judged: set[str] = set()
            findings = self.analyze(run, live=True, signals=signals, judged=judged)
            changes += self._reconcile(run, activity.attempt, findings, judged)
        return changes

    def _schedule_next_check(self, run: str, findings: list[Finding]) -> None:
        """When a run that gets nothing new is next judged: a stall already firing needs
        no more polls (new data or a metadata change judges it again); otherwise at the
        floor, then after a tenth of its silence, so a long silence is read rarely."""
        activity = self._activity_of(run, load=False)
        if activity is None:
            return
        if not self._time_based or activity.last_wall is None or self._is_history(activity):
            activity.due = math.inf  # nothing to judge by time, or history
            return
        current = [f.fingerprint for f in findings
                   if f.signal in TIME_BASED and f.state == "firing"]
        if current:
            states = self.store.alert_states(current)
            activity.due = self.clock() if "pending" in states else math.inf
            return
        now = self.clock()
        activity.due = max(activity.last_wall + self._silence_floor,
                           now + RECHECK_SHARE * max(now - activity.last_wall, 0.0))

    def _is_history(self, activity: _Activity) -> bool:
        """Whether a run had already gone quiet (longer than the silence floor) when
        runwatch first recorded it and has logged nothing since: a finished log, which
        cannot stall; a run that logged while runwatch watched it can."""
        return activity.last_wall is not None \
            and activity.last_wall < activity.created_at - self._silence_floor

    def _activity_of(self, run: str, *, load: bool = True) -> _Activity | None:
        """What is remembered of a run; read from the store at the first need (all runs at
        once), or for a run recorded since when ``load``."""
        if self._activity is None:
            self._activity = {row["run"]: self._activity_row(row)
                              for row in self.store.activity()}
        if run not in self._activity and load:
            rows = self.store.activity(run)
            if rows:
                self._activity[run] = self._activity_row(rows[0])
        return self._activity.get(run)

    def _activity_row(self, row: dict) -> _Activity:
        activity = _Activity(row["attempt"], row["created_at"] or 0.0, row["last_wall"])
        activity.due = (math.inf if activity.last_wall is None or self._is_history(activity)
                        else activity.last_wall + self._silence_floor)
        return activity

    def _stored(self, result: IngestResult, *, judge_again: bool = False) -> None:
        """Something of the run was written; ``judge_again``: its time-based signals are
        judged on this poll, whatever was due (new data is analysed anyway)."""
        activity = self._activity_of(result.run, load=False)
        if activity is not None:
            activity.attempt = result.attempt
            if judge_again:
                activity.due = 0.0
