"""The demo trainer as a real process: log format, fault, checkpoints, resume and skip."""

import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--steps", "80", "--batch-size", "1024", "--fault", "bad_batch", "--fault-step", "50",
          "--checkpoint-every", "10"]

pytestmark = pytest.mark.slow


def start(run_dir, *args):
    return subprocess.Popen(
        [sys.executable, "-m", "bot.demo.trainer", "--run-dir", str(run_dir), *map(str, args)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(*processes):
    for process in processes:
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0, output


def records(run_dir):
    with open(Path(run_dir) / "metrics.jsonl") as fh:
        return [json.loads(line) for line in fh]


def losses(run_dir):
    return {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs the processes once, a few at a time: each takes a couple of seconds."""
    base = tmp_path_factory.mktemp("demo")
    full, split, nan, skip = base / "full", base / "split", base / "nan", base / "skip"
    finish(start(full, *COMMON), start(split, *COMMON, "--stop-at", 30),
           start(nan, "--steps", 12, "--fault", "nan", "--fault-step", 5, "--fault-steps", 1,
                 "--eval-every", 4))
    shutil.copytree(full, skip)
    finish(start(split, *COMMON, "--resume-from", split / "checkpoint-30"),
           start(skip, *COMMON, "--resume-from", skip / "checkpoint-40",
                 "--skip-batches", "50-52"))
    return {"full": full, "split": split, "nan": nan, "skip": skip}


def test_log_has_every_step_and_the_expected_metrics(runs):
    lines = records(runs["full"])
    assert "meta" in lines[0] and lines[0]["meta"]["total_steps"] == 80
    steps = [r for r in lines if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 81))
    for r in steps:
        assert {"time", "loss", "learning_rate", "grad_norm", "tokens_per_sec"} <= set(r)
    assert [r["step"] for r in steps if "eval_loss" in r] == [25, 50, 75, 80]
    loss = losses(runs["full"])
    assert statistics.median(loss[s] for s in range(40, 50)) < 0.5 * loss[1]


def test_bad_batch_spikes_then_recovers(runs):
    loss = losses(runs["full"])
    before = statistics.median(loss[s] for s in range(30, 50))
    assert loss[50] >= 3 * before
    assert all(loss[s] >= 3 * before for s in (51, 52))
    assert all(math.isfinite(v) for v in loss.values())
    assert max(loss[s] for s in range(56, 81)) <= 1.2 * before


def test_checkpoints_every_ten_steps(runs):
    folders = sorted(p.name for p in runs["full"].glob("checkpoint-*"))
    assert folders == sorted(f"checkpoint-{s}" for s in range(10, 81, 10))
    assert all((runs["full"] / name / "state.pt").is_file() for name in folders)
    events = [r["step"] for r in records(runs["full"]) if r.get("event") == "checkpoint"]
    assert events == list(range(10, 81, 10))
    assert not list(runs["full"].glob(".tmp-*"))


def test_stop_and_resume_matches_an_uninterrupted_run(runs):
    lines = records(runs["split"])
    metas = [r["meta"] for r in lines if "meta" in r]
    assert [m["config"]["start_step"] for m in metas] == [1, 31]
    steps = [r["step"] for r in lines if "loss" in r]
    assert steps == list(range(1, 81))
    # the batch of a step depends only on (seed, step), and the optimizer state is restored:
    # the resumed run computes the very same losses
    assert losses(runs["split"]) == losses(runs["full"])


def test_skip_batches_steps_over_the_bad_batches(runs):
    lines = records(runs["skip"])
    resumed = lines[[i for i, r in enumerate(lines) if "meta" in r][1]:]
    assert [r["step"] for r in resumed if r.get("event") == "skipped_batch"] == [50, 51, 52]
    assert [r["step"] for r in resumed if "loss" in r] == [*range(41, 50), *range(53, 81)]
    full = losses(runs["full"])
    before = statistics.median(full[s] for s in range(30, 50))
    after_resume = {r["step"]: r["loss"] for r in resumed if "loss" in r}
    assert after_resume[49] == full[49]
    assert max(after_resume.values()) <= 1.2 * before


def test_a_nan_loss_skips_the_update_and_the_run_goes_on(runs):
    loss = losses(runs["nan"])
    assert sorted(loss) == list(range(1, 13))
    assert math.isnan(loss[5])
    assert all(math.isfinite(loss[s]) for s in loss if s != 5)
    assert loss[12] < loss[4]
