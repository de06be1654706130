"""`runwatch demo` end to end, as a newcomer runs it (input piped instead of typed)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_shows_the_alert_and_answers_status(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "demo", "--steps", "120", "--step-delay", "0.01",
         "--fault-step", "80", "--workdir", str(tmp_path)],
        input="/run status demo\n/run status nope\n", capture_output=True, text=True,
        cwd=ROOT, timeout=300, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "demo · spike" in out
    assert "jumped to" in out and "at step 80" in out
    assert "Roll back to the last checkpoint before the spike" in out
    assert "roll back to step 50" in out  # checkpoints every 50 steps
    # the demo rolls back as the person on call would, through the real action path
    assert "/run rollback demo" in out and "asks to roll back demo to checkpoint-50" in out
    assert "Rollback of demo done" in out and "relaunched as pid" in out
    assert "Recovered: demo passed step" in out
    assert "Resolved" in out  # the alert resolves
    assert "step 120 of 120" in out and "attempt 2" in out and "finished" in out
    # the demo asks what happened, and the answer is grounded in the run's history
    assert "/run ask demo what happened at step 80?" in out
    assert "Sources" in out
    # and what was changed then: the rollback's resume, a change event at its step
    assert "/run changes demo" in out and "attempt 2 at step 50" in out
    assert "config.skip_batches: none → [" in out  # the batches the rollback skips
    assert "unknown run 'nope'; known runs: demo" in out
    assert (tmp_path / "runs" / "demo" / "checkpoint-50").is_dir()
