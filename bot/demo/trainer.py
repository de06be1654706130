"""A real, small PyTorch training run for the runwatch demo.

A character-level language model (embeddings of a fixed context of characters, then a
small MLP) trains with AdamW, linear warmup and cosine decay on a text corpus generated
in code from a seeded toy grammar, so it needs no downloads and no files. It logs through
:class:`connectors.training.torchloop.RunLogger`, so runwatch can watch it, and it can inject a
fault on purpose (a learning-rate burst, corrupted batches or a NaN) for the demo.

The batch of a step is a pure function of ``(seed, step)``: a run resumed from a
checkpoint sees the same batches at the same steps as the original, which is what makes
"if the same position fails again, it is data" checkable. Rollback uses
``--resume-from`` together with ``--skip-batches`` and ``--lr-scale``.

Run ``python -m bot.demo.trainer --help`` for the options.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from connectors.training.torchloop import RunLogger, load_checkpoint

FAULTS = ("none", "lr", "bad_batch", "nan")
CONTEXT = 12
EMBED_DIM = 24
HIDDEN = 256
CORPUS_SEED = 20240601
CORPUS_SENTENCES = 700
EVAL_FRACTION = 0.1
MIN_LR_RATIO = 0.1

_NOUNS = ("cat", "dog", "bird", "horse", "robot", "model", "teacher", "student", "farmer",
          "river", "garden", "city", "window", "engine", "letter", "forest")
_ADJECTIVES = ("small", "red", "quiet", "happy", "old", "bright", "slow", "clever", "green")
_VERBS = ("sees", "likes", "finds", "follows", "builds", "paints", "carries", "watches")
_ADVERBS = ("slowly", "today", "again", "quietly", "often", "at night")
_PLACES = ("near the river", "in the garden", "under the bridge", "by the window",
           "across the city")


def make_corpus(sentences: int = CORPUS_SENTENCES, seed: int = CORPUS_SEED) -> str:
    """A few KB of English-like text from a seeded toy grammar (the same text every time)."""
    rng = random.Random(seed)

    def noun_phrase() -> str:
        article = rng.choice(("the", "a", "every"))
        if rng.random() < 0.5:
            return f"{article} {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
        return f"{article} {rng.choice(_NOUNS)}"

    lines = []
    for _ in range(sentences):
        form = rng.random()
        if form < 0.4:
            text = f"{noun_phrase()} {rng.choice(_VERBS)} {noun_phrase()}"
        elif form < 0.7:
            text = f"{noun_phrase()} {rng.choice(_VERBS)} {noun_phrase()} {rng.choice(_PLACES)}"
        else:
            text = f"{noun_phrase()} {rng.choice(_VERBS)} {rng.choice(_ADVERBS)}"
        lines.append(text + ".")
    return "\n".join(lines) + "\n"


class CharMLP(nn.Module):
    """Next-character model: embed ``CONTEXT`` characters, concatenate, two-layer MLP."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, EMBED_DIM)
        self.mlp = nn.Sequential(
            nn.Linear(CONTEXT * EMBED_DIM, HIDDEN),
            nn.LayerNorm(HIDDEN),
            nn.GELU(),
            nn.Linear(HIDDEN, vocab_size),
        )

    def forward(self, idx: torch.Tensor, *, nan_embedding: bool = False) -> torch.Tensor:
        """Logits ``(batch, vocab)``; ``nan_embedding`` poisons one input embedding (fault)."""
        emb = self.embed(idx)
        if nan_embedding:
            emb = emb.clone()
            emb[0, 0, 0] = float("nan")
        return self.mlp(emb.flatten(1))


