"""A Hugging Face ``TrainerCallback`` that writes runwatch's log and obeys its control requests.

Add it to a Trainer and point runwatch at the output directory::

    trainer = Trainer(..., callbacks=[RunwatchCallback()])

What it writes to ``<run_dir>/metrics.jsonl`` (``run_dir`` defaults to ``args.output_dir``),
through :class:`connectors.training.torchloop.RunLogger`:

* a meta line at the start of each ``train()`` call: ``max_steps`` as ``total_steps`` and
  the ``TrainingArguments`` (tokens redacted by HF) as ``config``;
* one line per HF log call, with everything HF logs (``loss``, ``grad_norm``,
  ``learning_rate``, ``epoch``, eval metrics, …) at ``state.global_step``. Use
  ``logging_steps=1`` for per-step points. HF's end-of-training summary is left out: its
  ``train_loss`` is a run average that would read as one more loss point;
* a ``checkpoint`` event for each ``checkpoint-<step>`` folder the Trainer saves;
* a ``control`` event for each control request answered.

Raw losses. With ``logging_nan_inf_filter=True`` (the default) the Trainer replaces a NaN or
infinite step loss by the average of the window's earlier losses before it logs (0.0 when the
window has one step), which hides exactly the divergence runwatch watches for. The callback
does not see the Trainer's per-step loss (callbacks get the model, optimizer and scheduler,
not the Trainer), so it registers a forward hook on the model that adds up the ``loss`` of
every training-mode forward call on the device, without a sync. When that raw sum of the
logging window is not finite, the logged ``loss`` is replaced by it (NaN, or ±inf); when it
is finite the filter changed nothing and HF's value is kept as it is, so the scaling of
gradient accumulation and of ``num_items_in_batch`` stays HF's own. A model whose output has
no ``loss`` (a custom ``compute_loss``) cannot be observed this way: the callback warns once
and logs HF's value; set ``logging_nan_inf_filter=False`` there.

Control. Between steps (``on_step_end``) the callback polls the run directory's control
request (:mod:`connectors.training.control`). ``stop`` sets ``control.should_training_stop``; the
request is acknowledged ``done`` with the last step when training has ended. ``rollback``
needs the training script to call :func:`train` (``connectors.training.hf_callback.train(trainer)``
instead of ``trainer.train()``): the callback then stops the loop at a step boundary and
:func:`train` calls ``trainer.train(resume_from_checkpoint=…)`` again in the same process, so
HF itself restores model, optimizer, scheduler, RNG and data position — nothing of the
Trainer's private loop state is touched. Skipping batches ``[first, last]`` resumes from a
view of the checkpoint (symbolic links, its ``trainer_state.json`` at step ``last``), so HF's
own data fast-forward passes over them and the scheduler is advanced to the same step;
``lr_scale`` scales the scheduler's base learning rates. With a plain ``trainer.train()``, a
rollback is refused (the ``process`` backend restarts the command instead).
Observation is kept apart from action: the callback only sets flags on the control object.

Distributed runs: only the world's process zero writes files and reads requests; its stop
decision is broadcast to every rank so all stop at the same step, and the raw loss is summed
over ranks like HF's own loss. Both are collectives, which is why every rank runs the
callback and why ``poll_every_n_steps`` can space out the control check.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import (
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from connectors.checkpoints import check as check_checkpoint
from connectors.checkpoints import step_of
from connectors.training.control import DEFAULT_MAX_AGE_S, ControlRequest
from connectors.training.torchloop import RunLogger

ROLLBACK_REFUSAL = ("in-process rollback needs connectors.training.hf_callback.train(trainer) "
                    "instead of trainer.train(); or use the process backend (runwatch launch)")
DISTRIBUTED_REFUSAL = ("in-process rollback is not supported in a distributed run; use the "
                       "process backend (runwatch launch)")
RESUME_PREFIX = ".runwatch-resume-"
TRAINER_STATE_NAME = "trainer_state.json"  # what HF's Trainer saves in each checkpoint
# RunLogger sets these itself; a log key of the same name cannot be written as a metric.
_RESERVED_KEYS = ("step", "time")

log = logging.getLogger(__name__)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _model_loss(output: object) -> torch.Tensor | None:
    """The loss in a model's output, found the way ``Trainer.compute_loss`` finds it."""
    if isinstance(output, Mapping):
        loss = output.get("loss")
    elif isinstance(output, (tuple, list)) and output:
        loss = output[0]
    else:
        loss = None
    # A tuple output without labels starts with the logits: only a scalar is a loss.
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def _checkpoint_step(path: str) -> int:
    return step_of(path.rstrip("/")) or 0


