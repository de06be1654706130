"""One suite, two backends: the store methods several instances share, on SQLite and on a
real PostgreSQL server (skipped, saying why, where the machine has none); the fixture
``open_store`` is conftest's, as ``test_shared_concerns.py`` runs the other concerns so."""

import math
import time

import pandas as pd
import pytest

from bot.store import LeaseLost


def ingest(store, rows, run="exp1", cursor=None):
    return store.ingest(run=run, source="file", log_path=run, cursor_key=run,
                        cursor=cursor or {"offset": len(rows)},
                        points=pd.DataFrame(rows, columns=["step", "tag", "value", "wall_time"]),
                        checkpoints=[], meta={"total_steps": 10}, malformed=[],
                        skipped_values=0, notices=[])


def test_points_round_trip_with_nan_attempts_and_cursor(open_store):
    store = open_store()
    result = ingest(store, [(1, "loss", 2.0, 10.0), (2, "loss", math.nan, 11.0),
                            (2, "lr", 0.1, None), (1, "loss", 3.0, 20.0)], cursor={"offset": 7})
    assert (result.attempt, result.new_points) == (2, 4)
    assert "step went back from 2 to 1" in result.notices[0]
    first = store.run_data("exp1", attempt=1)
    assert first.series("loss")[1] == 2.0 and math.isnan(first.series("loss")[2])
    assert first.series("lr").to_dict() == {2: 0.1}
    assert store.run_data("exp1").series("loss").to_dict() == {1: 3.0}
    assert store.last_step("exp1", 1) == 2 and store.last_step("exp1", 2) == 1
    assert store.cursors() == {"exp1": {"offset": 7}}
    assert store.run("exp1")["last_wall_time"] == 20.0 and store.unjudged() == ["exp1"]
    store.judged("exp1")
    assert store.unjudged() == []


def test_a_live_read_adds_only_the_new_points(open_store):
    store = open_store()
    ingest(store, [(1, "loss", 3.0, 10.0), (2, "loss", 2.5, 11.0)])
    live = store.run_data("exp1")
    ingest(store, [(2, "loss", 2.4, 12.0), (3, "loss", 2.3, 13.0)])
    live = store.run_data("exp1", since=live)
    assert live.live and live.series("loss").to_dict() == {1: 3.0, 2: 2.4, 3: 2.3}
    assert live.last_wall() == 13.0


def test_a_second_instance_takes_half_the_runs_and_a_dead_ones_runs_on_expiry(open_store):
    first, second = open_store(), open_store()
    runs = [f"run-{i}" for i in range(6)]
    assert first.acquire_leases("a", runs, ttl=0.6) == runs  # alone: all of them
    assert second.acquire_leases("b", runs, ttl=0.6) == []  # all are held
    assert first.acquire_leases("a", runs, ttl=0.6) == runs[:3]  # two live: hands half back
    assert second.acquire_leases("b", runs, ttl=0.6) == runs[3:]
    assert set(first.lease_owners().items()) == {(r, "a") for r in runs[:3]} | {
        (r, "b") for r in runs[3:]}
    time.sleep(0.7)  # "a" stops renewing: dead for the others once its leases expire
    assert second.acquire_leases("b", runs, ttl=0.6) == runs
    assert first.acquire_leases("a", runs, ttl=0.6) == []  # back, but its runs are taken


def test_released_leases_are_free_at_once(open_store):
    first, second = open_store(), open_store()
    runs = ["x", "y"]
    first.acquire_leases("a", runs, ttl=30)
    first.release_leases("a")
    assert second.acquire_leases("b", runs, ttl=30) == runs


def test_an_outbox_row_is_claimed_by_exactly_one_instance(open_store):
    first, second = open_store(), open_store()
    with first.transaction() as db:
        row_id = first.enqueue(db, kind="alert", fingerprint="f", run="r", channel="#c",
                               now=1.0)
    assert [r["id"] for r in second.pending_outbox()] == [row_id]
    assert first.claim_outbox(row_id, "a") is True
    assert second.claim_outbox(row_id, "b") is False
    assert second.pending_outbox() == []
    # "a" died while sending: only a taker naming it gets the row to settle
    assert second.claim_outbox(row_id, "b", in_doubt_of="c") is False
    assert second.claim_outbox(row_id, "b", in_doubt_of="a") is True
    second.record_sent(row_id, channel="#c", ts="1.0", fingerprint="f", run="r", kind="alert",
                       now=2.0)
    assert first.claim_outbox(row_id, "a") is False


def test_what_the_shared_watcher_asks_by_name(open_store):
    """cursor, instances, sending_outbox and judged(owner=, queue=): the methods the shared
    watcher calls instead of its own SQL, alike on both backends."""
    first, second = open_store(), open_store()
    ingest(first, [(1, "loss", 2.0, 10.0)], cursor={"offset": 3})
    assert first.cursor("exp1") == {"offset": 3} and first.cursor("other") is None
    first.acquire_leases("a", ["exp1"], ttl=30)
    assert set(second.instances()) == {"a"}
    with pytest.raises(LeaseLost):
        second.judged("exp1", owner="b")
    assert second.unjudged() == ["exp1"]
    alert = {"kind": "alert", "fingerprint": "exp1|nonfinite", "run": "exp1",
             "channel": "#c", "now": 1.0}
    first.judged("exp1", owner="a", queue=alert)
    first.judged("exp1", owner="a", queue=alert)  # already queued: not twice
    [row] = first.pending_outbox()
    assert row["fingerprint"] == "exp1|nonfinite" and first.unjudged() == []
    assert first.sending_outbox() == []
    first.claim_outbox(row["id"], "a")
    assert [r["id"] for r in second.sending_outbox()] == [row["id"]]


def test_a_postgresql_database_of_an_older_runwatch_is_extended_in_place(postgres):
    """SCHEMA is append only: a database made when it had 14 statements (runs, points,
    cursors, outbox, leases) gets the alert, audit and run-record tables at the next start,
    its points kept."""
    import psycopg

    from bot.pgstore import SCHEMA, PgStore

    url = postgres.create_database("older")
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in SCHEMA[:14]:
            conn.execute(sql)
        conn.execute("CREATE TABLE runwatch_schema (version integer)")
        conn.execute("INSERT INTO runwatch_schema VALUES (14)")
        for sql in ("INSERT INTO runs (name) VALUES ('exp1')",
                    "INSERT INTO attempts (run, attempt) VALUES ('exp1', 1)",
                    "INSERT INTO tags (name) VALUES ('loss')",
                    "INSERT INTO series (attempt_id, tag_id) VALUES (1, 1)",
                    "INSERT INTO points VALUES (1, 1, 2.0)",
                    "INSERT INTO steps VALUES (1, 1, 10.0)"):
            conn.execute(sql)
    store = PgStore(url)
    try:
        store.close()
        store = PgStore(url)  # a second start: nothing to add
        assert store.schema_version == len(SCHEMA)
        assert store.series("exp1", 1, "loss") == [(1, 2.0)]
        assert store.wall_span("exp1", 1) == (10.0, 10.0)  # run_steps, a view made now
        store.record_action(at=1.0, run="exp1", action="stop", actor="U0A", status="requested")
        assert [r["action"] for r in store.audit_log()] == ["stop"]
    finally:
        store.close()
