"""``runwatch inspect SOURCE``: what runwatch read from a file or folder, before any finding.

The first time a finding surprises someone, the question is what runwatch saw: which format
it took the file for, which runs, which tags with how many points over which steps, which
lines it could not read. The source is read the way the bot reads it (an engine ingest into a
throwaway store, as ``runwatch analyze`` does) and the report comes from that store, so it
shows what the analyzers would be given, not what a second reader thinks.

(Not ``bot/inspect.py``: run as ``python bot/cli.py``, that name would hide the standard
library's ``inspect`` from everything imported after it.)
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from bot.config import Settings, SourceConfig
from connectors.formats import KEY_VALUE, unsupported

if TYPE_CHECKING:
    from analyzers.finding import Finding
    from bot.engine import Engine
    from bot.store import IngestResult

# What a text log's pattern family is called in the report, when its name says too little.
FAMILY_NAMES = {KEY_VALUE: "generic 'key value' lines"}


@contextmanager
def read_source(settings: Settings, source: str) -> Iterator[tuple[Engine, dict[str,
                                                                             IngestResult]]]:
    """``source`` (a path or URI) read to its last byte into a throwaway store, the one way
    `runwatch analyze`, `runwatch inspect` and `runwatch bench real` read a source. Inside
    the block the engine's store holds the runs. Raises ValueError for an unknown scheme or
    a file runwatch cannot read."""
    from bot.engine import Engine
    from bot.store import Store

    settings.config.sources = [SourceConfig(path=source)]
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(settings, store=Store(str(Path(tmp) / "read.db")))
        try:
            yield engine, engine.ingest(final=True)
        finally:
            engine.store.close()


@contextmanager
def analyzed(settings: Settings, source: str) -> Iterator[
        tuple[Engine, dict[str, IngestResult], list[Finding]]]:
    """``source`` read to its last byte into a throwaway store and every run in it judged,
    as `runwatch analyze` does (:func:`read_source`); `runwatch bench real`
    scores the same findings, so the figure it publishes is what a user of `analyze` sees."""
    with read_source(settings, source) as (engine, ingested):
        yield engine, ingested, [f for run in sorted(ingested) for f in engine.analyze(run)]


def inspect_source(settings: Settings, source: str) -> dict[str, Any]:
    """The report for ``source`` (a path or URI) as one JSON-ready object: per run its format,
    points, step range, tags with their points and steps, malformed lines (count and first),
    skipped values and the last notice; the errors of runs that could not be read; and, in a
    folder, one line for each file with a log's suffix that is no log runwatch can read.

    Raises ``ValueError`` for a source that cannot be opened at all (an unknown scheme, a
    file runwatch cannot read: the message says what was tried and what to do).
    """
    with read_source(settings, source) as (engine, _):
        store = engine.store
        cursors = store.cursors()
        runs = [_run(store, name, cursors) for name in store.run_names()]
        errors = [row["last_error"] for row in store.sources() if row["last_error"]]
        not_read = [unsupported(path, "no log: binary data, JSON of another kind, a table "
                                      "of text, or text without a metric line")
                    for watched in engine.sources for path in getattr(watched, "rejected", ())]
    return {"source": source, "points": sum(r["points"] for r in runs), "runs": runs,
            "errors": errors, "not_read": not_read}


def _run(store: Any, name: str, cursors: dict[str, dict[str, Any]]) -> dict[str, Any]:
    info = store.run(name)
    tags = store.tag_summary(name)
    first = None
    if info["malformed_lines"]:
        first = {"line": info["first_malformed_line"], "error": info["first_malformed_error"]}
    return {
        "run": name, "read_from": info["log_path"],
        "format": describe_format(info["log_path"], cursors.get(info["log_path"], {})),
        "points": sum(t["points"] for t in tags),
        "steps": [min(t["first_step"] for t in tags), max(t["last_step"] for t in tags)]
        if tags else None,
        "attempts": info["attempt"], "total_steps": info.get("total_steps"), "tags": tags,
        "malformed_lines": info["malformed_lines"], "first_malformed": first,
        "skipped_values": info["skipped_values"], "notice": info.get("last_notice"),
    }


def describe_format(key: str, cursor: dict[str, Any]) -> str:
    """The format a run's reader detected, from the cursor it left: ``text (nanogpt)``,
    ``hf_trainer_state``, ``tensorboard_csv × 2 (train_loss.csv, val_loss.csv)``; the
    scheme for readers without formats (``tb``, ``mlflow``, ``wandb``)."""
    if "files" in cursor:
        names = sorted(cursor["files"])
        formats = sorted({c.get("format", "?") for c in cursor["files"].values()})
        return f"{', '.join(formats)} × {len(names)} ({', '.join(names)})"
    fmt = cursor.get("format")
    if fmt is None:
        return "unreadable" if cursor.get("unsupported") else key.partition(":")[0]
    family = (cursor.get("state") or {}).get("family")
    return f"{fmt} ({FAMILY_NAMES.get(family, family)})" if family else fmt


def render(report: dict[str, Any]) -> Group:
    """The report for people: a few lines per run and a table of its tags."""
    parts: list[Any] = [Text(f"{report['source']}: {_count(len(report['runs']), 'run')}, "
                             f"{_count(report['points'], 'point')}")]
    for run in report["runs"]:
        steps = f"steps {run['steps'][0]}…{run['steps'][1]}" if run["steps"] else "no points"
        total = f" of {run['total_steps']}" if run["total_steps"] else ""
        attempts = f", {run['attempts']} attempts" if run["attempts"] > 1 else ""
        parts.append(Text(f"\nrun {run['run']}: {run['format']}, {steps}{total}{attempts}; "
                          f"read from {run['read_from']}", style="bold"))
        if run["tags"]:
            table = Table("tag", "points", "first step", "last step")
            for tag in run["tags"]:
                table.add_row(tag["tag"], f"{tag['points']:,}", str(tag["first_step"]),
                              str(tag["last_step"]))
            parts.append(table)
        if run["first_malformed"]:
            first = run["first_malformed"]
            parts.append(Text(f"{_count(run['malformed_lines'], 'malformed line')} skipped, "
                              f"first at line {first['line']}: {first['error']}"))
        if run["skipped_values"]:
            parts.append(Text(f"{_count(run['skipped_values'], 'value')} that are not numbers "
                              f"skipped"))
        if run["notice"]:
            parts.append(Text(run["notice"]))
    parts += [Text(error, style="red") for error in report["errors"]]
    parts += [Text(line, style="yellow") for line in report["not_read"]]
    return Group(*parts)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
