"""Sources record what their trackers hold (issue 26 part 1): Lightning's hparams.yaml, HF's
training_args.json and the model's config.json become the run's config, read from real
files; `/run changes` and `/run compare` then see them. training_args.bin is never
unpickled."""

from __future__ import annotations

import json
import pickle

from bot.config import Config, Settings, SourceConfig
from bot.engine import Engine
from bot.services.changes import what_changed
from bot.services.compare import compare_runs
from connectors.files import HfOutputDir, LogDirectory


class _Canary:
    """Unpickling this creates the file named: proof that a pickle was (not) loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def hf_output(folder, lr: float, canary) -> None:
    checkpoint = folder / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({
        "log_history": [{"step": 5, "loss": 2.0}, {"step": 10, "loss": 1.8}],
        "max_steps": 100, "num_train_epochs": 3, "train_batch_size": 8}))
    (checkpoint / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "architectures": ["LlamaForCausalLM"],
        "id2label": {str(i): f"label {i}" for i in range(100)}}))
    (folder / "training_args.json").write_text(json.dumps({
        "learning_rate": lr, "num_train_epochs": 99, "warmup_ratio": 0.03}))
    (checkpoint / "training_args.bin").write_bytes(pickle.dumps(_Canary(str(canary))))


def test_an_hf_output_folder_records_its_training_arguments_and_model_config(tmp_path):
    canary = tmp_path / "unpickled"
    hf_output(tmp_path / "out", 3e-4, canary)
    config = HfOutputDir(tmp_path / "out", "out").read().meta["config"]
    assert config["learning_rate"] == 3e-4 and config["warmup_ratio"] == 0.03
    assert config["num_train_epochs"] == 3  # the trainer_state's own value wins
    assert config["model"]["model_type"] == "llama" and config["model"]["hidden_size"] == 64
    assert "id2label" not in config["model"]  # long label maps are left out
    assert not canary.exists()


def lightning_version(root, version: int, hparams: str) -> None:
    folder = root / "lightning_logs" / f"version_{version}"
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text(
        "epoch,step,train_loss_step\n" + "".join(f"0,{s},{2.0 - 0.01 * s}\n"
                                                  for s in range(1, 30)))
    (folder / "hparams.yaml").write_text(hparams)


def test_lightning_hparams_are_the_runs_config_in_changes_and_compare(tmp_path):
    root = tmp_path / "runs"
    lightning_version(root, 0, "lr: 0.001\nhidden: 128\nbatch_size: 32\n")
    lightning_version(root, 1, "lr: 0.002\nhidden: 256\nbatch_size: 32\n")
    settings = Settings(config=Config(sources=[SourceConfig(path=str(root))]),
                        secrets={}, config_path=None, db_path=str(tmp_path / "rw.db"))
    engine = Engine(settings)
    engine.poll(dispatch=False)
    first, second = "lightning_logs/version_0", "lightning_logs/version_1"
    comparison = compare_runs(engine.store, first, second)
    assert comparison.configs == (True, True)
    assert {c.key: (c.first, c.second) for c in comparison.changes} == {
        "lr": (0.001, 0.002), "hidden": (128, 256)}
    [change] = what_changed(engine.store, second, first).changes
    assert change.changed == {"config.lr": (0.002, 0.001), "config.hidden": (256, 128)}
    assert len(change.variables) == 2  # the one-variable warning follows from it


def test_a_tracker_file_that_cannot_be_used_is_said_and_never_built(tmp_path):
    root = tmp_path / "runs"
    canary = tmp_path / "built"
    lightning_version(root, 0, f"lr: 0.001\nmodule: !!python/object/apply:os.system "
                               f"['touch {canary}']\n")
    folder = root / "lightning_logs" / "version_0"
    (folder / "training_args.json").write_text('{"learning_rate": ')
    [reader] = LogDirectory(root).discover()
    batch = reader.read()
    assert not canary.exists()
    assert "config" not in batch.meta
    said = "\n".join(batch.notices)
    assert "hparams.yaml not read as the run's config" in said
    assert "training_args.json not read as the run's config" in said
    # with the log's next points, unchanged files are not read again; a fixed one is
    with open(folder / "metrics.csv", "a") as handle:
        handle.write("0,30,1.7\n")
    again = reader.read(batch.cursor)
    assert 30 in set(again.points["step"]) and not again.notices and "config" not in again.meta
    (folder / "hparams.yaml").write_text("lr: 0.001\n")
    with open(folder / "metrics.csv", "a") as handle:
        handle.write("0,31,1.69\n")
    assert reader.read(again.cursor).meta["config"] == {"lr": 0.001}