def train(trainer: Trainer, **kwargs: Any) -> Any:
    """``trainer.train(**kwargs)``, rolled back in-process when runwatch asks for it.

    A rollback request stops the running loop at a step boundary; this function then calls
    ``trainer.train(resume_from_checkpoint=…)`` from the requested checkpoint (HF restores
    every state itself) and goes on until training ends without a rollback. Returns the last
    ``TrainOutput``.
    """
    callback = next((cb for cb in trainer.callback_handler.callbacks
                     if isinstance(cb, RunwatchCallback)), None)
    if callback is None:
        raise ValueError("add RunwatchCallback() to the Trainer's callbacks first")
    callback._rollback_enabled = True
    try:
        output = trainer.train(**kwargs)
        while callback._rollback is not None:
            request, callback._rollback = callback._rollback, None
            resume = callback._resume_from(request, trainer.args)
            callback._resuming = request
            output = trainer.train(resume_from_checkpoint=str(resume))
    finally:
        callback._rollback_enabled = False
    return output


def _is_train_summary(logs: Mapping[str, object]) -> bool:
    return "train_loss" in logs and "total_flos" in logs


class RunwatchCallback(TrainerCallback):
    """Writes raw training metrics and checkpoint events for runwatch; stops on request.

    Parameters
    ----------
    run_dir
        Where ``metrics.jsonl`` and the control files live; ``args.output_dir`` when None, so
        checkpoint folders and the log sit together.
    poll_every_n_steps
        Check for a control request every N optimizer steps. One is right for a single
        process (a ``stat`` per step); in a distributed run each check is a broadcast, and a
        larger N trades reaction time for fewer collectives.
    max_request_age_s
        A request older than this is refused instead of acted on (None: no limit).
    leakcheck
        ``{"train": path, "eval": path, "field": "text"}``: run the train/eval leakage check
        at the start of training (within ``budget_s``, default 30 s) and record the result,
        which an overfit alert then shows first.
    eval_suites
        ``{"mmlu": "evals/mmlu.jsonl", "business": "v4"}``: the eval suites this run
        evaluates with, each a suite file (its content hash is the version) or a version;
        written in each attempt's meta line, so numbers are compared within one version.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 poll_every_n_steps: int = 1,
                 max_request_age_s: float | None = DEFAULT_MAX_AGE_S,
                 leakcheck: dict[str, Any] | None = None,
                 eval_suites: dict[str, Any] | None = None) -> None:
        if not isinstance(poll_every_n_steps, int) or poll_every_n_steps < 1:
            raise ValueError(f"poll_every_n_steps must be a positive integer, got "
                             f"{poll_every_n_steps!r}")
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.poll_every_n_steps = poll_every_n_steps
        self.max_request_age_s = max_request_age_s
        self.leakcheck = leakcheck
        self.eval_suites = eval_suites
        self._logger: RunLogger | None = None
        self._hook: RemovableHandle | None = None
        self._raw_loss: torch.Tensor | None = None
        self._saw_loss = False
        self._warned_no_loss = False
        self._stop_request: ControlRequest | None = None
        # in-process rollback (see train()): enabled by train(); the request being carried out
        self._rollback_enabled = False
        self._rollback: ControlRequest | None = None
        self._resuming: ControlRequest | None = None
        self._resume_view: Path | None = None

    # observation ------------------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: nn.Module | None = None,
                       **kwargs: Any) -> None:
        self._remove_hook()
        self._raw_loss = torch.zeros((), device=args.device)
        self._saw_loss = False
        self._stop_request = None
        if model is not None:
            self._hook = model.register_forward_hook(self._add_raw_loss)
        if state.is_world_process_zero:
            if self._logger is not None:
                self._logger.close()
            self._logger = RunLogger(self.run_dir or args.output_dir,
                                     total_steps=state.max_steps, config=args.to_dict(),
                                     control_max_age_s=self.max_request_age_s,
                                     data=kwargs.get("train_dataloader"),
                                     eval_data=kwargs.get("eval_dataloader"), model=model,
                                     step=state.global_step or None,
                                     leakcheck=self.leakcheck, eval_suites=self.eval_suites)
        if self._resuming is not None:
            self._finish_rollback(state, kwargs.get("optimizer"), kwargs.get("lr_scheduler"))

    def _finish_rollback(self, state: TrainerState, optimizer: Any, scheduler: Any) -> None:
        """The resumed train() has loaded the checkpoint: apply the options, answer."""
        request, self._resuming = self._resuming, None
        if self._resume_view is not None:
            shutil.rmtree(self._resume_view, ignore_errors=True)
            self._resume_view = None
        checkpoint_step = _checkpoint_step(request.checkpoint or "")
        scheduler = getattr(scheduler, "scheduler", scheduler)  # accelerate wraps it
        if request.lr_scale is not None and request.lr_scale != 1.0 and scheduler is not None:
            scheduler.base_lrs = [lr * request.lr_scale for lr in scheduler.base_lrs]
            if optimizer is not None:
                for group in optimizer.param_groups:
                    group["lr"] *= request.lr_scale
                scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
        if request.skip_batches is not None and scheduler is not None:
            with warnings.catch_warnings():  # stepping the schedule without an optimizer step
                warnings.simplefilter("ignore")
                for _ in range(max(0, state.global_step - checkpoint_step)):
                    scheduler.step()
        detail = f"rolled back in-process to {Path(request.checkpoint or '').name}"
        if self._logger is not None:
            if request.skip_batches is not None:
                first, last = request.skip_batches
                for step in range(first, last + 1):  # so readers see the run go back at once
                    self._logger.log(step, event="skipped_batch", skipped_batches=1)
                detail += f", skipping batches {first}–{last}"
            self._logger.acknowledge(request, "done", checkpoint_step,
                                     f"{detail}; resuming at step {state.global_step + 1}")

    def _add_raw_loss(self, module: nn.Module, inputs: object, output: object) -> None:
        """Forward hook: add the loss of a training forward call, kept on the device."""
        if not module.training or self._raw_loss is None:
            return
        loss = _model_loss(output)
        if loss is not None:
            self._saw_loss = True
            self._raw_loss += loss.detach().float().reshape(()).to(self._raw_loss.device)

    @staticmethod
    def _take_window(raw_loss: torch.Tensor) -> float:
        """The raw loss sum of the logging window over all ranks; starts the next window."""
        window = raw_loss.clone()
        raw_loss.zero_()
        if _distributed():
            dist.all_reduce(window)
        return window.item()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        logs = dict(logs or {})
        if "loss" in logs and self._raw_loss is not None:
            raw = self._take_window(self._raw_loss)  # a collective: every rank takes part
            if not math.isfinite(raw):
                logs["loss"] = raw
            elif not self._saw_loss:
                self._warn_no_loss(args)
        if self._logger is None or not state.is_world_process_zero or _is_train_summary(logs):
            return
        metrics = {key: value for key, value in logs.items() if key not in _RESERVED_KEYS}
        self._logger.log(state.global_step, **metrics)

    def _warn_no_loss(self, args: TrainingArguments) -> None:
        if args.logging_nan_inf_filter and not self._warned_no_loss:
            self._warned_no_loss = True
            log.warning("RunwatchCallback: the model output carries no 'loss', so non-finite "
                        "losses cannot be seen before logging_nan_inf_filter smooths them; "
                        "set logging_nan_inf_filter=False to keep them visible")

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if self._logger is not None and state.is_world_process_zero:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            self._logger.log_checkpoint(state.global_step, folder)

    # action -----------------------------------------------------------------------------
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if state.global_step % self.poll_every_n_steps:
            return
        request = self._logger.control(state.global_step) if self._logger else None
        if request is not None and request.action == "rollback":
            why = self._cannot_roll_back(request, args)
            if why is None:
                self._rollback = request  # train() resumes from it once this loop has ended
            else:
                self._logger.acknowledge(request, "refused", state.global_step, why)
            request = None
        if self._agree_to_stop(request is not None or self._rollback is not None, args.device):
            control.should_training_stop = True
            if self._rollback is None:
                self._stop_request = request or self._stop_request

    def _cannot_roll_back(self, request: ControlRequest, args: TrainingArguments) -> str | None:
        if _distributed():
            return DISTRIBUTED_REFUSAL
        if not self._rollback_enabled:
            return ROLLBACK_REFUSAL
        problem = check_checkpoint(request.checkpoint_path(self.run_dir or args.output_dir))
        if problem is not None:
            return f"checkpoint {problem}"
        if request.skip_batches is not None and request.skip_batches[0] <= \
                _checkpoint_step(request.checkpoint or ""):
            return "the batches to skip must come after the checkpoint"
        return None

    def _resume_from(self, request: ControlRequest, args: TrainingArguments) -> Path:
        """The folder train() resumes from: the checkpoint, or, to skip batches, a view of it
        whose trainer state says the run is at the last skipped step."""
        checkpoint = request.checkpoint_path(self.run_dir or args.output_dir)
        if request.skip_batches is None:
            return checkpoint
        view = Path(self.run_dir or args.output_dir) / f"{RESUME_PREFIX}{request.id}"
        shutil.rmtree(view, ignore_errors=True)
        view.mkdir(parents=True)
        for entry in checkpoint.iterdir():
            if entry.name != TRAINER_STATE_NAME:
                (view / entry.name).symlink_to(entry.resolve())
        trainer_state = json.loads((checkpoint / TRAINER_STATE_NAME).read_text())
        trainer_state["global_step"] = request.skip_batches[1]
        (view / TRAINER_STATE_NAME).write_text(json.dumps(trainer_state))
        self._resume_view = view
        return view

    @staticmethod
    def _agree_to_stop(stop: bool, device: torch.device) -> bool:
        """Process zero's decision, on every rank: a rank that stopped alone would hang."""
        if not _distributed():
            return stop
        flag = torch.tensor(int(stop), device=device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self._remove_hook()
        self._raw_loss = None
        if self._stop_request is not None and self._logger is not None:
            self._logger.acknowledge(self._stop_request, "done", state.global_step,
                                     f"training stopped at step {state.global_step}")
            self._stop_request = None
