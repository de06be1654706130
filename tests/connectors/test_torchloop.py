import json
import math

import numpy as np
import pytest
import torch

from connectors.training.control import ControlRequest, read_ack, write_request
from connectors.training.torchloop import (
    RunLogger,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
)


def lines(path):
    return path.read_text().splitlines(keepends=True)


def test_meta_line_then_one_complete_line_per_log(tmp_path):
    run = tmp_path / "run"
    with RunLogger(run, total_steps=10, config={"lr": 0.1}) as logger:
        logger.log(1, loss=2.5, grad_norm=torch.tensor(0.75), lr=np.float32(0.25))
        # flushed at once: a reader sees the whole line while the logger is still open
        written = lines(run / "metrics.jsonl")
        assert len(written) == 2 and all(line.endswith("\n") for line in written)
        logger.log(2, loss=2.0)
    meta, first, second = (json.loads(line) for line in lines(run / "metrics.jsonl"))
    assert "step" not in meta
    assert meta["meta"]["total_steps"] == 10 and meta["meta"]["config"] == {"lr": 0.1}
    assert isinstance(meta["meta"]["started_at"], float)
    assert first["step"] == 1 and isinstance(first["time"], float)
    assert first["loss"] == 2.5 and first["grad_norm"] == 0.75 and first["lr"] == 0.25
    assert type(first["grad_norm"]) is float and type(first["lr"]) is float
    assert second == {"step": 2, "time": second["time"], "loss": 2.0}


def test_each_line_is_a_single_write(tmp_path):
    logger = RunLogger(tmp_path)
    calls = []
    real_write = logger._file.write
    logger._file.write = lambda data: calls.append(data) or real_write(data)
    logger.log(7, loss=1.0, note="x")
    logger.close()
    assert len(calls) == 1 and calls[0].endswith(b"}\n") and calls[0].count(b"\n") == 1


def test_non_finite_values_round_trip(tmp_path):
    with RunLogger(tmp_path) as logger:
        logger.log(3, loss=float("nan"), grad_norm=torch.tensor(float("inf")),
                   eval_loss=np.float64("-inf"))
    text = lines(tmp_path / "metrics.jsonl")[-1]
    assert "NaN" in text and "Infinity" in text
    record = json.loads(text)
    assert math.isnan(record["loss"])
    assert record["grad_norm"] == math.inf and record["eval_loss"] == -math.inf


def test_reopening_appends_a_new_meta_line(tmp_path):
    with RunLogger(tmp_path, total_steps=5) as logger:
        logger.log(1, loss=1.0)
    with RunLogger(tmp_path, total_steps=5, config={"resumed": True}) as logger:
        logger.log(2, loss=0.9)
    records = [json.loads(line) for line in lines(tmp_path / "metrics.jsonl")]
    assert ["meta" in r for r in records] == [True, False, True, False]
    assert [r["step"] for r in records if "step" in r] == [1, 2]


def test_time_is_not_a_metric_name(tmp_path):
    with RunLogger(tmp_path) as logger, pytest.raises(ValueError, match="time"):
        logger.log(1, time=3.0)


def test_checkpoint_saves_loads_and_logs_an_event(tmp_path):
    state = {"step": 10, "model": {"w": torch.arange(4.0)}, "rng": torch.get_rng_state(),
             "config": {"lr": 3e-3, "name": "demo", "skip": None}}
    with RunLogger(tmp_path) as logger:
        folder = logger.checkpoint(10, state)
    assert folder == tmp_path / "checkpoint-10" and (folder / "state.pt").is_file()
    assert not list(tmp_path.glob(".tmp*"))  # no half-written checkpoint left behind
    for path in (folder, folder / "state.pt"):
        loaded = load_checkpoint(path)
        assert torch.equal(loaded["model"]["w"], state["model"]["w"])
        assert loaded["config"] == state["config"] and loaded["step"] == 10
    event = json.loads(lines(tmp_path / "metrics.jsonl")[-1])
    assert event["step"] == 10 and event["event"] == "checkpoint"
    assert event["path"] == "checkpoint-10"


def test_only_complete_checkpoint_folders_are_listed(tmp_path):
    with RunLogger(tmp_path) as logger:
        for step in (20, 5, 10):
            logger.checkpoint(step, {"step": step})
    (tmp_path / ".tmp-checkpoint-30").mkdir()
    (tmp_path / ".tmp-checkpoint-30" / "state.pt").write_bytes(b"half")
    (tmp_path / "checkpoint-40").mkdir()  # no state.pt
    (tmp_path / "checkpoint-abc").mkdir()
    (tmp_path / "checkpoint-abc" / "state.pt").write_bytes(b"")
    (tmp_path / "checkpoint-50").write_text("a file, not a folder")
    assert list_checkpoints(tmp_path) == [(5, tmp_path / "checkpoint-5"),
                                          (10, tmp_path / "checkpoint-10"),
                                          (20, tmp_path / "checkpoint-20")]
    assert latest_checkpoint(tmp_path) == (20, tmp_path / "checkpoint-20")


