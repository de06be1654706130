"""The seeded, labelled synthetic suite of `runwatch bench detect`: base curves
``c + a·(S1 + t0)^-b − C·S2`` (``S1`` the LR area, ``S2`` its annealing area: the LR-annealing
scaling law of Tissue et al. 2024) under warmup+cosine, linear and warmup-stable-decay
schedules, AR(1) Student-t noise whose size changes over the run, every signal injected at
several strengths with its onset labelled, and negative controls that must stay quiet.
:mod:`benchmarks.detect` scores detectors on it; :mod:`benchmarks.bound` computes what an
oracle could reach on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzers import Checkpoint, RunData

CAPACITY_GB = 80.0
# Signals whose unit of delay is the evaluation; the others count logged points, but for
# checkpoint_gap, whose series is the saves: it counts save intervals. The delay
# target for a periodic series (evaluations, saves) is 3 of its periods; for a step-level
# series, 2% of the run.
EVAL_SIGNALS = frozenset({"overfit", "diminishing_returns", "forgetting", "business_flat",
                          "reward_hacking", "repetition", "role_confusion", "over_refusal"})
PERIODIC_UNITS = {**{s: "evals" for s in EVAL_SIGNALS}, "checkpoint_gap": "saves"}
STRENGTHS = ("weak", "medium", "strong")
NEGATIVE_CONTROLS = ("healthy_cosine", "healthy_wsd", "lr_anneal", "eval_ckpt_slowdowns",
                     "resumed", "noisy_small_batch", "near_zero_per_batch", "multi_epoch",
                     "general_suite_noise", "business_tracks_loss", "rl_healthy",
                     "eval_pauses_live", "finished", "generations_diverse",
                     "generations_markers")


@dataclass(frozen=True)
class Event:
    """One labelled event: the signal, its onset step and how late a detection may come."""

    signal: str
    onset: int
    tolerance: int
    variant: str = ""
    strength: str = ""
    unit: int = 1  # steps per unit of delay (a logged point, or an evaluation)
    reason: str = ""


@dataclass
class Case:
    """A run with its labels. ``allowed`` maps a signal to the stretches of steps
    ``[start, end)`` in which a detection of it is true (a consequence of an injected event
    from its onset on, or a healthy run's convergence): the first detection in each
    stretch is not scored, a later one in the same stretch is a false positive."""

    name: str
    data: RunData
    events: list[Event]
    steps: int
    negative: bool = False
    allowed: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


# The end of a stretch that lasts to the end of the run.
FOREVER = 10**12


def _runs(flags: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first index of each run of true ``flags`` and the index just past its end."""
    flags = np.asarray(flags, dtype=bool)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flags.astype(np.int8), [0]))))
    return edges[::2], edges[1::2]


