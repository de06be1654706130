"""A Lightning ``Callback`` that writes runwatch's log and obeys its control requests.

This module imports ``lightning``; nothing in the bot imports it, so the bot runs without
Lightning installed. Add the callback to a Trainer::

    trainer = lightning.pytorch.Trainer(..., callbacks=[RunwatchLightningCallback()])

What it writes to ``<run_dir>/metrics.jsonl`` (``run_dir`` defaults to ``trainer.log_dir``,
the folder of this run's logs and checkpoints), through
:class:`connectors.training.torchloop.RunLogger`:

* a meta line when fitting starts: the number of optimizer steps the fit will take as
  ``total_steps`` and the module's ``hparams`` as ``config``;
* one line per optimizer step: ``loss`` (the raw value ``training_step`` returned, averaged
  over the micro-batches of gradient accumulation and over ranks: Lightning filters nothing,
  but its loggers see only what the user chose to log, and only every
  ``log_every_n_steps``), ``lr`` and ``grad_norm`` (taken just before the optimizer step,
  after unscaling; under a sharding strategy such as FSDP it is the norm of rank zero's
  shard). Writing a line reads the values from the device, one sync per step;
* the validation metrics whose names start with one of ``eval_prefixes`` after each
  validation run (Lightning's convention is ``val_loss``, ``val_acc``, …);
* a ``checkpoint`` event for each file a ``ModelCheckpoint`` saves;
* a ``control`` event for each control request answered.

Control: on each ``poll_every_n_steps``-th optimizer step the callback reads the control
request (:mod:`connectors.training.control`). ``stop`` sets ``trainer.should_stop`` and is
acknowledged ``done`` with the last step when the fit has ended (Lightning may go on until
``min_steps``/``min_epochs`` are met). ``rollback`` is refused: restoring a checkpoint inside a
running fit loop would rewrite Lightning's private loop state; runwatch's ``process`` backend
restarts the command with ``ckpt_path`` instead. The callback only sets flags on the trainer.

Distributed runs: only global rank zero writes files and reads requests; its stop decision is
broadcast through the strategy so every rank stops at the same step, and the loss is averaged
over ranks so a NaN on any rank shows. Both are collectives: every rank runs the callback.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from connectors.training.control import DEFAULT_MAX_AGE_S, ControlRequest
from connectors.training.torchloop import RunLogger

ROLLBACK_REFUSAL = ("in-process rollback is not supported by the Lightning callback; use the "
                    "process backend")


def _step_loss(outputs: object) -> torch.Tensor | None:
    """The loss in what ``training_step`` returned (a tensor, or a mapping with ``loss``)."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def _total_steps(trainer: pl.Trainer) -> int | None:
    steps = trainer.estimated_stepping_batches
    return int(steps) if math.isfinite(steps) else None


