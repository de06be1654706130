"""Versions per run and change events: captured by the training-side helpers at start, in a
real git repository, with real data and weight files, and a real HF Trainer resumed with a new
learning rate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bot.services.changes import variable
from connectors.training import versions
from connectors.training.hf_callback import RunwatchCallback
from connectors.training.torchloop import RunLogger
from tests.connectors.test_callbacks import records, train_hf


def _git_repo(path: Path) -> str:
    path.mkdir()
    (path / "train.py").write_text("print('train')\n")
    for argv in (["init", "-q"], ["add", "train.py"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first"]):
        subprocess.run(["git", "-C", str(path), *argv], check=True)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_run_logger_records_data_model_code_and_environment(tmp_path, monkeypatch):
    commit = _git_repo(tmp_path / "repo")
    monkeypatch.chdir(tmp_path / "repo")
    monkeypatch.setenv("RUNWATCH_IMAGE_DIGEST", "sha256:abc123")
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a"}\n')
    model_dir = tmp_path / "base"
    model_dir.mkdir()
    (model_dir / "model.safetensors").write_bytes(b"\x00" * 1000)
    with RunLogger(tmp_path / "run", config={"lr": 3e-4}, data=data, model=model_dir):
        pass
    meta = records(tmp_path / "run")[0]["meta"]
    got = meta["versions"]
    assert got["code"] == {"dir": str(tmp_path / "repo"), "commit": commit, "dirty": False}
    assert got["data"]["train"]["files"] == [
        {"path": str(data), "size": 14, "xxh3": versions.file_record(data)["xxh3"]}]
    assert got["model"]["weights"][0]["path"] == "model.safetensors"
    assert got["model"]["weights"][0]["size"] == 1000
    env = got["environment"]
    assert env["torch"].startswith("2.") and env["image"] == "sha256:abc123"
    assert env["packages"]["torch"] == env["torch"]  # from the dist-info folder name
    assert len(env["packages_hash"]) == 16 and env["packages_count"] > 20
    assert meta["changes"] == []

    (tmp_path / "repo" / "train.py").write_text("print('changed')\n")
    data.write_text('{"text": "b"}\n')
    with RunLogger(tmp_path / "run", config={"lr": 3e-4}, data=data, model=model_dir,
                   step=40):
        pass
    changes = records(tmp_path / "run")[1]["meta"]["changes"]
    assert [(c["step"], c["attempt"]) for c in changes] == [(40, 2)]
    assert set(changes[0]["changes"]) == {"code.dirty", f"data.train.files[{data}].xxh3"}
    assert changes[0]["changes"]["code.dirty"] == [False, True]


def test_the_same_config_again_is_not_a_change(tmp_path):
    for step in (None, 30):
        with RunLogger(tmp_path, config={"lr": 3e-4, "output_dir": f"/x/{step}"}, step=step):
            pass
    assert records(tmp_path)[1]["meta"]["changes"] == []


def test_versions_can_be_turned_off(tmp_path):
    with RunLogger(tmp_path, config={"lr": 1}, versions=False):
        pass
    assert set(records(tmp_path)[0]["meta"]) == {"total_steps", "config", "started_at"}
    assert not (tmp_path / versions.HISTORY_FILE).exists()


def test_under_runwatch_launch_the_scripts_record_replaces_the_launchers(tmp_path,
                                                                           monkeypatch):
    """One attempt per start: the launcher records each start from outside, and RunLogger
    inside the launched command (told which start by LAUNCH_ENV) replaces that record,
    keeping the data only the launcher was told of and the launcher's resume step."""
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a"}\n')
    outside = versions.capture(data=data)
    versions.record_attempt(tmp_path, {"command": ["python", "t.py"], "lr": 0.1}, outside,
                            None, source="launch", launch="start-1",
                            extra={"leakcheck": {"overlap_rate": 0.0}, "other": 1})
    monkeypatch.setenv(versions.LAUNCH_ENV, "start-1")
    with RunLogger(tmp_path, config={"lr": 0.1, "layers": 2}):
        pass
    [first] = json.loads((tmp_path / versions.HISTORY_FILE).read_text())["attempts"]
    assert "source" not in first and first["config"] == {"lr": 0.1, "layers": 2}
    assert first["versions"]["data"] == outside["data"]  # kept from the launcher's
    assert first["versions"]["environment"]["torch"]  # the script's own, with torch
    assert first["leakcheck"] == {"overlap_rate": 0.0} and "other" not in first
    # a rollback: the launcher compares with what it saw, not with the script's richer record
    event = versions.record_attempt(tmp_path, {"command": ["python", "t.py"], "lr": 0.1,
                                               "lr_scale": 0.5}, outside, 40,
                                    source="launch", launch="start-2")
    assert event["changes"] == {"config.lr_scale": ["missing", 0.5]}
    monkeypatch.setenv(versions.LAUNCH_ENV, "start-2")
    with RunLogger(tmp_path, config={"lr": 0.05, "layers": 2}):  # no step: the launcher's
        pass
    metas = [r["meta"] for r in records(tmp_path) if "meta" in r]
    assert [(e["step"], e["attempt"], e["changes"]) for e in metas[1]["changes"]] == [
        (40, 2, {"config.lr": [0.1, 0.05]})]
    assert len(json.loads((tmp_path / versions.HISTORY_FILE).read_text())["attempts"]) == 2
    # a restart inside the same process (the control backend) is an attempt of its own
    with RunLogger(tmp_path, config={"lr": 0.05, "layers": 2}, step=60):
        pass
    assert len(json.loads((tmp_path / versions.HISTORY_FILE).read_text())["attempts"]) == 3


