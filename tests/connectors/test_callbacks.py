"""The training-side callbacks in real training runs: a tiny HF Trainer and a tiny Lightning fit
on the CPU, each writing the log runwatch reads and obeying control requests."""

import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from connectors.files import LogFile
from connectors.training.control import ControlRequest, read_ack, write_request
from connectors.training.hf_callback import ROLLBACK_REFUSAL, RunwatchCallback
from connectors.training.hf_callback import train as hf_train

# Lightning's own use of a torch API that newer torch deprecates; nothing to do with runwatch.
pytestmark = pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)`")

VOCAB, SEQ = 64, 16
NAN_STEP = 7


class RandomTokens(Dataset):
    """Fixed random token sequences, the same for every run."""

    def __len__(self):
        return 256

    def __getitem__(self, index):
        tokens = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": tokens, "labels": tokens}


def tiny_config():
    return GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=SEQ,
                      bos_token_id=0, eos_token_id=0)


class NaNLossAtStep(GPT2LMHeadModel):
    """GPT-2 whose training loss reads NaN at one step while its gradients stay finite, so the
    run goes on and only the logged value tells."""

    nan_at_call = NAN_STEP

    def forward(self, input_ids=None, labels=None, **kwargs):
        output = super().forward(input_ids=input_ids, labels=labels, **kwargs)
        if self.training:
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == self.nan_at_call:
                output.loss = output.loss + float("nan")
        return output


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_hf(run_dir, *, model_class=GPT2LMHeadModel, callbacks=(), max_steps=20,
             in_process_rollback=False, resume=None, runwatch=None, **overrides):
    torch.manual_seed(0)
    settings = dict(
        output_dir=str(run_dir), max_steps=max_steps, logging_steps=1, save_steps=10,
        eval_strategy="steps", eval_steps=10, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, learning_rate=1e-3, report_to=[], use_cpu=True,
        disable_tqdm=True)
    args = TrainingArguments(**{**settings, **overrides})
    trainer = Trainer(model=model_class(tiny_config()), args=args, train_dataset=RandomTokens(),
                      eval_dataset=torch.utils.data.Subset(RandomTokens(), range(16)),
                      callbacks=[*callbacks, runwatch or RunwatchCallback()])
    if in_process_rollback:
        hf_train(trainer)
    else:
        trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_hf_run_logs_each_step_checkpoints_and_meta(tmp_path):
    trainer = train_hf(tmp_path)
    lines = records(tmp_path)
    meta = lines[0]["meta"]
    assert meta["total_steps"] == 20
    assert meta["config"]["logging_steps"] == 1 and meta["config"]["output_dir"] == str(tmp_path)
    train = [r for r in lines if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 21))
    assert all(math.isfinite(r[key]) for r in train for key in ("loss", "grad_norm",
                                                                 "learning_rate"))
    hf_losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    assert {r["step"]: r["loss"] for r in train} == hf_losses
    assert [r["step"] for r in lines if "eval_loss" in r] == [10, 20]
    assert not any("train_loss" in r for r in lines)  # HF's end-of-run summary stays out
    events = [r for r in lines if r.get("event") == "checkpoint"]
    assert [(e["step"], e["path"]) for e in events] == [(10, "checkpoint-10"),
                                                         (20, "checkpoint-20")]
    assert all((tmp_path / e["path"] / "model.safetensors").is_file() for e in events)

    batch = LogFile(tmp_path / "metrics.jsonl", "hf").read()
    assert {"train/loss", "lr", "grad_norm", "eval/loss"} <= set(batch.points["tag"])
    losses = batch.points[batch.points["tag"] == "train/loss"]
    assert list(losses["step"]) == list(range(1, 21))
    assert [c.step for c in batch.checkpoints] == [10, 20]
    assert batch.meta["total_steps"] == 20 and not batch.malformed


def test_hf_nan_loss_reaches_the_log_raw_while_hf_filters_it(tmp_path):
    trainer = train_hf(tmp_path, model_class=NaNLossAtStep)
    assert trainer.args.logging_nan_inf_filter  # the default, which hides the NaN from HF's log
    hf_loss = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    assert math.isfinite(hf_loss[NAN_STEP])
    ours = {r["step"]: r["loss"] for r in records(tmp_path) if "loss" in r}
    assert math.isnan(ours[NAN_STEP])
    assert all(math.isfinite(v) for step, v in ours.items() if step != NAN_STEP)
    assert {s: v for s, v in ours.items() if s != NAN_STEP} == {
        s: v for s, v in hf_loss.items() if s != NAN_STEP}

    points = LogFile(tmp_path / "metrics.jsonl", "hf").read().points
    nan_point = points[(points["tag"] == "train/loss") & (points["step"] == NAN_STEP)]
    assert math.isnan(nan_point["value"].item())


def test_hf_nan_in_a_logging_window_makes_the_window_nan(tmp_path):
    train_hf(tmp_path, model_class=NaNLossAtStep, max_steps=10, logging_steps=5)
    losses = {r["step"]: r["loss"] for r in records(tmp_path) if "loss" in r}
    assert set(losses) == {5, 10}
    assert math.isfinite(losses[5]) and math.isnan(losses[10])


class WriteRequestAt(TrainerCallback):
    """Plays the bot: writes a control request when training reaches ``step``."""

    def __init__(self, step, request):
        self.step, self.request = step, request

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            write_request(args.output_dir, self.request)


def test_hf_stop_request_stops_training_and_names_the_step(tmp_path):
    request = ControlRequest(id="stop-1", action="stop")
    trainer = train_hf(tmp_path, callbacks=[WriteRequestAt(5, request)])
    assert trainer.state.global_step == 5
    ack = read_ack(tmp_path)
    assert (ack.id, ack.action, ack.status, ack.step) == ("stop-1", "stop", "done", 5)
    assert "stopped at step 5" in ack.detail
    lines = records(tmp_path)
    assert max(r["step"] for r in lines if "loss" in r) == 5
    events = [r for r in lines if r.get("event") == "control"]
    assert events == [{"step": 5, "time": events[0]["time"], "event": "control",
                       "control": {"id": "stop-1", "action": "stop", "status": "done",
                                   "detail": ack.detail}}]


def test_hf_stop_written_before_training_acts_at_the_first_step(tmp_path):
    write_request(tmp_path, ControlRequest(id="early", action="stop"))
    trainer = train_hf(tmp_path)
    assert trainer.state.global_step == 1 and read_ack(tmp_path).step == 1


def test_hf_rollback_is_refused_and_training_goes_on(tmp_path):
    (tmp_path / "checkpoint-0").mkdir(parents=True)
    request = ControlRequest(id="rb-1", action="rollback", checkpoint="checkpoint-0",
                             skip_batches=(3, 4), lr_scale=0.5)
    trainer = train_hf(tmp_path, callbacks=[WriteRequestAt(3, request)], max_steps=6,
                       save_steps=100)
    assert trainer.state.global_step == 6
    ack = read_ack(tmp_path)
    assert (ack.id, ack.status, ack.step, ack.detail) == ("rb-1", "refused", 3,
                                                          ROLLBACK_REFUSAL)


def losses_by_attempt(run_dir):
    """The logged train losses, split where the step goes back (as runwatch's store does)."""
    attempts, last = [{}], 0
    for record in records(run_dir):
        step = record.get("step")
        if step is None or ("loss" not in record and "skipped_batches" not in record):
            continue
        if step < last:
            attempts.append({})
        last = step
        if "loss" in record:
            attempts[-1][step] = (record["loss"], record.get("learning_rate"))
    return attempts


def test_hf_rollback_in_process_resumes_exactly_from_the_checkpoint(tmp_path):
    request = ControlRequest(id="rb-hf", action="rollback", checkpoint="checkpoint-10")
    trainer = train_hf(tmp_path, callbacks=[WriteRequestAt(15, request)], max_steps=25,
                       in_process_rollback=True, eval_strategy="no")
    assert trainer.state.global_step == 25
    ack = read_ack(tmp_path)
    assert (ack.id, ack.status, ack.step) == ("rb-hf", "done", 10)
    assert "resuming at step 11" in ack.detail
    first, second = losses_by_attempt(tmp_path)
    assert sorted(first) == list(range(1, 16)) and sorted(second) == list(range(11, 26))
    # HF restored weights, optimizer, schedule and data order: the same steps, the same losses
    for step in range(11, 16):
        assert second[step] == pytest.approx(first[step], rel=1e-5)


def test_hf_rollback_in_process_skips_batches_and_scales_the_lr(tmp_path):
    request = ControlRequest(id="rb-skip", action="rollback", checkpoint="checkpoint-10",
                             skip_batches=(11, 20), lr_scale=0.5)
    trainer = train_hf(tmp_path, callbacks=[WriteRequestAt(15, request)], max_steps=30,
                       in_process_rollback=True, eval_strategy="no")
    assert trainer.state.global_step == 30
    ack = read_ack(tmp_path)
    assert (ack.status, ack.step) == ("done", 10) and "skipping batches 11–20" in ack.detail
    first, second = losses_by_attempt(tmp_path)
    assert sorted(second) == list(range(21, 31))  # 11–20 skipped, logged as skipped
    skipped = [r["step"] for r in records(tmp_path) if r.get("event") == "skipped_batch"]
    assert skipped == list(range(11, 21))
    # linear decay from 1e-3 over 30 steps (HF logs the rate the step used), advanced past
    # the skipped steps, then halved
    for step, (_, lr) in first.items():
        assert lr == pytest.approx(1e-3 * (1 - (step - 1) / 30), rel=1e-6)
    for step, (_, lr) in second.items():
        assert lr == pytest.approx(0.5 * 1e-3 * (1 - (step - 1) / 30), rel=1e-6)
    assert not any(p.name.startswith(".runwatch-resume-") for p in tmp_path.iterdir())


def test_hf_rollback_to_an_incomplete_checkpoint_is_refused(tmp_path):
    (tmp_path / "checkpoint-2").mkdir(parents=True)
    request = ControlRequest(id="rb-bad", action="rollback", checkpoint="checkpoint-2")
    trainer = train_hf(tmp_path, callbacks=[WriteRequestAt(3, request)], max_steps=6,
                       save_steps=100, in_process_rollback=True)
    assert trainer.state.global_step == 6
    ack = read_ack(tmp_path)
    assert ack.status == "refused" and "incomplete" in ack.detail


def test_hf_request_already_answered_is_not_acted_on_again(tmp_path):
    write_request(tmp_path, ControlRequest(id="once", action="stop"))
    train_hf(tmp_path, max_steps=3)
    first_ack = read_ack(tmp_path)
    trainer = train_hf(tmp_path, max_steps=3)  # a new process in the same directory
    assert trainer.state.global_step == 3
    assert read_ack(tmp_path) == first_ack


def test_hf_callback_rejects_bad_configuration():
    with pytest.raises(ValueError, match="poll_every_n_steps"):
        RunwatchCallback(poll_every_n_steps=0)


DDP_SCRIPT = """
import os, sys
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from connectors.training.control import ControlRequest, write_request
from connectors.training.hf_callback import RunwatchCallback
from tests.connectors.test_callbacks import NaNLossAtStep, RandomTokens, tiny_config

run_dir, rank = sys.argv[1], int(os.environ["RANK"])

class StopAtFour(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 4 and rank == 0:
            write_request(run_dir, ControlRequest(id="ddp-stop", action="stop"))

torch.manual_seed(0)
model = NaNLossAtStep(tiny_config())
model.nan_at_call = 2 if rank == 1 else -1  # only rank 1 sees the NaN
args = TrainingArguments(output_dir=run_dir, max_steps=10, logging_steps=1, save_steps=100,
                         per_device_train_batch_size=4, report_to=[], use_cpu=True,
                         disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(),
                  callbacks=[StopAtFour(), RunwatchCallback()])
trainer.train()
print(f"rank {rank} stopped at {trainer.state.global_step}", flush=True)
"""


def run_two_processes(tmp_path, script):
    """``script`` under torchrun with two CPU processes (gloo); returns their stdout."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(script))
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        # --standalone: torchrun picks a free port itself, with no window for another process
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(path), str(tmp_path / "run")],
        cwd=repo, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


@pytest.mark.slow
def test_hf_two_process_run_stops_together_and_sees_every_rank_loss(tmp_path):
    """Rank 0 alone reads the stop request, yet both ranks stop at the same step (one stopping
    alone would make the other fail or hang); a NaN loss on rank 1 only reaches rank 0's log,
    while HF's filtered, averaged loss hides it."""
    stdout = run_two_processes(tmp_path, DDP_SCRIPT)
    # Both ranks print to one pipe: their lines can interleave without a newline between.
    assert sorted(re.findall(r"rank \d stopped at \d+", stdout)) == [
        "rank 0 stopped at 4", "rank 1 stopped at 4"]
    ack = read_ack(tmp_path / "run")
    assert (ack.id, ack.status, ack.step) == ("ddp-stop", "done", 4)
    losses = {r["step"]: r["loss"] for r in records(tmp_path / "run") if "loss" in r}
    assert sorted(losses) == [1, 2, 3, 4] and math.isnan(losses[2])


# Lightning -----------------------------------------------------------------------------------

def lightning_module(nan_step=None):
    pl = pytest.importorskip("lightning.pytorch")

    class TinyRegression(pl.LightningModule):
        """A linear model on a fixed random regression problem; optional NaN loss at a step."""

        def __init__(self):
            super().__init__()
            self.save_hyperparameters({"lr": 0.05, "nan_step": nan_step})
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            if self.global_step + 1 == nan_step:
                loss = loss + float("nan")  # the value is NaN, the gradients stay finite
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return TinyRegression()


def regression_data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=generator)
    y = x @ torch.randn(8, 1, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def fit_lightning(run_dir, module, *, callbacks=(), max_steps=20, leakcheck=None):
    pl = pytest.importorskip("lightning.pytorch")
    from connectors.training.lightning_callback import RunwatchLightningCallback

    torch.manual_seed(0)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=run_dir / "checkpoints",
                                               every_n_train_steps=10, save_top_k=-1)
    trainer = pl.Trainer(default_root_dir=run_dir, max_steps=max_steps, accelerator="cpu",
                         devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, val_check_interval=10,
                         limit_val_batches=2, num_sanity_val_steps=0,
                         callbacks=[*callbacks, checkpoints,
                                    RunwatchLightningCallback(leakcheck=leakcheck)])
    data = regression_data()
    trainer.fit(module, DataLoader(data, batch_size=8), DataLoader(data, batch_size=64))
    return trainer


def test_lightning_fit_logs_raw_steps_checkpoints_and_meta(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"q": "one two three four"}\n{"q": "five six"}\n')
    (data / "eval.jsonl").write_text('{"q": "One, two, three, four."}\n')
    trainer = fit_lightning(tmp_path, lightning_module(nan_step=NAN_STEP), leakcheck={
        "train": data / "train.jsonl", "eval": data / "eval.jsonl", "field": "q"})
    lines = records(tmp_path)
    meta = lines[0]["meta"]
    assert (meta["leakcheck"]["eval_exact"], meta["leakcheck"]["overlap_rate"]) == (1, 1.0)
    assert meta["total_steps"] == 20 and meta["config"] == {"lr": 0.05, "nan_step": NAN_STEP}
    assert meta["versions"]["model"]["class"] == type(trainer.lightning_module).__name__
    assert meta["versions"]["environment"]["packages"]["lightning"]
    train = [r for r in lines if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 21))
    assert math.isnan(train[NAN_STEP - 1]["loss"])
    assert all(math.isfinite(r["loss"]) for r in train if r["step"] != NAN_STEP)
    assert all(math.isfinite(r["grad_norm"]) and r["lr"] == 0.05 for r in train)
    assert [r["step"] for r in lines if "val_loss" in r] == [10, 20]
    events = [r for r in lines if r.get("event") == "checkpoint"]
    assert [(e["step"], e["path"]) for e in events] == [
        (10, "checkpoints/epoch=0-step=10.ckpt"), (20, "checkpoints/epoch=0-step=20.ckpt")]
    assert all((tmp_path / e["path"]).is_file() for e in events)
    assert trainer.global_step == 20

    batch = LogFile(tmp_path / "metrics.jsonl", "pl").read()
    assert {"train/loss", "lr", "grad_norm", "eval/loss"} <= set(batch.points["tag"])
    assert [c.step for c in batch.checkpoints] == [10, 20] and not batch.malformed


def test_lightning_stop_request_stops_the_fit(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")

    class WriteAt(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 5:
                write_request(tmp_path, ControlRequest(id="pl-stop", action="stop"))

    trainer = fit_lightning(tmp_path, lightning_module(), callbacks=[WriteAt()])
    assert trainer.global_step == 5
    ack = read_ack(tmp_path)
    assert (ack.id, ack.status, ack.step) == ("pl-stop", "done", 5)
    assert max(r["step"] for r in records(tmp_path) if "loss" in r) == 5


def test_lightning_rollback_is_refused(tmp_path):
    from connectors.training.lightning_callback import ROLLBACK_REFUSAL as PL_REFUSAL

    (tmp_path / "checkpoints").mkdir()
    write_request(tmp_path, ControlRequest(id="pl-rb", action="rollback",
                                           checkpoint="checkpoints", requested_at=time.time()))
    trainer = fit_lightning(tmp_path, lightning_module(), max_steps=3)
    assert trainer.global_step == 3
    ack = read_ack(tmp_path)
    assert (ack.status, ack.step, ack.detail) == ("refused", 1, PL_REFUSAL)


LIGHTNING_DDP_SCRIPT = """
import os, sys
from pathlib import Path
import lightning.pytorch as pl
from torch.utils.data import DataLoader
from connectors.training.control import ControlRequest, write_request
from connectors.training.lightning_callback import RunwatchLightningCallback
from tests.connectors.test_callbacks import lightning_module, regression_data

run_dir, rank = Path(sys.argv[1]), int(os.environ["RANK"])

class StopAtFour(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 4 and trainer.is_global_zero:
            write_request(run_dir, ControlRequest(id="pl-ddp", action="stop"))

trainer = pl.Trainer(default_root_dir=run_dir, max_steps=10, accelerator="cpu", devices=2,
                     strategy="ddp", logger=False, enable_progress_bar=False,
                     enable_model_summary=False, limit_val_batches=0,
                     callbacks=[StopAtFour(), RunwatchLightningCallback()])
module = lightning_module(nan_step=2 if rank == 1 else None)  # only rank 1 sees the NaN
trainer.fit(module, DataLoader(regression_data(), batch_size=8))
print(f"rank {rank} stopped at {trainer.global_step}", flush=True)
"""


@pytest.mark.slow
def test_lightning_ddp_fit_stops_together_and_sees_every_rank_loss(tmp_path):
    pytest.importorskip("lightning.pytorch")
    stdout = run_two_processes(tmp_path, LIGHTNING_DDP_SCRIPT)
    # Both ranks print to one pipe: their lines can interleave without a newline between.
    assert sorted(re.findall(r"rank \d stopped at \d+", stdout)) == [
        "rank 0 stopped at 4", "rank 1 stopped at 4"]
    ack = read_ack(tmp_path / "run")
    assert (ack.id, ack.status, ack.step) == ("pl-ddp", "done", 4)
    losses = {r["step"]: r["loss"] for r in records(tmp_path / "run") if "loss" in r}
    assert sorted(losses) == [1, 2, 3, 4] and math.isnan(losses[2])
