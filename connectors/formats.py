"""Log formats: how runwatch recognises a metrics file and turns its content into records.

Every format ends in the same place, whatever the trainer wrote: :class:`Record` s (a step, a
few ``{tag: value}`` with canonical tags, a wall time), which :func:`assemble` turns into the
long frame of the source contract. Formats come in two kinds:

* **line formats** are read incrementally, a complete line at a time, from a byte offset:
  JSON lines (generic, LLaMA-Factory ``trainer_log.jsonl``), CSV with a header (generic,
  Keras ``CSVLogger``, Lightning ``metrics.csv``, TensorBoard and W&B CSV exports) and text
  logs, read through a table of :class:`LinePattern` s that users can extend, and failing
  those by a generic reader of ``key value`` lines that name their step
  (:func:`key_value_record`);
* **document formats** are JSON files rewritten whole (HF ``trainer_state.json``, Megatron-LM
  golden values): they are parsed again when the file changes and only entries past what was
  already read are new.

:func:`sniff` picks the format from the file name and its first bytes; a text log's pattern
family is decided later, by the first line that yields a metric (see :class:`TextLines`),
because real logs often start with thousands of lines of banner, config dump or source code.

Values: numbers and numeric strings, ``nan``/``inf`` included (a signal, never an error); a
value that is not a number is skipped and counted. Steps: non-negative integers; anything else
makes the line malformed.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import PurePath
from typing import Any, Protocol

from analyzers.base import Checkpoint
from connectors.aliases import STEP, TIME, AliasTable
from connectors.base import Batch

# Keys of a JSON/CSV record that are never metrics.
NON_METRIC_KEYS = {"event", "path", "meta", "control", STEP, TIME}
# Keys that say how long the run is; they go to the run's metadata, not to its metrics.
TOTAL_STEPS_KEYS = {"total_steps", "max_steps"}
# A value written with thousands separators, as OLMo and Python's ``{:,}`` do.
THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
# How many of the last steps' values the cursor keeps to recognise a record written twice.
RECENT_STEPS = 16
# Document formats remember a digest of what they emitted every this many entries, so a
# rewritten document is read again from about where it changed, with a small cursor.
DIGEST_BLOCK = 64
# What a line or a document nested deeper than Python's parser goes (RecursionError) is.
TOO_DEEP = "nested deeper than a metrics record can be"


def to_number(value: Any) -> float | None:
    """A float for numbers and numeric strings (``"nan"``, ``"inf"``, ``"8,949"``), else None.

    >>> to_number("8,949"), to_number(" 2.5E-01 "), to_number("-inf"), to_number("abc")
    (8949.0, 0.25, -inf, None)
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            text = value.strip()
            return float(text.replace(",", "")) if THOUSANDS.match(text) else None
    return None


# Steps are stored as SQLite integers (64-bit signed).
MAX_STEP = 2**63 - 1


def bad_step(value: Any) -> str:
    """The malformed-line message for a step that :func:`to_step` refuses."""
    return f"step {value!r} is not a non-negative integer below 2**63"


def to_step(value: Any) -> int | None:
    """A step is a non-negative integer (``12`` or ``"12"`` or ``12.0``) that a 64-bit
    integer holds; anything else is None.

    >>> to_step("12"), to_step(12.0), to_step(1e30), to_step(-1), to_step("x")
    (12, 12, None, None, None)
    """
    number = to_number(value)
    if (number is None or not math.isfinite(number) or number != int(number) or number < 0
            or int(number) > MAX_STEP):
        return None
    return int(number)


def to_wall_time(value: Any) -> float | None:
    """Unix seconds from a number or a timestamp such as ``2025-03-02 05:16:20,348``.

    A timestamp without a zone is read as UTC: only the differences between points matter
    (step times, stalls), and those do not depend on the zone.
    """
    number = to_number(value)
    if number is not None:
        return number
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.strip().strip("[]").replace(",", "."))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@dataclass
class Record:
    """What one logged line (or document entry) says about one step."""

    step: int
    values: dict[str, float]
    wall: float | None = None


@dataclass
class Context:
    """Where parsers put what they find: records, and the batch's counts, meta and checkpoints."""

    aliases: AliasTable
    path: PurePath
    batch: Batch
    records: list[Record] = field(default_factory=list)

    def add(self, record: Record | None) -> None:
        if record is not None:
            self.records.append(record)

    def malformed(self, line_no: int, why: str) -> None:
        self.batch.malformed.append((line_no, why))

    def total_steps(self, value: Any) -> None:
        total = to_step(value)
        if total:
            self.batch.meta["total_steps"] = total


# --------------------------------------------------------------------------------------------
# JSON and CSV records
# --------------------------------------------------------------------------------------------
def mapping_record(ctx: Context, raw: Mapping[str, Any], line_no: int,
                   ignore: frozenset[str] = frozenset(), step: Any = None) -> Record | None:
    """One key/value record (a JSON object, a CSV row): its step, its time, its metrics.

    Keys go through the alias table first, so ``global_step``, ``current_steps`` or a user's
    own name for the step all work. ``step`` overrides the record's own (Keras: the epoch).
    None when the record holds no metric (a checkpoint event, a malformed step: counted).
    """
    record: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ignore:
            continue
        record.setdefault(ctx.aliases.canonical(key), value)
    if step is not None:
        record[STEP] = step
    if STEP not in record:
        ctx.malformed(line_no, "no 'step' field (add an alias for the step key in [aliases] "
                               "if it has another name)")
        return None
    number = to_step(record[STEP])
    if number is None:
        ctx.malformed(line_no, bad_step(record[STEP]))
        return None
    wall = to_wall_time(record[TIME]) if TIME in record else None
    if record.get("event") == "checkpoint":
        path = record.get("path") or f"checkpoint-{number}"
        ctx.batch.checkpoints.append(Checkpoint(number, str(ctx.path.parent / str(path)), wall))
        return None
    values: dict[str, float] = {}
    for key, value in record.items():
        if key in NON_METRIC_KEYS:
            continue
        if key in TOTAL_STEPS_KEYS:
            ctx.total_steps(value)
            continue
        as_number = to_number(value)
        if as_number is None:
            ctx.batch.skipped_values += 1
            continue
        values[key] = as_number
    return Record(number, values, wall) if values else None


class LineParser(Protocol):
    """Reads one line at a time; ``state()`` is what it must remember until the next read."""

    def feed(self, line_no: int, text: str) -> None: ...

    def close(self) -> None:
        """The read ends here: settle what waited for more lines."""

    def state(self) -> dict[str, Any]: ...


