"""TensorBoard logdirs written by PyTorch's real SummaryWriter, read through the registry."""

import math
import os
import struct
import time

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util.tensor_util import make_tensor_proto
from torch.utils.tensorboard import SummaryWriter

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from connectors.base import SourceMissing
from connectors.registry import open_source
from tests.helpers import Recorder


def f32(value):
    """What a TensorBoard scalar holds: ``simple_value`` and the scalar tensor are float32."""
    return float(np.float32(value))


def points(batch, tag=None):
    frame = batch.points if tag is None else batch.points[batch.points["tag"] == tag]
    return [(int(s), t, v) for s, t, v in zip(frame["step"], frame["tag"], frame["value"],
                                              strict=True)]


def write(logdir, steps, *, loss=lambda s: 1.0 / (s + 1), writer=None, close=True):
    writer = writer or SummaryWriter(str(logdir))
    for step in steps:
        writer.add_scalar("loss", loss(step), step)
        writer.add_scalar("lr", 0.001 * step, step)
        writer.add_scalar("grad_norm", 0.5 + step, step)
    writer.flush()
    if close:
        writer.close()
    return writer


def expected(steps, loss=lambda s: 1.0 / (s + 1)):
    return [row for s in steps for row in ((s, "train/loss", f32(loss(s))),
                                           (s, "lr", f32(0.001 * s)),
                                           (s, "grad_norm", f32(0.5 + s)))]


def event_files(folder):
    return sorted(folder / n for n in os.listdir(folder) if n.startswith("events.out.tfevents."))


def record_offsets(path):
    """Where each TFRecord starts: [uint64 length][crc][data][crc]."""
    data = path.read_bytes()
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        pos += 12 + length + 4
    return offsets


def one_run(logdir):
    (reader,) = open_source(f"tb://{logdir}").discover()
    return reader


def test_scalars_are_read_exactly_with_canonical_tags_and_wall_time(tmp_path):
    logdir = tmp_path / "logs"
    started = time.time()
    writer = write(logdir / "exp1", range(5), close=False)
    writer.add_scalar("loss", float("nan"), 5)
    writer.close()
    reader = one_run(logdir)
    assert reader.run == "exp1"
    assert reader.key == f"tb:{(logdir / 'exp1').resolve()}"
    batch = reader.read()
    got = points(batch)
    assert got[:-1] == expected(range(5))
    assert got[-1][:2] == (5, "train/loss") and math.isnan(got[-1][2])
    assert batch.points["wall_time"].between(started - 1, time.time() + 1).all()
    assert batch.malformed == [] and batch.notices == []
    (name,) = [p.name for p in event_files(logdir / "exp1")]
    assert batch.cursor == {name: (logdir / "exp1" / name).stat().st_size}


def test_tensor_encoded_scalars_are_read(tmp_path):
    writer = SummaryWriter(str(tmp_path / "tf2"))
    for step in range(3):
        writer.add_scalar("eval_loss", 2.0 - step, step, new_style=True)
    writer.add_text("notes", "not a scalar", 0)
    writer.add_histogram("weights", np.arange(10.0), 0)
    writer.close()
    batch = one_run(tmp_path / "tf2").read()
    assert points(batch) == [(0, "eval/loss", 2.0), (1, "eval/loss", 1.0), (2, "eval/loss", 0.0)]


def test_bare_scalar_tensors_as_tf2_writes_after_a_tags_first_point(tmp_path):
    writer = EventFileWriter(str(tmp_path / "tf2"))
    values = [summary_pb2.Summary.Value(tag="loss", tensor=make_tensor_proto(0.25, np.float64)),
              summary_pb2.Summary.Value(tag="words", tensor=make_tensor_proto("not a number")),
              summary_pb2.Summary.Value(tag="hist", tensor=make_tensor_proto([1.0, 2.0]))]
    writer.add_event(event_pb2.Event(step=7, wall_time=1700000000.5,
                                     summary=summary_pb2.Summary(value=values)))
    writer.close()
    batch = one_run(tmp_path / "tf2").read()
    assert points(batch) == [(7, "train/loss", 0.25)]
    assert batch.points["wall_time"].tolist() == [1700000000.5]


