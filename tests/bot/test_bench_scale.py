"""The scale bench's generator (issue 27): what it writes is read by the real reader as the
canonical tags, healthy, with the NaN in the run and at the step it was asked for."""

import math

from benchmarks.scale import append_points, make_runs, run_path
from connectors.aliases import AliasTable
from connectors.registry import open_source


def test_the_runs_written_are_read_as_canonical_tags_with_the_nan_where_asked(tmp_path):
    folder = tmp_path / "runs"
    make_runs(folder, 3, 20)
    append_points(folder, 3, 21, 5, nan_runs=frozenset({1}))
    source = open_source(str(folder), aliases=AliasTable())
    readers = {r.run: r for r in source.discover()}
    assert sorted(readers) == [run_path(folder, r).stem for r in range(3)]
    points = readers["run0001"].read(None).points
    assert set(points["tag"]) == {"train/loss", "lr", "grad_norm", "throughput"}
    loss = points[points["tag"] == "train/loss"].set_index("step")["value"]
    assert list(loss.index) == list(range(1, 26))
    assert [s for s, v in loss.items() if not math.isfinite(v)] == [25]
    assert (loss.iloc[:24].diff().dropna() < 0.03).all()  # falling, with 1% noise
    other = readers["run0002"].read(None).points
    assert other["value"].map(math.isfinite).all() and len(other) == 4 * 25
