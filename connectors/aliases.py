"""One alias table: the names trainers log under → runwatch's canonical tags.

Names are matched case-insensitively after trimming. A name that is not in the table is
kept as it was logged, so nothing a trainer writes is lost; users add their own names with
``[aliases]`` in ``runwatch.toml``.
"""

from __future__ import annotations

CANONICAL_TAGS = ("train/loss", "eval/loss", "lr", "grad_norm", "throughput", "gpu_mem",
                  "reward", "kl", "policy/loss", "critic/loss")
# Not metrics: the global step of a record and its wall-clock time (Unix seconds).
STEP, TIME = "step", "time"

DEFAULT_ALIASES: dict[str, str] = {
    # record keys
    "step": STEP, "global_step": STEP, "iteration": STEP, "iter": STEP,
    "current_steps": STEP, "trainer/global_step": STEP, "num_updates": STEP,
    "time": TIME, "timestamp": TIME, "wall_time": TIME, "_timestamp": TIME,
    # train loss: HF, Lightning, Megatron, nanoGPT/llm.c, Keras
    "loss": "train/loss", "train_loss": "train/loss", "train/loss": "train/loss",
    "train_loss_step": "train/loss", "training_loss": "train/loss", "lm loss": "train/loss",
    "lm_loss": "train/loss", "train/lm_loss": "train/loss",
    # eval loss
    "eval_loss": "eval/loss", "eval/loss": "eval/loss", "val_loss": "eval/loss",
    "val/loss": "eval/loss", "validation_loss": "eval/loss", "valid_loss": "eval/loss",
    # perplexity: one metric whichever way a log spells it (DeepSpeed's examples print
    # ``'ppl': 61.7`` and ``Step at 10 with Perplexity: 61.6`` in one file; a custom print
    # says ``ppl 89.1``), so a question, a label or a finding about one finds the other
    "ppl": "perplexity", "perplexity": "perplexity", "train/ppl": "perplexity",
    "train_ppl": "perplexity",
    "eval_ppl": "eval/perplexity", "val_ppl": "eval/perplexity", "eval/ppl": "eval/perplexity",
    "val/ppl": "eval/perplexity", "eval_perplexity": "eval/perplexity",
    "val_perplexity": "eval/perplexity", "eval/perplexity": "eval/perplexity",
    # learning rate
    "lr": "lr", "learning_rate": "lr", "learning-rate": "lr", "train/lr": "lr",
    "train/learning_rate": "lr",
    # gradient norm
    "grad_norm": "grad_norm", "grad-norm": "grad_norm", "gradient_norm": "grad_norm",
    "train/grad_norm": "grad_norm", "gnorm": "grad_norm",
    # throughput
    "throughput": "throughput", "tokens_per_sec": "throughput", "tokens_per_second": "throughput",
    "tok/s": "throughput", "tokens/s": "throughput", "tok/sec": "throughput",
    "tokens/sec": "throughput", "samples_per_second": "throughput",
    "train_samples_per_second": "throughput", "train/throughput": "throughput",
    # memory
    "gpu_mem": "gpu_mem", "gpu_memory": "gpu_mem", "max_memory_allocated": "gpu_mem",
    "gpu_mem_gb": "gpu_mem",
    # RL: the reward, KL, and PPO's actor (policy) and critic (value) losses as DeepSpeed-Chat,
    # TRL and OpenRLHF name them
    "reward": "reward", "rewards/chosen": "reward", "kl": "kl", "objective/kl": "kl",
    "average reward score": "reward", "average_reward_score": "reward",
    "ppo/mean_scores": "reward", "objective/scores": "reward", "env/reward_mean": "reward",
    "act_loss": "policy/loss", "actor_loss": "policy/loss", "policy_loss": "policy/loss",
    "ppo/loss/policy": "policy/loss", "loss/policy": "policy/loss",
    "cri_loss": "critic/loss", "critic_loss": "critic/loss", "value_loss": "critic/loss",
    "ppo/loss/value": "critic/loss", "loss/value": "critic/loss",
}


class AliasTable:
    """Maps logged names to canonical tags; ``extra`` entries override the defaults."""

    def __init__(self, extra: dict[str, str] | None = None) -> None:
        self._table = {k.strip().lower(): v for k, v in DEFAULT_ALIASES.items()}
        self._table.update({k.strip().lower(): v for k, v in (extra or {}).items()})

    def canonical(self, name: str) -> str:
        """The canonical tag for ``name``, or the name itself when it is unknown.

        >>> AliasTable().canonical("eval_loss")
        'eval/loss'
        >>> AliasTable({"my_loss": "train/loss"}).canonical("My_Loss")
        'train/loss'
        >>> AliasTable().canonical("eval/general/accuracy")
        'eval/general/accuracy'
        """
        key = name.strip()
        return self._table.get(key.lower(), key)
