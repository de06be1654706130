import math
import sqlite3

import numpy as np
import pandas as pd
import pytest
import sqlite_utils

from analyzers.base import Checkpoint
from bot.store import MIGRATIONS, Store


def frame(rows):
    return pd.DataFrame(rows, columns=["step", "tag", "value", "wall_time"])


def ingest(store, rows, **kw):
    args = dict(run="exp1", source="file", log_path="x", cursor_key="k", cursor={"offset": 1},
                points=frame(rows), checkpoints=[], meta={}, malformed=[], skipped_values=0,
                notices=[])
    args.update(kw)
    return store.ingest(**args)


def test_fresh_file_is_migrated_in_wal_mode(tmp_path):
    path = str(tmp_path / "rw.db")
    store = Store(path)
    assert store.schema_version == len(MIGRATIONS)
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = set(store.db.table_names())
    assert {"runs", "points", "steps", "series", "checkpoints", "findings", "notifications",
            "actions", "cursors", "threads", "outbox"} <= tables
    assert "metrics" in store.db.view_names()
    store.close()
    assert Store(path).schema_version == len(MIGRATIONS)  # reopening migrates nothing


def test_newer_schema_is_refused(tmp_path):
    path = str(tmp_path / "rw.db")
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="upgrade runwatch"):
        Store(path)