def test_incremental_reads_return_only_new_points(tmp_path):
    logdir = tmp_path / "logs"
    writer = write(logdir / "exp1", range(3), close=False)
    reader = one_run(logdir)
    first = reader.read()
    assert points(first) == expected(range(3))
    assert points(reader.read(first.cursor)) == []
    write(logdir / "exp1", range(3, 6), writer=writer)
    second = reader.read(first.cursor)
    assert points(second) == expected(range(3, 6))
    assert points(reader.read(second.cursor)) == []


def test_runs_appearing_later_are_discovered_by_relative_path(tmp_path):
    logdir = tmp_path / "logs"
    write(logdir / "exp1", range(2))
    source = open_source(f"tb://{logdir}")
    assert [r.run for r in source.discover()] == ["exp1"]
    write(logdir / "exp2" / "train", range(2))
    (logdir / "checkpoint-5").mkdir()  # never searched for event files
    readers = source.discover()
    assert [r.run for r in readers] == ["exp1", "exp2/train"]
    assert points(readers[1].read()) == expected(range(2))


def test_writer_restart_reads_the_new_event_file_from_its_start(tmp_path):
    folder = tmp_path / "logs" / "exp1"
    write(folder, range(10))
    reader = one_run(tmp_path / "logs")
    first = reader.read()
    write(folder, range(5, 8), loss=lambda s: 9.0)  # resumed from a checkpoint at step 5
    second = reader.read(first.cursor)
    assert points(second) == expected(range(5, 8), loss=lambda s: 9.0)
    assert sorted(second.cursor) == [p.name for p in event_files(folder)]
    assert len(second.cursor) == 2


def test_more_than_10k_points_of_one_tag_are_all_kept(tmp_path):
    writer = SummaryWriter(str(tmp_path / "long"))
    for step in range(12_000):
        writer.add_scalar("loss", step * 0.5, step)
    writer.close()
    batch = one_run(tmp_path / "long").read()
    assert len(batch.points) == 12_000
    assert batch.points["step"].tolist() == list(range(12_000))
    assert batch.points["value"].tolist() == [f32(s * 0.5) for s in range(12_000)]


def test_a_record_being_written_waits_and_a_final_read_counts_it(tmp_path):
    folder = tmp_path / "exp1"
    write(folder, range(4))
    (path,) = event_files(folder)
    last = record_offsets(path)[-1]
    with open(path, "r+b") as handle:
        handle.truncate(last + 10)  # cut inside the last record (grad_norm at step 3)
    reader = one_run(folder)
    batch = reader.read()
    assert points(batch) == expected(range(4))[:-1]
    assert batch.malformed == []
    assert batch.cursor == {path.name: last}
    final = reader.read(batch.cursor, final=True)
    assert points(final) == []
    assert final.malformed == [(last, f"{path.name}: truncated or corrupt record at byte {last}: "
                                      f"the last 10 bytes are unreadable")]
    assert final.cursor == {path.name: last + 10}


def test_a_cut_file_loses_nothing_already_read(tmp_path):
    folder = tmp_path / "exp1"
    write(folder, range(4))
    (path,) = event_files(folder)
    reader = one_run(folder)
    first = reader.read()
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.truncate(size - 7)
    again = reader.read(first.cursor)
    assert points(again) == [] and again.malformed == []
    assert again.notices == [f"exp1: {path.name} shrank to {size - 7} bytes from {size} "
                             f"(truncated); points already read are kept"]
    assert points(first) == expected(range(4))


def test_a_newer_event_file_settles_the_partial_tail_of_the_older_one(tmp_path):
    folder = tmp_path / "exp1"
    write(folder, range(3))
    (old,) = event_files(folder)
    last = record_offsets(old)[-1]
    with open(old, "r+b") as handle:
        handle.truncate(last + 5)  # the writer died mid-record
    reader = one_run(folder)
    waiting = reader.read()
    assert waiting.malformed == [] and len(waiting.points) == 8
    write(folder, range(2, 4))  # restarted: a new file
    batch = reader.read(waiting.cursor)
    assert [m[1] for m in batch.malformed] == [
        f"{old.name}: truncated or corrupt record at byte {last}: the last 5 bytes are unreadable"]
    assert points(batch) == expected(range(2, 4))
    assert reader.read(batch.cursor).malformed == []


