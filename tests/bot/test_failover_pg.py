"""Two instances on one real PostgreSQL server, each its own process; one is killed
(SIGKILL) mid-pass while the logs grow: the other takes its runs over, with every point
stored once and every alert posted once."""

import json
import math
import os
import signal
import subprocess
import sys
import time

from benchmarks.processes import stop
from bot.pgstore import PgStore
from bot.shared_watch import Receiver

RUNS = 12
NAN_AT = {"run-02": 30, "run-05": 80, "run-08": 140, "run-11": 190}  # line of the NaN
LINES = 200
INTERVAL = 0.5


def line(run, step):
    loss = math.nan if NAN_AT.get(run) == step else 3.0 - step / 100
    return json.dumps({"step": step, "loss": loss, "learning_rate": 1e-3, "grad_norm": 1.0,
                       "time": 1.7e9 + step}) + "\n"


def write_logs(folder, start, stop):
    for step in range(start, stop):
        for i in range(RUNS):
            with open(folder / f"run-{i:02d}.jsonl", "a") as f:
                f.write(line(f"run-{i:02d}", step))


def instance(url, folder, name, receiver, tmp_path):
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - the child writes it
    return subprocess.Popen(
        [sys.executable, "-m", "bot.shared_watch", "--store", url, "--folder", str(folder),
         "--instance", name, "--interval", str(INTERVAL), "--post-url", receiver],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": os.getcwd()})



def test_a_killed_instances_runs_are_taken_over_with_nothing_lost_or_posted_twice(
        postgres, tmp_path):
    url = postgres.create_database("failover")
    folder = tmp_path / "logs"
    folder.mkdir()
    write_logs(folder, 1, 20)
    server = Receiver()
    receiver = server.url
    store = PgStore(url)
    a = instance(url, folder, "a", receiver, tmp_path)
    b = instance(url, folder, "b", receiver, tmp_path)
    try:
        deadline = time.monotonic() + 30
        while set(store.lease_owners().values()) != {"a", "b"}:  # both working
            assert time.monotonic() < deadline, (tmp_path / "a.log").read_text()[-2000:]
            time.sleep(0.1)
        write_logs(folder, 20, 100)  # run-02's NaN is in here
        time.sleep(2 * INTERVAL)
        held_by_a = sorted(r for r, o in store.lease_owners().items() if o == "a")
        a.send_signal(signal.SIGKILL)
        killed_at = store.clock()
        a.wait()
        write_logs(folder, 100, LINES + 1)
        deadline = time.monotonic() + 60
        while True:
            owners = store.lease_owners()
            stored = store.query("SELECT COUNT(*) AS n FROM points")[0]["n"]
            if (set(owners.values()) == {"b"} and len(owners) == RUNS
                    and stored == RUNS * LINES * 3 and len(server.posts) >= len(NAN_AT)
                    and not store.query("SELECT id FROM outbox WHERE state <> 'sent'")):
                break
            assert time.monotonic() < deadline, (owners, stored, server.posts,
                                                 (tmp_path / "b.log").read_text()[-3000:])
            time.sleep(0.2)
        time.sleep(2 * INTERVAL)  # nothing more arrives late
    finally:
        stop(a)
        stop(b)
        server.shutdown()
    assert held_by_a, "the killed instance held no runs"
    taken = store.query("SELECT run, acquired_at FROM leases WHERE owner = 'b' AND run = ANY(%s)",
                        (held_by_a,))
    # its leases ran out within two poll intervals of its last renewal, and b took them then
    assert all(r["acquired_at"] <= killed_at + 2 * INTERVAL + 3 for r in taken), taken
    per_run = {r["run"]: r["n"] for r in store.query(
        "SELECT run, COUNT(*) AS n FROM metrics GROUP BY run")}
    assert per_run == {f"run-{i:02d}": LINES * 3 for i in range(RUNS)}  # 0 lost, 0 doubled
    assert sorted(p["run"] for p in server.posts) == sorted(NAN_AT)  # once each
    assert len({p["key"] for p in server.posts}) == len(server.posts)
    assert {r["n"] for r in store.query("SELECT attempt AS n FROM runs")} == {1}
    store.close()
