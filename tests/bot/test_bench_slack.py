"""A burst of signed Slack requests is acknowledged and answered, every one, while the
action worker is busy (the figures themselves are `runwatch bench ack`'s)."""

import pytest

from benchmarks.slack import bench_ack


@pytest.mark.slow
def test_twenty_commands_at_once_are_all_acknowledged_and_answered():
    result = bench_ack(concurrency=20, rounds=1)
    assert result["commands"] == 20 and result["answered"] == 20
    assert result["slow job still running at the end"]  # they did not wait for it
