"""The signal catalog of SIGNALS.md as data: kind of trouble, ordered fixes and their sources.

Seed marks: ``000`` is the training platform's troubleshooting guide, ``003`` the
practitioner's guide to pre-training, SFT and alignment (both in ``shared/seeds``).
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzers.finding import Fix, TroubleKind


@dataclass(frozen=True)
class Signal:
    id: str
    title: str
    kind: TroubleKind
    source: str
    fixes: tuple[Fix, ...]
    # Fixes when only an evaluation metric is in trouble (SIGNALS.md ``spike (any
    # metric)``): rolling the training back would not help.
    eval_fixes: tuple[Fix, ...] = ()


def _signal(id: str, title: str, kind: TroubleKind, source: str,
            *fixes: tuple[str, str | None], eval_fixes: tuple[Fix, ...] = ()) -> Signal:
    return Signal(id, title, kind, source,
                  tuple(Fix(text, source, request) for text, request in fixes), eval_fixes)


CATALOG: dict[str, Signal] = {s.id: s for s in (
    _signal("plateau", "loss barely falls", "not_learning", "000 §2.1 §3.1; 003 §2.4 §5.1 row 1",
            ("Sample and read a batch of training data by hand (label noise, truncated text, "
             "mixed formats, duplicates)", None),
            ("Run a small controlled learning-rate sweep", None),
            ("Only then change the model or architecture", None)),
    _signal("spike", "loss jumps to an abnormal value, or NaN/Inf", "not_learning",
            "000 §3.2; 003 §2.4 §5.1 row 2",
            ("Roll back to the last checkpoint before the spike", "rollback"),
            ("Inspect that batch; if the same position fails again it is data, not chance: "
             "remove it (skip those batches)", None),
            ("Enable or lower gradient clipping (max norm 1.0), lower the learning rate", None),
            eval_fixes=(
                Fix("Check the eval data (an eval batch with empty targets, a division by "
                    "zero in a custom metric) and the eval precision (fp16 overflow in "
                    "evaluation) before trusting any eval number", "000 §3.2"),)),
    _signal("divergence", "an instability episode, not a single point", "not_learning",
            "000 §3.2; 003 §5.2",
            ("Roll back to the last checkpoint before the onset", "rollback"),
            ("Lower the learning rate or enable gradient clipping", None),
            ("If it recurs at the same data position, inspect and skip those batches", None)),
    _signal("overfit", "train looks good, validation looks bad", "not_learning",
            "000 §2.2 §3.3; 003 §3.4",
            ("Run the leakage check first: `runwatch leakcheck TRAIN EVAL` (cross-set "
             "duplicates between train and eval)", None),
            ("Make train and eval preprocessing identical", None),
            ("Fewer epochs, more data, a smaller model or lower LoRA rank; roll back to the "
             "checkpoint with the best validation", "rollback")),
    _signal("forgetting", "new skill up, old skill down", "not_learning",
            "000 §3.4 §5(3); 003 §1.3 §5.1 row 5",
            ("Mix a share of general data back in (replay)", None),
            ("Lower training intensity (epochs, learning rate)", None),
            ("Keep the general suite fixed and run it after every training", None)),
    _signal("business_flat", "loss falls, business metric doesn't", "not_learning", "000 §3.5",
            ("Trust the business metric when they diverge", None),
            ("Adjust data composition and the training objective; stop chasing lower loss",
             None)),
    _signal("diminishing_returns", "long run, flattening returns", "not_learning",
            "000 §3.6 §5(4)",
            ("Stop: apply the stop-loss rule agreed before the run", "stop"),
            ("Move resources to data quality, eval sets or inference", None)),
    _signal("grad_norm", "gradient norm spikes or rises steadily", "not_learning",
            "003 §2.4 §5.3",
            ("Lower the learning rate rather than push on", None),
            ("Clip gradients", None),
            ("Inspect the batch at the spike", None)),
    _signal("throughput_drop", "tokens/s falls suddenly", "slow", "003 §5.3; 000 §1.1",
            ("Check the data pipeline (disk IO, number of loader workers)", None),
            ("Check node health and communication", None)),
    _signal("lr_schedule", "the LR curve is not the configured one", "not_learning",
            "003 §2.3 §5.2 case 1",
            ("Fix the scheduler; lower the peak LR by about 30% if the loss oscillates", None),
            ("Always log the LR", None)),
    _signal("oscillation", "periodic loss oscillation", "not_learning", "003 §5.2 case 1",
            ("Check the LR curve", None),
            ("Lower the peak LR", None)),
    _signal("memory", "GPU memory near the limit / OOM", "cant_finish", "003 §2.3 §5.1 row 3",
            ("Use a smaller block_size", None),
            ("Enable gradient checkpointing", None),
            ("Use a smaller micro-batch with gradient accumulation", None)),
    _signal("stalled", "the run stopped advancing", "cant_finish",
            "000 §1.1 §2.3 §4.2",
            ("Resume from the latest checkpoint, not from scratch", "rollback"),),
    _signal("checkpoint_gap", "no recent checkpoint", "cant_finish", "003 §5.3; 000 §2.3",
            ("Save every 500–1000 steps and keep several checkpoints, never only the last",
             None),),
    _signal("repetition", "generations repeat themselves", "not_learning",
            "003 §5.1 row 4 §5.2 case 2",
            ("Fewer epochs (e.g. 8 → 3)", None),
            ("More diverse instructions", None),
            ("Lower the LoRA rank", None)),
    _signal("role_confusion", "the model answers for the user", "not_learning",
            "003 §3.1 §5.1 row 6",
            ("Check the special tokens and chat template", None),
            ("Add more multi-turn data", None)),
    _signal("over_refusal", "refuses harmless requests after alignment", "not_learning",
            "003 §4.4 §5.1 row 7",
            ("Rebalance the preference data", None),
            ("Lower the KL penalty", None),
            ("Use fewer \"harmless\" samples", None)),
    _signal("reward_collapse", "RL reward falls away", "not_learning", "003 §4.2 §4.4",
            ("Roll back to the checkpoint before the burst", "rollback"),
            ("Lower the actor learning rate or tighten clipping", None),
            ("Check the KL coefficient and the reward model's inputs", None)),
    _signal("reward_hacking", "reward up, quality down", "not_learning", "003 §4.2 §4.4",
            ("Raise the KL coefficient", None),
            ("Do human spot checks of generations", None)),
)}
