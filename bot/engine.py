"""The watch loop: sources → store → analyzers → alert pipeline → transport.

One :meth:`Engine.poll` is what the scheduler runs every ``poll_interval``: read new points
from every source, analyse only the runs that got new points, reconcile their findings with
the stored ones and send what the outbox holds.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import analyzers
from analyzers.base import Finding
from bot.alerts import Change, Outbox, reconcile
from bot.config import Settings
from bot.notify import Notifier
from bot.store import IngestResult, Store
from connectors.aliases import AliasTable
from connectors.base import RunReader, Source, SourceMissing, SourceUnavailable
from connectors.registry import open_source

log = logging.getLogger("runwatch.engine")


@dataclass
class PollReport:
    ingested: dict[str, IngestResult] = field(default_factory=dict)
    catching_up: set[str] = field(default_factory=set)  # runs read for the first time
    analysed: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    sent: int = 0
    seconds: float = 0.0


class Engine:
    def __init__(self, settings: Settings, *, store: Store | None = None,
                 notifier: Notifier | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store or Store(settings.db_path)
        self.clock = clock
        self.aliases = AliasTable(settings.config.aliases)
        patterns = [p.line_pattern() for p in settings.config.patterns]
        self.sources: list[Source] = [
            open_source(s.path, s.run, self.aliases, patterns=patterns)
            for s in settings.config.sources]
        self.analyzers = analyzers.build(settings.config.analyzers)
        self.channel = settings.config.slack.channel
        self.outbox = (Outbox(self.store, notifier, settings.config.outbox, clock)
                       if notifier is not None else None)
        self._missing: set[str] = set()
        self._present_at_start: set[str] | None = None
        self._healthy: dict[str, int] = {}  # source → runs last recorded as healthy
        self._unreadable: set[str] = set()  # run keys whose last read failed
        # This engine is the only writer of cursors: one query at start, then memory, so a
        # poll that finds nothing new across many files costs file stats, not queries.
        self._cursors: dict[str, dict] | None = None
        self._poll_lock = threading.Lock()  # a poll reads and advances cursors: one at a time

    def readers(self) -> list[tuple[str, RunReader]]:
        """Every run the sources hold now, with its source's URI; a missing or unreachable
        source is reported once and its health recorded."""
        readers: list[tuple[str, RunReader]] = []
        now = self.clock()
        for source in self.sources:
            key = source.uri
            try:
                found = source.discover()
            except (SourceMissing, SourceUnavailable) as exc:
                state = "missing" if isinstance(exc, SourceMissing) else "unavailable"
                if key not in self._missing:
                    log.warning("%s; will look again every poll", exc)
                    self._missing.add(key)
                    self.store.source_health(key, now=now, state=state, error=str(exc))
                    self._healthy.pop(key, None)
                continue
            if key in self._missing:
                log.info("%s is there now; watching it", key)
                self._missing.discard(key)
            if self._healthy.get(key) != len(found):  # write only what changed
                self.store.source_health(key, now=now, runs=len(found))
                self._healthy[key] = len(found)
            readers.extend((key, reader) for reader in found)
        if self._present_at_start is None:
            self._present_at_start = {r.key for _, r in readers}
        return readers

    def ingest(self, catching_up: set[str] | None = None, *,
               final: bool = False) -> dict[str, IngestResult]:
        """Read every source; runs whose history is read for the first time since runwatch
        started go into ``catching_up``. ``final`` reads finished logs to their last byte."""
        results: dict[str, IngestResult] = {}
        if self._cursors is None:
            self._cursors = self.store.cursors()
        for source_uri, reader in self.readers():
            cursor = self._cursors.get(reader.key)
            if cursor is None and catching_up is not None \
                    and reader.key in (self._present_at_start or ()):
                catching_up.add(reader.run)
            try:
                batch = reader.read(cursor, final=final)
            except (SourceMissing, SourceUnavailable, OSError) as exc:
                if reader.key not in self._unreadable:  # once, until it can be read again
                    self._unreadable.add(reader.key)
                    log.warning("run %s: could not read %s: %s", reader.run, reader.key, exc)
                    self.store.source_health(source_uri, now=self.clock(), state="degraded",
                                             error=f"run {reader.run}: {exc}")
                    self._healthy.pop(source_uri, None)
                continue
            self._unreadable.discard(reader.key)
            if batch.malformed or batch.skipped_values:
                self.store.source_health(source_uri, now=self.clock(),
                                         malformed=len(batch.malformed),
                                         skipped=batch.skipped_values)
            if batch.cursor == cursor and batch.points.empty and not (
                    batch.checkpoints or batch.meta or batch.malformed or batch.notices
                    or batch.skipped_values):
                continue  # nothing new: no write
            for line_no, error in batch.malformed[:3]:
                log.warning("run %s: %s line %d skipped: %s", reader.run, reader.key, line_no,
                            error)
            result = self.store.ingest(
                run=reader.run, source=reader.key.partition(":")[0], log_path=reader.key,
                cursor_key=reader.key, cursor=batch.cursor, points=batch.points,
                checkpoints=batch.checkpoints, meta=batch.meta, malformed=batch.malformed,
                skipped_values=batch.skipped_values, notices=batch.notices, now=self.clock())
            self._cursors[reader.key] = json.loads(json.dumps(batch.cursor))  # as stored
            for notice in result.notices:
                log.warning(notice)
            if result.new_points:
                self._forget_deleted_checkpoints(reader.run)
                results[reader.run] = result
        return results

    def _forget_deleted_checkpoints(self, run: str) -> None:
        """A checkpoint deleted on disk (e.g. HF ``save_total_limit``) is never offered."""
        gone = [c.step for c in self.store.checkpoints(run) if not os.path.exists(c.path)]
        if gone:
            log.info("run %s: checkpoints at steps %s were deleted; no longer offered", run,
                     ", ".join(map(str, gone)))
            self.store.forget_checkpoints(run, gone)

    def analyze(self, run: str) -> list[Finding]:
        data = self.store.run_data(run)
        findings: list[Finding] = []
        for analyzer in self.analyzers:
            try:
                findings.extend(analyzer.detect(data))
            except Exception:  # one broken analyzer must not silence the others
                log.exception("run %s: analyzer %s failed", run, analyzer.signal)
        return findings

    def poll(self, *, dispatch: bool = True) -> PollReport:
        """One pass; ``dispatch=False`` leaves sending to the scheduler's outbox job."""
        with self._poll_lock:
            return self._poll(dispatch)

    def _poll(self, dispatch: bool) -> PollReport:
        started = time.perf_counter()
        report = PollReport()
        report.ingested = self.ingest(report.catching_up)
        signals = {a.signal for a in self.analyzers}
        for run, result in report.ingested.items():
            findings = self.analyze(run)
            report.analysed.append(run)
            changes = reconcile(self.store, run, result.attempt, findings, signals=signals,
                                channel=self.channel, now=self.clock(),
                                catching_up=run in report.catching_up)
            for change in changes:
                if change.transition != "updated":
                    log.info("run %s: %s %s", run, change.signal, change.transition)
            report.changes.extend(changes)
        if dispatch and self.outbox is not None:
            report.sent = self.outbox.dispatch()
        report.seconds = time.perf_counter() - started
        return report