def test_corrupt_records_are_counted_and_the_rest_of_the_file_is_read(tmp_path):
    folder = tmp_path / "exp1"
    write(folder, range(4))
    (path,) = event_files(folder)
    offsets = record_offsets(path)  # [file_version, loss0, lr0, grad0, loss1, ...]
    data = bytearray(path.read_bytes())
    data[offsets[2] + 14] ^= 0xFF  # lr at step 0: its body fails the checksum
    data[offsets[7] + 3] ^= 0xFF  # loss at step 2: its length field is damaged
    path.write_bytes(bytes(data))
    batch = one_run(folder).read()
    lost = [(0, "lr", 0.0), (2, "train/loss", f32(1 / 3))]
    assert points(batch) == [row for row in expected(range(4)) if row not in lost]
    assert [m[1] for m in batch.malformed] == [
        f"{path.name}: record at byte {offsets[2]} fails its checksum; skipped",
        f"{path.name}: corrupt record header at byte {offsets[7]}; skipped "
        f"{offsets[8] - offsets[7]} bytes to the next record"]
    assert batch.cursor == {path.name: len(data)}


def test_checkpoint_folders_beside_the_event_files(tmp_path):
    folder = tmp_path / "exp1"
    write(folder, range(2))
    for step in (200, 100):
        (folder / f"checkpoint-{step}").mkdir()
    batch = one_run(folder).read()
    assert [(c.step, c.path) for c in batch.checkpoints] == [
        (100, str(folder / "checkpoint-100")), (200, str(folder / "checkpoint-200"))]


def test_hparams_become_the_run_config(tmp_path):
    writer = SummaryWriter(str(tmp_path / "logs"))
    writer.add_hparams({"lr": 0.1, "optimizer": "adam"}, {"hparam/loss": 0.5}, run_name="hp")
    writer.close()
    readers = open_source(f"tb://{tmp_path / 'logs'}").discover()
    assert [r.run for r in readers] == ["logs", "hp"]  # add_hparams writes a sub-run
    batch = readers[1].read()
    assert batch.meta == {"config": {"lr": 0.1, "optimizer": "adam"}}
    assert points(batch) == [(0, "hparam/loss", 0.5)]


def test_a_logdir_holding_event_files_is_one_run_named_after_it(tmp_path):
    write(tmp_path / "exp7", range(1))
    assert [r.run for r in open_source(f"tb://{tmp_path / 'exp7'}").discover()] == ["exp7"]
    named = open_source(f"tb://{tmp_path / 'exp7'}", run="baseline").discover()
    assert [r.run for r in named] == ["baseline"]


def test_a_named_run_appears_when_its_first_event_file_does(tmp_path):
    folder = tmp_path / "late"
    folder.mkdir()
    source = open_source(f"tb://{folder}", run="late")
    assert source.discover() == []
    write(folder, range(1))
    assert [r.run for r in source.discover()] == ["late"]


def test_user_errors_say_what_to_do(tmp_path):
    with pytest.raises(SourceMissing, match="does not exist"):
        open_source(f"tb://{tmp_path / 'nowhere'}").discover()
    with pytest.raises(ValueError, match="needs a TensorBoard logdir"):
        open_source("tb://")
    write(tmp_path / "exp1", range(1))
    (path,) = event_files(tmp_path / "exp1")
    with pytest.raises(ValueError, match=f"tb://{tmp_path / 'exp1'}"):
        open_source(f"tb://{path}")


def test_engine_watches_a_logdir_and_alerts_on_a_nan_loss(tmp_path):
    logdir = tmp_path / "tb"
    settings = Settings(config=Config(sources=[SourceConfig(path=f"tb://{logdir}")]),
                        secrets=Secrets(), config_path=None, db_path=str(tmp_path / "rw.db"))
    recorder = Recorder()
    engine = Engine(settings, notifier=recorder)
    engine.poll()  # the logdir does not exist yet: reported once, watched
    writer = SummaryWriter(str(logdir / "exp1"))
    for step in range(1, 41):
        writer.add_scalar("loss", 2.0 + 1.0 / step, step)
    writer.flush()
    report = engine.poll()
    assert report.analysed == ["exp1"] and report.ingested["exp1"].new_points == 40
    assert engine.poll().analysed == []
    writer.add_scalar("loss", float("nan"), 41)
    writer.close()
    engine.poll()
    assert [kind for kind, _, _ in recorder.sent] == ["alert"]
    assert "NaN at step 41" in recorder.sent[0][1]
