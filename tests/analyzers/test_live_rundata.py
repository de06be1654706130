"""A watcher's attempt extended poll by poll (RunData.extended) reads as the same attempt
built whole, and every analyzer finds the same on it."""

import numpy as np
import pandas as pd
import pytest

from analyzers import RunData
from benchmarks.detect import available_analyzers
from benchmarks.synthetic import synthetic_suite


def frame(steps, tag, values, walls=None):
    walls = np.full(len(steps), np.nan) if walls is None else walls
    return pd.DataFrame({"step": steps, "tag": tag, "value": values, "wall_time": walls})


def same(a: RunData, b: RunData) -> None:
    assert a.tags() == b.tags()
    for tag in a.tags():
        pd.testing.assert_series_equal(a.series(tag), b.series(tag), check_names=False)
        np.testing.assert_array_equal(a.wall_times(tag), b.wall_times(tag))
    assert a.last_step() == b.last_step()
    assert a.last_wall() == b.last_wall() or (a.last_wall() is None and b.last_wall() is None)


def test_extending_poll_by_poll_equals_the_whole_attempt():
    rng = np.random.default_rng(0)
    whole = []
    data = RunData(run="r")
    step = 0
    for poll in range(30):
        rows = []
        for _ in range(int(rng.integers(0, 6))):
            step += int(rng.integers(0, 3))  # a step may repeat (the newer value wins)
            for tag in ("loss", "lr") if poll % 7 else ("loss", "lr", f"eval/{poll}"):
                value = float(rng.choice([rng.normal(), np.nan, np.inf]))
                rows.append(frame([step], tag, [value], [1e9 + step + poll]))
        new = pd.concat(rows, ignore_index=True) if rows else frame([], "loss", [])
        whole.append(new)
        data = data.extended(new)
        assert data is not None and data.live
        same(data, RunData(run="r", metrics=pd.concat(whole, ignore_index=True)))
    # the long frame, when asked for, holds the same points
    again = RunData(run="r", metrics=data.metrics)
    same(again, data)


def test_a_point_before_the_last_step_asks_for_a_full_read_and_the_parent_is_untouched():
    data = RunData.from_series("r", {"loss": [3.0, 2.0, 1.0]})
    before = data.series("loss").copy()
    replaced = data.extended(frame([3], "loss", [9.0]))
    assert replaced.series("loss").tolist() == [3.0, 2.0, 9.0]
    pd.testing.assert_series_equal(data.series("loss"), before)  # copied, not overwritten
    assert data.extended(frame([2], "loss", [5.0])) is None
    # two children of one parent do not write into each other's points
    a = replaced.extended(frame([4], "loss", [4.0]))
    b = replaced.extended(frame([4], "loss", [8.0]))
    assert a.series("loss").tolist()[-1] == 4.0 and b.series("loss").tolist()[-1] == 8.0


def test_history_checksums_carry_over_unless_the_point_changed():
    data = RunData.from_series("r", {"loss": [3.0, 2.0, 1.0]})
    full = data.digest("loss", 3)
    kept = data.extended(frame([4], "loss", [0.5]))
    assert kept._digests[("loss", 3)] == full == kept.digest("loss", 3)
    changed = data.extended(frame([3], "loss", [0.7]))
    assert ("loss", 3) not in changed._digests
    assert changed.digest("loss", 3) != full



def test_checksums_do_not_pile_up_over_a_long_watch():
    """Each poll's analyzers ask for the lengths the previous poll saved: two per tag are
    kept, whatever the number of polls, and the ones kept are still right."""
    live = RunData.from_series("r", {"loss": [3.0, 2.0]})
    for poll in range(200):
        live.digest("loss", len(live.series("loss")))
        live = live.extended(frame([3 + poll], "loss", [1.0 / (poll + 1)]))
    assert sorted(n for _, n in live._digests) == [200, 201]
    loss = live.series("loss")
    whole = RunData.from_series("r", {"loss": loss.to_numpy()}, steps=loss.index.to_numpy())
    assert live._digests[("loss", 201)] == whole.digest("loss", 201)

CASES = [c for c in synthetic_suite(seed=3, repeats=1,
                                    signals=["spike", "stalled", "overfit", "repetition",
                                             "diminishing_returns"])
         if c.name.endswith("/strong/0") or c.name.startswith("stalled/")][:6]


def polls(data: RunData, count: int = 12):
    """The attempt's rows as a watcher reads them: in step order, a poll at a time."""
    rows = data.metrics.sort_values("step", kind="stable").reset_index(drop=True)
    edges = np.unique(np.linspace(0, len(rows), count + 1).astype(int))
    return [rows.iloc[a:b] for a, b in zip(edges[:-1], edges[1:], strict=True)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_analyzer_finds_the_same_on_a_live_attempt(case):
    whole = case.data
    parts = {"meta": whole.meta, "checkpoints": whole.checkpoints,
             "generations": whole.generations, "now": whole.now}
    live, streaming = RunData(run=whole.run, attempt=whole.attempt), available_analyzers()
    for k, rows in enumerate(polls(whole)):
        live = live.extended(rows, **parts)
        found = [f for a in streaming for f in a.detect(live)]
        if k % 4 == 3:  # and on the way, the same as analyzers that start afresh
            fresh = [f for a in available_analyzers() for f in a.detect(live)]
            assert [(f.signal, f.detected_step, f.state) for f in found] == [
                (f.signal, f.detected_step, f.state) for f in fresh]
    expected = [f for a in available_analyzers() for f in a.detect(whole)]
    key = [(f.signal, f.onset_step, f.detected_step, f.state, f.summary) for f in found]
    assert key == [(f.signal, f.onset_step, f.detected_step, f.state, f.summary)
                   for f in expected]
    assert key  # each case has something to find
