"""The stalled analyzer on runs with wall times: live silences, past ones, and the guards."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.stalled import Stalled

T0 = 1_700_000_000.0
CHECKPOINTS = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (500, 1000, 1500)]


def run(walls: np.ndarray, *, now: float | None, steps: np.ndarray | None = None,
        meta: dict | None = None, tag: str = "train/loss", **extra: np.ndarray) -> RunData:
    """One point of ``tag`` per step (1, 2, …) logged at ``walls`` seconds after T0."""
    steps = np.arange(1, len(walls) + 1) if steps is None else steps
    data = RunData.from_series("run-1", {tag: np.full(len(walls), 2.0)}, steps=steps,
                               checkpoints=CHECKPOINTS, meta=meta, now=now)
    data.metrics["wall_time"] = T0 + np.asarray(walls, dtype=float)
    return data


def steady(points: int = 1600, every: float = 10.0) -> np.ndarray:
    return every * np.arange(1, points + 1)


def test_a_silent_run_fires_at_its_last_step_with_its_numbers() -> None:
    walls = steady()
    [finding] = Stalled().detect(run(walls, now=T0 + walls[-1] + 3600))
    assert (finding.onset_step, finding.detected_step) == (1600, 1600)
    assert (finding.state, finding.severity, finding.rollback_to) == ("firing", "warning", None)
    assert finding.summary == (
        "no new point for 1h since step 1600 (usual interval 10s; limit 15m); resume "
        "from the latest checkpoint, ckpt/checkpoint-1500 at step 1500")
    evidence = finding.evidence
    assert evidence["latest_checkpoint"] == [1500, "ckpt/checkpoint-1500"]
    assert (evidence["silence_s"], evidence["usual_interval_s"], evidence["limit_s"]) == (
        3600, 10, 900)
    spec = CATALOG["stalled"]
    assert finding.fixes == list(spec.fixes) and finding.kind == "cant_finish"
    json.dumps(finding.to_dict(), allow_nan=False)


def test_nothing_is_claimed_without_now_or_wall_times() -> None:
    walls = steady()
    assert Stalled().detect(run(walls, now=None)) == []
    data = RunData.from_series("run-1", {"train/loss": np.full(100, 2.0)}, now=T0 + 1e9)
    assert Stalled().detect(data) == []  # from_series logs no wall time


def test_the_limit_is_the_largest_of_floor_own_interval_and_pauses() -> None:
    walls = steady()
    assert Stalled().detect(run(walls, now=T0 + walls[-1] + 899)) == []
    assert Stalled().detect(run(walls, now=T0 + walls[-1] + 901))
    # A slow run, one point every 5 minutes: 10 × its interval is 50 minutes.
    slow = steady(50, every=300.0)
    assert Stalled().detect(run(slow, now=T0 + slow[-1] + 2900)) == []
    [finding] = Stalled().detect(run(slow, now=T0 + slow[-1] + 3100))
    assert finding.evidence["limit_s"] == 3000


def test_evaluation_pauses_raise_the_limit() -> None:
    """A 20-minute evaluation every 500 steps: the first is reported (and resolved), the
    next ones are the run's habit, and so is a 25-minute silence now."""
    walls = steady()
    for step in (500, 1000, 1500):
        walls[step:] += 1200
    findings = Stalled().detect(run(walls, now=T0 + walls[-1] + 1500))
    assert [(f.onset_step, f.state, f.resolved_step) for f in findings] == [
        (500, "resolved", 501)]
    assert findings[0].summary.endswith("; it went on at step 501")
    assert findings[0].evidence["silence_s"] == pytest.approx(1210)
    past, now = Stalled().detect(run(walls, now=T0 + walls[-1] + 1900))  # over 1.5 × 1210 s
    assert past.fingerprint == findings[0].fingerprint
    assert (now.onset_step, now.state, now.evidence["limit_s"]) == (1600, "firing",
                                                                    pytest.approx(1815))


@pytest.mark.parametrize("config", [{"eval_steps": 500}, {"save_steps": 500},
                                    {"eval_steps": 500 / 1600},
                                    {"eval_steps": "500"}])  # MLflow's params are text