class JsonLines:
    """One JSON object per line. A ``{"meta": {...}}`` line (runwatch's own loggers) is run
    metadata; ``{"event": "checkpoint", ...}`` is a checkpoint."""

    ignore: frozenset[str] = frozenset()

    def __init__(self, ctx: Context, state: dict[str, Any]) -> None:
        self.ctx = ctx

    def state(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Every line is complete in itself."""

    def feed(self, line_no: int, text: str) -> None:
        text = text.strip()
        if not text:
            return
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            self.ctx.malformed(line_no, f"not JSON ({exc.msg})")
            return
        except RecursionError:
            self.ctx.malformed(line_no, f"JSON {TOO_DEEP}")
            return
        if not isinstance(record, dict):
            self.ctx.malformed(line_no, "not a JSON object")
            return
        if "meta" in record and not any(self.ctx.aliases.canonical(k) == STEP for k in record):
            if isinstance(record["meta"], dict):
                self.ctx.batch.meta.update(record["meta"])
            else:
                self.ctx.malformed(line_no, "'meta' is not an object")
            return
        self.ctx.add(mapping_record(self.ctx, record, line_no, self.ignore))


class LlamaFactoryLines(JsonLines):
    """LLaMA-Factory's ``trainer_log.jsonl``: progress fields are not metrics (the elapsed and
    remaining times are ``"9 days, 21:39:23"`` strings, the percentage is derived)."""

    ignore = frozenset({"percentage", "elapsed_time", "remaining_time"})


class CsvRows:
    """CSV with a header line. Which column is the step, and how columns become tags, depends
    on who wrote it:

    * a column whose name is a step alias (``step``, ``global_step``…; Lightning, generic);
    * else ``epoch`` (Keras ``CSVLogger`` logs once per epoch);
    * else the row number, from 1 (a plain table of values, one row per logged step);
    * TensorBoard's export (``Wall time,Step,Value``) names the tag in its file name
      (``run-exp1-tag-train_loss.csv``); W&B's export names columns ``<run> - <metric>`` and
      adds ``__MIN``/``__MAX`` bands of its sampled chart, which are not values and are dropped.
    """

    def __init__(self, ctx: Context, state: dict[str, Any]) -> None:
        self.ctx = ctx
        self.header: list[str] | None = state.get("header")
        self.rows: int = state.get("rows", 0)

    def state(self) -> dict[str, Any]:
        return {"header": self.header, "rows": self.rows} if self.header is not None else {}

    def close(self) -> None:
        """Every row is complete in itself."""

    def feed(self, line_no: int, text: str) -> None:
        text = text.strip()
        if not text:
            return
        try:
            values = next(csv.reader([text]))
        except csv.Error as exc:  # a field over csv's size limit
            self.ctx.malformed(line_no, f"not a CSV row ({exc})")
            return
        if self.header is None:
            self.header = self._tags([h.strip() for h in values])
            return
        if len(values) != len(self.header):
            self.ctx.malformed(line_no, f"{len(values)} fields, the header has "
                                        f"{len(self.header)}")
            return
        self.rows += 1
        row = {k: v for k, v in zip(self.header, values, strict=True)
               if k and v.strip() != ""}
        has_step = any(self.ctx.aliases.canonical(k) == STEP for k in self.header if k)
        if has_step:
            record = mapping_record(self.ctx, row, line_no)
        elif "epoch" in self.header:
            record = mapping_record(self.ctx, row, line_no, ignore=frozenset({"epoch"}),
                                    step=row.get("epoch", ""))
        else:
            record = mapping_record(self.ctx, row, line_no, step=self.rows)
        self.ctx.add(record)

    def _tags(self, header: list[str]) -> list[str]:
        """Column names as tags; ``""`` for a column that holds no metric."""
        if [h.lower() for h in header] == ["wall time", "step", "value"]:
            name = self.ctx.path.stem
            return [TIME, STEP, name.split("-tag-", 1)[1] if "-tag-" in name else name]
        runs = {h.split(" - ", 1)[0] for h in header if " - " in h}
        tags = []
        for h in header:
            if " - " in h and h.endswith(("__MIN", "__MAX")):
                tags.append("")
            elif " - " in h and len(runs) == 1:
                tags.append(h.split(" - ", 1)[1])
            else:
                tags.append(h)
        return tags


# --------------------------------------------------------------------------------------------
# Text logs: a table of line patterns
# --------------------------------------------------------------------------------------------
# Named groups with a meaning of their own; every other named group is a metric.
SPECIAL_GROUPS = frozenset({"step", "total", "time", "epoch", "epoch_step", "epoch_steps",
                            "stride"})
# The family name of the generic reader (see :func:`key_value_record`), which reads a text
# log that no pattern family recognises.
KEY_VALUE = "key_value"


@dataclass(frozen=True)
class LinePattern:
    """One shape of line in a text log, and what its parts mean.

    ``name`` is the format family the pattern belongs to: patterns that share a name are
    one format (a train line and an eval line of the same trainer), and a log is read with
    the one family that recognised it first, so a generic pattern of another trainer never
    misreads it. ``regex`` is searched in each line (and in each ``\\r``-separated part of a
    line: progress bars redraw with carriage returns). Its named groups:

    * ``step``: the global step; ``epoch`` + ``epoch_step`` + ``epoch_steps``: a step
      counted within each epoch (global step = epoch × epoch_steps + epoch_step);
    * ``total``: the run's total steps; ``time``: a timestamp or Unix seconds; ``stride``:
      the logging interval, for patterns that count steps;
    * any other group is a metric named after the group.

    ``pairs``, a regex with ``key`` and ``value`` groups, takes every ``key``/``value`` pair
    from where ``regex`` matched to the end of the line as metrics (``lm loss: 2.3E+00 | grad
    norm: 1.1 |``), so ``regex`` only has to recognise the line. ``names`` maps
    a group name or a pair key to the name it is logged under (``{"trl": "train_loss"}``; an
    empty name drops it); names then go through the alias table, so ``lm_loss`` is
    ``train/loss``. Pair keys not in ``names`` have their spaces replaced by ``_``.

    A match without a step belongs to the step last seen in the log (an eval line after the
    train line it follows), or 0 before any. With ``counts_steps``, a match is instead the
    next logged step: its number × the logging interval (``stride`` if the log states it,
    else inferred from the progress shown, see :class:`TextLines`). In a family that counts,
    a match with a step and no metric is progress (a bar), not the step of what follows.

    Bad patterns raise :class:`ValueError` when the pattern is built, saying what to fix.
    """

    name: str
    regex: str
    names: Mapping[str, str] = field(default_factory=dict)
    pairs: str | None = None
    counts_steps: bool = False
    compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)
    compiled_pairs: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("a line pattern needs a name (its format family, e.g. 'mytrainer')")
        if self.name == KEY_VALUE:
            raise ValueError(f"line pattern {self.name!r}: that name is runwatch's generic "
                             f"reader of 'key value' lines; give your format another name")
        compiled = _compile(self.name, "regex", self.regex)
        pairs = None if self.pairs is None else _compile(self.name, "pairs", self.pairs)
        if pairs is not None and not {"key", "value"} <= set(pairs.groupindex):
            raise ValueError(f"line pattern {self.name!r}: 'pairs' must have named groups "
                             f"'key' and 'value', e.g. (?P<key>\\w+)=(?P<value>\\S+)")
        groups = set(compiled.groupindex)
        partial = groups & {"epoch_step", "epoch_steps"}
        if partial and not {"epoch", "epoch_step", "epoch_steps"} <= groups:
            raise ValueError(f"line pattern {self.name!r}: a step within an epoch needs all "
                             f"three groups epoch, epoch_step and epoch_steps")
        # The dataclass is frozen so patterns can be shared; the compiled forms are caches.
        object.__setattr__(self, "compiled", compiled)
        object.__setattr__(self, "compiled_pairs", pairs)


def _compile(name: str, what: str, regex: str) -> re.Pattern[str]:
    try:
        return re.compile(regex)
    except re.error as exc:
        raise ValueError(f"line pattern {name!r}: {what} is not a valid regular expression "
                         f"({exc}); check its escaping (TOML: use '''...''' literal strings)"
                         ) from None


_NUM = r"[-+]?(?:\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+|(?i:nan|infinity|inf))"
_STAMP = r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?"

BUILTIN_PATTERNS: tuple[LinePattern, ...] = (
    # Megatron-LM / Megatron-DeepSpeed, with DeepSpeed's engine lines (one family: a
    # Megatron-DeepSpeed log has both).
    LinePattern("megatron_deepspeed",
                r"iteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|.*",
                pairs=rf"(?P<key>[A-Za-z][\w ()/.-]*?)\s*:\s+(?P<value>{_NUM})\s*(?=\|)",
                names={"elapsed time per iteration (ms)": "iteration_time_ms",
                       "number of skipped iterations": "skipped_iterations",
                       "number of nan iterations": "nan_iterations", "TFLOPs": "tflops"}),
    LinePattern("megatron_deepspeed",
                rf"validation loss at iteration (?P<step>\d+)\s*\|\s*lm loss value:\s*"
                rf"(?P<val_loss>{_NUM})(?:\s*\|\s*lm loss PPL:\s*(?P<val_ppl>{_NUM}))?",
                names={"val_ppl": "eval/perplexity"}),
    LinePattern("megatron_deepspeed",
                rf"(?:\[(?P<time>{_STAMP})\].*)?\] step=(?P<step>\d+), skipped=(?P<skipped>\d+),"
                rf" lr=\[(?P<lr>{_NUM})",
                names={"skipped": "skipped_steps"}),
    LinePattern("megatron_deepspeed",
                rf"(?:\[(?P<time>{_STAMP})\].*)?global_step=(?P<step>\d+), RunningAvgSamplesPerSec="
                rf"{_NUM}, CurrSamplesPerSec=(?P<samples_per_second>{_NUM})"
                rf"(?:, MemAllocated=(?P<gpu_mem_gb>{_NUM})GB)?"),
    LinePattern("megatron_deepspeed",
                rf"OVERFLOW! Rank \d+ Skipping step\. Attempted loss scale: {_NUM}, "
                rf"reducing to (?P<overflow_loss_scale>{_NUM})"),
    LinePattern("megatron_deepspeed", rf"^ppl: (?P<ppl>{_NUM})\s*$",
                names={"ppl": "eval/perplexity"}),
    # OLMo: a ``[step=10/1000,epoch=0]`` line, then one ``    group/name=value`` line per metric.
    LinePattern("olmo",
                rf"^(?P<time>{_STAMP})\s.*\[step=(?P<step>\d+)/(?P<total>\d+),epoch=\d+\]"),
    LinePattern("olmo", rf"^\s+[A-Za-z][^=]*/[^=]*=\s*{_NUM}\s*$",
                pairs=rf"^\s+(?P<key>[^=]+?)=\s*(?P<value>{_NUM})\s*$",
                names={"train/CrossEntropyLoss": "train/loss",
                       "optim/total_grad_norm": "grad_norm",
                       "throughput/device/tokens_per_second": "throughput",
                       "train/Perplexity": "train_perplexity",
                       "System/Peak GPU Memory (MB)": "gpu_mem_mb"}),
    # nanoGPT (``iter 100: loss 2.1, time 30.1ms``), llm.c (``step 10/1000 | train loss 3.2 |
    # …`` and the compact ``s:10 trl:3.2 lr:… norm:…``) and modded-nanogpt
    # (``step:10/6200 train_loss:6.7 train_time:77676ms step_avg:nanms``).
    LinePattern("nanogpt",
                rf"^iter (?P<step>\d+): loss (?P<loss>{_NUM}), time (?P<step_time_ms>{_NUM})ms"
                rf"(?:, mfu (?P<mfu_pct>{_NUM})%)?"),
    LinePattern("nanogpt",
                rf"^step (?P<step>\d+): train loss (?P<train_loss_estimate>{_NUM}), "
                rf"val loss (?P<val_loss>{_NUM})"),
    LinePattern("nanogpt", r"^step\s+(?P<step>\d+)/(?P<total>\d+)\s*\|.*",
                pairs=rf"(?P<key>[a-z][a-z ]*?)\s+(?P<value>{_NUM})\s*(?=\||$)",
                names={"norm": "grad_norm"}),
    LinePattern("nanogpt", rf"^val loss (?P<val_loss>{_NUM})\s*$"),
    LinePattern("nanogpt", r"^s:(?P<step>\d+) .*",
                pairs=rf"(?P<key>[a-z]+):(?P<value>{_NUM})(?=\s|$)",
                names={"s": "", "trl": "train_loss", "tel": "val_loss", "norm": "grad_norm"}),
    LinePattern("nanogpt", r"^step:(?P<step>\d+)/(?P<total>\d+) .*",
                pairs=rf"(?P<key>[a-z_]+):(?P<value>{_NUM})(?P<unit>ms)?(?=\s|$)",
                names={"step": "", "train_time": "train_time_ms", "step_avg": "step_avg_ms"}),
    # HF Trainer console output: ``{'loss': 1.2, 'grad_norm': …, 'epoch': 0.1}`` lines without
    # a step. The step is what the training progress bar showed just before (``123/1000``; an
    # eval bar, redrawn with ``ESC[A``, is not it), else the ``logging_steps`` it printed times
    # the number of dicts so far, else the number of dicts.
    LinePattern("hf_console",
                r"^\s*(?:\x1b\[A\s*)*\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+) \[[^\]]*\]"
                r"(?!\x1b\[A)"),
    LinePattern("hf_console", r"logging_steps\s*[=:]\s*(?P<stride>\d+)"),
    LinePattern("hf_console", r"\{'loss': .*\}",
                pairs=r"'(?P<key>[^']+)':\s*(?:np\.\w+\()?(?P<value>[^,'{}()]+)",
                counts_steps=True),
    LinePattern("hf_console", r"\{'eval_[^']*': .*\}",
                pairs=r"'(?P<key>[^']+)':\s*(?:np\.\w+\()?(?P<value>[^,'{}()]+)"),
    # Python-logging progress lines: ``Epoch 0 | Step 10/6501 | Loss: 8.2 | PPL: … | LR: … |
    # Grad: … | Time: 0.5s`` (the step restarts every epoch).
    LinePattern("epoch_step_text",
                r"Epoch (?P<epoch>\d+) \| Step\s+(?P<epoch_step>\d+)/(?P<epoch_steps>\d+) \|.*",
                pairs=rf"\|\s*(?P<key>[A-Za-z][\w ]*?):\s*(?P<value>{_NUM})s?\s*(?=\||$)",
                names={"PPL": "train_perplexity", "Grad": "grad_norm", "Time": "step_time_s"}),
    # ``2025-03-02 05:16:20,348 - INFO - Epoch 1 - Batch loss: 12.13``, one line per step, with
    # per-epoch averages and BLEU scores between them.
    LinePattern("epoch_batch_text",
                rf"^(?P<time>{_STAMP}) - \w+ - Epoch \d+ - Batch loss: (?P<loss>{_NUM})",
                counts_steps=True),
    LinePattern("epoch_batch_text",
                rf"^(?P<time>{_STAMP}) - \w+ - Epoch \d+ - Average Train Loss: "
                rf"(?P<train_loss_epoch>{_NUM})"),
    LinePattern("epoch_batch_text", r"- Validation BLEU: .*",
                pairs=rf"(?P<key>BLEU-\d) (?P<value>{_NUM})",
                names={f"BLEU-{i}": f"eval/validation/bleu-{i}" for i in range(1, 5)}),
    LinePattern("epoch_batch_text", r"- Dev BLEU: .*",
                pairs=rf"(?P<key>BLEU-\d) (?P<value>{_NUM})",
                names={f"BLEU-{i}": f"eval/dev/bleu-{i}" for i in range(1, 5)}),
)


# --------------------------------------------------------------------------------------------
# Any text log with numbers: ``key value`` lines with a named step
# --------------------------------------------------------------------------------------------
# Keys that name the step, best first: a line with ``epoch 2 global_step 900`` is at 900.
STEP_NAMES = ("global_step", "step", "iteration", "iter", "it")
# What may stand before a step name in a key that names the step (``micro_step``).
STEP_PREFIXES = tuple([w] for w in ("micro", "train", "training", "optimizer", "opt", "update",
                                    "cur", "curr", "current", "trainer"))
# Words that qualify the key after them (``val loss``, ``grad norm``) wherever they stand.
QUALIFIERS = frozenset({"train", "training", "val", "valid", "validation", "eval", "test",
                        "lm", "grad", "gradient", "learning", "total", "avg", "mean"})
# Colour codes (SGR) never belong to a metric; cursor movements (``ESC[A``) are kept: the HF
# console patterns tell an evaluation's progress bar by them.
COLOURS = re.compile(r"\x1b\[[0-9;]*m")
_KV_TOKEN = re.compile(
    r"(?P<quote>['\"])|(?P<sep>[|,;:=()\[\]{}]|(?<=\s)-(?=\s))"
    r"|(?P<value>\d{1,3}(?:,\d{3})+(?!\d)|[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
    r"|[-+]?(?i:nan|inf(?:inity)?)(?!\w))"
    r"(?:\s*/\s*(?P<total>\d+)(?![\w.])|(?P<unit>%|[A-Za-z]+(?:/[A-Za-z]+)?)?(?![\w.]))"
    r"|(?P<word>[A-Za-z_][\w./-]*)|(?P<other>\S)")
# A key that names a source file: the number after it is a line number, not a metric.
SOURCE_FILE = re.compile(r"\.(?:py|pyx|cc|cpp|cu|c|h|hpp|rs|go|js|ts|java|scala|jl)$")
_LEADING_STAMP = re.compile(rf"^\s*\[?(?P<time>{_STAMP})")
# A one-letter suffix that scales the value rather than naming a unit (``1.31M`` tokens).
SCALES = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def key_values(line: str) -> list[tuple[str, str, str | None]]:
    """``(key, value, total)`` for every number a line names, in order: ``step 710/5000 |
    tok/s 512 | val loss: 3.2, time 35ms`` gives ``step`` 710 (of 5000), ``tok/s`` 512,
    ``val_loss`` 3.2 and ``time_ms`` 35.

    A key is the word before its value (``:`` or ``=`` between them, or only spaces); a unit
    stuck to the value joins the key (``35ms``: ``time_ms``), a scale multiplies it
    (``1.1M``: 1100000.0, see :data:`SCALES`). Words before the key belong to
    it when they start a field (after ``|``, ``,``, ``;``, a bracket or the line's start, up
    to three words: ``| Train Loss: 2.3``) or qualify it (``val``, ``grad``…); other words
    are prose (``5.2 ms loss 3`` is ``loss``). A number without a word before it is no value,
    nor one after another sign (``it / 100``, ``if it % 100``: code, not a log).

    >>> key_values("step 710/5000 | val loss: 3.2, time 35ms")
    [('step', '710', '5000'), ('val_loss', '3.2', None), ('time_ms', '35', None)]
    """
    found: list[tuple[str, str, str | None]] = []
    words: list[str] = []
    field_start = True  # whether the words since the last value start a field
    for token in _KV_TOKEN.finditer(line):
        if token["quote"] is not None:  # ``'step':10, 'ppl': 61.7``: quotes only wrap keys
            continue
        if token["sep"] is not None:
            if token["sep"] not in ":=":  # between a key and its value
                words, field_start = [], True
        elif token["word"] is not None:
            words.append(token["word"])
        elif token["other"] is not None:
            words, field_start = [], False
        else:
            if words:
                key = words if field_start and len(words) <= 3 else _qualified(words)
                if len(key) > 1 and key[-1].lower() == "at" and key[-2].lower() in STEP_NAMES:
                    key = key[:-1]  # ``Step at 10 with Perplexity: 61.6`` (DeepSpeed)
                if SOURCE_FILE.search(key[-1]):  # ``[engine.py:1840:step]``: a line number
                    words, field_start = [], False
                    continue
                value, unit = token["value"], token["unit"]
                if unit in SCALES:
                    value = repr(to_number(value) * SCALES[unit])
                elif unit:
                    key = [*key, "pct" if unit == "%" else unit]
                found.append(("_".join(key), value, token["total"]))
            words, field_start = [], False
    return found


def _qualified(words: list[str]) -> list[str]:
    """The last word and the qualifiers just before it."""
    key = [words[-1]]
    for word in reversed(words[:-1]):
        if word.lower() not in QUALIFIERS:
            break
        key.insert(0, word)
    return key


def key_value_record(line: str, aliases: AliasTable
                     ) -> tuple[Record | None, int | None, int | None]:
    """The record of a line of ``key value`` pairs with a named step (see
    :data:`STEP_NAMES`, or a key the alias table maps to the step), the total the step shows
    (``step 710/5000``) and the whole epoch the line names, if any. No record without a step
    and a metric: numbers in prose, a printed training script or a banner are not metrics."""
    pairs = key_values(line)
    meanings = [_key_meaning(key, aliases) for key, _, _ in pairs]
    ranked = [(rank, index) for index, (rank, _) in enumerate(meanings) if rank is not None]
    if not ranked:
        return None, None, None
    at = min(ranked)[1]
    step = to_step(pairs[at][1])
    values: dict[str, float] = {}
    for (rank, tag), (_, raw, _) in zip(meanings, pairs, strict=True):
        number = to_number(raw) if rank is None and tag not in (STEP, TIME) else None
        if number is not None:
            values[tag] = number
    if step is None or not values:
        return None, None, None
    stamp = _LEADING_STAMP.match(line)
    wall = to_wall_time(stamp["time"]) if stamp else None
    epoch = next((to_step(raw) for (_, tag), (_, raw, _) in zip(meanings, pairs, strict=True)
                  if tag.lower() == "epoch"), None)
    return Record(step, values, wall), to_step(pairs[at][2]), epoch


@dataclass
class _EpochSteps:
    """How the generic reader numbers steps that restart every epoch (``Epoch 2, Step
    10/500``). Learned when a step goes back while the epoch goes up and the step shows its
    total: from then on the step is (epoch − first epoch) × that total + the step shown. A
    step that goes back in the same epoch is a resume, as in any log."""

    first: int | None = None  # the first epoch seen
    epoch: int | None = None  # the epoch and step of the last line with an epoch
    step: int | None = None
    per_epoch: int | None = None  # steps per epoch, once learned

    def number(self, step: int, epoch: int | None, total: int | None) -> int:
        if epoch is None:
            return step
        if self.first is None:
            self.first = epoch
        if self.per_epoch is None and total and self.step is not None \
                and step < self.step and epoch > (self.epoch or 0):
            self.per_epoch = total
        self.epoch, self.step = epoch, step
        return step if self.per_epoch is None else (epoch - self.first) * self.per_epoch + step


@lru_cache(maxsize=4096)
def _key_meaning(key: str, aliases: AliasTable) -> tuple[int | None, str]:
    """What a key names: how good a step (lower is better; None for no step), and its tag.
    Cached: a log repeats its few keys on every line."""
    tag = aliases.canonical(key)
    parts = key.lower().split("_")
    last = "global_step" if key.lower() == "global_step" else parts[-1]
    # ``step``, ``micro_step``, ``train_iter``; not ``seq_per_step`` or ``start_profile_step``
    # (settings in a printed config).
    if last in STEP_NAMES and (len(parts) == 1 or parts[:-1] in (["global"], *STEP_PREFIXES)):
        return STEP_NAMES.index(last), tag
    return (len(STEP_NAMES) if tag == STEP else None), tag


@dataclass
class _FamilyState:
    """What a pattern family remembers between lines (and, in the cursor, between reads)."""

    step: int | None = None  # the step that step-less matches belong to
    count: int = 0  # matches of counting patterns so far
    stride: int | None = None  # steps between two counted matches, once known
    progress: int | None = None  # the last step a progress line showed (counting families)
    total: int | None = None
    wall: float | None = None


class TextLines:
    """A text log read through the pattern table.

    Until a family has yielded a metric, every family reads each line with its own state
    (so a step shown before the first metric is not lost); the first family to yield a
    metric is the log's format from then on, and the others are dropped. Families are tried
    in table order: the user's patterns first, then the built-ins. Lines that match nothing
    are the log's prose and are not counted as malformed.

    A log that no family recognises in a whole read, but whose lines name a step and values
    (``step 710 | loss 4.51 | lr 3e-4``, ``global_step=20 loss=3.1``), is read by the generic
    :data:`KEY_VALUE` reader (see :func:`key_value_record`) from then on. It is decided at the
    end of a read, not at its first line, so that a line a generic reader would take (a
    config dump, a printed script) never wins over a trainer's own format further down. In a
    log a family recognised, a line none of its patterns matches is read generically too
    (unless the family counts steps, whose numbering a named step would confuse): trainers
    print their own lines between the framework's (DeepSpeed's engine lines around an
    example's ``'step':10, 'ppl': 61.7``).

    Counting families (a pattern with ``counts_steps``, e.g. HF console dicts) number their
    records: step = count × interval. The interval is the ``stride`` the log states, else it
    is inferred at the end of the first group of counted records from the progress the log
    showed before them (``200/1755`` then 20 dicts: 10), else 1. A progress bar's position is
    not used as the step itself: under ``nohup`` stdout is block-buffered, so the dicts come
    in bursts long after the bar moved on, while the bar (stderr) is written at once.
    """

    def __init__(self, ctx: Context, state: dict[str, Any],
                 patterns: Sequence[LinePattern]) -> None:
        self.ctx = ctx
        self.families: dict[str, list[LinePattern]] = {}
        for pattern in patterns:
            self.families.setdefault(pattern.name, []).append(pattern)
        self.counting = {name: any(p.counts_steps for p in family)
                         for name, family in self.families.items()}
        self.family: str | None = state.get("family")
        saved = state.get("families", {})
        self.states = {name: _FamilyState(**saved.get(name, {})) for name in self.families
                       if self.family in (None, name)}
        # Records of the first counted group, numbered until the interval is known.
        self.pending: list[tuple[Record, int]] = []
        # The generic reader's records and total while no family has recognised the log.
        self.fallback: list[Record] = []
        self.fallback_total: int | None = None
        self.epochs = _EpochSteps(**state.get("epochs", {}))
        self.tags: dict[tuple[int, str], str] = {}  # (pattern, group or key) → tag, "" = drop

    @property
    def decided(self) -> str | None:
        return self.family

    def state(self) -> dict[str, Any]:
        epochs = {"epochs": asdict(self.epochs)} if self.epochs != _EpochSteps() else {}
        return {"family": self.family,
                "families": {name: asdict(s) for name, s in self.states.items()
                             if s != _FamilyState()}, **epochs}

    def close(self) -> None:
        """The end of a read: the first counted group's steps are settled now, and a log no
        family recognised is the generic reader's if it read records."""
        if self.family is None and self.fallback:
            self.family, self.states = KEY_VALUE, {}
            self.ctx.records.extend(self.fallback)
            if self.epochs.per_epoch is None:  # else it was an epoch's steps, not the run's
                self.ctx.total_steps(self.fallback_total)
        if self.family in self.states and self.pending:
            self._settle(self.states[self.family])
        self.pending, self.fallback = [], []

    def feed(self, line_no: int, text: str) -> None:
        for segment in COLOURS.sub("", text.rstrip("\n")).split("\r"):
            if not segment.strip():
                continue
            if self.family == KEY_VALUE:
                self._key_value(segment, self.ctx.records)
                continue
            if self.family is not None:
                records = self._read(self.family, segment, line_no)
                if records is None and not self.counting[self.family]:
                    # A line the family has no pattern for, in a log it recognised: read
                    # it generically (a DeepSpeed log's own ``'step':10, 'ppl': 61.7``).
                    self._key_value(segment, self.ctx.records)
                elif records:
                    self.ctx.records.extend(records)
                continue
            for name in list(self.states):
                records = self._read(name, segment, line_no)
                if records:
                    self.family = name
                    self.ctx.records.extend(records)
                    self.states = {name: self.states[name]}
                    self.ctx.total_steps(self.states[name].total)
                    self.fallback = []
                    break
            else:
                self._key_value(segment, self.fallback)

    def _key_value(self, segment: str, into: list[Record]) -> None:
        record, total, epoch = key_value_record(segment, self.ctx.aliases)
        if record is not None:
            record.step = self.epochs.number(record.step, epoch, total)
            into.append(record)
        if self.epochs.per_epoch is None and total and total > (self.fallback_total or 0):
            self.fallback_total = total
            if self.family == KEY_VALUE:
                self.ctx.total_steps(total)

    def _read(self, family: str, segment: str, line_no: int) -> list[Record] | None:
        """The records ``family``'s patterns read from ``segment``; None when none of them
        matched it (the line is not the family's)."""
        state = self.states[family]
        found: list[Record] = []
        matched = False
        for pattern in self.families[family]:
            match = pattern.compiled.search(segment)
            if match is None:
                continue
            matched = True
            record = self._apply(family, pattern, match, state, line_no)
            if record is not None:
                found.append(record)
        return found if matched else None

    def _apply(self, family: str, pattern: LinePattern, match: re.Match[str],
               state: _FamilyState, line_no: int) -> Record | None:
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        if "time" in groups:
            state.wall = to_wall_time(groups["time"])
        if "stride" in groups:
            state.stride = to_step(groups["stride"]) or state.stride
        if "total" in groups:
            total = to_step(groups["total"])
            # Never shorter: an evaluation's progress bar after training has its own total.
            if total and total > (state.total or 0):
                state.total = total
                if self.family == family:
                    self.ctx.total_steps(total)
        values: dict[str, float] = {}
        for name, raw in groups.items():
            if name not in SPECIAL_GROUPS:
                self._value(pattern, name, raw, values)
        if pattern.compiled_pairs is not None:
            for pair in pattern.compiled_pairs.finditer(match.string, match.start()):
                self._value(pattern, pair.group("key"), pair.group("value"), values)
        if "step" in groups or "epoch_step" in groups:
            step = self._step(groups, line_no)
            if step is None:
                return None
            if "time" not in groups:
                state.wall = None  # an earlier line's time is not this step's
            if self.counting[family] and not values:
                if self.pending:
                    self._settle(state)
                state.progress = step
                return None
            state.step = step
            return Record(step, values, state.wall) if values else None
        if not values:
            return None
        if pattern.counts_steps:
            state.count += 1
        record = Record(0, values, state.wall)
        if self.counting[family] and state.stride is None:
            self.pending.append((record, state.count))
        elif pattern.counts_steps:
            record.step = state.step = state.count * (state.stride or 1)
        else:
            record.step = state.step or 0
        return record

    def _settle(self, state: _FamilyState) -> None:
        """The interval from the progress shown before the first group, then its steps."""
        state.stride = max(1, round(state.progress / state.count)) \
            if state.progress and state.count else 1
        for record, index in self.pending:
            record.step = index * state.stride
        state.step = state.count * state.stride
        self.pending = []

    def _step(self, groups: dict[str, str], line_no: int) -> int | None:
        """The step a match names; None for a malformed one (counted)."""
        if "step" in groups:
            raw: Any = groups["step"]
            step = to_step(raw)
        else:
            raw = f"epoch {groups['epoch']} step {groups['epoch_step']}"
            epoch, within, per_epoch = (to_step(groups[k])
                                        for k in ("epoch", "epoch_step", "epoch_steps"))
            step = None if epoch is None or within is None or per_epoch is None \
                else epoch * per_epoch + within
        if step is None:
            self.ctx.malformed(line_no, bad_step(raw))
        return step

    def _value(self, pattern: LinePattern, key: str, raw: str, out: dict[str, float]) -> None:
        tag = self.tags.get((id(pattern), key))
        if tag is None:
            name = pattern.names.get(key, key if key in pattern.compiled.groupindex
                                     else "_".join(key.split()))
            tag = self.tags[id(pattern), key] = self.ctx.aliases.canonical(name) if name else ""
        if not tag:
            return
        number = to_number(raw)
        if number is None:
            self.ctx.batch.skipped_values += 1
            return
        out[tag] = number


