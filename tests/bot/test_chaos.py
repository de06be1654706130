"""Chaos (issue 23): `runwatch serve` killed with SIGKILL at random moments while a real
PyTorch training process and three other runs log, NaNs arrive and the Slack stand-in fails
for a while (see benchmarks/chaos.py). Every point is stored once, every run keeps one
attempt, every NaN is alerted, and nothing is posted twice.

The cycle count is ``RUNWATCH_CHAOS_CYCLES`` (default 12: the trainer and the writers are
mostly done by then, later kills restart an idle bot); the seed is in the failure message
and can be fixed with ``RUNWATCH_CHAOS_SEED``. `runwatch bench chaos` runs 50.
"""

import os

import pytest

from benchmarks.chaos import NAN_RUNS, run_chaos

CYCLES = int(os.environ.get("RUNWATCH_CHAOS_CYCLES", "12"))


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing_and_posts_nothing_twice(tmp_path):
    seed = os.environ.get("RUNWATCH_CHAOS_SEED")
    result = run_chaos(tmp_path, cycles=CYCLES, seed=int(seed) if seed else None)
    context = f"seed {result.seed}; the bot's log: {result.log}"
    assert result.kills == CYCLES and result.slack_faults > 0
    assert result.stored == result.expected, context  # nothing lost, nothing twice
    assert result.attempts == {name: 1 for name in result.expected}, context
    assert result.alerted == set(NAN_RUNS), context  # no missed alert
    assert not result.posted_twice, f"posted twice: {result.posted_twice} ({context})"
    assert not result.healthy_mentioned, context
    assert result.last_exit == 0, context  # SIGTERM: a clean exit
