"""The checkpoint registry on real files: runwatch's and HF's folders, Lightning .ckpt files."""

import json

import pytest
import torch

from connectors.checkpoints import NoCheckpoint, check, choose, discover, step_of


def runwatch_checkpoint(root, step):
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    torch.save({"step": step}, folder / "state.pt")
    return folder


def hf_checkpoint(root, step, weights=("model.safetensors",)):
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    for name in weights:
        (folder / name).write_bytes(b"weights")
    return folder


def test_complete_checkpoints_of_every_layout_are_found_in_step_order(tmp_path):
    runwatch_checkpoint(tmp_path, 200)
    hf_checkpoint(tmp_path, 100)
    ckpts = tmp_path / "lightning_logs" / "checkpoints"
    ckpts.mkdir(parents=True)
    torch.save({"global_step": 150}, ckpts / "epoch=1-step=150.ckpt")
    found = discover(tmp_path)
    assert [(c.step, c.usable) for c in found] == [(100, True), (150, True), (200, True)]


def test_incomplete_checkpoints_are_listed_with_the_reason(tmp_path):
    (tmp_path / "checkpoint-50").mkdir()  # empty: a save that never happened
    hf_checkpoint(tmp_path, 100, weights=())  # trainer state but no weights
    sharded = hf_checkpoint(tmp_path, 150, weights=("model-00001-of-00002.safetensors",))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    folder = runwatch_checkpoint(tmp_path, 200)
    data = (folder / "state.pt").read_bytes()
    (folder / "state.pt").write_bytes(data[: len(data) // 2])  # truncated copy
    problems = {c.step: c.problem for c in discover(tmp_path)}
    assert problems[50].startswith("incomplete") and "empty" in problems[50]
    assert "no model weights" in problems[100]
    assert "model-00002-of-00002.safetensors" in problems[150]
    assert "truncated" in problems[200]


def test_a_save_in_progress_is_not_a_checkpoint(tmp_path):
    runwatch_checkpoint(tmp_path, 100)
    (tmp_path / ".tmp-checkpoint-200").mkdir()
    assert [c.step for c in discover(tmp_path)] == [100]
    assert "in progress" in check(tmp_path / ".tmp-checkpoint-200")


def test_recorded_checkpoint_events_are_checked_too(tmp_path):
    runwatch_checkpoint(tmp_path, 100)
    found = discover(tmp_path, [(100, "checkpoint-100"), (300, str(tmp_path / "gone.ckpt"))])
    assert [(c.step, c.usable) for c in found] == [(100, True), (300, False)]
    assert found[1].problem.startswith("missing")


def test_choose_never_crosses_the_onset_and_skips_broken_ones(tmp_path):
    for step in (100, 200, 300):
        runwatch_checkpoint(tmp_path, step)
    (tmp_path / "checkpoint-250").mkdir()
    found = discover(tmp_path)
    assert choose(found, onset=300).step == 200  # 250 is broken, 300 is the onset
    assert choose(found, onset=202).step == 200
    assert choose(found, onset=201).step == 100  # 200 may hold the update that broke it
    assert choose(found, onset=201, margin=0).step == 200
    assert choose(found).step == 300
    with pytest.raises(NoCheckpoint, match="no usable checkpoint before the onset at step 101"):
        choose(found, onset=101)
    with pytest.raises(NoCheckpoint, match="step 300 is not at least 2 steps before the onset "
                                           "at step 250"):
        choose(found, onset=250, step=300)
    with pytest.raises(NoCheckpoint, match="no checkpoint at step 150; usable checkpoints: "
                                           "100, 200, 300"):
        choose(found, step=150)
    with pytest.raises(NoCheckpoint, match="cannot be used: incomplete"):
        choose(found, step=250)


def test_step_of_reads_both_naming_schemes():
    assert step_of("run/checkpoint-1500") == 1500
    assert step_of("ckpts/epoch=3-step=1200.ckpt") == 1200
    assert step_of("ckpts/last.ckpt") is None


def test_without_a_run_directory_only_recorded_checkpoints_count(tmp_path):
    artifacts = tmp_path / "mlruns" / "0" / "abc" / "artifacts"
    runwatch_checkpoint(artifacts, 40)
    found = discover(None, [(40, str(artifacts / "checkpoint-40")), (80, "checkpoint-80")])
    assert [(c.step, c.usable) for c in found] == [(40, True), (80, False)]