# --------------------------------------------------------------------------------------------
# Documents
# --------------------------------------------------------------------------------------------
Entry = tuple[Any, Record | None]  # what is digested (the raw entry), its record if any


def read_trainer_state(data: Any, ctx: Context) -> list[Entry]:
    """HF ``trainer_state.json``: ``log_history`` entries, each with its ``step``.

    ``max_steps`` is the run's total; the run's few training arguments are its config. The
    closing summary entry (``train_runtime``, ``train_loss`` = the mean over the run) goes to
    the metadata: as a point it would overwrite the last logged loss.
    """
    if not isinstance(data, dict) or not isinstance(data.get("log_history"), list):
        ctx.malformed(1, "no 'log_history' list: not a trainer_state.json")
        return []
    ctx.total_steps(data.get("max_steps"))
    config = {k: data[k] for k in ("num_train_epochs", "train_batch_size", "logging_steps",
                                   "eval_steps", "save_steps") if data.get(k) is not None}
    if config:
        ctx.batch.meta["config"] = config
    entries: list[Entry] = []
    for number, entry in enumerate(data["log_history"], start=1):
        if isinstance(entry, dict) and "train_runtime" in entry:
            ctx.batch.meta["summary"] = entry
            continue
        if not isinstance(entry, dict):
            ctx.malformed(number, f"log_history entry {number} is not an object")
            continue
        entries.append((entry, mapping_record(ctx, entry, number)))
    return entries


