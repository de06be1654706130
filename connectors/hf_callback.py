"""A Hugging Face ``TrainerCallback`` that writes runwatch's log and obeys its control requests.

Add it to a Trainer and point runwatch at the output directory::

    trainer = Trainer(..., callbacks=[RunwatchCallback()])

What it writes to ``<run_dir>/metrics.jsonl`` (``run_dir`` defaults to ``args.output_dir``),
through :class:`connectors.torchloop.RunLogger`:

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
request (:mod:`connectors.control`). ``stop`` sets ``control.should_training_stop``; the
request is acknowledged ``done`` with the last step when training has ended. ``rollback`` is
refused: reloading model, optimizer, scheduler and data position inside a running Trainer
would rely on its private loop state (the step counters of its logging window, the data
iterator), so runwatch's ``process`` backend restarts the command from the checkpoint instead.
Observation is kept apart from action: the callback only sets flags on the control object.

Distributed runs: only the world's process zero writes files and reads requests; its stop
decision is broadcast to every rank so all stop at the same step, and the raw loss is summed
over ranks like HF's own loss. Both are collectives, which is why every rank runs the
callback and why ``poll_every_n_steps`` can space out the control check.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from connectors.control import DEFAULT_MAX_AGE_S, ControlRequest
from connectors.torchloop import RunLogger

ROLLBACK_REFUSAL = ("in-process rollback is not supported by the HF callback; use the process "
                    "backend")
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
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 poll_every_n_steps: int = 1,
                 max_request_age_s: float | None = DEFAULT_MAX_AGE_S) -> None:
        if not isinstance(poll_every_n_steps, int) or poll_every_n_steps < 1:
            raise ValueError(f"poll_every_n_steps must be a positive integer, got "
                             f"{poll_every_n_steps!r}")
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.poll_every_n_steps = poll_every_n_steps
        self.max_request_age_s = max_request_age_s
        self._logger: RunLogger | None = None
        self._hook: RemovableHandle | None = None
        self._raw_loss: torch.Tensor | None = None
        self._saw_loss = False
        self._warned_no_loss = False
        self._stop_request: ControlRequest | None = None

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
                                     control_max_age_s=self.max_request_age_s)

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
            self._logger.acknowledge(request, "refused", state.global_step, ROLLBACK_REFUSAL)
            request = None
        if self._agree_to_stop(request is not None, args.device):
            control.should_training_stop = True
            self._stop_request = request or self._stop_request

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
