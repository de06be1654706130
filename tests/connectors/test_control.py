import json
import logging
import os
import time

import pytest

from connectors.training import control
from connectors.training.control import (
    ACK_FILE,
    REQUEST_FILE,
    ControlAck,
    ControlBusy,
    ControlChannel,
    ControlError,
    ControlRequest,
    read_ack,
    read_request,
    resolve_checkpoint,
    write_request,
)
from connectors.training.torchloop import RunLogger


def rollback(**fields):
    return ControlRequest(**{"id": "rb-1", "action": "rollback", "checkpoint": "checkpoint-10",
                             **fields})


def write_raw(run_dir, data):
    (run_dir / REQUEST_FILE).write_text(json.dumps(data))


def test_request_round_trips_with_the_checkpoint_relative_to_the_run(tmp_path):
    (tmp_path / "checkpoint-10").mkdir()
    request = rollback(checkpoint=str(tmp_path / "checkpoint-10"), skip_batches=[12, 20],
                       lr_scale=0.9, requested_at=1718000000)
    path = write_request(tmp_path, request)
    assert path == tmp_path / REQUEST_FILE
    assert json.loads(path.read_text()) == {
        "id": "rb-1", "action": "rollback", "checkpoint": "checkpoint-10",
        "skip_batches": [12, 20], "lr_scale": 0.9, "requested_at": 1718000000.0}
    read = read_request(tmp_path)
    assert read.skip_batches == (12, 20) and read.checkpoint == "checkpoint-10"
    assert read.checkpoint_path(tmp_path) == (tmp_path / "checkpoint-10").resolve()
    stop = ControlRequest(id="s", action="stop", requested_at=5)
    assert stop.to_json() == {"id": "s", "action": "stop", "requested_at": 5.0}


def test_write_is_atomic_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    write_request(tmp_path, ControlRequest(id="first", action="stop"))
    before = (tmp_path / REQUEST_FILE).read_bytes()
    inode = os.stat(tmp_path / REQUEST_FILE).st_ino
    (tmp_path / ACK_FILE).write_text(json.dumps(ControlAck("first", "stop", "done", 1).to_json()))

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(control.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_request(tmp_path, ControlRequest(id="second", action="stop"))
    assert (tmp_path / REQUEST_FILE).read_bytes() == before  # the old request, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [ACK_FILE, REQUEST_FILE]
    monkeypatch.undo()
    write_request(tmp_path, ControlRequest(id="second", action="stop"))
    assert os.stat(tmp_path / REQUEST_FILE).st_ino != inode  # renamed into place
    assert read_request(tmp_path).id == "second"


@pytest.mark.parametrize(("fields", "message"), [
    ({"checkpoint": "../other-run/checkpoint-10"}, "not inside the run directory"),
    ({"checkpoint": "/etc"}, "not inside the run directory"),
    ({"checkpoint": "."}, "not inside the run directory"),
    ({"checkpoint": "escape/checkpoint-1"}, "not inside the run directory"),
])
def test_checkpoint_outside_the_run_dir_is_refused(tmp_path, fields, message):
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "outside").mkdir()
    (run / "escape").symlink_to(tmp_path / "outside")
    with pytest.raises(ControlError, match=message):
        write_request(run, rollback(**fields))
    assert not (run / REQUEST_FILE).exists()


@pytest.mark.parametrize(("fields", "message"), [
    ({"skip_batches": [3.0, 5]}, r"skip_batches must be two integers \[first, last\]"),
    ({"skip_batches": ["3", "5"]}, "skip_batches must be two integers"),
    ({"skip_batches": [True, 5]}, "skip_batches must be two integers"),
    ({"skip_batches": [9, 5]}, "0 <= first <= last"),
    ({"skip_batches": [-1, 5]}, "0 <= first <= last"),
    ({"skip_batches": [1, 2, 3]}, "skip_batches must be two integers"),
    ({"lr_scale": 0}, "0 < lr_scale <= 1"),
    ({"lr_scale": 1.5}, "0 < lr_scale <= 1"),
    ({"lr_scale": float("nan")}, "lr_scale must be a number"),
    ({"lr_scale": True}, "lr_scale must be a number"),
    ({"checkpoint": None}, "a rollback needs a checkpoint"),
    ({"checkpoint": 10}, "a rollback needs a checkpoint"),
    ({"action": "restart"}, "action must be one of stop, rollback"),
    ({"action": "stop"}, "checkpoint only apply to a rollback"),
    ({"id": ""}, "id must be"),
    ({"id": "$(rm -rf /)"}, "id must be"),
    ({"requested_at": float("inf")}, "requested_at must be a Unix time"),
])
def test_invalid_fields_give_clear_messages(fields, message):
    with pytest.raises(ControlError, match=message):
        rollback(**fields)


@pytest.mark.parametrize(("data", "message"), [
    ({"id": "x", "action": "stop", "requested_at": 1, "command": "rm"},
     "unknown field.*'command'.*upgrade runwatch"),
    ({"id": "x", "action": "stop"}, "missing field.*requested_at"),
    (["stop"], "must be a JSON object"),
])
def test_request_files_are_parsed_strictly(data, message):
    with pytest.raises(ControlError, match=message):
        ControlRequest.from_json(data)


def test_write_request_needs_an_existing_run_dir(tmp_path):
    with pytest.raises(ControlError, match="does not exist"):
        write_request(tmp_path / "nope", ControlRequest(id="s", action="stop"))


