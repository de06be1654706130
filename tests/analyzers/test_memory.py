"""Golden series for the memory analyzer: near capacity with exact steps, where the capacity
comes from, the out-of-memory failure, and the guards."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.memory import Memory
from connectors.registry import open_source
from tests.corpus import CORPUS

MANIFEST = CORPUS / "MANIFEST.csv"


def run(values: np.ndarray, meta: dict | None = None, metric: str = "gpu_mem") -> RunData:
    """Steps are 10, 20, 30, …: point ``i`` is logged at step ``10 * (i + 1)``."""
    return RunData.from_series("run-1", {metric: values, "train/loss": np.full(len(values), 2.0)},
                               steps=10 * np.arange(1, len(values) + 1), meta=meta,
                               checkpoints=[Checkpoint(100, "ckpt/checkpoint-100")])


def step(i: int) -> int:
    return 10 * (i + 1)


def memory(*segments: tuple[int, float]) -> np.ndarray:
    """GB readings: (points, level) segments with a little allocator jitter."""
    values = np.concatenate([np.full(n, level) for n, level in segments])
    return values + 0.05 * np.random.default_rng(0).standard_normal(len(values))


def test_near_capacity_fires_after_patience_and_resolves() -> None:
    mem = memory((100, 60.0), (50, 78.0), (100, 65.0))
    [finding] = Memory().detect(run(mem, {"gpu_mem_total": 80.0}))
    assert (finding.onset_step, finding.detected_step) == (step(100), step(104))
    assert (finding.state, finding.resolved_step) == ("resolved", step(154))
    assert finding.severity == "warning"
    assert finding.summary == ("gpu_mem reached 95% of its 80.00 capacity at step 1010 (78.03) "
                               "and stayed there for 5 points; peak 78.07 (98%) at step 1170")
    evidence = finding.evidence
    assert (evidence["rule"], evidence["capacity"], evidence["capacity_from"]) == (
        "near_capacity", 80.0, "meta")
    assert evidence["peak"] == pytest.approx(mem[100:150].max())
    assert [s for s, _ in evidence["points"]] == [step(i) for i in range(95, 125)]
    spec = CATALOG["memory"]
    assert finding.fixes == list(spec.fixes)
    assert (finding.kind, finding.source) == ("cant_finish", spec.source)
    assert finding.rollback_to is None


@pytest.mark.parametrize(("meta", "kwargs", "origin"), [
    ({"gpu_mem_total": 80.0}, {}, "meta"),
    ({"config": {"gpu_mem_total": 80}}, {}, "config"),
    ({"gpu_mem_total": 200.0}, {"capacity": 80.0}, "parameter"),
    ({"gpu_mem_total": 80.0, "config": {"gpu_mem_total": 200.0}}, {}, "meta"),
])
def test_where_the_capacity_comes_from(meta: dict, kwargs: dict, origin: str) -> None:
    mem = memory((100, 60.0), (50, 78.0))
    [finding] = Memory(**kwargs).detect(run(mem, meta))
    assert (finding.evidence["capacity"], finding.evidence["capacity_from"]) == (80.0, origin)


@pytest.mark.parametrize("meta", [None, {"gpu_mem_total": "80GB"}, {"gpu_mem_total": 0},
                                  {"gpu_mem_total": True}, {"config": "gpu_mem_total=80"}])
def test_without_a_usable_capacity_nothing_is_said(meta: dict | None) -> None:
    """How close is too close cannot be told from the readings alone."""
    mem = memory((100, 60.0), (200, 79.9))
    assert Memory().detect(run(mem, meta)) == []


@pytest.mark.parametrize(("high_points", "fires"), [(4, False), (5, True)])
def test_a_brief_peak_needs_patience_points(high_points: int, fires: bool) -> None:
    mem = memory((100, 60.0), (high_points, 77.0), (100, 60.0))
    findings = Memory().detect(run(mem, {"gpu_mem_total": 80.0}))
    assert [f.onset_step for f in findings] == ([step(100)] if fires else [])


def creep(noise: float = 0.15) -> np.ndarray:
    """60 GB for 100 points, then a creep to 78 GB over 400 points (0.045 GB a point) with
    noise that straddles the 76 GB threshold for a dozen points."""
    level = np.concatenate([np.full(100, 60.0), np.linspace(60.0, 78.0, 400)])
    return level + noise * np.random.default_rng(0).standard_normal(len(level))


def test_a_noisy_creep_fires_on_its_trend_before_patience_points_in_a_row() -> None:
    """The first reading at 95% is point 452, the first 5 in a row end at point 466; the
    Theil-Sen level of the last 20 points is at 95% by point 457."""
    mem = creep()
    assert int(np.flatnonzero(mem >= 76.0)[0]) == 452
    assert int(np.flatnonzero(np.convolve(mem >= 76.0, np.ones(5), "valid") == 5)[0]) + 4 == 466
    [finding] = Memory().detect(run(mem, {"gpu_mem_total": 80.0}))
    assert (finding.onset_step, finding.detected_step) == (step(452), step(457))
    assert finding.evidence["fired_by"] == "trend"
    assert finding.summary == (
        "gpu_mem reached 95% of its 80.00 capacity at step 4530 (76.01) and its trend over "
        "the last 20 points was there by step 4580; peak 78.05 (98%) at step 5000")


def test_the_trend_rule_polls_like_a_full_recompute() -> None:
    """The trend looks back before the point a poll resumes from; the onset does too."""
    mem = np.concatenate([creep(), memory((30, 60.0)), creep()[100:]])
    analyzer = Memory()
    for n in range(50, len(mem), 7):
        analyzer.detect(run(mem[:n], {"gpu_mem_total": 80.0}))
    polled = analyzer.detect(run(mem, {"gpu_mem_total": 80.0}))
    full = Memory().detect(run(mem, {"gpu_mem_total": 80.0}))
    assert [(f.onset_step, f.detected_step, f.resolved_step) for f in polled] == [
        (f.onset_step, f.detected_step, f.resolved_step) for f in full]
    assert [f.evidence["fired_by"] for f in full] == ["trend", "trend"]


@pytest.mark.parametrize("share", [0.93, 0.94])
def test_noise_just_below_the_threshold_never_fires(share: float) -> None:
    """20,000 points at 93% / 94% of 80 GB with 0.3 GB of noise: at 94% a reading in 300
    is at 95%, but the level is not."""
    rng = np.random.default_rng(3)
    mem = np.concatenate([np.full(100, 60.0), np.full(20_000, share * 80.0)])
    mem += 0.3 * rng.standard_normal(len(mem))
    assert Memory().detect(run(mem, {"gpu_mem_total": 80.0})) == []


def test_a_brief_peak_on_a_noisy_high_run_needs_patience_points() -> None:
    """Four points at capacity on a run at 90%: the robust trend ignores them."""
    mem = memory((100, 72.0), (4, 80.0), (100, 72.0)) + 0.25 * np.random.default_rng(
        5).standard_normal(204)
    assert Memory().detect(run(mem, {"gpu_mem_total": 80.0})) == []


def test_memory_hovering_at_the_threshold_does_not_flap() -> None:
    """Above 95% for 5 points, then between 90% and 95%: one finding, still firing; below
    90% for 5 points resolves it."""
    mem = memory((100, 60.0), (10, 77.0), (40, 74.0), (10, 77.0), (40, 73.5))
    [finding] = Memory().detect(run(mem, {"gpu_mem_total": 80.0}))
    assert (finding.onset_step, finding.state) == (step(100), "firing")
    mem = np.concatenate([mem, memory((30, 70.0))])
    [finding] = Memory().detect(run(mem, {"gpu_mem_total": 80.0}))
    assert (finding.state, finding.resolved_step) == ("resolved", step(204))


def test_two_episodes_are_two_findings() -> None:
    mem = memory((100, 60.0), (20, 78.0), (50, 60.0), (20, 78.0))
    first, second = Memory().detect(run(mem, {"gpu_mem_total": 80.0}))
    assert (first.onset_step, first.resolved_step) == (step(100), step(124))
    assert (second.onset_step, second.state) == (step(170), "firing")


def test_readings_in_another_unit_than_the_capacity_say_nothing() -> None:
    """Bytes against a capacity in GB: a configuration error, not a full GPU."""
    mem = memory((100, 60.0), (50, 78.0)) * 1e9
    assert Memory().detect(run(mem, {"gpu_mem_total": 80.0})) == []
    [finding] = Memory(capacity=80e9).detect(run(mem))
    assert finding.onset_step == step(100)


def test_non_finite_readings_are_skipped() -> None:
    mem = memory((100, 60.0), (50, 78.0))
    mem[[101, 102]] = [np.nan, np.inf]
    [finding] = Memory().detect(run(mem, {"gpu_mem_total": 80.0}))
    assert (finding.onset_step, finding.detected_step) == (step(100), step(106))


@pytest.mark.parametrize("status", [
    "failed: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "RuntimeError: CUDA error: out of memory",
    "killed (OOM)",
])
def test_an_out_of_memory_failure_is_critical(status: str) -> None:
    mem = memory((150, 78.0))
    [finding] = Memory().detect(run(mem, {"status": status}))
    assert (finding.severity, finding.state) == ("critical", "firing")
    assert (finding.onset_step, finding.detected_step) == (step(149), step(149))
    assert finding.summary == f"the run failed out of memory after step 1500 ({status!r})"
    assert finding.evidence["rule"] == "out_of_memory"
    assert finding.evidence["last"] == [step(149), pytest.approx(mem[-1])]
    assert finding.rollback_to is None


def test_an_out_of_memory_failure_with_capacity_comes_after_the_warning() -> None:
    mem = memory((100, 60.0), (50, 78.0))
    near, oom = Memory().detect(run(mem, {"gpu_mem_total": 80.0,
                                          "error": "CUDA out of memory"}))
    assert (near.severity, oom.severity) == ("warning", "critical")
    assert oom.evidence["capacity"] == 80.0


def test_without_a_capacity_a_watcher_reads_only_the_new_points() -> None:
    """No capacity: the episodes are never judged, but the peak (the out-of-memory
    finding's evidence) is kept a poll at a time from the new points alone (the resume
    point for episodes never moves here, and re-reading from it made a poll's cost grow
    with the history); the peak long before the last poll is still known."""
    mem = memory((100, 60.0), (5, 79.0), (400, 60.0))
    analyzer = Memory()
    for n in range(10, len(mem) + 1, 25):
        analyzer.detect(run(mem[:n]))
        [entry] = analyzer._streams._entries.values()
        assert (entry.state.peaked, entry.state.resume) == (n, 0)
    meta = {"status": "failed: CUDA out of memory"}
    [polled] = analyzer.detect(run(mem, meta))
    [full] = Memory().detect(run(mem, meta))
    assert polled.evidence["peak"] == full.evidence["peak"] == mem.max()


def test_an_out_of_memory_failure_without_memory_readings() -> None:
    data = RunData.from_series("run-1", {"train/loss": np.full(30, 2.0)},
                               meta={"status": "CUDA out of memory"})
    [finding] = Memory().detect(data)
    assert (finding.onset_step, finding.severity) == (30, "critical")


@pytest.mark.parametrize("status", ["FAILED", "failed (exit code 1)", "finished", "KILLED",
                                    "zoomed"])
def test_other_failures_are_not_out_of_memory(status: str) -> None:
    assert Memory().detect(run(memory((150, 78.0)), {"status": status})) == []


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"metric": ""}, "metric"),
    ({"capacity": 0}, "capacity"),
    ({"capacity": float("nan")}, "capacity"),
    ({"capacity": "80GB"}, "capacity"),
    ({"threshold": 0.05}, "threshold"),
    ({"threshold": 1.0}, "threshold"),
    ({"patience": 0}, "patience"),
    ({"window": 2}, "window"),
])
def test_bad_parameters_raise(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Memory(**kwargs)


def test_a_million_points_are_analysed() -> None:
    rng = np.random.default_rng(1)
    mem = 60.0 + rng.random(1_000_000)
    for start in rng.integers(0, 999_000, 200):
        mem[start:start + 50] = 78.0
    data = run(mem, {"gpu_mem_total": 80.0})
    data.series("gpu_mem")
    findings = Memory().detect(data)
    assert 150 < len(findings) <= 200


needs_corpus = pytest.mark.skipif(not CORPUS.exists(), reason="shared corpus not available")


def corpus_run(relative: str, **meta: object) -> RunData:
    batch = open_source(str(CORPUS / relative)).discover()[0].read(final=True)
    return RunData(run=relative, metrics=batch.points, checkpoints=batch.checkpoints,
                   meta={**batch.meta, **meta})


@needs_corpus
def test_megatron_release_test_on_h100_is_far_from_capacity() -> None:
    """Mixtral 8x7B on H100 (80 GB): peak allocated 26.5e9 bytes, a third of capacity."""
    data = corpus_run("megatron_golden_json/mixtral_8x7b_release_h100.json")
    assert Memory(metric="mem-max-allocated-bytes", capacity=80e9).detect(data) == []
    assert Memory(metric="mem-max-allocated-bytes", capacity=27e9).detect(data) != []


@needs_corpus
def test_deepspeed_chat_allocated_memory_is_far_from_capacity() -> None:
    """MemAllocated 3.96 GB throughout on an 80 GB device."""
    data = corpus_run("deepspeed_chat_text/dschat_step1_sft_opt1.3b.log", gpu_mem_total=80.0)
    assert len(data.series("gpu_mem")) == 736
    assert Memory().detect(data) == []


@needs_corpus
def test_runs_with_no_visible_problem_stay_quiet() -> None:
    with open(MANIFEST, newline="") as fh:
        healthy = [row["file"] for row in csv.DictReader(fh)
                   if row["your_observation"].startswith("NO VISIBLE PROBLEM")]
    for relative in healthy:
        assert Memory().detect(corpus_run(relative)) == [], relative
