"""Train/eval leakage check (seed §3.3): which evaluation examples also sit in the training data,
word for word after normalisation or nearly (MinHash/LSH from ``datasketch``).

Owns reading one text field from JSONL, JSON, Parquet, CSV/TSV or a local ``datasets`` folder
(``save_to_disk`` arrow files, or a folder of data files), the normalisation, and the report:
overlap rate of the eval set and a few examples. The eval set is indexed (it is the small
side); the training set is streamed once, so memory does not grow with it.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import itertools
import json
import re
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

if TYPE_CHECKING:  # datasketch pulls in scipy (0.4 s): imported where a check runs
    from datasketch import MinHash

SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".json", ".parquet", ".csv", ".tsv", ".arrow")
SHINGLE = 5  # characters: short texts have too few words for word n-grams to be stable
NUM_PERM = 128
# LSH looks for candidates below the threshold asked for: its S-curve misses pairs just above
# its own threshold, and the exact Jaccard that confirms each candidate keeps precision.
LSH_MARGIN = 0.15
_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


class LeakInputError(ValueError):
    """A file or field the check cannot use; the message says what to do."""


def normalise(text: str) -> str:
    """Case, width, accents of compatibility forms, punctuation and spacing do not make a
    different example.

    >>> normalise("  The  Answer:\\tFORTY-two! ")
    'the answer forty two'
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    return _NON_WORD.sub(" ", text).strip()


