"""Golden runs for the checkpoint-gap analyzer: exact onset and resolve steps, the run's own
interval, resumed attempts; and, for all four analyzers of this batch (grad_norm,
throughput_drop, memory, checkpoint_gap), the corpus controls and the demo trainer."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.checkpoint_gap import CheckpointGap
from analyzers.grad_norm import GradNorm
from analyzers.memory import Memory
from analyzers.throughput_drop import ThroughputDrop
from connectors.registry import open_source
from tests.corpus import CORPUS
from tests.demo_logs import demo_logs

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = CORPUS / "MANIFEST.csv"
BATCH = (GradNorm, ThroughputDrop, Memory, CheckpointGap)



def SEEING() -> CheckpointGap:  # noqa: N802 (reads as the analyzer it builds)
    """Checkpoint-gap with checkpoints expected, so a run with none is judged too."""
    return CheckpointGap(expect_checkpoints=True)

def saved(*steps: int) -> list[Checkpoint]:
    return [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in steps]


def run(last: int, checkpoints: list[Checkpoint], first: int = 10, every: int = 10) -> RunData:
    """A loss logged every ``every`` steps from ``first`` to ``last``."""
    steps = np.arange(first, last + 1, every)
    return RunData.from_series("run-1", {"train/loss": np.full(len(steps), 2.0)}, steps=steps,
                               checkpoints=checkpoints)


def test_a_run_that_stops_saving_fires_past_the_limit() -> None:
    """Saved every 200 steps to 2000: 3 × 200 is below the 1000-step floor."""
    [finding] = SEEING().detect(run(3500, saved(*range(200, 2001, 200))))
    assert (finding.onset_step, finding.detected_step) == (3010, 3010)
    assert (finding.state, finding.resolved_step, finding.severity) == ("firing", None,
                                                                       "warning")
    assert finding.summary == ("no checkpoint for 1010 steps at step 3010: the last is "
                               "ckpt/checkpoint-2000 at step 2000 (limit 1000 steps)")
    assert finding.evidence == {
        "last_checkpoint": [2000, "ckpt/checkpoint-2000"], "counted_from": 2000,
        "limit": 1000, "max_interval": 1000, "median_interval": 200, "checkpoints": 10,
        "latest_step": 3500, "gap": 1500, "ended_by": None}
    spec = CATALOG["checkpoint_gap"]
    assert finding.fixes == list(spec.fixes)
    assert (finding.kind, finding.source) == ("cant_finish", spec.source)
    assert finding.rollback_to is None


def test_the_next_checkpoint_resolves_the_gap() -> None:
    none_yet, finding = SEEING().detect(run(4000, saved(1800, 2000, 3500)))
    assert (none_yet.onset_step, none_yet.resolved_step) == (1020, 1800)
    assert (finding.onset_step, finding.state, finding.resolved_step) == (3010, "resolved",
                                                                         3500)
    assert finding.evidence["gap"] == 1500
    assert finding.evidence["ended_by"] == [3500, "ckpt/checkpoint-3500"]


def test_the_limit_follows_the_runs_own_interval() -> None:
    """Saved every 500 steps: 3 × 500 = 1500 steps allowed after the last, at 2000."""
    assert SEEING().detect(run(3500, saved(500, 1000, 1500, 2000))) == []
    [finding] = SEEING().detect(run(3600, saved(500, 1000, 1500, 2000)))
    assert finding.onset_step == 3510
    assert finding.summary.endswith("(limit 1500 steps: 3 × the run's median interval of 500)")
    assert CheckpointGap(factor=5).detect(run(3600, saved(500, 1000, 1500, 2000))) == []


def test_every_gap_is_its_own_finding_judged_with_the_checkpoints_known_then() -> None:
    data = run(9000, saved(500, 1000, 2200, 2600, 3100, 5000, 5500))
    findings = SEEING().detect(data)
    # 1000 → 2200: one 500-step interval known, limit max(1000, 3 × 500) = 1500: no gap.
    # 3100 → 5000: intervals 500, 1200, 400, 500, median 500: passed 4600 at 4610.
    # 5500 → now: intervals 500, 1200, 400, 500, 1900, 500, median 500: passed at 7010.
    assert [(f.onset_step, f.resolved_step, f.evidence["limit"]) for f in findings] == [
        (4610, 5000, 1500), (7010, None, 1500)]
    # With one interval known at 1000, the 1000 → 2600 gap passes its limit at 2510.
    findings = SEEING().detect(run(9000, saved(500, 1000, 2600, 3100, 5000, 5500)))
    assert [(f.onset_step, f.resolved_step) for f in findings] == [(2510, 2600), (4610, 5000),
                                                                  (7010, None)]


def test_a_run_with_no_checkpoint_yet() -> None:
    [finding] = CheckpointGap(expect_checkpoints=True).detect(run(1500, []))
    assert (finding.onset_step, finding.state) == (1020, "firing")
    assert finding.summary == ("no checkpoint yet after 1010 steps at step 1020 (this attempt "
                               "started at step 10; limit 1000 steps)")
    assert finding.evidence["last_checkpoint"] is None
    # exactly 1000 steps: not past it
    assert CheckpointGap(expect_checkpoints=True).detect(run(1010, [])) == []
    assert CheckpointGap().detect(run(1500, [])) == []  # by default only seen checkpoints count


def test_a_first_checkpoint_ends_the_no_checkpoint_gap() -> None:
    [finding] = SEEING().detect(run(1500, saved(1200)))
    assert (finding.onset_step, finding.resolved_step) == (1020, 1200)
    assert CheckpointGap(expect_checkpoints=False).detect(run(1500, saved(1200))) == []
    # One checkpoint, 1190 steps in: that interval is the run's habit (limit 3 × 1190).
    assert CheckpointGap(expect_checkpoints=False).detect(run(4700, saved(1200))) == []
    [later] = CheckpointGap(expect_checkpoints=False).detect(run(4800, saved(1200)))
    assert later.onset_step == 4780


def test_a_resumed_attempt_counts_from_its_checkpoint_or_its_first_step() -> None:
    resumed = run(6500, saved(4000, 4500, 5000), first=5010)
    assert SEEING().detect(resumed) == []
    [finding] = SEEING().detect(run(6600, saved(4000, 4500, 5000), first=5010))
    assert finding.onset_step == 6510
    # No checkpoint visible: counted from the attempt's first step, not from step 0.
    assert SEEING().detect(run(6000, [], first=5010)) == []
    [finding] = SEEING().detect(run(6100, [], first=5010))
    assert finding.onset_step == 6020


def test_checkpoints_past_the_last_logged_step_and_duplicates() -> None:
    """A checkpoint folder can appear before its step's metrics are read; the same step may
    be listed twice (a resumed run re-saving it); order does not matter."""
    cps = saved(2500, 200, 200)
    [finding] = SEEING().detect(run(2300, cps))
    assert (finding.onset_step, finding.resolved_step) == (1210, 2500)


def test_a_single_late_first_checkpoint_sets_the_interval() -> None:
    """A long run saving every 5000 steps: the first gap is judged against 3 × ~5000."""
    assert CheckpointGap().detect(run(14_000, saved(5000), every=50)) == []
    [finding] = CheckpointGap().detect(run(21_000, saved(5000), every=50))
    assert finding.evidence["limit"] == 3 * (5000 - 10)  # logged from step 10


def test_the_demo_trainer_interval_is_quiet() -> None:
    """Checkpoints every 50 steps for 300 steps."""
    assert SEEING().detect(run(300, saved(*range(50, 301, 50)), first=1, every=1)) == []


def test_without_the_metric_there_is_no_progress_to_judge() -> None:
    data = RunData.from_series("run-1", {"eval/loss": np.full(300, 2.0)},
                               steps=10 * np.arange(1, 301))
    assert SEEING().detect(data) == []
    assert len(CheckpointGap(metric="eval/loss", expect_checkpoints=True).detect(data)) == 1


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"max_interval": 0}, "max_interval"),
    ({"max_interval": 1000.0}, "max_interval"),
    ({"factor": 0.5}, "factor"),
    ({"factor": float("inf")}, "factor"),
    ({"expect_checkpoints": "yes"}, "expect_checkpoints"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        CheckpointGap(**kwargs)


# --- the shared corpus, for the whole batch ---------------------------------------

needs_corpus = pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")


def corpus_files(prefix: str = "") -> list[str]:
    with open(MANIFEST, newline="") as fh:
        return [row["file"] for row in csv.DictReader(fh)
                if row["your_observation"].startswith(prefix)]


def corpus_run(relative: str) -> RunData:
    batch = open_source(str(CORPUS / relative)).discover()[0].read(final=True)
    return RunData(run=relative, metrics=batch.points, checkpoints=batch.checkpoints,
                   meta=batch.meta)


@needs_corpus
def test_runs_with_no_visible_problem_get_no_critical_and_at_most_one_warning() -> None:
    """The corpus files carry no checkpoints (single logs, no checkpoint-* folders): with the
    defaults none of the four analyzers says anything on them."""
    for relative in corpus_files("NO VISIBLE PROBLEM"):
        data = corpus_run(relative)
        findings = [f for cls in BATCH for f in cls().detect(data)]
        assert findings == [], (relative, [f.summary for f in findings])


@needs_corpus
def test_every_corpus_run_gets_at_most_one_gap_warning() -> None:
    for relative in corpus_files():
        findings = CheckpointGap(expect_checkpoints=True).detect(corpus_run(relative))
        assert len(findings) <= 1, relative
        if findings:
            assert findings[0].summary.startswith("no checkpoint yet after ")


@needs_corpus
def test_a_resumed_lightning_run_is_counted_from_its_own_first_step() -> None:
    """slm_training v5 continues v0 at step 140749: the gap starts there, not at 0."""
    [finding] = SEEING().detect(corpus_run("lightning_csv/slm_training_v5_resume.csv"))
    assert (finding.onset_step, finding.evidence["counted_from"]) == (141799, 140749)


# --- the demo trainer -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["none", "bad_batch"])
def test_the_demo_trainer_gets_nothing_from_this_batch(fault: str) -> None:
    """300 steps, checkpoints every 50, evaluation every 25; with bad_batch the loss and the
    grad norm jump together at step 150, which is spike's to report. Throughput is left
    out here: the demo runs on a shared CPU, where another process starting mid-run is a
    real slowdown that the analyzer is right to report."""
    data = demo_logs()[fault]
    assert [c.step for c in data.checkpoints] == list(range(50, 301, 50))
    for cls in (GradNorm, Memory, CheckpointGap):
        assert cls().detect(data) == [], cls.signal
    if fault == "bad_batch":
        grad_norm = data.series("grad_norm")
        assert grad_norm[150] > 5 * grad_norm.loc[100:149].median()
