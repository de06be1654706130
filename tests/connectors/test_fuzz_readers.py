"""Every file reader and format detector, fed what a stranger or a crashing trainer can leave
in a watched folder: arbitrary bytes, truncated logs, huge lines, deep nesting, UTF-16,
latin-1, NUL bytes. A read returns points and counted errors and never raises; a read that
finds nothing new changes nothing; one huge line costs little memory."""

import json
import struct
import tracemalloc
import zlib
from pathlib import Path
from unittest import mock

import google_crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzers.base import METRIC_COLUMNS
from connectors import files
from connectors.aliases import AliasTable
from connectors.base import Batch
from connectors.files import MAX_LINE_BYTES, HfOutputDir, LogDirectory, LogFile, open_source
from connectors.formats import (
    BUILTIN_PATTERNS,
    KEY_VALUE,
    csv_holds_metrics,
    key_value_record,
    sniff,
    text_family,
)
from connectors.generations import read_generations
from connectors.tensorboard import EventFolder
from connectors.wandb import BLOCK_LEN, FILE_HEADER, FULL, TYPE_CRC, LocalRun

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
# Names that pick each format: by suffix, by a known file name, or by content alone.
NAMES = ["x.jsonl", "metrics.csv", "train.log", "out.txt", "trainer_state.json", "golden.json",
         "trainer_log.jsonl", "run-exp1-tag-loss.csv"]
ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32", "latin-1", "cp1252"]

_number = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.sampled_from(["nan", "inf", "1,234", "2.5E-01", "", "abc"]))
_json_line = st.fixed_dictionaries(
    {}, optional={"step": _number, "global_step": _number, "loss": _number, "lr": _number,
                  "event": st.just("checkpoint"), "meta": st.one_of(st.just({}), _number),
                  "time": _number}).map(lambda d: json.dumps(d))
_csv_line = st.lists(st.one_of(_number.map(str), st.text(max_size=6)), max_size=5).map(
    lambda cells: ",".join(cells))
_text_line = st.sampled_from([
    "iter {n}: loss {v}, time 5.0ms", "step {n}/100 | train loss {v} | norm 1.0 |",
    " 10%|#| {n}/100 [00:01<00:10]", "{{'loss': {v}, 'epoch': 0.1}}",
    "iteration {n}/ 100 | lm loss: {v} |", "Epoch 0 | Step {n}/9 | Loss: {v} |",
    "step {n} | loss {v} | tok/s {v}", "global_step={n} loss={v}", "\x1b[32mit {n}\x1b[0m: {v}",
    "val loss: {v}, step {n}/{n}"]).flatmap(
    lambda shape: st.tuples(st.integers(-5, 2**64), _number).map(
        lambda nv: shape.format(n=nv[0], v=nv[1])))
_nested = st.integers(1, 50_000).map(lambda depth: "[" * depth + "]" * (depth % 3))
_line = st.one_of(_json_line, _csv_line, _text_line, _nested, st.text(max_size=40),
                  st.just("wall time,step,value"), st.just("epoch,step,loss"))


@st.composite
def log_bytes(draw):
    """A plausible log, then damaged: encoded oddly, cut anywhere, NULs or bytes spliced in."""
    lines = draw(st.lists(_line, max_size=12))
    newline = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    text = newline.join(lines) + draw(st.sampled_from(["", newline]))
    data = text.encode(draw(st.sampled_from(ENCODINGS)), errors="replace")
    data = data[: draw(st.integers(0, len(data)))]  # truncated mid-write
    if draw(st.booleans()):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(max_size=40)) + data[at:]
    return data


ANY_BYTES = st.one_of(st.binary(max_size=600), log_bytes())


def check(batch: Batch) -> None:
    """What the engine relies on: a frame of the contract's columns with integer steps, and
    counts and a cursor the store can keep."""
    assert isinstance(batch, Batch)
    assert list(batch.points.columns) == METRIC_COLUMNS
    assert all(isinstance(s, int) or float(s).is_integer() for s in batch.points["step"])
    assert all(isinstance(n, int) and isinstance(why, str) for n, why in batch.malformed)
    json.dumps(batch.cursor)
    json.dumps(batch.meta, default=str)