class CharData:
    """The encoded corpus, split into train and held-out parts, and its batches."""

    def __init__(self, text: str, seed: int) -> None:
        self.chars = sorted(set(text))
        index = {c: i for i, c in enumerate(self.chars)}
        encoded = torch.tensor([index[c] for c in text], dtype=torch.long)
        split = int(len(encoded) * (1 - EVAL_FRACTION))
        self.train = encoded[:split]
        self.held_out = encoded[split:]
        self.seed = seed
        self._offsets = torch.arange(CONTEXT)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def _windows(self, tokens: torch.Tensor,
                 starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tokens[starts[:, None] + self._offsets], tokens[starts + CONTEXT]

    def batch(self, step: int, batch_size: int,
              corrupt: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The training batch of ``step``: a pure function of ``(seed, step)``.

        ``corrupt`` replaces the targets with random characters (the bad-batch fault),
        also drawn from ``(seed, step)`` so a rerun corrupts the same batch the same way.
        """
        rng = np.random.default_rng([self.seed, step])
        starts = torch.from_numpy(rng.integers(0, len(self.train) - CONTEXT, size=batch_size))
        inputs, targets = self._windows(self.train, starts)
        if corrupt:
            noise = np.random.default_rng([self.seed, step, 1])
            targets = torch.from_numpy(noise.integers(0, self.vocab_size, size=batch_size))
        return inputs, targets

    def eval_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every window of the held-out split (the same each time)."""
        return self._windows(self.held_out, torch.arange(len(self.held_out) - CONTEXT))


def scheduled_lr(step: int, args: argparse.Namespace) -> float:
    """Linear warmup to ``--lr``, then cosine decay to ``MIN_LR_RATIO`` of it at ``--steps``.

    The schedule is a pure function of the step, so restoring the step restores it.
    """
    if step <= args.warmup:
        return args.lr * step / max(args.warmup, 1)
    progress = min((step - args.warmup) / max(args.steps - args.warmup, 1), 1.0)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return args.lr * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * cosine)


def parse_range(text: str) -> tuple[int, int]:
    """``"A-B"`` → ``(A, B)``, an inclusive step range."""
    try:
        first, last = (int(part) for part in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected A-B (two step numbers), got {text!r}") from None
    if not 1 <= first <= last:
        raise argparse.ArgumentTypeError(f"expected 1 <= A <= B, got {text!r}")
    return first, last


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bot.demo.trainer",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train a tiny character-level language model and log it for runwatch "
                    "(metrics.jsonl and checkpoint-<step>/ folders in --run-dir).")
    parser.add_argument("--run-dir", type=Path, required=True, default=argparse.SUPPRESS,
                        help="folder for metrics.jsonl and checkpoints (created if missing)")
    parser.add_argument("--steps", type=int, default=300, help="total training steps")
    parser.add_argument("--batch-size", type=int, default=2048,
                        help="context windows per step (each predicts its next character)")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="linear warmup steps before cosine decay")
    parser.add_argument("--grad-clip", type=float, default=1.0,
                        help="max total gradient norm; 0 disables clipping")
    parser.add_argument("--eval-every", type=int, default=25,
                        help="log eval_loss on the held-out split every N steps")
    parser.add_argument("--checkpoint-every", type=int, default=50,
                        help="save a checkpoint every N steps (and at the last step)")
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="seconds to sleep after each step, so a person can watch")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the initial weights and of the data order")
    parser.add_argument("--fault", choices=FAULTS, default="none",
                        help="inject a fault: lr = learning-rate burst, bad_batch = random "
                             "targets, nan = NaN in the input embeddings")
    parser.add_argument("--fault-step", type=int, default=150, help="first step of the fault")
    parser.add_argument("--fault-steps", type=int, default=3,
                        help="number of consecutive steps the fault lasts")
    parser.add_argument("--fault-scale", type=float, default=50.0,
                        help="learning-rate multiplier of the 'lr' fault")
    parser.add_argument("--resume-from", type=Path, default=None, metavar="PATH",
                        help="checkpoint folder to resume from (continues at its step + 1)")
    parser.add_argument("--skip-batches", type=parse_range, default=None, metavar="A-B",
                        help="skip the batches of steps A..B: the data position advances "
                             "without training")
    parser.add_argument("--lr-scale", type=float, default=1.0,
                        help="multiply the scheduled learning rate (e.g. after a rollback)")
    parser.add_argument("--stop-at", type=int, default=None, metavar="STEP",
                        help="stop cleanly after STEP, saving a checkpoint there")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    positive = ("steps", "batch_size", "eval_every", "checkpoint_every", "fault_steps")
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("lr", "lr_scale", "fault_scale"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.stop_at is not None and args.stop_at < 1:
        parser.error("--stop-at must be at least 1")
    if args.warmup < 0 or args.grad_clip < 0 or args.step_delay < 0:
        parser.error("--warmup, --grad-clip and --step-delay must not be negative")
    if args.resume_from is not None and not args.resume_from.is_dir():
        parser.error(f"--resume-from {args.resume_from}: no such checkpoint folder")


def train(args: argparse.Namespace) -> int:
    """Run (or resume) training as ``args`` says; return the last step trained."""
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    data = CharData(make_corpus(), args.seed)
    model = CharMLP(data.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.01)
    eval_inputs, eval_targets = data.eval_batch()
    max_norm = args.grad_clip if args.grad_clip > 0 else math.inf

    def restore(path: Path) -> int:
        state = load_checkpoint(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        return int(state["step"]) + 1

    start = restore(args.resume_from) if args.resume_from is not None else 1
    last = args.steps if args.stop_at is None else min(args.steps, args.stop_at)
    fault_steps = range(args.fault_step, args.fault_step + args.fault_steps)

    config: dict[str, Any] = {k: (str(v) if isinstance(v, Path) else v)
                              for k, v in vars(args).items()}
    config.update(model="char-mlp", context=CONTEXT, vocab_size=data.vocab_size,
                  parameters=sum(p.numel() for p in model.parameters()), start_step=start,
                  # the schedule scheduled_lr follows, declared so runwatch can check the LR
                  lr_schedule={"type": "cosine_with_min_lr", "peak_lr": args.lr * args.lr_scale,
                               "warmup_steps": args.warmup, "total_steps": args.steps,
                               "min_lr_ratio": MIN_LR_RATIO})

    with RunLogger(args.run_dir, total_steps=args.steps, config=config,
                   step=start - 1 if args.resume_from is not None else None) as logger:
        step = start
        while step <= last:
            skipped = args.skip_batches is not None and (
                args.skip_batches[0] <= step <= args.skip_batches[1])
            if skipped:
                # a value, not only an event: the step is visible to readers, so a resumed
                # attempt that starts by skipping is seen going back at once
                logger.log(step, event="skipped_batch", skipped_batches=1)
            else:
                fault = args.fault if step in fault_steps else "none"
                lr = scheduled_lr(step, args) * args.lr_scale
                if fault == "lr":
                    lr *= args.fault_scale
                for group in optimizer.param_groups:
                    group["lr"] = lr
                inputs, targets = data.batch(step, args.batch_size,
                                             corrupt=fault == "bad_batch")
                started = time.perf_counter()
                logits = model(inputs, nan_embedding=fault == "nan")
                loss = F.cross_entropy(logits, targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                # A non-finite loss or gradient would poison the weights and Adam's moments:
                # skip this update so the run can go on (and the spike stays visible).
                if torch.isfinite(loss) and torch.isfinite(grad_norm):
                    optimizer.step()
                elapsed = time.perf_counter() - started
                metrics: dict[str, float] = {
                    "loss": loss.item(),
                    "learning_rate": lr,
                    "grad_norm": grad_norm.item(),
                    "tokens_per_sec": args.batch_size * CONTEXT / elapsed,
                }
                if step % args.eval_every == 0 or step == last:
                    with torch.no_grad():
                        eval_loss = F.cross_entropy(model(eval_inputs), eval_targets).item()
                    metrics["eval_loss"] = eval_loss
                    print(f"step {step:5d}  loss {metrics['loss']:.4f}  eval {eval_loss:.4f}"
                          f"  lr {lr:.2e}", flush=True)
                logger.log(step, **metrics)
            if step % args.checkpoint_every == 0 or step == last:
                logger.checkpoint(step, {
                    "step": step,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    "config": config,
                })
            if args.step_delay:
                time.sleep(args.step_delay)
            # runwatch's control requests, between steps (the `control` action backend)
            request = logger.control(step)
            if request is not None and request.action == "stop":
                logger.acknowledge(request, "done", step, f"stopped after step {step}")
                return step
            if request is not None:
                step = restore(request.checkpoint_path(args.run_dir))
                args.skip_batches = request.skip_batches
                args.lr_scale = request.lr_scale or 1.0
                config.update(skip_batches=args.skip_batches, lr_scale=args.lr_scale,
                              start_step=step)
                config["lr_schedule"]["peak_lr"] = args.lr * args.lr_scale
                logger.start_attempt(total_steps=args.steps, config=config, step=step)
                logger.acknowledge(request, "done", step - 1,
                                   f"rolled back in-process to step {step - 1}; resuming at "
                                   f"{step}" + (f", skipping batches {args.skip_batches[0]}–"
                                                f"{args.skip_batches[1]}"
                                                if args.skip_batches else ""))
                continue
            step += 1
    return max(last, start - 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    last = train(args)
    print(f"done at step {last}; logs in {args.run_dir / 'metrics.jsonl'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