def _stretches(flags: np.ndarray, steps: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` in steps of each run of true ``flags`` (``end``: the step of the
    first false flag after it, or FOREVER)."""
    return [(int(steps[a]), int(steps[b]) if b < len(steps) else FOREVER)
            for a, b in zip(*_runs(flags), strict=True)]


@dataclass(frozen=True)
class Detection:
    signal: str
    step: int


# --------------------------------------------------------------------------- generator

@dataclass(frozen=True)
class _Profile:
    name: str
    steps: int
    log_every: int
    eval_every: int
    ckpt_every: int
    start_excess: tuple[float, float]  # loss at step 0 above its floor
    floor: tuple[float, float]
    noise: tuple[float, float]  # relative noise of one logged point


PROFILES = (
    _Profile("pretrain", 20_000, 10, 500, 1000, (6.0, 8.0), (1.8, 2.6), (0.006, 0.02)),
    _Profile("finetune", 3_000, 1, 100, 500, (0.8, 2.0), (0.3, 1.5), (0.02, 0.05)),
    _Profile("long", 100_000, 50, 2000, 5000, (6.0, 8.0), (1.8, 2.6), (0.004, 0.012)),
)


@dataclass
class _Run:
    """A synthetic run at its logged resolution; injections edit it before it is built."""

    profile: _Profile
    steps: np.ndarray  # logged steps
    lr: np.ndarray
    progress: np.ndarray  # the loss law's S1 at each logged step (the LR area, in steps)
    anneal: np.ndarray  # its S2
    law: tuple[float, float, float, float, float]  # a, b, c, t0, anneal coefficient
    noise: np.ndarray  # relative noise of each logged loss
    noise_model: tuple[np.ndarray, float]  # its standard deviation per point, AR(1) coefficient
    eval_gap: float
    eval_noise: np.ndarray  # per evaluation
    grad_norm: np.ndarray
    grad_noise: tuple[float, float]  # the log grad norm's noise: standard deviation, AR(1)
    throughput: np.ndarray
    gpu_mem: np.ndarray
    config: dict[str, Any]
    checkpoints: list[int]
    extra_loss: np.ndarray  # added to the clean loss (oscillation, resume bumps)
    extra_eval: np.ndarray | None = None  # replaces the clean eval curve where finite
    meta: dict[str, Any] = field(default_factory=dict)
    loss_override: np.ndarray | None = None  # a whole logged loss series, noise included
    # Further series (tag → values at their steps): eval suites, RL reward and KL.
    extra: dict[str, pd.Series] = field(default_factory=dict)
    generations: list[dict[str, Any]] | None = None  # logged sample generations
    wall: np.ndarray | None = None  # wall time of each logged step, seconds
    now: float | None = None  # the time of a live watcher's poll
    cut: int | None = None  # the last step logged (a run that stopped); None: all

    @property
    def eval_steps(self) -> np.ndarray:
        every = self.profile.eval_every
        return np.arange(every, int(self.steps[-1]) + 1, every)

    def clean_loss(self, steps: np.ndarray | None = None) -> np.ndarray:
        a, b, c, t0, coef = self.law
        if steps is None:
            return c + a * (self.progress + t0) ** -b - coef * self.anneal + self.extra_loss
        idx = np.searchsorted(self.steps, steps)
        return (c + a * (self.progress[idx] + t0) ** -b - coef * self.anneal[idx]
                + self.extra_loss[idx])

    def clean_eval(self) -> np.ndarray:
        base = self.clean_loss(self.eval_steps) * (1 + self.eval_gap)
        if self.extra_eval is not None:
            base = np.where(np.isfinite(self.extra_eval), self.extra_eval, base)
        return base

    def loss(self) -> np.ndarray:
        if self.loss_override is not None:
            return self.loss_override
        return self.clean_loss() * np.exp(self.noise)

    def last_step(self) -> int:
        return int(self.steps[-1]) if self.cut is None else min(self.cut, int(self.steps[-1]))

    def build(self, name: str, *, attempt_from: int = 0) -> RunData:
        end = self.last_step()
        keep = (self.steps > attempt_from) & (self.steps <= end)
        evals = self.eval_steps
        eval_keep = (evals > attempt_from) & (evals <= end)
        eval_loss = self.clean_eval() * (1 + self.eval_noise[:len(evals)])
        series: dict[str, Any] = {
            "train/loss": pd.Series(self.loss()[keep], index=self.steps[keep]),
            "lr": pd.Series(self.lr[keep], index=self.steps[keep]),
            "grad_norm": pd.Series(self.grad_norm[keep], index=self.steps[keep]),
            "throughput": pd.Series(self.throughput[keep], index=self.steps[keep]),
            "gpu_mem": pd.Series(self.gpu_mem[keep], index=self.steps[keep]),
            "eval/loss": pd.Series(eval_loss[eval_keep], index=evals[eval_keep]),
        }
        series.update({tag: s[s.index > attempt_from] for tag, s in self.extra.items()})
        last = int(self.steps[keep][-1]) if keep.any() else 0
        series = {tag: s[s.index <= last] for tag, s in series.items()}
        checkpoints = [Checkpoint(int(s), f"ckpt/checkpoint-{s}") for s in self.checkpoints
                       if s <= last]
        meta = {"config": self.config, "gpu_mem_total": CAPACITY_GB,
                "total_steps": self.profile.steps, **self.meta}
        rows = None if self.generations is None else [
            g for g in self.generations if attempt_from < g["step"] <= last]
        data = RunData.from_series(name, series, checkpoints=checkpoints, meta=meta,
                                   generations=rows, now=self.now)
        if self.wall is not None:
            data.metrics["wall_time"] = np.interp(data.metrics["step"].to_numpy(dtype=float),
                                                  self.steps, self.wall)
        if attempt_from:
            data.attempt = 2
        return data

    def point(self, fraction: float) -> int:
        """Index of the logged point at ``fraction`` of the run."""
        return int(np.searchsorted(self.steps, fraction * self.profile.steps))


def _ar1(rng: np.random.Generator, n: int, phi: float, df: float = 5.0) -> np.ndarray:
    """AR(1) noise of unit variance with Student-t innovations (real losses have fat tails)."""
    shocks = rng.standard_t(df, n) / math.sqrt(df / (df - 2))
    out = np.empty(n)
    scale = math.sqrt(1 - phi * phi)
    level = shocks[0]
    for i in range(n):
        level = phi * level + scale * shocks[i] if i else shocks[0]
        out[i] = level
    return out


def _schedule(kind: str, steps: np.ndarray, total: int, warmup: int, decay: int
              ) -> np.ndarray:
    """The LR as a share of its peak, as Hugging Face's schedulers compute it."""
    s = steps.astype(float)
    warm = s / max(1, warmup)
    if kind == "cosine":
        progress = (s - warmup) / max(1, total - warmup)
        after = 0.5 * (1 + np.cos(np.pi * progress))
    elif kind == "linear":
        after = np.maximum(0.0, (total - s) / max(1, total - warmup))
    else:  # warmup-stable-decay, linear decay to zero over the last ``decay`` steps
        after = np.clip((total - s) / max(1, decay), 0.0, 1.0)
    return np.where(s < warmup, warm, after)


def _config(kind: str, peak: float, warmup: int, total: int, decay: int, eval_every: int,
            save_every: int) -> dict[str, Any]:
    """The run's Hugging Face TrainingArguments: its schedule, evaluations and saves."""
    config: dict[str, Any] = {"learning_rate": peak, "lr_scheduler_type": kind,
                              "warmup_steps": warmup, "max_steps": total,
                              "eval_strategy": "steps", "eval_steps": eval_every,
                              "save_strategy": "steps", "save_steps": save_every}
    if kind == "wsd":
        config.update(lr_scheduler_type="warmup_stable_decay",
                      lr_scheduler_kwargs={"num_decay_steps": decay, "decay_type": "linear"})
    return config


def _annealing(drops: np.ndarray, log_every: int) -> np.ndarray:
    """The loss law's S2, the annealing area, at each logged point from the drops of the
    LR (a share of its peak) in each logged stretch: momentum 0.999 per step."""
    momentum = np.empty(len(drops))
    carry, keep = 0.0, 0.999 ** log_every
    for i, d in enumerate(drops):
        carry = keep * carry + d
        momentum[i] = carry
    return np.cumsum(momentum) * log_every


def base_run(rng: np.random.Generator, profile: _Profile, schedule: str = "cosine", *,
             noise_scale: float = 1.0, anneal_gain: float | None = None) -> _Run:
    """A healthy run: the loss law under the LR schedule, with changing AR(1) noise, and
    healthy grad norm, throughput (slow at evaluations and checkpoints) and memory."""
    p = profile
    steps = np.arange(p.log_every, p.steps + 1, p.log_every)
    n = len(steps)
    warmup = int(p.steps * rng.uniform(0.01, 0.04))
    decay = int(p.steps * rng.uniform(0.1, 0.2))
    peak = float(rng.choice([1e-4, 3e-4, 6e-4, 2e-5]))
    every_step = np.arange(1, p.steps + 1)
    factor = _schedule(schedule, every_step, p.steps, warmup, decay)
    area = np.cumsum(factor)
    drops = np.maximum(0.0, -np.diff(factor, prepend=factor[0]))
    # S2: the annealing area, momentum 0.999 per step (taken per logged point here).
    anneal = _annealing(np.add.reduceat(drops, np.arange(0, p.steps, p.log_every))[:n],
                        p.log_every)
    progress = area[steps - 1]
    b = rng.uniform(0.3, 0.55)
    t0 = rng.uniform(20, 100) * (p.log_every / 10 if p.log_every > 1 else 0.5)
    c = rng.uniform(*p.floor)
    a = rng.uniform(*p.start_excess) * t0**b
    end = c + a * (progress[-1] + t0) ** -b
    gain = rng.uniform(0.02, 0.05) if anneal_gain is None else anneal_gain
    coef = gain * end / max(anneal[-1], 1e-9)
    sigma = rng.uniform(*p.noise) * noise_scale
    drift = np.linspace(rng.uniform(1.0, 2.0), rng.uniform(0.5, 1.0), n)  # noise shrinks
    phi = rng.uniform(0.2, 0.7)
    noise = sigma * drift * _ar1(rng, n, phi)
    evals = np.arange(p.eval_every, p.steps + 1, p.eval_every)
    eval_noise = rng.uniform(0.001, 0.004) * rng.standard_normal(len(evals))
    t = steps / p.steps
    grad_level = rng.uniform(0.2, 2.0) * (1 + 5 * np.exp(-t / 0.02))
    grad_sigma = rng.uniform(0.05, 0.2)
    grad_norm = grad_level * np.exp(grad_sigma * _ar1(rng, n, 0.5))
    speed = rng.uniform(2e4, 2e5) * np.exp(rng.uniform(0.01, 0.04) * _ar1(rng, n, 0.3))
    speed[:5] *= 0.3  # compilation, first data-loader fill
    after_eval = np.searchsorted(steps, evals[evals < p.steps] + 1)
    speed[after_eval[after_eval < n]] *= rng.uniform(0.2, 0.5)
    ckpts = list(range(p.ckpt_every, p.steps + 1, p.ckpt_every))
    after_ckpt = np.searchsorted(steps, np.asarray(ckpts) + 1)
    speed[after_ckpt[after_ckpt < n]] *= rng.uniform(0.3, 0.6)
    mem = CAPACITY_GB * rng.uniform(0.55, 0.85) + 0.3 * rng.standard_normal(n)
    return _Run(p, steps, peak * factor[steps - 1], progress, anneal, (a, b, c, t0, coef),
                noise, (sigma * drift, phi), rng.uniform(0.01, 0.05), eval_noise, grad_norm,
                (grad_sigma, 0.5), speed, mem,
                _config(schedule, peak, warmup, p.steps, decay, p.eval_every, p.ckpt_every),
                ckpts, np.zeros(n))


def _profile_for(rng: np.random.Generator, i: int) -> _Profile:
    return PROFILES[i % len(PROFILES)]


def _schedule_for(rng: np.random.Generator) -> str:
    return str(rng.choice(["cosine", "cosine", "linear", "wsd"]))


# --------------------------------------------------------------------------- injections
# Each takes a base run, a strength and the random generator, edits the run and returns
# its events and the signals allowed from their onset.

Injected = tuple[list[Event], dict[str, int]]


def _inject_spike(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """Two loss spikes: a jump of ×1.75 / ×2.5 / ×6 that decays over 1–10 points."""
    ratio = {"weak": 1.75, "medium": 2.5, "strong": 6.0}[strength]
    n = len(run.steps)
    override = run.loss().copy()
    clean = run.clean_loss()
    events = []
    for lo, hi in ((0.2, 0.5), (0.55, 0.9)):
        at = int(rng.integers(run.point(lo), run.point(hi)))
        length = int(rng.choice([1, 3, 10]))
        shape = ratio ** np.exp(-np.arange(length) / max(1.0, length / 3))
        end = min(n, at + length)
        override[at:end] = clean[at:end] * shape[:end - at] * np.exp(run.noise[at:end])
        events.append(Event("spike", int(run.steps[at]), 2 * run.profile.log_every,
                            "finite", strength, run.profile.log_every,
                            f"loss x{ratio} for {length} points"))
    run.loss_override = override
    return events, {}


def _inject_sustained_spike(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """The training loss jumps ×1.75 / ×2.5 / ×6 and stays there for 20–60 points before it
    works its way back over 10–30 more (a shard of bad data: the batches are hard, the
    model's eval loss is not hurt): the case llm-foundry's ``KillLossSpike`` is made for.
    Tolerance 10 points: the trouble lasts at least twice that."""
    ratio = {"weak": 1.75, "medium": 2.5, "strong": 6.0}[strength]
    at = int(rng.integers(run.point(0.3), run.point(0.7)))
    hold = int(rng.integers(20, 61))
    k = np.arange(len(run.steps)) - at
    back = np.exp(-np.maximum(k - hold, 0) / rng.uniform(10, 30))
    run.loss_override = run.loss() * np.where(k >= 0, 1 + (ratio - 1) * back, 1.0)
    log = run.profile.log_every
    return [Event("spike", int(run.steps[at]), 10 * log, "sustained", strength, log,
                  f"loss x{ratio} for {hold} points")], {}


def _inject_nonfinite(run: _Run, variant: str, rng: np.random.Generator) -> Injected:
    """A single NaN, a single +Inf, or NaN from then on (a diverged run)."""
    override = run.loss().copy()
    at = int(rng.integers(run.point(0.1), run.point(0.95)))
    if variant == "nan":
        override[at] = np.nan
    elif variant == "inf":
        override[at] = np.inf
    else:
        override[at:] = np.nan
    run.loss_override = override
    return [Event("spike", int(run.steps[at]), 0, "nan/inf", variant, run.profile.log_every,
                  f"{variant} at one logged point")], {}


def _freeze(run: _Run, at: int, keep: float) -> None:
    """From logged point ``at`` the loss law only advances ``keep`` of its normal pace."""
    later = run.progress[at:] - run.progress[at]
    run.progress[at:] = run.progress[at] + keep * later
    run.anneal[at:] = run.anneal[at] + keep * (run.anneal[at:] - run.anneal[at])


def _draw_before(rng: np.random.Generator, lo: int, hi: int, limit: int) -> int:
    """A position in ``[lo, hi)`` and before ``limit`` (where the clean curve meets the
    analyzer's rule by itself: an event from there would have no onset); in the first half
    of the stretch before ``limit`` when that comes before ``lo``."""
    hi = min(hi, limit)
    lo = lo if hi > lo else hi // 2
    return int(rng.integers(lo, max(lo + 1, hi)))


def _inject_plateau(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """The training loss stops falling: its law advances at 30% / 10% / 0% of its pace,
    from a point between 30% and 60% of the run where the clean loss is not yet flat by
    ``plateau``'s own definition (a stall on a loss already flat has no onset; where it is
    flat before 30%, from the first half of the stretch before that)."""
    keep = {"weak": 0.3, "medium": 0.1, "strong": 0.0}[strength]
    at = _draw_before(rng, run.point(0.3), run.point(0.6),
                      int(np.searchsorted(run.steps, _first(_flat(run)))))
    _freeze(run, at, keep)
    onset = int(run.steps[at])
    tolerance = int(0.2 * run.profile.steps)
    return ([Event("plateau", onset, tolerance, "flat", strength, run.profile.log_every,
                   f"loss law at {keep:.0%} pace")],
            {"diminishing_returns": onset})


def _inject_grad_spike(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    ratio = {"weak": 6.0, "medium": 12.0, "strong": 50.0}[strength]
    at = int(rng.integers(run.point(0.2), run.point(0.9)))
    run.grad_norm[at] *= ratio
    return [Event("grad_norm", int(run.steps[at]), 2 * run.profile.log_every, "spike",
                  strength, run.profile.log_every, f"grad norm x{ratio}")], {}


def _inject_grad_climb(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    rise = {"weak": 4.0, "medium": 8.0, "strong": 30.0}[strength]
    at = int(rng.integers(run.point(0.3), run.point(0.6)))
    span = len(run.steps) - at
    run.grad_norm[at:] *= rise ** (np.arange(span) / span)
    return [Event("grad_norm", int(run.steps[at]), int(0.2 * run.profile.steps), "climb",
                  strength, run.profile.log_every, f"grad norm x{rise} by the end")], {}


def _inject_throughput(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    drop = {"weak": 0.35, "medium": 0.5, "strong": 0.75}[strength]
    at = int(rng.integers(run.point(0.2), run.point(0.8)))
    end = min(len(run.steps), at + int(rng.integers(100, 400)))
    run.throughput[at:end] *= 1 - drop
    return [Event("throughput_drop", int(run.steps[at]), 20 * run.profile.log_every, "drop",
                  strength, run.profile.log_every, f"{drop:.0%} slower")], {}


def _inject_memory(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """Memory creeps up to 96% / 98% / 100% of capacity; the label is the first logged
    reading at 95% or more."""
    top = {"weak": 0.965, "medium": 0.98, "strong": 1.0}[strength] * CAPACITY_GB
    start = int(rng.integers(run.point(0.2), run.point(0.5)))
    reach = int(rng.integers(run.point(0.6), run.point(0.9)))
    base = float(np.median(run.gpu_mem[:start]))
    creep = np.interp(np.arange(len(run.steps)), [start, reach], [base, top])
    clean = np.where(np.arange(len(run.steps)) >= start, creep, base)
    run.gpu_mem = np.minimum(clean + (run.gpu_mem - base) * 0.3, CAPACITY_GB)
    near = int(np.flatnonzero(run.gpu_mem >= 0.95 * CAPACITY_GB)[0])
    return [Event("memory", int(run.steps[near]), 10 * run.profile.log_every, "near capacity",
                  strength, run.profile.log_every, f"creeps to {top:.1f} of {CAPACITY_GB}")], {}


def _inject_oom(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    at = int(rng.integers(run.point(0.3), run.point(0.9)))
    keep = run.steps <= run.steps[at]
    for name in ("steps", "lr", "progress", "anneal", "noise", "grad_norm", "throughput",
                 "gpu_mem", "extra_loss"):
        setattr(run, name, getattr(run, name)[keep])
    run.gpu_mem[-5:] = np.linspace(run.gpu_mem[-6], CAPACITY_GB * 0.99, 5)
    run.meta["status"] = "failed: torch.OutOfMemoryError: CUDA out of memory"
    return [Event("memory", int(run.steps[at]), 0, "oom", strength, run.profile.log_every,
                  "the run died out of memory")], {}


def _inject_checkpoint_gap(run: _Run, strength: str, rng: np.random.Generator
                           ) -> Injected:
    """Saves stop (a full disk, a broken save hook) after a random checkpoint. The strength
    sets the save interval (half, once or twice the profile's; the gap is longer, not
    worse), at most an eighth of the run; at least two saves come before the stop (the
    run's interval is known) and the run goes on past the stop for longer than the
    default limit (three intervals, at least 1,000 steps) and one interval more, so the
    gap can be seen."""
    every = {"weak": 0.5, "medium": 1.0, "strong": 2.0}[strength]
    interval = max(1, min(int(run.profile.ckpt_every * every), run.profile.steps // 8))
    run.checkpoints = list(range(interval, run.profile.steps + 1, interval))
    run.config["save_steps"] = interval
    room = run.profile.steps - max(3 * interval, 1000) - interval
    usable = [i for i, step in enumerate(run.checkpoints) if i >= 1 and step <= room]
    lo, hi = usable[len(usable) // 4], usable[max(len(usable) // 2, len(usable) // 4 + 1) - 1]
    last = int(rng.integers(lo, hi + 1))
    stopped = run.checkpoints[last]
    run.checkpoints = run.checkpoints[:last + 1]
    onset = stopped + interval  # the first save that did not happen
    first_logged = int(run.steps[np.searchsorted(run.steps, onset)])
    return [Event("checkpoint_gap", first_logged, max(3 * interval, 1000), "stopped saving",
                  strength, interval,
                  f"saves every {interval} steps stop after {stopped}")], {}


def _inject_overfit(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """From an evaluation on, the eval loss climbs 0.3% / 0.6% / 1.5% per evaluation while
    the training loss keeps falling; the label is the first evaluation past the clean eval
    curve's minimum."""
    rate = {"weak": 0.003, "medium": 0.006, "strong": 0.015}[strength]
    evals = run.eval_steps
    start = int(rng.integers(len(evals) // 4, len(evals) - 14))
    clean = run.clean_eval()
    since = np.maximum(0, np.arange(len(evals)) - start)
    run.extra_eval = clean * (1 + rate * since)
    best = int(np.argmin(run.extra_eval))
    onset = int(evals[min(best + 1, len(evals) - 1)])
    every = run.profile.eval_every
    if best >= len(evals) - 3:
        # The rise never overcomes the falling curve: no turn to label. The eval loss stalls
        # while the gap to the train loss widens from the start, which SIGNALS.md's overfit
        # also names ("val loss stalls or rises; the gap widens"): a finding from the start
        # is neither counted for nor against.
        began = int(evals[start])
        return [], {"overfit": began, "diminishing_returns": onset}
    return ([Event("overfit", onset, 10 * every, "eval rises", strength, every,
                   f"eval loss +{rate:.1%} per evaluation")],
            {"diminishing_returns": onset})


def _inject_diminishing(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """The eval loss converges: from a point it improves at 20% / 5% / 0% of its pace. The
    point lies between a third and two thirds of the evaluations, before the clean curve
    meets the stop-loss rule by itself (a run that has converged already has no onset; where
    it does before a third, in the first half of the evaluations before that)."""
    keep = {"weak": 0.2, "medium": 0.05, "strong": 0.0}[strength]
    evals = run.eval_steps
    converged = int(np.searchsorted(evals, _first(_converged(run))))
    start = _draw_before(rng, len(evals) // 3, 2 * len(evals) // 3, converged - 1)
    clean = run.clean_eval()
    run.extra_eval = np.where(np.arange(len(evals)) > start,
                              clean[start] + keep * (clean - clean[start]), clean)
    every = run.profile.eval_every
    onset = int(evals[start + 1])
    # The eval stalls while the train loss keeps falling: SIGNALS.md's overfit ("val loss
    # stalls or rises; the gap widens") is a fair reading too.
    return [Event("diminishing_returns", onset, 12 * every, "converged", strength, every,
                  f"eval improves at {keep:.0%} of its pace")], {"overfit": onset}


def _inject_lr(run: _Run, variant: str, rng: np.random.Generator) -> Injected:
    """The logged LR leaves the declared schedule: stuck at its peak after warmup (003 §5.2
    case 1), doubled, 5% high, or a restarted decay."""
    peak = run.config["learning_rate"]
    warmup = run.config["warmup_steps"]
    expected = run.lr.copy()
    actual = expected.copy()
    after = run.steps >= warmup
    at = int(rng.integers(run.point(0.2), run.point(0.7)))
    if variant == "constant":
        actual[after] = peak
    elif variant == "doubled":
        actual[at:] *= 2.0
    elif variant == "5% high":
        actual[at:] *= 1.05
    else:  # restarted: the decay starts over from the peak
        actual[at:] = peak * _schedule("cosine", run.steps[at:] - run.steps[at] + warmup,
                                       run.profile.steps - int(run.steps[at]) + warmup,
                                       warmup, 0)
    run.lr = actual
    # The loss follows the LR it got: the law's S1 (LR area) and S2 (annealing) change by
    # what the change adds (a higher LR: faster progress, an LR that rises again undoes
    # some annealing; a stuck LR never anneals).
    change = (actual - expected) / peak
    run.progress = run.progress + np.cumsum(change) * run.profile.log_every
    run.anneal = run.anneal + _annealing(-np.diff(change, prepend=0.0), run.profile.log_every)
    off = np.abs(actual - expected) > 0.01 * np.maximum(expected, 0.05 * peak)
    first = int(np.flatnonzero(off & after)[0])
    log = run.profile.log_every
    return [Event("lr_schedule", int(run.steps[first]), 3 * log, variant, variant, log,
                  "logged LR leaves the declared schedule")], {}


def _inject_oscillation(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """A periodic swing of 2% / 4% / 8% of the loss, period 10–60 logged points."""
    amplitude = {"weak": 0.02, "medium": 0.04, "strong": 0.08}[strength]
    period = int(rng.choice([10, 25, 60]))
    at = int(rng.integers(run.point(0.3), run.point(0.6)))
    clean = run.clean_loss()
    k = np.arange(len(run.steps)) - at
    run.extra_loss += np.where(k >= 0, amplitude * clean * np.sin(2 * np.pi * k / period), 0.0)
    log = run.profile.log_every
    # The swing reaches the eval loss too: on its down-swings the evaluations stop improving
    # by the stop-loss rule's reading (a bounce back is no progress), so a
    # diminishing_returns finding after the onset is the rule at work, whichever phase the
    # evaluations sample (the clean curve's own stretches hang on that phase).
    return ([Event("oscillation", int(run.steps[at]), 12 * period * log, f"period {period}",
                   strength, log, f"±{amplitude:.0%} every {period} points")],
            {"diminishing_returns": int(run.steps[at])})


# --- cross-metric, time and text signals: the series they read are added to the base run.

def _eval_series(run: _Run, values: np.ndarray) -> pd.Series:
    return pd.Series(values, index=run.eval_steps[:len(values)])


def _eval_start(run: _Run, rng: np.random.Generator, tail: int = 14) -> int:
    """An evaluation index from a quarter of the run on, leaving ``tail`` evaluations."""
    n = len(run.eval_steps)
    return int(rng.integers(n // 4, max(n // 4 + 1, n - tail)))


# A general suite's relative noise per evaluation; forgetting's fall per evaluation and depth.
GENERAL_NOISE = (0.003, 0.01)
FORGETTING = {"weak": (0.005, 0.04), "medium": (0.01, 0.08), "strong": (0.03, 0.2)}
FORGETTING_TOLERANCE = 10  # evaluations


def _general_suite(run: _Run, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """A general-ability accuracy that holds its level (drifting at most ±0.5% over the
    run) and its relative noise per evaluation (0.3–1%)."""
    n = len(run.eval_steps)
    level = rng.uniform(0.4, 0.7) * (1 + np.linspace(0, rng.uniform(-0.005, 0.005), n))
    return level, float(rng.uniform(*GENERAL_NOISE))


def _add_general(run: _Run, rng: np.random.Generator, clean: np.ndarray, sigma: float) -> None:
    """``eval/general/accuracy`` from its clean curve, and a second general tag that only
    wobbles; the domain eval is the base run's ``eval/loss``, which improves."""
    n = len(clean)
    run.extra["eval/general/accuracy"] = _eval_series(
        run, clean * (1 + sigma * rng.standard_normal(n)))
    other, other_sigma = _general_suite(run, rng)
    run.extra["eval/general/reasoning"] = _eval_series(
        run, other * (1 + other_sigma * rng.standard_normal(n)))


def _inject_forgetting(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """The general suite's accuracy falls 0.5% / 1% / 3% of its level per evaluation, down
    to 4% / 8% / 20% below it, while the domain eval (``eval/loss``) keeps improving; the
    label is the first evaluation below the level."""
    rate, depth = FORGETTING[strength]
    clean, sigma = _general_suite(run, rng)
    start = _eval_start(run, rng)
    since = np.maximum(0, np.arange(len(clean)) - start)
    _add_general(run, rng, clean * (1 - np.minimum(depth, rate * since)), sigma)
    every = run.profile.eval_every
    onset = int(run.eval_steps[start + 1])
    return [Event("forgetting", onset, FORGETTING_TOLERANCE * every, "general drops",
                  strength, every,
                  f"general accuracy -{rate:.1%} per evaluation, to -{depth:.0%}")], {}


def _business(run: _Run, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """A business pass rate that improves with the eval loss: ``p_end·(L_end / L)^k``, so
    a fall of the loss by x% lifts it by about k·x% (k 1.5–3); relative noise 0.3–0.8%."""
    loss = run.clean_eval()
    k = rng.uniform(1.5, 3.0)
    return rng.uniform(0.4, 0.8) * (loss[-1] / loss) ** k, float(rng.uniform(0.003, 0.008))


def _inject_business_flat(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """From an evaluation on, the business metric improves at 10% of its pace with the
    loss (weak), stays flat (medium) or falls 0.3% per evaluation (strong), while the loss
    keeps falling; the label is the first evaluation after the break. The break is placed
    where the noise-free training loss still falls 4% or more over the next five
    evaluations (the signal is a business metric that stops *while the loss improves*);
    where no evaluation of the run's first half does, at the steepest one."""
    clean, sigma = _business(run, rng)
    n = len(clean)
    loss = run.clean_loss(run.eval_steps)
    lo, hi = max(2, n // 4), max(3, n // 2)
    fall = 1 - loss[lo + 5:hi + 5] / loss[lo:hi]
    steep = np.flatnonzero(fall >= 0.04)
    start = lo + (int(rng.choice(steep)) if steep.size else int(np.argmax(fall)))
    k = np.arange(n)
    if strength == "strong":
        broken = clean[start] * (1 - 0.003 * (k - start))
    else:
        keep = 0.1 if strength == "weak" else 0.0
        broken = clean[start] * (clean / clean[start]) ** keep
    values = np.where(k > start, broken, clean) * (1 + sigma * rng.standard_normal(n))
    run.extra["eval/business/pass_rate"] = _eval_series(run, values)
    every = run.profile.eval_every
    what = {"weak": "improves at 10% of its pace", "medium": "flat",
            "strong": "falls 0.3% per evaluation"}[strength]
    return [Event("business_flat", int(run.eval_steps[start + 1]), 12 * every, "flat",
                  strength, every, f"business metric {what} while the loss falls")], {}


def _rl(run: _Run, rng: np.random.Generator, *, kl_flat: bool = False
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """An RL run: the reward rises (logarithmically) with noise, the KL to the reference
    grows as t^0.6 (or settles after 10% of the run under a strong KL penalty), the judged
    eval improves and saturates; returns the clean reward, KL, judged eval and its
    relative noise."""
    t = run.steps / run.profile.steps
    size = rng.uniform(1.0, 3.0)
    reward = rng.uniform(-0.5, 0.5) + size * np.log1p(20 * t) / math.log(21)
    kl_top = rng.uniform(2.0, 10.0)
    kl = kl_top * (np.minimum(t, 0.1) / 0.1 if kl_flat else t ** 0.6)
    te = run.eval_steps / run.profile.steps
    judge = rng.uniform(5.0, 7.0) + rng.uniform(0.3, 1.0) * (
        1 - np.exp(-te / rng.uniform(0.05, 0.2)))
    return reward, kl, judge, float(rng.uniform(0.003, 0.008))


def _add_rl(run: _Run, rng: np.random.Generator, reward: np.ndarray, kl: np.ndarray,
            judge: np.ndarray, sigma: float) -> None:
    n = len(run.steps)
    spread = float(np.ptp(reward)) or 1.0
    run.extra["reward"] = pd.Series(
        reward + spread * rng.uniform(0.05, 0.15) * rng.standard_normal(n), index=run.steps)
    run.extra["kl"] = pd.Series(
        kl * (1 + rng.uniform(0.03, 0.08) * rng.standard_normal(n)), index=run.steps)
    run.extra["eval/judge/score"] = _eval_series(
        run, judge * (1 + sigma * rng.standard_normal(len(judge))))


def _inject_reward_hacking(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """From an evaluation on, the judged eval falls 0.4% / 1% / 3% per evaluation while
    the reward rises faster and the KL grows faster; the label is the first evaluation
    past the judged eval's clean best."""
    rate = {"weak": 0.004, "medium": 0.01, "strong": 0.03}[strength]
    reward, kl, judge, sigma = _rl(run, rng)
    start = _eval_start(run, rng)
    at = run.eval_steps[start]
    since = np.maximum(0, np.arange(len(judge)) - start)
    judge = judge[np.minimum(np.arange(len(judge)), start)] * (1 - rate * since)
    after = np.maximum(0.0, (run.steps - at) / run.profile.steps)
    reward = reward + float(np.ptp(reward)) * 0.5 * after
    kl = kl + kl[-1] * after
    _add_rl(run, rng, reward, kl, judge, sigma)
    every = run.profile.eval_every
    return [Event("reward_hacking", int(run.eval_steps[start + 1]), 10 * every,
                  "judge falls", strength, every,
                  f"judged eval -{rate:.1%} per evaluation, reward and KL up")], {}


def _wall(run: _Run, rng: np.random.Generator, eval_pause: tuple[float, float]) -> None:
    """Wall times: 0.3–3 s a step with jitter, a pause after each evaluation (drawn once
    per run from ``eval_pause`` seconds, ±10% each time) and 30–180 s per checkpoint."""
    per_step = rng.uniform(0.3, 3.0)
    gaps = np.diff(run.steps, prepend=0) * per_step * np.exp(0.1 * rng.standard_normal(
        len(run.steps)))
    pause = rng.uniform(*eval_pause)
    for marks, length in ((run.eval_steps, pause), (np.asarray(run.checkpoints),
                                                    rng.uniform(30, 180))):
        after = np.searchsorted(run.steps, marks[marks < run.steps[-1]] + 1)
        gaps[after] += length * rng.uniform(0.9, 1.1, len(after))
    run.wall = 1.7e9 + np.cumsum(gaps)


def _inject_stalled(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """The run stops logging (a hang, a dead process) and a live watcher polls 30 min /
    2 h / 12 h later; evaluation pauses of 2–10 min before. The label is the last logged
    step, where the analyzer puts both onset and detection."""
    silence = {"weak": 1800.0, "medium": 7200.0, "strong": 43_200.0}[strength]
    _wall(run, rng, (120.0, 600.0))
    at = int(rng.integers(run.point(0.3), run.point(0.9)))
    run.cut = int(run.steps[at])
    run.now = float(run.wall[at]) + silence
    return [Event("stalled", run.cut, 0, "silent", strength, run.profile.log_every,
                  f"no point for {silence / 3600:g} h")], {}


_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def _words(rng: np.random.Generator, n: int) -> list[str]:
    """Pseudo-words of two or three syllables: varied text with no refusal phrase and no
    role marker in it."""
    count = rng.integers(2, 4, n)
    picks = rng.integers(0, len(_SYLLABLES), (n, 3))
    return ["".join(_SYLLABLES[j] for j in row[:c]) for row, c in zip(picks, count,
                                                                       strict=True)]


def _answer(rng: np.random.Generator) -> str:
    return " ".join(_words(rng, int(rng.integers(30, 60)))) + "."


def _loop(rng: np.random.Generator) -> str:
    """An answer that falls into a loop: a 3–8 word phrase repeated over its last
    50–100%."""
    words = _words(rng, int(rng.integers(30, 60)))
    head = int(len(words) * rng.uniform(0.0, 0.5))
    phrase = words[head:head + int(rng.integers(3, 9))]
    looped = (phrase * len(words))[:len(words) - head]
    return " ".join(words[:head] + looped) + "."


_ROLE_TURNS = ("\nUser: {}", "\n<|im_start|>user\n{}", "\n### Instruction:\n{}",
               "\n[INST] {} [/INST]", "\nHuman: {}", "\n用户：{}")
_REFUSALS = ("I'm sorry, but I can't help with that.", "I cannot provide that information.",
             "As an AI, I am unable to do this.", "抱歉，我无法提供该信息。")


def _generations(run: _Run, rng: np.random.Generator,
                 make: Callable[[int, int], str], outputs: int | None = None) -> None:
    """Sample generations at every evaluation: the same prompts each time, ``make(k, i)``
    writing the output of prompt ``i`` at evaluation ``k``."""
    n = int(rng.integers(16, 25)) if outputs is None else outputs
    run.generations = [{"step": int(step), "prompt": f"question {i}", "output": make(k, i)}
                       for k, step in enumerate(run.eval_steps) for i in range(n)]


def _text_event(run: _Run, signal: str, variant: str, strength: str, start: int,
                reason: str) -> Injected:
    every = run.profile.eval_every
    return [Event(signal, int(run.eval_steps[start]), 5 * every, variant, strength, every,
                  reason)], {}


def _inject_repetition(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """From an evaluation on, 35% / 60% / 90% of the outputs (each drawn) fall into a
    loop; the label is that evaluation."""
    share = {"weak": 0.35, "medium": 0.6, "strong": 0.9}[strength]
    start = _eval_start(run, rng, tail=8)
    _generations(run, rng, lambda k, i: _loop(rng) if k >= start and rng.random() < share
                 else _answer(rng))
    return _text_event(run, "repetition", "loops", strength, start,
                       f"{share:.0%} of outputs loop")


def _inject_role_confusion(run: _Run, strength: str, rng: np.random.Generator
                           ) -> Injected:
    """From an evaluation on, 10% / 25% / 60% of the outputs (each drawn) go on to write
    the user's next turn (``User:``, ChatML, ``### Instruction``, ``[INST]``, …)."""
    share = {"weak": 0.1, "medium": 0.25, "strong": 0.6}[strength]
    start = _eval_start(run, rng, tail=8)

    def make(k: int, i: int) -> str:
        text = _answer(rng)
        if k >= start and rng.random() < share:
            text += str(rng.choice(_ROLE_TURNS)).format(" ".join(_words(rng, 8)))
        return text

    _generations(run, rng, make)
    return _text_event(run, "role_confusion", "user turn", strength, start,
                       f"{share:.0%} of outputs write the user's turn")


def _probe_rows(run: _Run, rng: np.random.Generator, refusal: Callable[[int], float],
                harmful: int = 4) -> None:
    """A fixed benign probe set (``probe`` true) whose outputs refuse with probability
    ``refusal(k)`` at evaluation ``k``, and ``harmful`` red-team prompts, always refused."""
    n = int(rng.integers(16, 25))
    rows = []
    for k, step in enumerate(run.eval_steps):
        p = refusal(k)
        rows += [{"step": int(step), "prompt": f"benign {i}", "probe": True,
                  "output": str(rng.choice(_REFUSALS)) if rng.random() < p
                  else _answer(rng)} for i in range(n)]
        rows += [{"step": int(step), "prompt": f"harmful {i}", "probe": False,
                  "output": str(rng.choice(_REFUSALS))} for i in range(harmful)]
    run.generations = rows


def _inject_over_refusal(run: _Run, strength: str, rng: np.random.Generator) -> Injected:
    """From an evaluation on, the benign probes are refused with probability 25% / 40% /
    80% (from 0–5% before); red-team prompts are refused throughout."""
    share = {"weak": 0.25, "medium": 0.4, "strong": 0.8}[strength]
    base = rng.uniform(0.0, 0.05)
    start = _eval_start(run, rng, tail=8)
    _probe_rows(run, rng, lambda k: share if k >= start else base)
    return _text_event(run, "over_refusal", "benign refused", strength, start,
                       f"{share:.0%} of benign probes refused")


# (signal, variant, variants-or-strengths, injection)
INJECTIONS: list[tuple[str, str, tuple[str, ...], Callable[..., Injected]]] = [
    ("spike", "finite", STRENGTHS, _inject_spike),
    ("spike", "nan/inf", ("nan", "inf", "nan onwards"), _inject_nonfinite),
    ("plateau", "flat", STRENGTHS, _inject_plateau),
    ("grad_norm", "spike", STRENGTHS, _inject_grad_spike),
    ("grad_norm", "climb", STRENGTHS, _inject_grad_climb),
    ("throughput_drop", "drop", STRENGTHS, _inject_throughput),
    ("memory", "near capacity", STRENGTHS, _inject_memory),
    ("memory", "oom", ("oom",), _inject_oom),
    ("checkpoint_gap", "stopped saving", STRENGTHS, _inject_checkpoint_gap),
    ("overfit", "eval rises", STRENGTHS, _inject_overfit),
    ("diminishing_returns", "converged", STRENGTHS, _inject_diminishing),
    ("lr_schedule", "off schedule", ("constant", "doubled", "5% high", "restarted"),
     _inject_lr),
    ("oscillation", "periodic", STRENGTHS, _inject_oscillation),
    ("forgetting", "general drops", STRENGTHS, _inject_forgetting),
    ("business_flat", "flat", STRENGTHS, _inject_business_flat),
    ("reward_hacking", "judge falls", STRENGTHS, _inject_reward_hacking),
    ("stalled", "silent", STRENGTHS, _inject_stalled),
    ("repetition", "loops", STRENGTHS, _inject_repetition),
    ("role_confusion", "user turn", STRENGTHS, _inject_role_confusion),
    ("over_refusal", "benign refused", STRENGTHS, _inject_over_refusal),
    # Added last: an injection's place in this list seeds its cases.
    ("spike", "sustained", STRENGTHS, _inject_sustained_spike),
]


def _converged(run: _Run, start: int = 0) -> list[tuple[int, int]]:
    """The stretches of evaluations (after step ``start``) in which the clean eval curve
    meets the default stop-loss rule itself, "stop after N evaluations that improve less
    than X" (0.5% and 3 by default), read either way ``diminishing_returns`` reads it: N
    evaluations in a row each less than X below the one before (its pace), or N in a row
    none of which beats the reference, the last evaluation that did, by X
    (``EarlyStopping``'s reading: a bounce back is no progress). There a finding is the
    rule doing its job, not a false alarm."""
    from analyzers.diminishing_returns import DiminishingReturns
    rule = DiminishingReturns()
    n, x = rule.evaluations, rule.min_improvement
    judged = run.eval_steps > start
    clean, steps = run.clean_eval()[judged], run.eval_steps[judged]
    met = np.zeros(len(clean), dtype=bool)
    slow = reference = 0  # evaluations in a row under the pace; the reference
    for k in range(1, len(clean)):
        slow = slow + 1 if clean[k - 1] - clean[k] < x * abs(clean[k - 1]) else 0
        if clean[reference] - clean[k] >= x * abs(clean[reference]):
            reference = k
        met[k] = slow >= n or k - reference >= n
    return _stretches(met, steps)


def _flat(run: _Run, start: int = 0) -> list[tuple[int, int]]:
    """The stretches of logged steps (after step ``start``, the attempt the analyzers see)
    in which the noise-free training loss is flat by ``plateau``'s own definition: over
    its window (``window`` points, or ``history`` of the points so far when more), the
    middle of the last third lies less than ``min_delta`` below the middle of the first.
    There a ``plateau`` finding is true, not a false alarm."""
    from analyzers.plateau import Plateau
    rule = Plateau()
    first = int(np.searchsorted(run.steps, start, side="right"))
    clean, steps = run.clean_loss()[first:], run.steps[first:]
    flat = np.zeros(len(clean), dtype=bool)
    ends = np.arange(rule.grace_period + rule.window, len(clean) + 1)
    if ends.size:
        widths = np.maximum(rule.window, np.minimum((rule.history * ends).astype(int),
                                                    ends - rule.grace_period))
        early = clean[ends - widths + widths // 6]
        late = clean[ends - 1 - widths // 6]
        flat[ends - 1] = (early - late) / np.abs(early) < rule.min_delta
    return _stretches(flat, steps)


def _first(stretches: list[tuple[int, int]]) -> int:
    return stretches[0][0] if stretches else FOREVER


def _negative(kind: str, rng: np.random.Generator, i: int) -> tuple[_Run, int]:
    """A negative control; returns the run and, for a resumed run, the step it resumed at."""
    profile = _profile_for(rng, i)
    resumed_at = 0
    if kind == "healthy_cosine":
        run = base_run(rng, profile, "cosine")
    elif kind == "healthy_wsd":
        run = base_run(rng, profile, "wsd", anneal_gain=rng.uniform(0.04, 0.08))
    elif kind == "lr_anneal":
        run = base_run(rng, profile, "cosine", anneal_gain=rng.uniform(0.08, 0.12))
    elif kind == "eval_ckpt_slowdowns":
        run = base_run(rng, profile, _schedule_for(rng))
        n = len(run.steps)
        for every, factor, width in ((profile.eval_every, 0.15, 3), (profile.ckpt_every, 0.3, 2)):
            marks = np.searchsorted(run.steps, np.arange(every, profile.steps, every) + 1)
            for w in range(width):
                hit = marks + w
                run.throughput[hit[hit < n]] *= factor
    elif kind == "resumed":
        run = base_run(rng, profile, _schedule_for(rng))
        resumed_at = run.checkpoints[len(run.checkpoints) // 2]
        after = int(np.searchsorted(run.steps, resumed_at + 1))
        bump = np.zeros(len(run.steps))
        k = np.arange(len(run.steps) - after)
        bump[after:] = 0.03 * np.exp(-k / 10)  # optimizer state warming up again
        run.extra_loss += bump * run.clean_loss()
        run.throughput[after:after + 5] *= 0.3
    elif kind == "noisy_small_batch":
        run = base_run(rng, profile, _schedule_for(rng), noise_scale=rng.uniform(6, 12))
    elif kind == "near_zero_per_batch":
        # A per-batch loss that has memorised its data: ~0.001 with hard batches at 0.3–1
        # (the T5 fine-tune of the corpus): log-normal with a very wide spread.
        run = base_run(rng, PROFILES[1], _schedule_for(rng))
        n = len(run.steps)
        level = 0.002 * np.exp(-np.arange(n) / n)
        run.loss_override = level * np.exp(1.6 * rng.standard_normal(n))
    elif kind == "general_suite_noise":  # the general suite wobbles, the domain improves
        run = base_run(rng, profile, _schedule_for(rng))
        level, sigma = _general_suite(run, rng)
        _add_general(run, rng, level, 1.5 * sigma)
    elif kind == "business_tracks_loss":  # the business metric improves with the loss
        run = base_run(rng, profile, _schedule_for(rng))
        clean, sigma = _business(run, rng)
        run.extra["eval/business/pass_rate"] = _eval_series(
            run, clean * (1 + sigma * rng.standard_normal(len(clean))))
    elif kind == "rl_healthy":  # reward up; KL flat (even) or growing (odd); judge saturates
        run = base_run(rng, profile, _schedule_for(rng))
        reward, kl, judge, sigma = _rl(run, rng, kl_flat=i % 2 == 0)
        _add_rl(run, rng, reward, kl, judge, sigma)
    elif kind == "eval_pauses_live":
        # A live run with long, regular evaluation pauses, polled in the middle of one (even
        # cases: the silence is the evaluation's) or between two logged steps (odd cases).
        run = base_run(rng, profile, _schedule_for(rng))
        _wall(run, rng, (300.0, 1200.0))
        assert run.wall is not None
        if i % 2 == 0:
            evals = run.eval_steps[(run.eval_steps >= run.steps[run.point(0.5)])
                                   & (run.eval_steps <= run.steps[run.point(0.95)])]
            at = int(np.searchsorted(run.steps, rng.choice(evals), side="right")) - 1
            pause = run.wall[at + 1] - run.wall[at]
            run.now = float(run.wall[at] + rng.uniform(0.3, 0.95) * pause)
        else:
            at = int(rng.integers(run.point(0.5), run.point(0.95)))
            run.now = float(run.wall[at] + rng.uniform(0.5, 3.0)
                            * np.median(np.diff(run.wall)))
        run.cut = int(run.steps[at])
    elif kind == "finished":  # a finished run: read after the fact, or polled after its end
        run = base_run(rng, profile, _schedule_for(rng))
        _wall(run, rng, (120.0, 600.0))
        if i % 2 == 0:
            run.now = float(run.wall[-1]) + 6 * 3600.0
            run.meta["status"] = "finished"
    elif kind == "generations_diverse":  # varied answers; list-like ones repeat by nature
        run = base_run(rng, profile, _schedule_for(rng))
        lists = rng.uniform(0.2, 0.4)

        def diverse(k: int, j: int) -> str:
            if rng.random() < lists:
                return "\n".join(f"- item {m}: {' '.join(_words(rng, 4))}" for m in range(8))
            return _answer(rng)

        _generations(run, rng, diverse)
    elif kind == "generations_markers":
        # Role markers quoted in code blocks (more and more often), prose that mentions a
        # user, red-team prompts refused and benign probes refused at a steady 0–5%.
        run = base_run(rng, profile, _schedule_for(rng))
        base = rng.uniform(0.0, 0.05)
        _probe_rows(run, rng, lambda k: base)
        n = len(run.eval_steps)
        for row in run.generations or []:
            if not row["probe"]:
                continue
            k = int(np.searchsorted(run.eval_steps, row["step"]))
            if rng.random() < 0.1 + 0.3 * k / n:
                row["output"] += ("\n```\n<|im_start|>user\n{q}<|im_end|>\nUser: {q}\n"
                                  "### Instruction:\n{q}\n```").format(q=_words(rng, 1)[0])
            elif rng.random() < 0.2:
                row["output"] += " so the user typed User: then the question."
    else:  # multi-epoch SFT: the loss drops at each epoch boundary (the data is seen again)
        run = base_run(rng, PROFILES[1], "linear")
        epochs = int(rng.integers(3, 6))
        epoch = np.minimum(run.steps * epochs // run.profile.steps, epochs - 1)
        drop = rng.uniform(0.15, 0.3)
        run.extra_loss += run.clean_loss() * ((1 - drop) ** epoch - 1)
    return run, resumed_at


def synthetic_suite(seed: int = 0, repeats: int = 4,
                    signals: Iterable[str] | None = None) -> list[Case]:
    """The labelled synthetic suite: every injection at every strength ``repeats`` times,
    and every negative control ``repeats`` times. Deterministic for a seed."""
    wanted = set(signals) if signals is not None else None
    cases: list[Case] = []
    for k, (signal, variant, strengths, inject) in enumerate(INJECTIONS):
        if wanted is not None and signal not in wanted:
            continue
        for strength in strengths:
            for r in range(repeats):
                rng = np.random.default_rng([seed, k, strengths.index(strength), r])
                run = base_run(rng, _profile_for(rng, r), _schedule_for(rng))
                events, consequences = inject(run, strength, rng)
                allowed = {"diminishing_returns": _converged(run), "plateau": _flat(run)}
                for consequence, onset in consequences.items():
                    allowed[consequence] = [*allowed.get(consequence, []), (onset, FOREVER)]
                name = f"{signal}/{variant}/{strength}/{r}"
                cases.append(Case(name, run.build(name), events, run.last_step(),
                                  allowed=allowed))
    for k, kind in enumerate(NEGATIVE_CONTROLS):
        if wanted is not None and "negative" not in wanted and f"negative/{kind}" not in wanted:
            continue
        for r in range(repeats):
            rng = np.random.default_rng([seed, 100 + k, r])
            run, resumed_at = _negative(kind, rng, r)
            name = f"negative/{kind}/{r}"
            data = run.build(name, attempt_from=resumed_at)
            steps = run.last_step() - resumed_at
            cases.append(Case(name, data, [], steps, negative=True,
                              allowed={"diminishing_returns": _converged(run, resumed_at),
                                       "plateau": _flat(run, resumed_at)}))
    return cases


# --------------------------------------------------------------------------- detectors