def shingles(norm: str, size: int = SHINGLE, unique: bool = True) -> np.ndarray:
    """Character n-grams of a normalised text (the whole text when shorter), each packed into
    one integer (n ≤ 8 bytes, so two different n-grams never share a number); sorted and
    unique unless ``unique`` is false (MinHash does not mind repeats: a minimum is a minimum).

    >>> [int(x).to_bytes(5, "big") for x in shingles("abcdef", 5)]
    [b'abcde', b'bcdef']
    """
    data = np.frombuffer(norm.encode(), dtype=np.uint8).astype(np.uint64)
    if data.size <= size:
        packed = np.zeros(1, dtype=np.uint64)
        for byte in data:
            packed = (packed << np.uint64(8)) | byte
        return packed
    packed = np.zeros(data.size - size + 1, dtype=np.uint64)
    for offset in range(size):
        packed = (packed << np.uint64(8)) | data[offset:offset + packed.size]
    if not unique:
        return packed
    packed.sort()
    return packed[np.concatenate(([True], packed[1:] != packed[:-1]))]


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two outputs of :func:`shingles`.

    >>> jaccard(shingles("abcdef"), shingles("abcdeg"))
    0.3333333333333333
    """
    both = np.intersect1d(a, b, assume_unique=True).size
    return both / (a.size + b.size - both)


def _hash_inputs(ids: np.ndarray) -> list[int]:
    """32-bit inputs for MinHash's affine32 scheme (which mixes them again with fmix):
    Fibonacci hashing of the packed n-grams, so MinHash does not call a hash per n-gram."""
    return ((ids * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)).tolist()


# --------------------------------------------------------------------------- reading


@dataclass
class TextSource:
    """The texts of one file or folder, with the rows that had no usable text counted."""

    path: Path
    field: str
    rows: int = 0
    skipped: int = 0  # a row without the field, or whose value is not text
    malformed: int = 0  # a JSON line that does not parse
    first_problem: str | None = None

    def _skip(self, why: str, *, malformed: bool = False) -> None:
        if malformed:
            self.malformed += 1
        else:
            self.skipped += 1
        self.first_problem = self.first_problem or why

    def texts(self) -> Iterator[str]:
        files = _files(self.path)
        for path in files:
            yield from self._read(path)
        if self.rows == 0:
            raise LeakInputError(f"{self.path}: no rows with a text field {self.field!r}"
                                 + (f" ({self.first_problem})" if self.first_problem else "")
                                 + "; choose the field with --field")

    def _value(self, value: Any, where: str) -> str | None:
        if isinstance(value, str):
            self.rows += 1
            return value
        self._skip(f"{where}: {self.field!r} is {type(value).__name__}, not text"
                   if value is not None else f"{where}: no {self.field!r}")
        return None

    def _read(self, path: Path) -> Iterator[str]:
        name = path.name.lower()
        try:
            if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")) or (
                    name.endswith(".json") and not _json_array(path)):
                yield from self._json_lines(path)
            elif name.endswith(".json"):
                yield from self._json_array(path)
            elif name.endswith(".parquet"):
                yield from self._parquet(path)
            elif name.endswith((".csv", ".tsv")):
                yield from self._csv(path, "\t" if name.endswith(".tsv") else ",")
            elif name.endswith(".arrow"):
                yield from self._arrow(path)
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise LeakInputError(f"{path}: cannot be read ({exc}); check the file is "
                                 f"complete and in one of {', '.join(SUFFIXES)}") from exc

    def _json_lines(self, path: Path) -> Iterator[str]:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    self._skip(f"{path.name} line {number}: not JSON ({exc.msg})",
                               malformed=True)
                    continue
                if not isinstance(row, dict):
                    self._skip(f"{path.name} line {number}: not an object", malformed=True)
                    continue
                self._check_field_once(path, row.keys())
                text = self._value(row.get(self.field), f"{path.name} line {number}")
                if text is not None:
                    yield text

    def _json_array(self, path: Path) -> Iterator[str]:
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise LeakInputError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}); fix "
                                 f"the file or export it as JSONL") from exc
        for number, row in enumerate(rows, 1):
            if isinstance(row, dict):
                self._check_field_once(path, row.keys())
            text = self._value(row.get(self.field) if isinstance(row, dict) else None,
                               f"{path.name} item {number}")
            if text is not None:
                yield text

    def _check_field_once(self, path: Path, keys: Any) -> None:
        """The first row of a file decides whether the field exists at all: a misspelt field
        is one clear error, not a million skipped rows."""
        if self.rows or self.skipped or self.field in keys:
            return
        raise _missing_field(path, self.field, list(keys))

    def _columns(self, path: Path, names: list[str]) -> None:
        if self.field not in names:
            raise _missing_field(path, self.field, names)

    def _parquet(self, path: Path) -> Iterator[str]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            handle = pq.ParquetFile(path)
        except pa.ArrowException as exc:
            raise LeakInputError(f"{path}: not a readable Parquet file ({exc}); check it is "
                                 f"complete") from exc
        self._columns(path, handle.schema_arrow.names)
        for batch in handle.iter_batches(columns=[self.field], batch_size=65536):
            yield from self._column(batch.column(0).to_pylist(), path.name)

    def _arrow(self, path: Path) -> Iterator[str]:
        import pyarrow as pa

        try:  # `datasets.save_to_disk` writes the streaming format; others may be files
            reader = pa.ipc.open_stream(path)
        except pa.ArrowInvalid:
            try:
                reader = pa.ipc.open_file(path)
            except pa.ArrowInvalid as exc:
                raise LeakInputError(f"{path}: not an Arrow file ({exc})") from exc
        self._columns(path, reader.schema.names)
        batches = reader if isinstance(reader, pa.ipc.RecordBatchStreamReader) else (
            reader.get_batch(i) for i in range(reader.num_record_batches))
        for batch in batches:
            yield from self._column(batch.column(self.field).to_pylist(), path.name)

    def _column(self, values: list[Any], name: str) -> Iterator[str]:
        for value in values:
            text = self._value(value, f"{name} row {self.rows + self.skipped + 1}")
            if text is not None:
                yield text

    def _csv(self, path: Path, delimiter: str) -> Iterator[str]:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle, delimiter=delimiter)
            with _long_fields():
                fields = list(reader.fieldnames or [])
            self._columns(path, fields)
            for number in itertools.count(2):
                with _long_fields():  # per row: the limit is the whole process's
                    row = next(reader, None)
                if row is None:
                    return
                text = self._value(row.get(self.field), f"{path.name} line {number}")
                if text is not None:
                    yield text


@contextlib.contextmanager
def _long_fields() -> Iterator[None]:
    """Python's csv refuses a field over 128 KiB, and its limit is one for the whole process
    (runwatch's own CSV log reader relies on it): raised while a row of texts is parsed."""
    old = csv.field_size_limit(1 << 30)
    try:
        yield
    finally:
        csv.field_size_limit(old)


def _json_array(path: Path) -> bool:
    with open(path, "rb") as handle:
        return handle.read(64).lstrip()[:1] == b"["


def _missing_field(path: Path, name: str, names: list[str]) -> LeakInputError:
    shown = ", ".join(names[:12]) + (" …" if len(names) > 12 else "")
    return LeakInputError(f"{path}: no field {name!r} (fields: {shown or 'none'}); choose one "
                          f"with --field")


def _files(path: Path) -> list[Path]:
    if not path.exists():
        raise LeakInputError(f"{path}: no such file or folder; give a JSONL, Parquet or CSV "
                             f"file, or a folder saved by `datasets`")
    if path.is_file():
        if not path.name.lower().endswith(SUFFIXES):
            raise LeakInputError(f"{path}: unknown format; use one of {', '.join(SUFFIXES)}")
        return [path]
    arrow = sorted(path.glob("*.arrow"))
    if arrow and (path / "state.json").exists():  # a `datasets` save_to_disk folder
        return [path / f["filename"] for f in json.loads(
            (path / "state.json").read_text()).get("_data_files", [])] or arrow
    files = sorted(p for p in path.rglob("*") if p.is_file()
                   and p.name.lower().endswith(SUFFIXES) and p.name not in (
                       "dataset_info.json", "state.json", "dataset_dict.json"))
    if not files:
        raise LeakInputError(f"{path}: no data files in this folder (looked for "
                             f"{', '.join(SUFFIXES)}); point at the split's folder or file")
    return files


# --------------------------------------------------------------------------- the check


@dataclass
class Match:
    """One eval row found in train; rows count from 0 over the rows that hold text."""

    eval_row: int
    train_row: int
    kind: str  # "exact" (equal after normalisation) or "near" (Jaccard ≥ threshold)
    similarity: float
    eval_text: str
    train_text: str


@dataclass
class LeakReport:
    train: str
    eval: str
    field: str
    threshold: float
    train_rows: int = 0
    eval_rows: int = 0
    eval_exact: int = 0  # eval rows with an exact duplicate in train
    eval_near: int = 0  # eval rows with only a near duplicate in train
    train_rows_matched: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    complete: bool = True  # false when the time budget ran out before the end of train
    seconds: float = 0.0
    examples: list[Match] = field(default_factory=list)
    matched_rows: list[int] = field(default_factory=list)  # every eval row found in train

    @property
    def overlap_rate(self) -> float:
        return (self.eval_exact + self.eval_near) / self.eval_rows if self.eval_rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "overlap_rate": self.overlap_rate}

    def summary(self) -> str:
        scanned = "" if self.complete else f" (time budget spent after {self.train_rows:,} " \
                                            f"train rows: a lower bound)"
        return (f"{self.eval_exact + self.eval_near:,} of {self.eval_rows:,} eval rows "
                f"({self.overlap_rate:.2%}) also appear in train: {self.eval_exact:,} exact "
                f"after normalisation, {self.eval_near:,} near (Jaccard ≥ {self.threshold}) "
                f"— {self.train_rows_matched:,} of {self.train_rows:,} train rows"
                f"{scanned}")