def read_megatron_golden(data: Any, ctx: Context) -> list[Entry]:
    """Megatron-LM's functional-test golden values: ``{metric: {start_step, end_step,
    step_interval, values: {step: value}}}``. The test harness writes the string ``"nan"`` for
    steps past what it recorded, so those strings are gaps, not NaN losses."""
    if not isinstance(data, dict):
        ctx.malformed(1, "not a JSON object of metrics: not a Megatron golden values file")
        return []
    by_step: dict[int, dict[str, float]] = {}
    for metric, series in data.items():
        if not isinstance(series, dict) or not isinstance(series.get("values"), dict):
            ctx.malformed(1, f"metric {metric!r} has no 'values' object")
            continue
        ctx.total_steps(series.get("end_step"))
        tag = ctx.aliases.canonical(metric)
        for key, value in series["values"].items():
            step = to_step(key)
            if step is None:
                ctx.malformed(1, f"metric {metric!r}: {bad_step(key)}")
                continue
            if isinstance(value, str) and value.strip().lower() == "nan":
                continue
            number = to_number(value)
            if number is None:
                ctx.batch.skipped_values += 1
                continue
            by_step.setdefault(step, {})[tag] = number
    return [((step, values), Record(step, values)) for step, values in sorted(by_step.items())]


def read_document(reader: Callable[[Any, Context], list[Entry]], raw: bytes, ctx: Context,
                  cursor: dict[str, Any]) -> dict[str, Any]:
    """Parse a whole document and keep only the records past what ``cursor`` says was read.

    The cursor holds how many entries were read and a digest of them (every
    :data:`DIGEST_BLOCK` entries and in all). A document that grew has the same digest over
    the entries read: only the entries after them are new. A document rewritten from an
    earlier step (a resumed run: its log history is the checkpoint's, plus new entries) is
    read again from the last block that still matches: those entries have lower steps than
    the ones already stored, so the store records them as a new attempt. Returns the cursor.
    """
    try:
        data = json.loads(raw.decode("utf-8-sig", errors="replace"))
        entries = reader(data, ctx)
        digests = [hashlib.sha1(json.dumps(entry, sort_keys=True, default=str).encode())
                   .digest() for entry, _ in entries]
    except json.JSONDecodeError as exc:
        ctx.malformed(1, f"not valid JSON ({exc.msg} at line {exc.lineno}); it is being "
                         f"written or was truncated, and is read again when it changes")
        return {**cursor, "bad": True}
    except RecursionError:
        ctx.malformed(1, f"JSON {TOO_DEEP}; it is read again when it changes")
        return {**cursor, "bad": True}
    chain = hashlib.sha1()
    blocks: list[str] = []
    prefixes: dict[int, str] = {0: chain.hexdigest()[:16]}
    count = cursor.get("count", 0)
    for index, digest in enumerate(digests, start=1):
        chain.update(digest)
        if index % DIGEST_BLOCK == 0:
            blocks.append(chain.hexdigest()[:16])
        if index in (count, len(digests)):
            prefixes[index] = chain.hexdigest()[:16]
    start = count
    if count and prefixes.get(count) != cursor.get("digest"):
        matching = 0
        for mine, theirs in zip(blocks, cursor.get("blocks", []), strict=False):
            if mine != theirs:
                break
            matching += 1
        start = matching * DIGEST_BLOCK
        step = entries[start][1].step if start < len(entries) and entries[start][1] else None
        ctx.batch.notices.append(
            f"{ctx.batch.run}: {ctx.path.name} was rewritten"
            + (f" from step {step}" if step is not None else " with fewer entries")
            + "; reading it again from there (a resumed run starts a new attempt)")
    ctx.records.extend(record for _, record in entries[start:] if record is not None)
    return {"count": len(entries), "digest": prefixes[len(digests)], "blocks": blocks}


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Format:
    """A format runwatch recognises: ``sniff(file name, first bytes as text)`` says whether a
    file is in it; a line format builds a :class:`LineParser`, a document format has a reader."""

    name: str
    sniff: Callable[[str, str], bool]
    lines: Callable[[Context, dict[str, Any], Sequence[LinePattern]], LineParser] | None = None
    document: Callable[[Any, Context], list[Entry]] | None = None