def fresh(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture
def short_lines():
    """Lines over 256 bytes count as huge, so examples reach that path cheaply."""
    with mock.patch.object(files, "MAX_LINE_BYTES", 256):
        yield


@pytest.mark.usefixtures("short_lines")
@FUZZ
@given(name=st.sampled_from(NAMES), first=ANY_BYTES, more=ANY_BYTES)
def test_a_log_file_reads_anything_incrementally_without_raising(tmp_path_factory, name,
                                                                  first, more):
    path = fresh(tmp_path_factory) / name
    path.write_bytes(first)
    reader = LogFile(path, "r")
    batch = reader.read()
    check(batch)
    again = reader.read(batch.cursor)  # nothing new: nothing read twice
    check(again)
    assert again.points.empty and again.cursor == batch.cursor
    with open(path, "ab") as handle:
        handle.write(more)
    check(reader.read(batch.cursor))
    check(reader.read(batch.cursor, final=True))


@pytest.mark.usefixtures("short_lines")
@FUZZ
@given(name=st.sampled_from(NAMES), data=ANY_BYTES)
def test_format_detectors_never_raise(name, data):
    fmt = sniff(name, data[: files.HEAD_BYTES])
    assert fmt is None or fmt.name
    assert text_family(data, BUILTIN_PATTERNS) in (None, KEY_VALUE,
                                                   *{p.name for p in BUILTIN_PATTERNS})
    assert csv_holds_metrics(data) in (True, False)


@pytest.mark.usefixtures("short_lines")
@FUZZ
@given(contents=st.dictionaries(st.sampled_from(NAMES + ["a/metrics.jsonl", "b/train.log",
                                                         "c/trainer_state.json"]),
                                ANY_BYTES, max_size=5))
def test_a_watched_folder_of_anything_is_discovered_and_read(tmp_path_factory, contents):
    root = fresh(tmp_path_factory)
    for rel, data in contents.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        try:
            open_source(root / rel)  # refusing a file that is no log is its contract
        except ValueError as exc:
            assert "unsupported log format" in str(exc)
    for reader in LogDirectory(root).discover():
        check(reader.read())
    if (root / "c").is_dir():
        check(HfOutputDir(root / "c", "c").read())


@FUZZ
@given(line=st.one_of(st.text(max_size=200), _text_line,
                      st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_the_generic_reader_takes_any_line(line):
    """A line of anything gives a record with a step SQLite stores, or none; never raises."""
    record, total, epoch = key_value_record(line, AliasTable())
    assert total is None or (isinstance(total, int) and total >= 0)
    assert epoch is None or (isinstance(epoch, int) and epoch >= 0)
    if record is not None:
        assert isinstance(record.step, int) and 0 <= record.step < 2**63
        assert record.values and all(isinstance(v, float) for v in record.values.values())


def tfrecord(payload: bytes) -> bytes:
    def masked(data):
        value = google_crc32c.value(data)
        return ((((value >> 15) | (value << 17)) + 0xA282EAD8) & 0xFFFFFFFF).to_bytes(4, "little")

    header = struct.pack("<Q", len(payload))
    return header + masked(header) + payload + masked(payload)


def wandb_chunk(payload: bytes) -> bytes:
    return (struct.pack("<IHB", zlib.crc32(payload, TYPE_CRC[FULL]), len(payload), FULL)
            + payload)


@pytest.mark.usefixtures("short_lines")
@FUZZ
@given(raw=st.binary(max_size=600), payloads=st.lists(st.binary(max_size=80), max_size=6),
       cut=st.integers(0, 2000))
def test_tensorboard_event_files_of_anything(tmp_path_factory, raw, payloads, cut):
    folder = fresh(tmp_path_factory)
    framed = b"".join(tfrecord(p) for p in payloads)
    (folder / "events.out.tfevents.1.a").write_bytes(raw)
    (folder / "events.out.tfevents.2.b").write_bytes(framed[:cut] + raw[:cut % 7])
    reader = EventFolder(folder, "r")
    batch = reader.read()
    check(batch)
    check(reader.read(batch.cursor, final=True))


@pytest.mark.usefixtures("short_lines")
@FUZZ
@given(raw=st.binary(max_size=600), payloads=st.lists(st.binary(max_size=80), max_size=6),
       header=st.booleans())
def test_wandb_transaction_logs_of_anything(tmp_path_factory, raw, payloads, header):
    folder = fresh(tmp_path_factory) / "run-20250101_000000-exp1"
    folder.mkdir()
    body = b"".join(wandb_chunk(p) for p in payloads)[: BLOCK_LEN - 100] + raw
    (folder / "run-exp1.wandb").write_bytes((FILE_HEADER if header else b"") + body)
    reader = LocalRun(folder.parent, [f"{folder.name}/run-exp1.wandb"], "exp1", "exp1")
    batch = reader.read()
    check(batch)
    check(reader.read(batch.cursor, final=True))


@pytest.mark.usefixtures("short_lines")
@FUZZ
@given(first=ANY_BYTES, more=ANY_BYTES)
def test_generations_of_anything(tmp_path_factory, first, more):
    path = fresh(tmp_path_factory) / "generations.jsonl"
    path.write_bytes(first)
    batch = read_generations(path)
    assert all(isinstance(n, int) for n, _ in batch.malformed)
    with open(path, "ab") as handle:
        handle.write(more)
    json.dumps(read_generations(path, batch.cursor, final=True).cursor)


@pytest.mark.parametrize("deep", ["[" * 100_000, '{"a":' * 100_000, "[" * 999 + "]" * 999])
def test_deep_nesting_is_a_malformed_line_or_a_document_read_again(tmp_path, deep):
    log = tmp_path / "x.jsonl"
    log.write_text(f'{{"step": 1, "loss": 2.0}}\n{deep}\n{{"step": 2, "loss": 1.0}}\n')
    batch = LogFile(log, "x").read()
    assert list(batch.points["step"]) == [1, 2]
    state = tmp_path / "trainer_state.json"
    state.write_text(f'{{"log_history": [{deep}]}}')
    check(LogFile(state, "x").read())


def test_a_csv_field_over_the_csv_modules_limit_is_a_malformed_row(tmp_path):
    """Python's csv refuses a field over 128 KiB (a line under runwatch's own limit)."""
    log = tmp_path / "metrics.csv"
    log.write_text(f"step,loss\n1,2.0\n2,{'9' * 200_000}\n3,1.0\n")
    assert sniff(log.name, log.read_bytes()[:4096]) is not None
    batch = LogFile(log, "x").read()
    assert list(batch.points["step"]) == [1, 3]
    assert batch.malformed[0][0] == 3 and "not a CSV row" in batch.malformed[0][1]
    wide_header = tmp_path / "wide.csv"
    wide_header.write_text(f"step,{'x' * 200_000}\n1,2\n")
    assert csv_holds_metrics(wide_header.read_bytes()) in (True, False)
    check(LogFile(wide_header, "y").read())


@pytest.mark.parametrize("read", [
    lambda path: LogFile(path, "x").read(),
    lambda path: read_generations(path),
], ids=["metrics", "generations"])
def test_a_50_mb_line_costs_little_memory(tmp_path, read):
    """It is counted as malformed without being kept whole: the read's peak is a small part
    of the line, and the lines around it are read."""
    path = tmp_path / "generations.jsonl"
    huge = 50 * 2**20
    with open(path, "wb") as handle:
        handle.write(b'{"step": 1, "loss": 2.0, "output": "a"}\n{"step": 2, "loss": "')
        for _ in range(huge // 2**20):
            handle.write(b"9" * 2**20)
        handle.write(b'"}\n{"step": 3, "loss": 1.0, "output": "b"}\n')
    tracemalloc.start()
    try:
        batch = read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_LINE_BYTES < huge / 10
    [(line, why)] = batch.malformed
    assert line == 2 and "52,428,8" in why and "over the" in why
    if isinstance(batch, Batch):
        assert list(batch.points["step"]) == [1, 3]
    else:
        assert list(batch.rows["step"]) == [1, 3]