class RunwatchLightningCallback(pl.Callback):
    """Writes raw training metrics and checkpoint events for runwatch; stops on request.

    Parameters
    ----------
    run_dir
        Where ``metrics.jsonl`` and the control files live; ``trainer.log_dir`` when None.
    eval_prefixes
        Validation metrics (``trainer.callback_metrics``) whose names start with one of these
        are written after each validation run; other metrics are the user's loggers' business.
    poll_every_n_steps
        Check for a control request every N optimizer steps (a broadcast in distributed runs).
    max_request_age_s
        A request older than this is refused instead of acted on (None: no limit).
    leakcheck
        ``{"train": path, "eval": path, "field": "text"}``: run the train/eval leakage check
        when fitting starts (within ``budget_s``, default 30 s) and record the result.
    eval_suites
        ``{"mmlu": "evals/mmlu.jsonl", "business": "v4"}``: the eval suites this run
        evaluates with, each a suite file (its content hash is the version) or a version;
        written in each attempt's meta line, so numbers are compared within one version.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 eval_prefixes: tuple[str, ...] = ("val", "eval"),
                 poll_every_n_steps: int = 1,
                 max_request_age_s: float | None = DEFAULT_MAX_AGE_S,
                 leakcheck: dict[str, Any] | None = None,
                 eval_suites: dict[str, Any] | None = None) -> None:
        if not isinstance(poll_every_n_steps, int) or poll_every_n_steps < 1:
            raise ValueError(f"poll_every_n_steps must be a positive integer, got "
                             f"{poll_every_n_steps!r}")
        if not eval_prefixes or not all(isinstance(p, str) and p for p in eval_prefixes):
            raise ValueError(f"eval_prefixes must be non-empty strings, got {eval_prefixes!r}")
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.eval_prefixes = eval_prefixes
        self.poll_every_n_steps = poll_every_n_steps
        self.max_request_age_s = max_request_age_s
        self.leakcheck = leakcheck
        self.eval_suites = eval_suites
        self._logger: RunLogger | None = None
        self._last_step = 0
        self._loss_sum: torch.Tensor | None = None
        self._micro_batches = 0
        self._lr: float | None = None
        self._grad_norm: torch.Tensor | None = None
        self._pending_checkpoint_step: int | None = None
        self._checkpoint_mtimes: dict[str, int] = {}
        self._stop_request: ControlRequest | None = None

    # observation ------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._last_step = trainer.global_step
        self._loss_sum, self._micro_batches = None, 0
        self._stop_request = None
        # Every rank asks: trainer.log_dir is a broadcast in distributed runs.
        run_dir = self.run_dir or trainer.log_dir or trainer.default_root_dir
        total_steps = _total_steps(trainer)
        if trainer.is_global_zero:
            if self._logger is not None:
                self._logger.close()
            self._logger = RunLogger(run_dir, total_steps=total_steps,
                                     config=dict(pl_module.hparams),
                                     control_max_age_s=self.max_request_age_s,
                                     model=pl_module, step=trainer.global_step or None,
                                     leakcheck=self.leakcheck, eval_suites=self.eval_suites)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        self._lr = optimizer.param_groups[0]["lr"]
        norms = [torch.linalg.vector_norm(p.grad.detach()) for p in pl_module.parameters()
                 if p.grad is not None]
        self._grad_norm = torch.linalg.vector_norm(torch.stack(norms)) if norms else None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = _step_loss(outputs)
        if loss is not None:
            if pl_module.automatic_optimization:  # Lightning divided it for accumulation
                loss = loss * trainer.accumulate_grad_batches
            loss = loss.detach().float()
            self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
            self._micro_batches += 1
        step = trainer.global_step
        if step == self._last_step:  # still accumulating gradients
            return
        self._last_step = step
        self._write_checkpoint_events(trainer)
        self._write_step(trainer, step)
        if step % self.poll_every_n_steps == 0:
            self._obey_control(trainer, step)

    def _write_step(self, trainer: pl.Trainer, step: int) -> None:
        metrics: dict[str, object] = {}
        if self._loss_sum is not None:
            # The mean over ranks, as HF logs it; a collective, so every rank gets here.
            metrics["loss"] = trainer.strategy.reduce(self._loss_sum / self._micro_batches,
                                                      reduce_op="mean")
        if self._lr is not None:
            metrics["lr"] = self._lr
        if self._grad_norm is not None:
            metrics["grad_norm"] = self._grad_norm
        self._loss_sum, self._micro_batches = None, 0
        if self._logger is not None and metrics:
            self._logger.log(step, **metrics)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self._logger is None:
            return
        self._write_checkpoint_events(trainer)
        metrics = {name: value for name, value in trainer.callback_metrics.items()
                   if name.startswith(self.eval_prefixes)}
        if metrics:
            self._logger.log(trainer.global_step, **metrics)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        # Called before the file is written and without its path: the event is written at the
        # next hook, from the paths the ModelCheckpoint callbacks then report.
        self._pending_checkpoint_step = trainer.global_step

    def _write_checkpoint_events(self, trainer: pl.Trainer) -> None:
        """One event per checkpoint file saved (new or rewritten) since the last call."""
        step = self._pending_checkpoint_step
        if step is None or self._logger is None:
            return
        self._pending_checkpoint_step = None
        paths: set[str] = set()
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint):
                paths.update((callback.best_model_path, callback.last_model_path,
                              *callback.best_k_models))
        for path in sorted(p for p in paths if p):
            try:
                mtime = os.stat(path).st_mtime_ns
            except FileNotFoundError:  # removed again by save_top_k
                continue
            if self._checkpoint_mtimes.get(path) != mtime:
                self._checkpoint_mtimes[path] = mtime
                self._logger.log_checkpoint(step, path)

    # action -----------------------------------------------------------------------------
    def _obey_control(self, trainer: pl.Trainer, step: int) -> None:
        request = self._logger.control(step) if self._logger else None
        if request is not None and request.action == "rollback":
            self._logger.acknowledge(request, "refused", step, ROLLBACK_REFUSAL)
            request = None
        # Rank zero decides for all ranks: a rank that stopped alone would hang the others.
        if trainer.strategy.broadcast(request is not None, src=0):
            trainer.should_stop = True
            self._stop_request = request or self._stop_request

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write_checkpoint_events(trainer)
        if self._stop_request is not None and self._logger is not None:
            self._logger.acknowledge(self._stop_request, "done", trainer.global_step,
                                     f"training stopped at step {trainer.global_step}")
            self._stop_request = None