_DEFAULT_ALIASES = AliasTable()


def _first_line(head: str) -> str:
    for line in head.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _csv_rows(lines: Iterable[str]) -> list[list[str]]:
    """Lines as CSV rows; none if one is not (a field over csv's size limit)."""
    try:
        return list(csv.reader(lines))
    except csv.Error:
        return []


def _header(head: str) -> list[str]:
    line = _first_line(head)
    return [h.strip() for h in next(iter(_csv_rows([line])), [])] if line else []


def _looks_like_csv(name: str, head: str) -> bool:
    """``.csv`` files are CSV; other text is CSV when its first line is a header of names and
    the rows after it hold numbers (Keras writes ``training.log``; a text log whose first line
    has a comma, like ``2025-03-02 05:16:20,348 - INFO``, is not CSV)."""
    if name.lower().endswith(".csv"):
        return True
    lines = [line.strip() for line in head.splitlines() if line.strip()][:6]
    if len(lines) < 2:
        return False
    rows = _csv_rows(lines)
    header = rows[0] if rows else []
    if len(header) < 2 or not all(re.match(r"^\s*[A-Za-z_\"]", h) for h in header):
        return False
    data = rows[1:-1] if len(rows) > 2 else rows[1:]  # the last line may be partial
    return all(len(row) == len(header)
               and all(v.strip() == "" or to_number(v) is not None for v in row)
               for row in data)