def test_a_first_scheduled_evaluation_or_save_may_take_longer_than_the_floor(
        config: dict) -> None:
    """The config says an evaluation (or a save) is due every 500 steps: the first one's
    20 minutes are not a stall (nothing shows yet how long it takes); once it has been
    seen, the run's own pauses set the limit as without a config (a 40-minute silence at
    the next one is reported). A hang at the first one is reported after the allowance,
    and a silence at a step with nothing scheduled gets none."""
    meta = {"config": config, "total_steps": 1600}
    walls = steady()
    walls[500:] += 1200
    walls[1000:] += 2400
    findings = Stalled().detect(run(walls, now=T0 + walls[-1] + 60, meta=meta))
    assert [(f.onset_step, f.state) for f in findings] == [(1000, "resolved")]
    assert findings[0].evidence["limit_s"] == pytest.approx(1.5 * 1210)
    # Live, in the middle of the first evaluation: quiet for an hour, then a stall.
    first = walls[:500]
    assert Stalled().detect(run(first, now=T0 + first[-1] + 3500, meta=meta)) == []
    [hang] = Stalled().detect(run(first, now=T0 + first[-1] + 3700, meta=meta))
    assert (hang.onset_step, hang.state, hang.evidence["limit_s"]) == (500, "firing", 3600)
    # Silent at step 499 (nothing scheduled): the floor as ever.
    assert Stalled().detect(run(walls[:499], now=T0 + walls[498] + 1000, meta=meta))
    # Without the config the first evaluation is reported, as before.
    assert [f.onset_step for f in Stalled().detect(run(walls, now=T0 + walls[-1] + 60))] == [
        500, 1000]
    assert Stalled(scheduled_pause=0).detect(run(first, now=T0 + first[-1] + 1000,
                                                 meta=meta))


def test_a_stall_resolves_when_new_points_arrive() -> None:
    """Between two polls the run came back: the stall reported before is now resolved,
    under the same identity (fingerprint), at the first new step."""
    walls = steady()
    firing = Stalled().detect(run(walls[:1200], now=T0 + walls[1199] + 7200))
    assert [f.state for f in firing] == ["firing"]
    resumed = walls.copy()
    resumed[1200:] += 7200
    [resolved] = Stalled().detect(run(resumed, now=T0 + resumed[-1] + 10))
    assert (resolved.state, resolved.onset_step, resolved.resolved_step) == (
        "resolved", 1200, 1201)
    assert resolved.fingerprint == firing[0].fingerprint


def test_a_failed_status_is_critical_and_does_not_wait_for_the_floor() -> None:
    walls = steady()
    meta = {"status": "failed (exit code 1)"}
    [finding] = Stalled().detect(run(walls, now=T0 + walls[-1] + 120, meta=meta))
    assert finding.severity == "critical" and finding.evidence["limit_s"] == 100
    assert finding.summary.endswith("; the run's status is 'failed (exit code 1)'")
    for status in ("FAILED", "KILLED", "crashed"):
        assert Stalled().detect(run(walls, now=T0 + walls[-1] + 120,
                                    meta={"status": status}))[0].severity == "critical"


@pytest.mark.parametrize("meta", [{"status": "FINISHED"}, {"status": "finished"},
                                  {"ended_at": T0 + 1e5}, {"total_steps": 1600}])
def test_a_finished_run_has_not_stalled(meta: dict) -> None:
    walls = steady()
    assert Stalled().detect(run(walls, now=T0 + walls[-1] + 1e6, meta=meta)) == []


def test_start_up_is_not_judged() -> None:
    """Four points are too few to know the run's pace (compilation, data loading)."""
    walls = steady(4)
    assert Stalled().detect(run(walls, now=T0 + walls[-1] + 1e5)) == []
    assert Stalled(min_points=2).detect(run(walls, now=T0 + walls[-1] + 1e5))


def test_a_slow_start_up_does_not_raise_the_limit_for_the_rest_of_the_run() -> None:
    """Two hours of loading before the second point: the start-up is not judged, and it
    is no pause the run "came back from" either, or it would allow three hours of silence
    from then on. A later pause after the start-up still raises the limit."""
    walls = steady(300)
    walls[1:] += 7200
    [finding] = Stalled().detect(run(walls, now=T0 + walls[-1] + 9000))
    assert finding.evidence["limit_s"] == 900
    walls[100:] += 3600  # an hour-long evaluation after the start-up
    findings = Stalled().detect(run(walls, now=T0 + walls[-1] + 3600 * 1.4))
    # The evaluation is reported (resolved); 1.4 h of silence now is within 1.5 × 1 h.
    assert [(f.state, f.detected_step) for f in findings] == [("resolved", 100)]