def test_a_pending_request_is_not_replaced_by_accident(tmp_path):
    write_request(tmp_path, ControlRequest(id="first", action="stop"))
    mtime = os.stat(tmp_path / REQUEST_FILE).st_mtime_ns
    write_request(tmp_path, ControlRequest(id="first", action="stop"))  # a retry: no-op
    assert os.stat(tmp_path / REQUEST_FILE).st_mtime_ns == mtime
    with pytest.raises(ControlBusy, match="'first' \\(stop\\) is still waiting"):
        write_request(tmp_path, ControlRequest(id="second", action="stop"))
    write_request(tmp_path, ControlRequest(id="second", action="stop"), replace_pending=True)
    assert read_request(tmp_path).id == "second"
    ControlChannel(tmp_path).acknowledge(read_request(tmp_path), "done", 4)
    write_request(tmp_path, ControlRequest(id="third", action="stop"))  # answered: free
    assert read_request(tmp_path).id == "third"


def test_a_request_is_delivered_once_per_id(tmp_path, monkeypatch):
    channel = ControlChannel(tmp_path)
    assert channel.poll(0) is None
    write_request(tmp_path, ControlRequest(id="once", action="stop"))
    assert channel.poll(3).id == "once"
    reads = []
    real_read = control._read_json
    monkeypatch.setattr(control, "_read_json", lambda path: reads.append(path) or real_read(path))
    assert [channel.poll(step) for step in (4, 5, 6)] == [None, None, None]
    assert reads == []  # an unchanged file costs a stat, not a read
    (tmp_path / REQUEST_FILE).unlink()
    write_request(tmp_path, ControlRequest(id="once", action="stop"))  # the same id again
    reads.clear()
    assert channel.poll(7) is None and len(reads) == 1
    channel.acknowledge(read_request(tmp_path), "done", 7)
    assert ControlChannel(tmp_path).poll(8) is None  # a restarted process: already answered


def test_an_unanswered_request_reaches_a_restarted_process(tmp_path):
    write_request(tmp_path, ControlRequest(id="lost", action="stop"))
    assert ControlChannel(tmp_path).poll(1).id == "lost"  # delivered, never acknowledged
    assert ControlChannel(tmp_path).poll(1).id == "lost"


def test_invalid_request_with_an_id_is_refused_with_the_reason(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with RunLogger(run) as logger:
        write_raw(run, {"id": "bad", "action": "rollback", "checkpoint": "../../etc",
                        "requested_at": time.time()})
        assert logger.control(12) is None
    ack = read_ack(run)
    assert (ack.id, ack.action, ack.status, ack.step) == ("bad", "rollback", "refused", 12)
    assert ack.detail.startswith("invalid request: checkpoint '../../etc' is not inside")
    event = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert event["event"] == "control" and event["step"] == 12
    assert event["control"] == {"id": "bad", "action": "rollback", "status": "refused",
                                "detail": ack.detail}


def test_unreadable_request_is_reported_in_the_training_log(tmp_path, caplog):
    channel = ControlChannel(tmp_path)
    (tmp_path / REQUEST_FILE).write_text('{"id": "half')
    with caplog.at_level(logging.WARNING, logger="connectors.training.control"):
        assert channel.poll(1) is None
    assert "not valid JSON" in caplog.text and read_ack(tmp_path) is None
    write_raw(tmp_path, {"id": "$bad", "action": "stop", "requested_at": time.time()})
    with caplog.at_level(logging.WARNING, logger="connectors.training.control"):
        assert channel.poll(2) is None
    assert "id must be" in caplog.text and read_ack(tmp_path) is None
    (tmp_path / REQUEST_FILE).write_bytes(b" " * (control.MAX_FILE_BYTES + 1))
    with caplog.at_level(logging.WARNING, logger="connectors.training.control"):
        assert channel.poll(3) is None
    assert "larger than" in caplog.text


def test_an_old_request_is_refused_as_expired(tmp_path):
    write_request(tmp_path, ControlRequest(id="old", action="stop",
                                           requested_at=time.time() - 7200))
    assert ControlChannel(tmp_path, max_age_s=3600).poll(40) is None
    ack = read_ack(tmp_path)
    assert ack.status == "refused" and ack.step == 40 and ack.detail.startswith("expired")
    write_request(tmp_path, ControlRequest(id="old2", action="stop",
                                           requested_at=time.time() - 7200))
    assert ControlChannel(tmp_path, max_age_s=None).poll(41).id == "old2"


def test_acknowledgements_are_validated(tmp_path):
    channel = ControlChannel(tmp_path)
    request = ControlRequest(id="s", action="stop")
    with pytest.raises(ControlError, match="status must be one of done, refused, failed"):
        channel.acknowledge(request, "ok", 1)
    with pytest.raises(ControlError, match="step must be a non-negative integer"):
        channel.acknowledge(request, "done", 1.5)
    assert read_ack(tmp_path) is None
    ack = channel.acknowledge(request, "failed", 3, "x" * 5000)
    assert len(ack.detail) == control.MAX_DETAIL_CHARS and read_ack(tmp_path) == ack
    (tmp_path / ACK_FILE).write_text('{"id": "s"}')
    with pytest.raises(ControlError, match="exactly the fields"):
        read_ack(tmp_path)


def test_bad_channel_configuration_raises():
    with pytest.raises(ValueError, match="max_age_s"):
        ControlChannel(".", max_age_s=0)


def test_resolve_checkpoint_refuses_unusable_paths(tmp_path):
    with pytest.raises(ControlError, match="not a usable path"):
        resolve_checkpoint(tmp_path, "checkpoint-\x00")