def csv_holds_metrics(head: bytes) -> bool:
    """Whether a CSV file's first rows are mostly numbers (or empty cells): a metrics table
    rather than a manifest or a dataset. A file without complete rows yet may become one."""
    lines = head.decode("utf-8", errors="replace").removeprefix("\ufeff").splitlines()
    rows = _csv_rows(line for line in lines[1:-1] if line.strip())
    cells = [cell for row in rows for cell in row]
    numeric = sum(1 for cell in cells if cell.strip() == "" or to_number(cell) is not None)
    return not cells or numeric * 2 >= len(cells)


def _is_jsonl(name: str, head: str) -> bool:
    """``.jsonl``, or a first line that is a JSON object (with a step, for a ``.json`` file:
    a one-line ``config.json`` is not a log)."""
    if name.lower().endswith(".jsonl"):
        return True
    first = _json_object(_first_line(head))
    if first is None:
        return False
    return not name.lower().endswith(".json") \
        or any(_DEFAULT_ALIASES.canonical(k) == STEP for k in first)


def _step_columns(head: str) -> bool:
    """Whether the header names a step column (by the default aliases: sniffing only labels
    the format; the parser resolves columns with the user's aliases)."""
    return any(_DEFAULT_ALIASES.canonical(h) == STEP for h in _header(head))