def test_ingest_stores_points_cursor_and_problems(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    result = ingest(store, [(1, "train/loss", 2.0, 10.0), (2, "train/loss", float("nan"), None)],
                    malformed=[(7, "not JSON")], skipped_values=2, meta={"total_steps": 100},
                    checkpoints=[Checkpoint(1, "/ck/checkpoint-1", 5.0)])
    assert result.new_points == 2 and result.attempt == 1
    data = store.run_data("exp1")
    loss = data.series("train/loss")
    assert loss[1] == 2.0 and math.isnan(loss[2])
    assert store.cursors() == {"k": {"offset": 1}}
    run = store.run("exp1")
    assert (run["malformed_lines"], run["first_malformed_line"], run["skipped_values"],
            run["total_steps"]) == (1, 7, 2, 100)
    ingest(store, [], malformed=[(9, "x")])
    assert store.run("exp1")["first_malformed_line"] == 7
    assert store.run("exp1")["malformed_lines"] == 2
    assert [c.step for c in store.checkpoints("exp1")] == [1]


def test_step_rewind_starts_a_new_attempt_and_keeps_history(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    ingest(store, [(s, "train/loss", 1.0, None) for s in range(1, 11)])
    result = ingest(store, [(6, "train/loss", 0.5, None), (7, "train/loss", 0.4, None)])
    assert result.attempt == 2 and "step went back from 10 to 6" in result.notices[0]
    assert list(store.run_data("exp1").series("train/loss").index) == [6, 7]
    assert len(store.run_data("exp1", attempt=1).series("train/loss")) == 10
    # an eval point at the same step as the last train point is not a rewind
    assert ingest(store, [(7, "eval/loss", 0.9, None)]).attempt == 2


def test_two_step_counters_interleaving_across_reads_are_one_attempt(tmp_path):
    """A log with DeepSpeed's optimizer steps beside an example's own eval steps (twice
    as many): each tag goes forward, so no read is a rewind, until a tag goes back."""
    store = Store(str(tmp_path / "rw.db"))
    ingest(store, [(0, "lr", 1.0, None), (0, "ppl", 60.0, None), (20, "ppl", 61.0, None)])
    assert ingest(store, [(12, "lr", 1.0, None), (40, "ppl", 62.0, None)]).attempt == 1
    assert ingest(store, [(30, "ppl", 70.0, None)]).attempt == 2


def test_failed_ingest_keeps_what_was_stored(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    ingest(store, [(1, "train/loss", 1.0, None)])
    with pytest.raises(ValueError):
        ingest(store, [(2, "train/loss", "not a number", None)])
    assert list(store.run_data("exp1").series("train/loss").index) == [1]
    assert store.cursors() == {"k": {"offset": 1}}


def test_run_metadata_from_the_source_is_kept_and_merged(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    ingest(store, [], meta={"total_steps": 10, "config": {"lr": 0.1}, "status": "RUNNING",
                            "data_version": "v3"})
    ingest(store, [], meta={"status": "FINISHED"})
    meta = store.run_data("exp1").meta
    assert meta == {"total_steps": 10, "config": {"lr": 0.1}, "status": "FINISHED",
                    "data_version": "v3"}


def generation_rows(rows):
    return pd.DataFrame(rows, columns=["step", "prompt", "output", "probe"])


def test_generations_are_stored_by_attempt_with_their_probe_marks(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    ingest(store, [(1, "train/loss", 2.0, 10.0), (2, "train/loss", 1.9, 11.0)])
    result = store.ingest_generations(
        run="exp1", source="file", log_path="x", cursor_key="generations:/x",
        cursor={"offset": 9}, notices=["exp1: generations.jsonl: 1 malformed line skipped"],
        rows=generation_rows([(100, "benign", "Sure.", True), (100, "hi", "hello", None)]))
    assert (result.new_generations, result.attempt, result.new_points) == (2, 1, 0)
    assert store.run_data("exp1").generations.to_dict("records") == [
        {"step": 100, "prompt": "benign", "output": "Sure.", "probe": True},
        {"step": 100, "prompt": "hi", "output": "hello", "probe": False}]
    assert store.cursors()["generations:/x"] == {"offset": 9}
    assert "1 malformed line" in store.run("exp1")["last_notice"]
    ingest(store, [(1, "train/loss", 3.0, 20.0)])  # the run went back: attempt 2
    store.ingest_generations(run="exp1", source="file", log_path="x", cursor_key="g",
                             cursor={}, notices=[],
                             rows=generation_rows([(5, "", "again", None)]))
    generations = store.run_data("exp1").generations
    assert generations.to_dict("records") == [{"step": 5, "prompt": "", "output": "again"}]
    assert len(store.run_data("exp1", attempt=1).generations) == 2


def database_before(path, migration):
    """A database as runwatch left it before ``migration``: the migrations released up to
    then, applied as they were (a released migration is never edited)."""
    version = [m.__name__ for m in MIGRATIONS].index(migration)
    db = sqlite_utils.Database(path)
    for step in MIGRATIONS[:version]:
        step(db)
    db.execute(f"PRAGMA user_version = {version}")
    return db


def test_a_store_from_before_generations_is_upgraded_in_place(tmp_path):
    path = str(tmp_path / "rw.db")
    db = database_before(path, "_generations")
    db["runs"].insert({"name": "exp1", "source": "file", "log_path": "x", "attempt": 1})
    db["metrics"].insert_all([{"run": "exp1", "attempt": 1, "tag": "train/loss", "step": s,
                               "value": v, "wall_time": w}
                              for s, v, w in [(1, 2.0, 10.0), (2, 1.9, 12.0)]])
    db.close()
    store = Store(path)
    assert store.schema_version == len(MIGRATIONS) and "generations" in store.db.table_names()
    assert store.run_data("exp1").generations.empty
    assert store.run_data("exp1").series("train/loss").to_dict() == {1: 2.0, 2: 1.9}
    assert store.activity("exp1")[0]["last_wall"] == 12.0  # filled from the points


def test_the_latest_wall_time_of_the_current_attempt_is_kept(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    ingest(store, [(1, "train/loss", 2.0, 10.0), (2, "train/loss", 1.9, None)])
    ingest(store, [(3, "train/loss", 1.8, float("nan"))])
    [row] = store.activity()
    assert (row["run"], row["attempt"], row["last_wall"]) == ("exp1", 1, 10.0)
    ingest(store, [(4, "train/loss", 1.7, 30.0)])
    assert store.activity("exp1")[0]["last_wall"] == 30.0
    ingest(store, [(1, "train/loss", 2.0, None)])  # went back: attempt 2 has no wall time yet
    [row] = store.activity("exp1")
    assert (row["attempt"], row["last_wall"]) == (2, None)
    ingest(store, [(2, "train/loss", 1.9, 40.0)])
    assert store.activity("exp1")[0]["last_wall"] == 40.0


def test_a_watchers_read_adds_only_what_was_logged_since(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    ingest(store, [(1, "loss", 3.0, 10.0), (1, "lr", 1e-3, 10.0), (2, "loss", 2.5, 11.0)])
    live = store.run_data("exp1")
    ingest(store, [(2, "loss", 2.4, 12.0), (3, "loss", math.nan, 13.0),
                   (3, "eval/loss", 2.9, None)])
    live = store.run_data("exp1", since=live)
    assert live.live  # extended from the earlier read, not read whole
    whole = store.run_data("exp1")
    for tag in whole.tags():
        pd.testing.assert_series_equal(live.series(tag), whole.series(tag), check_names=False)
    assert live.tags() == whole.tags() == ["eval/loss", "loss", "lr"]
    assert live.series("loss").iloc[1] == 2.4  # the newer value of step 2
    assert live.last_wall() == whole.last_wall() == 13.0
    # the step goes back: a new attempt, read whole
    ingest(store, [(1, "loss", 3.1, 20.0)])
    again = store.run_data("exp1", since=live)
    assert (again.attempt, again.live, again.series("loss").tolist()) == (2, False, [3.1])


def test_the_last_step_and_new_points_are_index_lookups(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    plans = [" ".join(str(c) for c in row) for sql in (
        "SELECT MAX(step) FROM steps WHERE attempt_id = 1",
        "SELECT step, value FROM points WHERE series = 1 AND step >= 5",
        "SELECT step, wall_time FROM steps WHERE attempt_id = 1 AND step >= 5")
        for row in store.db.execute("EXPLAIN QUERY PLAN " + sql).fetchall()]
    assert all("SEARCH" in plan and "PRIMARY KEY" in plan for plan in plans), plans


def test_points_from_the_previous_layout_are_all_kept_in_the_compact_one(tmp_path):
    path = str(tmp_path / "rw.db")
    db = database_before(path, "_compact_points")
    old = [("a", 1, "train/loss", 1, 2.0, 10.0), ("a", 1, "lr", 1, 1e-3, 10.5),
           ("a", 1, "train/loss", 2, None, 11.0), ("a", 1, "lr", 2, 1e-3, None),
           ("a", 2, "train/loss", 1, 3.5, 20.0), ("b", 1, "eval/loss", 100, 1.25, None),
           ("b", 1, "train/loss", 100, float("inf"), 30.0)]
    for run in ("a", "b"):
        db["runs"].insert({"name": run, "source": "file", "log_path": run, "attempt": 1})
    db["metrics"].insert_all([dict(zip(["run", "attempt", "tag", "step", "value", "wall_time"],
                                       row, strict=True)) for row in old])
    db.close()
    store = Store(path)
    kept = store.query("SELECT run, attempt, tag, step, value, wall_time FROM metrics "
                       "ORDER BY run, attempt, tag, step")
    # a step keeps one wall time: the latest its points logged
    walls = {("a", 1, 1): 10.5, ("a", 1, 2): 11.0, ("a", 2, 1): 20.0, ("b", 1, 100): 30.0}
    expected = sorted((r, a, t, s, v, walls[(r, a, s)]) for r, a, t, s, v, _ in old)
    assert [tuple(row.values()) for row in kept] == expected
    assert "metrics" in store.db.view_names() and "metrics_by_step" not in {
        r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert math.isnan(store.run_data("a", attempt=1).series("train/loss")[2])
    assert store.last_step("a", 1) == 2 and store.last_step("b", 1) == 100
    assert store.db.execute("PRAGMA freelist_count").fetchone()[0] == 0  # the old pages freed


def test_points_are_one_clustered_table_without_a_second_index(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    sql = store.db.execute("SELECT sql FROM sqlite_master WHERE name = 'points'").fetchone()[0]
    assert "WITHOUT ROWID" in sql
    assert not store.db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND "
                                "tbl_name = 'points'").fetchall()
    ingest(store, [(s, tag, s / 7, 1000.0 + s) for s in range(5000)
                   for tag in ("train/loss", "lr", "grad_norm", "throughput", "gpu_mem")])
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pages = store.db.execute("SELECT page_count * page_size FROM pragma_page_count(), "
                             "pragma_page_size()").fetchone()[0]
    empty = Store(str(tmp_path / "empty.db"))
    base = empty.db.execute("SELECT page_count * page_size FROM pragma_page_count(), "
                            "pragma_page_size()").fetchone()[0]
    assert (pages - base) / 25_000 <= 30  # the old layout took 80-130 bytes a point


def test_writes_through_the_old_name_land_in_the_compact_tables(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    ingest(store, [(1, "loss", 2.0, 10.0)])
    with store.transaction() as db:
        db.conn.executemany("INSERT OR REPLACE INTO metrics (run, attempt, tag, step, value, "
                            "wall_time) VALUES ('exp1', 1, ?, ?, ?, ?)",
                            [("loss", 1, 1.5, 9.0), ("loss", 2, 1.4, 12.0), ("lr", 2, 0.1, None)])
    ids = store.query("SELECT id FROM series ORDER BY id")
    assert len(ids) == 2  # the existing series kept its id
    data = store.run_data("exp1")
    assert data.series("loss").to_dict() == {1: 1.5, 2: 1.4}
    assert store.query("SELECT step, wall_time FROM steps ORDER BY step") == [
        {"step": 1, "wall_time": 10.0}, {"step": 2, "wall_time": 12.0}]


def test_the_wal_is_truncated_by_the_periodic_checkpoint(tmp_path):
    path = tmp_path / "rw.db"
    store = Store(str(path))
    assert store.db.execute("PRAGMA journal_size_limit").fetchone()[0] == 64 * 2**20
    ingest(store, [(s, "loss", s / 3, None) for s in range(20_000)])
    assert (tmp_path / "rw.db-wal").stat().st_size > 0
    store.checkpoint(every=0)
    assert (tmp_path / "rw.db-wal").stat().st_size == 0
    assert store.run_data("exp1").series("loss").size == 20_000


def test_two_rewinds_in_one_read_make_two_attempts_and_the_last_value_of_a_point_wins(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    result = ingest(store, [(1, "loss", 3.0, 1.0), (2, "loss", 2.0, 2.0), (2, "loss", 1.5, 2.5),
                            (1, "loss", 3.1, 3.0), (1, "lr", 0.1, 3.0), (3, "loss", 2.9, 4.0),
                            (2, "loss", 2.8, 5.0)])
    assert result.attempt == 3 and result.new_points == 7
    assert [n.split(";")[0] for n in result.notices] == [
        "exp1: step went back from 2 to 1", "exp1: step went back from 3 to 2"]
    assert store.run_data("exp1", attempt=1).series("loss").to_dict() == {1: 3.0, 2: 1.5}
    assert store.run_data("exp1", attempt=2).series("lr").to_dict() == {1: 0.1}
    assert store.run_data("exp1").series("loss").to_dict() == {2: 2.8}
    assert store.activity("exp1")[0]["last_wall"] == 5.0


def test_a_finished_run_is_thinned_to_envelopes_that_keep_spikes_and_nan(tmp_path):
    store = Store(str(tmp_path / "rw.db"))
    rng = np.random.default_rng(0)
    loss = 2.0 + rng.normal(0, 0.01, 20_000)
    loss[[4_321, 4_330]] = [9.0, 7.5]  # two spikes in one bucket
    loss[[12_000, 17_777]] = [math.nan, math.inf]
    rows = [(s, "loss", float(v), 100.0 + s) for s, v in enumerate(loss)]
    ingest(store, rows, now=1_000.0)
    ingest(store, rows[:100], run="recent", now=1_000.0 + 86_400 * 6)
    removed = store.thin_finished(7, now=1_000.0 + 86_400 * 8, buckets=100)
    kept = store.run_data("exp1").series("loss")
    assert removed == 20_000 - len(kept) and len(kept) < 2_000
    assert kept[4_321] == 9.0 and kept[4_330] == 7.5 and kept[17_777] == math.inf
    assert math.isnan(kept[12_000]) and kept.index[-1] == 19_999
    for lo in range(0, 20_000, 200):  # each bucket's lowest and highest finite point kept
        bucket = loss[lo:lo + 200]
        finite = bucket[np.isfinite(bucket)]
        assert finite.min() in kept.values and finite.max() in kept.values
    assert len(store.run_data("recent").series("loss")) == 100  # not finished yet: untouched
    assert store.query("SELECT COUNT(*) AS n FROM steps")[0]["n"] == len(kept) + 100
    assert store.thin_finished(7, now=1_000.0 + 86_400 * 30, buckets=100) == 0  # once a run


def test_a_rollback_begins_a_new_attempt_even_when_the_steps_never_go_back(tmp_path):
    """A resume that skipped every batch past the old attempt's last step logs on from
    there: no step goes back, yet it is the next attempt (runwatch did the rollback); the
    old process's last points, read late, stay in the old attempt."""
    import pandas as pd

    from bot.store import Store

    store = Store(str(tmp_path / "s.db"))
    kw = dict(run="r", source="f", log_path="p", cursor_key="k", cursor={}, checkpoints=[],
              meta={}, malformed=[], skipped_values=0, notices=[])

    def points(lo: int, hi: int, wall: float) -> pd.DataFrame:
        steps = range(lo, hi + 1)
        return pd.DataFrame({"step": steps, "tag": "train/loss", "value": 1.0,
                             "wall_time": [wall + 0.01 * i for i, _ in enumerate(steps)]})

    store.ingest(points=points(1, 90, 1000.0), **kw)
    store.begin_attempt("r", stopped_at=2000.0)
    # the old process's tail (logged before the stop) and the resumed run in one read
    tail_and_resumed = pd.concat([points(91, 100, 1500.0), points(111, 120, 2100.0)])
    assert store.ingest(points=tail_and_resumed, **kw).attempt == 2
    assert store.last_step("r", 1) == 100 and store.last_step("r", 2) == 120
    assert store.ingest(points=points(121, 125, 2200.0), **kw).attempt == 2  # once only
    # a step going back is still a rewind, with or without a rollback of runwatch's
    assert store.ingest(points=points(50, 55, 2300.0), **kw).attempt == 3


def test_a_rollback_splits_a_read_by_time_not_by_position(tmp_path):
    """Readers give rows step-sorted: the old attempt's last loss (step 41, logged before
    the rollback) comes after the new attempt's first skipped batches (steps 31-40, logged
    after it); it stays in the old attempt all the same."""
    import pandas as pd

    from bot.store import Store

    store = Store(str(tmp_path / "s.db"))
    kw = dict(run="r", source="f", log_path="p", cursor_key="k", cursor={}, checkpoints=[],
              meta={}, malformed=[], skipped_values=0, notices=[])
    store.ingest(points=pd.DataFrame({"step": range(1, 41), "tag": "train/loss", "value": 1.0,
                                      "wall_time": [1000.0 + s for s in range(1, 41)]}), **kw)
    store.begin_attempt("r", stopped_at=1041.5)
    skipped = pd.DataFrame({"step": range(31, 41), "tag": "skipped_batches", "value": 1.0,
                            "wall_time": [1042.0 + s for s in range(10)]})
    old_loss = pd.DataFrame({"step": [41], "tag": "train/loss", "value": [9.0],
                             "wall_time": [1041.0]})
    result = store.ingest(points=pd.concat([skipped, old_loss]), **kw)
    assert result.attempt == 2
    assert store.last_step("r", 1) == 41
    assert [r["tag"] for r in store.query(
        "SELECT tag FROM metrics WHERE run = 'r' AND attempt = 2 GROUP BY tag")] == \
        ["skipped_batches"]