def test_any_tag_is_a_sign_of_life_and_steps_set_the_pace_without_the_metric() -> None:
    walls = steady()
    data = run(walls, now=T0 + walls[-1] + 1000, tag="lm loss")  # no train/loss
    [finding] = Stalled().detect(data)
    assert finding.evidence["usual_interval_s"] == 10
    # An evaluation logged 15 minutes after the last train point keeps it alive.
    data = run(walls, now=T0 + walls[-1] + 1500)
    data.metrics.loc[len(data.metrics)] = [1600, "eval/loss", 2.5, T0 + walls[-1] + 900]
    assert Stalled().detect(data) == []


def test_steps_out_of_order_and_repeated_steps() -> None:
    """A run resumed from step 1000 rewrites steps 1001–1200 after an hour's silence."""
    walls = np.concatenate((steady(1200), steady(200) + 12_000 + 3600))
    steps = np.concatenate((np.arange(1, 1201), np.arange(1001, 1201)))
    [finding] = Stalled().detect(run(walls, steps=steps, now=T0 + walls[-1] + 5))
    assert (finding.state, finding.onset_step, finding.resolved_step) == ("resolved", 1200, 1200)
    assert finding.evidence["resumed_at_step"] == 1001


@pytest.mark.parametrize(("params", "name"), [
    ({"metric": ""}, "metric"),
    ({"min_silence": 0}, "min_silence"),
    ({"factor": 0.5}, "factor"),
    ({"gap_margin": float("inf")}, "gap_margin"),
    ({"min_points": 1}, "min_points"),
    ({"scheduled_pause": -1.0}, "scheduled_pause"),
    ({"scheduled_pause": float("nan")}, "scheduled_pause"),
])
def test_bad_parameters_are_rejected(params: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Stalled(**params)


@pytest.mark.parametrize(("meta", "silence", "onsets"), [
    ({}, 3600, [600, 1200]),
    # The evaluation due at step 600 takes 40 minutes: within the allowance.
    ({"config": {"eval_steps": 600}}, 2400, [1200]),
])
def test_a_live_run_read_poll_by_poll_is_judged_as_a_whole_one(
        meta: dict, silence: float, onsets: list[int]) -> None:
    """Without the heartbeat metric the pace is the times new steps appear; kept poll by
    poll (several tags a poll, one point at the same time as the last poll's) it gives the
    findings of the whole run read at once."""
    rng = np.random.default_rng(0)
    steps = np.arange(1, 1201)
    walls = T0 + np.cumsum(rng.uniform(5, 15, len(steps)))
    walls[600:] += silence  # a past silence after step 600
    rows = pd.DataFrame({"step": np.r_[steps, steps[::50]],
                         "tag": ["lm loss"] * len(steps) + ["eval/loss"] * len(steps[::50]),
                         "value": 2.0, "wall_time": np.r_[walls, walls[::50]]})
    rows = rows.sort_values(["step", "tag"], kind="stable").reset_index(drop=True)
    now = float(walls[-1]) + 30_000  # longer than the hour it came back from
    live, streaming = RunData(run="run-1", meta=meta), Stalled()
    for part in np.array_split(np.arange(len(rows)), 9):
        live = live.extended(rows.iloc[part], now=now)
        found = streaming.detect(live)
    whole = RunData(run="run-1", metrics=rows, now=now, meta=meta)
    expected = Stalled().detect(whole)
    assert [(f.onset_step, f.state, f.summary) for f in found] == [
        (f.onset_step, f.state, f.summary) for f in expected]
    assert [f.onset_step for f in found] == onsets


def test_the_last_point_logged_again_later_is_read_afresh() -> None:
    """Step 20 logged again, same value, an hour later (a restart re-logs it): its history
    checksum is unchanged, but its wall time moved; a live watcher must not keep the old
    one."""
    steps = np.arange(1, 21)
    first = pd.DataFrame({"step": steps, "tag": "train/loss", "value": 2.0,
                          "wall_time": T0 + 10.0 * steps})
    again = pd.DataFrame({"step": [20], "tag": "train/loss", "value": [2.0],
                          "wall_time": [T0 + 3800.0]})
    live, streaming = RunData(run="run-1"), Stalled(min_silence=60)
    live = live.extended(first, now=T0 + 210)
    streaming.detect(live)
    live = live.extended(again, now=T0 + 3860)
    found = [(f.state, f.summary) for f in streaming.detect(live)]
    assert found == [(f.state, f.summary) for f in Stalled(min_silence=60).detect(live)]
    assert [state for state, _ in found] == ["resolved"]