FORMATS: tuple[Format, ...] = (
    Format("hf_trainer_state",
           lambda name, head: name == "trainer_state.json"
           or (head.lstrip().startswith("{") and '"log_history"' in head),
           document=read_trainer_state),
    Format("megatron_golden_json",
           lambda name, head: head.lstrip().startswith("{") and '"step_interval"' in head
           and '"values"' in head,
           document=read_megatron_golden),
    Format("llamafactory_jsonl",
           lambda name, head: _is_jsonl(name, head) and (name == "trainer_log.jsonl"
                                                         or '"current_steps"' in _first_line(head)),
           lines=lambda ctx, state, patterns: LlamaFactoryLines(ctx, state)),
    Format("jsonl", _is_jsonl, lines=lambda ctx, state, patterns: JsonLines(ctx, state)),
    Format("tensorboard_csv",
           lambda name, head: [h.lower() for h in _header(head)] == ["wall time", "step", "value"],
           lines=lambda ctx, state, patterns: CsvRows(ctx, state)),
    Format("wandb_csv",
           lambda name, head: _looks_like_csv(name, head) and _step_columns(head)
           and any(" - " in h for h in _header(head)),
           lines=lambda ctx, state, patterns: CsvRows(ctx, state)),
    Format("lightning_csv",
           lambda name, head: _looks_like_csv(name, head)
           and {"epoch", "step"} <= set(_header(head)),
           lines=lambda ctx, state, patterns: CsvRows(ctx, state)),
    Format("keras_csv",
           lambda name, head: _looks_like_csv(name, head) and _header(head)[:1] == ["epoch"]
           and not _step_columns(head),
           lines=lambda ctx, state, patterns: CsvRows(ctx, state)),
    Format("csv", _looks_like_csv, lines=lambda ctx, state, patterns: CsvRows(ctx, state)),
    Format("text", lambda name, head: not name.lower().endswith(".json"),
           lines=lambda ctx, state, patterns: TextLines(ctx, state, patterns)),
)
FORMATS_BY_NAME = {f.name: f for f in FORMATS}


