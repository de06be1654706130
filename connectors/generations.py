"""Sample generations: the JSONL file a run writes at each evaluation, read incrementally.

One JSON object per line: ``step`` (the evaluation's global step), ``prompt``, ``output``
and, optionally, ``probe`` (true for the rows of a fixed benign probe set)::

    {"step": 500, "prompt": "What is the capital of France?", "output": "Paris.", "probe": true}

By convention the file is ``generations.jsonl`` in the run's folder, beside its metrics log
(:func:`generations_path`). Reading follows :class:`connectors.files.LogFile`: the cursor
(byte offset, line number, a digest of the first bytes) says where the last read stopped;
only complete lines are consumed, so a partial last line waits for its newline (``final``
takes it too); a file that shrank, or whose beginning changed, is read again from the start
with a notice. Bad input never stops a read: a malformed line is counted with its line
number and skipped, with one notice line per read that says how many and why the first
was. Unknown keys are ignored. A file that does not exist (yet) is an empty read: most runs
log no generations.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from connectors.aliases import STEP, AliasTable
from connectors.files import HEAD_BYTES, MAX_LINE_BYTES, checkpoint_folder, complete_lines
from connectors.formats import TOO_DEEP, bad_step, to_step

GENERATIONS_FILE = "generations.jsonl"
GENERATION_ROW_COLUMNS = ["step", "prompt", "output", "probe"]
# Names trainers' sample loggers use for the two texts; the first one present is taken.
OUTPUT_KEYS = ("output", "completion", "response")
PROMPT_KEYS = ("prompt", "input")
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}


@dataclass
class GenerationsBatch:
    """What one read produced: new rows (``step, prompt, output, probe``; ``probe`` is
    None where a line has no mark) in file order, and the cursor to pass next time."""

    cursor: dict[str, Any]
    rows: pd.DataFrame = field(
        default_factory=lambda: pd.DataFrame(columns=GENERATION_ROW_COLUMNS))
    malformed: list[tuple[int, str]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


def generations_path(log: str | os.PathLike[str]) -> Path:
    """Where a run's generations are expected: ``generations.jsonl`` in the run's folder
    (``out/metrics.jsonl`` → ``out/generations.jsonl``; an HF checkpoint's
    ``out/checkpoint-500/trainer_state.json`` → ``out/generations.jsonl``)."""
    return checkpoint_folder(Path(log)) / GENERATIONS_FILE


def read_generations(path: str | os.PathLike[str], cursor: dict[str, Any] | None = None, *,
                     final: bool = False, aliases: AliasTable | None = None) -> GenerationsBatch:
    """The generations logged since ``cursor``; the batch carries the next cursor.

    ``aliases`` names the step key (``global_step`` works by default). An unreadable file
    raises :class:`PermissionError` saying what to do.
    """
    path = Path(path)
    aliases = aliases or AliasTable()
    cursor = dict(cursor or {})
    notices: list[str] = []
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(HEAD_BYTES)
            offset = int(cursor.get("offset", 0))
            if cursor and (_digest(head[:cursor.get("head_len", 0)]) != cursor.get("head")
                           or size < offset):
                why = (f"shrank to {size} bytes from {offset}" if size < offset
                       else "was replaced by another file")
                notices.append(f"{path.name} {why} (truncated or rotated); reading it again "
                               f"from the start")
                cursor, offset = {}, 0
            if size == offset:
                return GenerationsBatch(cursor=cursor, notices=notices)
            handle.seek(offset)
            line_no = int(cursor.get("line", 0))
            new_offset = offset
            rows: list[dict[str, Any]] = []
            malformed: list[tuple[int, str]] = []
            for raw, length in complete_lines(handle, final):
                line_no += 1
                new_offset += length
                if raw is None:
                    malformed.append((line_no, f"a line of {length:,} bytes, over the "
                                               f"{MAX_LINE_BYTES:,} runwatch reads"))
                    continue
                text = raw.decode("utf-8", errors="replace")
                if line_no == 1:
                    text = text.removeprefix("\ufeff")
                if not text.strip():
                    continue
                row = _row(text, aliases)
                if isinstance(row, str):
                    malformed.append((line_no, row))
                else:
                    rows.append(row)
    except FileNotFoundError:
        return GenerationsBatch(cursor=cursor)
    except PermissionError as exc:
        raise PermissionError(f"{path}: permission denied ({exc.strerror}); make it readable "
                              f"by the user running runwatch (e.g. chmod a+r)") from None
    if malformed:
        first_line, why = malformed[0]
        count = len(malformed)
        notices.append(f"{path.name}: {count} malformed line{'s' if count > 1 else ''} skipped, "
                       f"first at line {first_line}: {why}")
    head_len = min(new_offset, HEAD_BYTES)
    if len(head) < head_len:  # the file grew past the head while it was read
        with path.open("rb") as handle:
            head = handle.read(head_len)
    batch = GenerationsBatch(
        cursor={"offset": new_offset, "line": line_no, "head_len": head_len,
                "head": _digest(head[:head_len])},
        malformed=malformed, notices=notices)
    if rows:
        batch.rows = pd.DataFrame(rows, columns=GENERATION_ROW_COLUMNS)
    return batch


def _row(text: str, aliases: AliasTable) -> dict[str, Any] | str:
    """One line as a row, or why it is malformed."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg})"
    except RecursionError:
        return f"JSON {TOO_DEEP}"
    if not isinstance(record, dict):
        return "not a JSON object"
    step_key = next((k for k in record if aliases.canonical(k) == STEP), None)
    if step_key is None:
        return ("no 'step' field (add an alias for the step key in [aliases] if it has "
                "another name)")
    step = to_step(record[step_key])
    if step is None:
        return bad_step(record[step_key])
    output_key = next((k for k in OUTPUT_KEYS if k in record), None)
    if output_key is None:
        return f"no 'output' field (one of {', '.join(OUTPUT_KEYS)})"
    output = record[output_key]
    if not isinstance(output, str):
        return f"'{output_key}' is not text"
    prompt_key = next((k for k in PROMPT_KEYS if k in record), None)
    prompt = "" if prompt_key is None or record[prompt_key] is None else record[prompt_key]
    if not isinstance(prompt, str):
        return f"'{prompt_key}' is not text"
    probe = _probe(record.get("probe"))
    if probe == "bad":
        return f"'probe' is {record['probe']!r}, not true or false"
    return {"step": step, "prompt": prompt, "output": output, "probe": probe}


def _probe(value: Any) -> bool | None | str:
    """True, False, None (no mark), or ``"bad"``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return "bad"


def _digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()