def test_no_checkpoint(tmp_path):
    assert list_checkpoints(tmp_path / "missing") == []
    assert latest_checkpoint(tmp_path) is None


def test_a_failed_save_leaves_no_checkpoint(tmp_path, monkeypatch):
    def broken_save(obj, fh):
        fh.write(b"partial")
        raise OSError("disk full")

    with RunLogger(tmp_path) as logger:
        logger.checkpoint(1, {"step": 1})
        monkeypatch.setattr(torch, "save", broken_save)
        with pytest.raises(OSError):
            logger.checkpoint(2, {"step": 2})
    assert (tmp_path / ".tmp-checkpoint-2").exists()
    assert not (tmp_path / "checkpoint-2").exists()
    assert latest_checkpoint(tmp_path) == (1, tmp_path / "checkpoint-1")
    events = [json.loads(line).get("event") for line in lines(tmp_path / "metrics.jsonl")]
    assert events.count("checkpoint") == 1


def test_saving_a_step_again_replaces_it_and_clears_leftovers(tmp_path):
    with RunLogger(tmp_path) as logger:
        logger.checkpoint(7, {"version": 1})
        (tmp_path / ".tmp-checkpoint-7").mkdir()  # left by a killed writer
        (tmp_path / ".tmp-checkpoint-7" / "state.pt").write_bytes(b"junk")
        logger.checkpoint(7, {"version": 2})
    assert load_checkpoint(tmp_path / "checkpoint-7") == {"version": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".runwatch-versions.json",
                                                          "checkpoint-7", "metrics.jsonl"]


def test_log_checkpoint_names_the_path_relative_to_the_run_when_inside(tmp_path):
    outside = tmp_path / "elsewhere" / "step-3.ckpt"
    with RunLogger(tmp_path / "run") as logger:
        logger.log_checkpoint(2, tmp_path / "run" / "ckpts" / "step-2.ckpt")
        logger.log_checkpoint(3, outside)
    events = [json.loads(line) for line in lines(tmp_path / "run" / "metrics.jsonl")][1:]
    assert [(e["event"], e["step"], e["path"]) for e in events] == [
        ("checkpoint", 2, "ckpts/step-2.ckpt"), ("checkpoint", 3, str(outside.resolve()))]


def test_control_request_reaches_the_loop_once_and_is_answered(tmp_path):
    with RunLogger(tmp_path) as logger:
        assert logger.control(1) is None
        write_request(tmp_path, ControlRequest(id="stop-7", action="stop"))
        request = logger.control(2)
        assert (request.id, request.action) == ("stop-7", "stop")
        assert logger.control(3) is None
        ack = logger.acknowledge(request, "done", 3, "stopped")
    assert read_ack(tmp_path) == ack and (ack.status, ack.step) == ("done", 3)
    event = json.loads(lines(tmp_path / "metrics.jsonl")[-1])
    assert event["event"] == "control" and event["control"]["id"] == "stop-7"


def test_a_hand_written_loop_rolls_back_on_request(tmp_path):
    """The loop the module docstring sketches: reload, skip the bad batches, scale the LR."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(13)]
    skip, step, acted = (0, 0), 1, []
    with RunLogger(tmp_path, total_steps=12) as logger:
        while step <= 12:
            if not skip[0] <= step <= skip[1]:
                x, y = batches[step]
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                logger.log(step, loss=loss, lr=optimizer.param_groups[0]["lr"])
            if step == 4:
                logger.checkpoint(step, {"step": step, "model": model.state_dict(),
                                         "optimizer": optimizer.state_dict()})
                write_request(tmp_path, ControlRequest(
                    id="rb", action="rollback", checkpoint=str(tmp_path / "checkpoint-4"),
                    skip_batches=(5, 6), lr_scale=0.5))
            request = logger.control(step) if step == 6 else None
            if request is not None:
                state = load_checkpoint(request.checkpoint_path(tmp_path))
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                for group in optimizer.param_groups:
                    group["lr"] *= request.lr_scale
                skip = request.skip_batches
                logger.acknowledge(request, "done", step, f"resumed from step {state['step']}")
                acted.append(step)
                step = state["step"]
            step += 1
    assert acted == [6]
    ack = read_ack(tmp_path)
    assert (ack.status, ack.step, ack.detail) == ("done", 6, "resumed from step 4")
    logged = [json.loads(line) for line in lines(tmp_path / "metrics.jsonl")]
    steps = [r["step"] for r in logged if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]  # 5, 6 once (first attempt only)
    assert {r["lr"] for r in logged if "loss" in r and r["step"] >= 7} == {0.05}