class _EvalIndex:
    def __init__(self, texts: Iterator[str], threshold: float, num_perm: int) -> None:
        from datasketch import MinHash, MinHashLSH

        self.texts: list[str] = []
        self.shingles: list[np.ndarray] = []
        self.exact: dict[int, list[int]] = {}
        self.lsh = MinHashLSH(threshold=max(0.05, threshold - LSH_MARGIN), num_perm=num_perm)
        self.template = MinHash(num_perm=num_perm, hashfunc=int)
        for row, text in enumerate(texts):
            norm = normalise(text)
            grams = shingles(norm)
            self.texts.append(text)
            self.shingles.append(grams)
            self.exact.setdefault(xxhash.xxh64_intdigest(norm.encode()), []).append(row)
            self.lsh.insert(row, self.minhash(grams), check_duplication=False)

    def minhash(self, grams: np.ndarray) -> MinHash:
        m = self.template.copy()
        m.update_batch(_hash_inputs(grams))
        return m


def check(train: str | Path, eval: str | Path, field: str = "text", *,
          threshold: float = 0.7, num_perm: int = NUM_PERM, examples: int = 5,
          time_budget_s: float | None = None) -> LeakReport:
    """Compare every training row against the eval set.

    Eval rows equal to a training row after :func:`normalise` are *exact*; the others whose
    character 5-gram Jaccard with a training row is at least ``threshold`` are *near* (LSH
    finds candidates, the Jaccard of the real shingle sets confirms them, so the estimate's
    noise never becomes a false match). ``time_budget_s`` stops the scan of train early and
    marks the report incomplete (the callback at a training start uses it).
    """
    if not 0.0 < threshold <= 1.0:
        raise LeakInputError(f"threshold {threshold} is outside (0, 1]; 0.7 is the default")
    started = time.perf_counter()
    report = LeakReport(train=str(train), eval=str(eval), field=field, threshold=threshold)
    eval_source = TextSource(Path(eval), field)
    index = _EvalIndex(eval_source.texts(), threshold, num_perm)
    report.eval_rows = len(index.texts)
    best: dict[int, Match] = {}
    train_source = TextSource(Path(train), field)
    for train_row, text in enumerate(train_source.texts()):
        report.train_rows = train_row + 1
        if time_budget_s is not None and train_row % 1024 == 0 and \
                time.perf_counter() - started > time_budget_s:
            report.complete = False
            break
        norm = normalise(text)
        rows = index.exact.get(xxhash.xxh64_intdigest(norm.encode()))
        if rows is not None:
            report.train_rows_matched += 1
            for row in rows:
                if row not in best or best[row].kind != "exact":
                    best[row] = Match(row, train_row, "exact", 1.0, index.texts[row], text)
            continue
        grams = shingles(norm, unique=False)
        candidates = index.lsh.query(index.minhash(grams))
        matched = False
        if candidates:
            grams = shingles(norm)
        for row in candidates:
            similarity = jaccard(grams, index.shingles[row])
            if similarity < threshold:
                continue
            matched = True
            if row not in best or (best[row].kind == "near" and
                                   similarity > best[row].similarity):
                best[row] = Match(row, train_row, "near", round(similarity, 4),
                                  index.texts[row], text)
        report.train_rows_matched += matched
    report.eval_exact = sum(m.kind == "exact" for m in best.values())
    report.eval_near = len(best) - report.eval_exact
    ordered = sorted(best.values(), key=lambda m: (m.kind != "exact", -m.similarity,
                                                   m.eval_row))
    report.examples = ordered[:examples]
    report.matched_rows = sorted(best)
    report.skipped = {name: source.skipped + source.malformed
                      for name, source in (("train", train_source), ("eval", eval_source))}
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def summary(train: Any, eval: Any, field: str = "text", budget_s: float = 30.0,
            threshold: float = 0.7) -> dict[str, Any]:
    """The leakage check at a run's start (``connectors.training.leakcheck``), bounded by
    ``budget_s``, as the run's metadata keeps it: rates, counts and the first matched rows
    (no texts). A file it cannot read is recorded as the error, never raised into the training.
    The training-side helpers (``RunLogger`` and so the callbacks, ``runwatch launch``) keep
    it in the run's metadata, where the overfit alert reads it."""
    try:
        report = check(train, eval, field, threshold=threshold, examples=5,
                       time_budget_s=budget_s)
    except LeakInputError as exc:
        return {"error": str(exc)}
    return {"overlap_rate": report.overlap_rate, "eval_exact": report.eval_exact,
            "eval_near": report.eval_near, "eval_rows": report.eval_rows,
            "train_rows": report.train_rows, "complete": report.complete,
            "seconds": report.seconds, "threshold": threshold, "field": field,
            "examples": [{"eval_row": m.eval_row, "train_row": m.train_row, "kind": m.kind,
                          "similarity": m.similarity} for m in report.examples]}