# Bytes that text holds only by accident (not tab, newlines, form feed or ESC); NUL is apart.
CONTROL_BYTES = bytes(b for b in range(32) if b not in b"\x00\t\n\r\x0c\x1b") + b"\x7f"


def is_binary(head: bytes) -> bool:
    """Whether a file that starts with ``head`` is binary data (event files, Parquet, a
    model) rather than text. NULs alone do not make it binary: a log cut by a crash or
    preallocated is padded with them, and the text around them is still read."""
    text = head.replace(b"\x00", b"")
    return len(text) - len(text.translate(None, CONTROL_BYTES)) > len(text) // 20


def sniff(name: str, head: bytes) -> Format | None:
    """The format of a file called ``name`` that starts with ``head``; None when runwatch cannot
    read it (binary data, or a ``.json`` file that is neither a trainer state nor golden values)."""
    if is_binary(head):
        return None
    text = head.replace(b"\x00", b"").decode("utf-8", errors="replace").removeprefix("\ufeff")
    return next((f for f in FORMATS if f.sniff(name, text)), None)


def unsupported(path: PurePath | str, why: str) -> str:
    """The one line for a file runwatch cannot read: what it is, what was tried, what to do."""
    families = sorted({p.name for p in BUILTIN_PATTERNS})
    return (f"{path}: unsupported log format ({why}); runwatch tried JSON lines, CSV with a "
            f"header, HF trainer_state.json, Megatron golden values, the text logs of "
            f"{', '.join(families)} and 'key value' lines with a step "
            f"({', '.join(STEP_NAMES)}); for a text log, add a [[patterns]] entry to "
            f"runwatch.toml: a name and a regex with a (?P<step>\\d+) group and one group per "
            f"metric, e.g. regex = '^it=(?P<step>\\d+) ce=(?P<ce>\\S+)' (see README)")


def text_family(head: bytes, patterns: Sequence[LinePattern]) -> str | None:
    """The pattern family that recognises a text log from its first bytes, if one does
    (:data:`KEY_VALUE` when only the generic reader does)."""
    ctx = Context(AliasTable(), PurePath("."), Batch(run="", cursor={}))
    parser = TextLines(ctx, {}, patterns)
    for line_no, line in enumerate(head.decode("utf-8", errors="replace").split("\n"), 1):
        parser.feed(line_no, line)
        if parser.decided:
            return parser.decided
    parser.close()
    return parser.decided


# --------------------------------------------------------------------------------------------
# Records → points
# --------------------------------------------------------------------------------------------
@dataclass
class Assembled:
    rows: list[tuple[int, str, float, float | None]]
    top: int | None
    recent: dict[int, dict[str, float]]
    duplicates: int = 0


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def assemble(records: Iterable[Record], top: int | None,
             recent: dict[int, dict[str, float]]) -> Assembled:
    """Records (in logged order) → points, applying the rules for steps that go back.

    * The same (step, tag) twice: the last value wins.
    * A record for a step lower than the highest one read so far is
      - a *duplicate* when its values are already known for that step (a second writer, or
        the same line printed twice): dropped, counted;
      - *interleaved* when every tag it holds is past that tag's own last step (a log
        with two step counters: DeepSpeed's optimizer steps beside an example's own
        ``'step':20, 'ppl': …``): sorted into place;
      - *out of order* when the next record goes past the highest step again (unsorted
        lines): sorted into place;
      - otherwise a *rewind*: the run went back and continues from there (a resume from a
        checkpoint). Its points stay after the earlier ones, so the store starts a new
        attempt with them.

    ``top`` and ``recent`` (the last steps' values) come from the previous read's cursor.
    """
    listed = list(records)
    segments: list[dict[int, dict[str, tuple[float, float | None]]]] = [{}]
    known = {step: dict(values) for step, values in recent.items()}
    last: dict[str, int] = {}  # each tag's highest step in the current segment
    for step in sorted(known):
        last.update(dict.fromkeys(known[step], step))
    duplicates = 0
    for index, record in enumerate(listed):
        if top is not None and record.step < top:
            seen = known.get(record.step, {})
            if record.values and all(tag in seen and _same(seen[tag], value)
                                     for tag, value in record.values.items()):
                duplicates += 1
                continue
            following = listed[index + 1].step if index + 1 < len(listed) else None
            interleaved = all(record.step > last.get(tag, -1) for tag in record.values)
            if not interleaved and (following is None or following <= top):
                segments.append({})
                top, last = record.step, {}
        top = record.step if top is None else max(top, record.step)
        for tag in record.values:
            last[tag] = max(last.get(tag, record.step), record.step)
        slot = segments[-1].setdefault(record.step, {})
        for tag, value in record.values.items():
            slot[tag] = (value, record.wall)
        known.setdefault(record.step, {}).update(record.values)
    rows = [(step, tag, value, wall)
            for segment in segments for step in sorted(segment)
            for tag, (value, wall) in segment[step].items()]
    kept = sorted(known)[-RECENT_STEPS:]
    return Assembled(rows, top, {step: known[step] for step in kept}, duplicates)