def test_a_history_the_bot_reads_beside_a_log(tmp_path):
    assert versions.recorded(tmp_path) == {}
    versions.record_attempt(tmp_path, {"lr": 1}, {"code": {"commit": "a"}}, None,
                            source="launch", launch="s1")
    versions.record_attempt(tmp_path, {"lr": 2}, {"code": {"commit": "a"}}, 10,
                            source="launch", launch="s2")
    got = versions.recorded(tmp_path)
    assert got["config"] == {"lr": 2} and got["versions"] == {"code": {"commit": "a"}}
    assert [(e["step"], e["changes"]) for e in got["changes"]] == [(10, {"config.lr": [1, 2]})]
    (tmp_path / versions.HISTORY_FILE).write_text("[not json")
    assert versions.recorded(tmp_path) == {} and versions.change_events(tmp_path) == []


def test_a_datasets_dataset_is_recorded_by_its_fingerprint_and_files(tmp_path):
    """A real ``datasets.Dataset`` saved with ``save_to_disk`` and loaded back: its fingerprint
    and arrow files are the data's version, also through a DataLoader; a mapped copy is
    another version, and a resume on it is a change of the one variable ``data.train``."""
    datasets = pytest.importorskip("datasets")
    import torch.utils.data

    datasets.Dataset.from_dict({"text": ["a cat", "a dog", "a bird"]}).save_to_disk(
        str(tmp_path / "ds"))
    loaded = datasets.load_from_disk(str(tmp_path / "ds"))
    record = versions.data_record(loaded)
    assert record["type"] == "Dataset" and record["rows"] == 3
    assert record["fingerprint"] == loaded._fingerprint and len(record["fingerprint"]) >= 16
    [arrow] = record["files"]
    assert arrow["path"].startswith(str(tmp_path / "ds")) and arrow["path"].endswith(".arrow")
    assert arrow["xxh3"] == versions.file_record(arrow["path"])["xxh3"]
    assert versions.data_record(torch.utils.data.DataLoader(loaded)) == record
    upper = loaded.map(lambda row: {"text": row["text"].upper()})
    assert versions.data_record(upper)["fingerprint"] != record["fingerprint"]
    with RunLogger(tmp_path / "run", config={"lr": 1e-3}, data=loaded):
        pass
    with RunLogger(tmp_path / "run", config={"lr": 1e-3}, data=upper, step=10):
        pass
    [event] = records(tmp_path / "run")[1]["meta"]["changes"]
    assert event["changes"]["data.train.fingerprint"] == [record["fingerprint"],
                                                          upper._fingerprint]
    assert {variable(k) for k in event["changes"]} == {"data.train"}


def test_outside_git_the_commit_is_said_to_be_missing(tmp_path):
    assert versions.code_record(tmp_path) == {"dir": str(tmp_path), "commit": "missing",
                                              "why": "not a git repository"}


def test_large_files_are_hashed_by_head_and_tail(tmp_path, monkeypatch):
    monkeypatch.setattr(versions, "HASH_BYTES", 1024)
    path = tmp_path / "big.bin"
    path.write_bytes(b"a" * 5000)
    first = versions.file_record(path)
    assert first["sampled"] and first["size"] == 5000
    path.write_bytes(b"a" * 2000 + b"b" + b"a" * 2999)  # a change in the middle is not seen
    assert versions.file_record(path)["xxh3"] == first["xxh3"]
    path.write_bytes(b"a" * 4999 + b"b")
    assert versions.file_record(path)["xxh3"] != first["xxh3"]


@pytest.mark.slow
def test_hf_trainer_resumed_with_a_new_lr_is_a_change_event_at_its_step(tmp_path):
    train, eval_ = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train.write_text("".join(json.dumps({"text": f"training sentence number {i} about cats"})
                             + "\n" for i in range(200)))
    eval_.write_text(json.dumps({"text": "Training sentence number 7, about cats!"}) + "\n"
                     + json.dumps({"text": "an evaluation sentence seen nowhere else"}) + "\n")
    train_hf(tmp_path, max_steps=10, runwatch=RunwatchCallback(
        leakcheck={"train": train, "eval": eval_, "field": "text"}))
    train_hf(tmp_path, max_steps=20, learning_rate=2e-3,
             resume=str(tmp_path / "checkpoint-10"))
    metas = [r["meta"] for r in records(tmp_path) if "meta" in r]
    assert len(metas) == 2
    leak = metas[0]["leakcheck"]  # the planted duplicate, found by the callback at start
    assert (leak["eval_exact"], leak["eval_near"], leak["eval_rows"]) == (1, 0, 2)
    assert leak["overlap_rate"] == 0.5 and leak["examples"][0]["train_row"] == 7
    first = metas[0]["versions"]
    assert first["model"]["class"] == "GPT2LMHeadModel"
    assert first["data"]["train"]["type"] == "RandomTokens"
    assert first["environment"]["packages"]["transformers"]
    (event,) = metas[1]["changes"]
    assert event["step"] == 10 and event["attempt"] == 2
    assert event["changes"]["config.learning_rate"] == [1e-3, 2e-3]
    assert "config.max_steps" in event["changes"]
    history = json.loads((tmp_path / versions.HISTORY_FILE).read_text())
    assert [a["step"] for a in history["attempts"]] == [None, 10]
