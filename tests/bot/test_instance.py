"""One bot per database (issue 23, defect 6): two `runwatch serve` on one SQLite file stored
every point twice, multiplied attempts and posted "Resolved" once per bot; the second one,
on the same port, died with a raw traceback. And SIGTERM (defect 11) stops it promptly."""

import os
import signal
import subprocess
import sys
import time

import pytest

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.instance import AlreadyRunning, InstanceLock
from bot.serve import Bot


def _settings(tmp_path) -> Settings:
    config = Config(sources=[SourceConfig(path=str(tmp_path / "runs"))], poll_interval=1)
    return Settings(config=config, secrets=Secrets(), config_path=None,
                    db_path=str(tmp_path / "rw.db"))


def test_a_second_bot_on_the_same_database_is_refused_until_the_first_stops(tmp_path):
    (tmp_path / "runs").mkdir()
    first = Bot(_settings(tmp_path))
    try:
        with pytest.raises(AlreadyRunning, match=rf"pid {os.getpid()}.*rw\.db.*RUNWATCH_DB"):
            Bot(_settings(tmp_path))
    finally:
        first.stop()
    Bot(_settings(tmp_path)).stop()  # the lock went with the first


def test_the_lock_file_names_its_holder_and_survives_nothing(tmp_path):
    lock = InstanceLock(str(tmp_path / "rw.db")).acquire()
    assert lock.path.read_text().strip() == str(os.getpid())
    lock.release()
    assert not lock.held
    InstanceLock(str(tmp_path / "rw.db")).acquire().release()


def _config(tmp_path) -> str:
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    (runs / "exp1.jsonl").write_text("".join(
        f'{{"step": {s}, "loss": {2.0 - s / 1000}}}\n' for s in range(1, 201)))
    path = tmp_path / "runwatch.toml"
    path.write_text(f'poll_interval = 1\ndb = "{tmp_path / "rw.db"}"\n'
                    f'[[sources]]\npath = "{runs}"\n')
    return str(path)


def _serve(config: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "RUNWATCH_"))}
    return subprocess.Popen([sys.executable, "-m", "bot.cli", "--config", config, "serve"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_points(db: str, count: int, timeout: float = 60.0) -> None:
    import sqlite3

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(db):
            try:
                with sqlite3.connect(db) as conn:
                    if conn.execute("SELECT count(*) FROM metrics").fetchone()[0] >= count:
                        return
            except sqlite3.OperationalError:
                pass  # the schema is being created
        time.sleep(0.2)
    raise AssertionError(f"{db} never held {count} points")


@pytest.mark.slow
def test_serve_refuses_a_second_process_in_one_line_and_frees_the_lock_when_killed(tmp_path):
    config = _config(tmp_path)
    first = _serve(config)
    try:
        _wait_for_points(str(tmp_path / "rw.db"), 200)
        second = _serve(config)
        out, err = second.communicate(timeout=60)
        assert second.returncode == 1
        assert f"pid {first.pid}" in err and "Traceback" not in err
        first.send_signal(signal.SIGKILL)  # a crash: the kernel drops the flock
        first.wait(timeout=10)
        third = _serve(config)
        try:
            lock = tmp_path / "rw.db.lock"
            end = time.monotonic() + 60
            while lock.read_text().strip() != str(third.pid) and time.monotonic() < end:
                assert third.poll() is None, third.communicate()[1]
                time.sleep(0.1)
            third.send_signal(signal.SIGTERM)
            assert third.wait(timeout=30) == 0
        finally:
            if third.poll() is None:
                third.kill()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    import sqlite3

    with sqlite3.connect(tmp_path / "rw.db") as conn:  # one bot at a time: stored once
        assert conn.execute("SELECT count(*) FROM metrics WHERE tag = 'train/loss'"
                            ).fetchone()[0] == 200
        assert conn.execute("SELECT attempt FROM runs WHERE name = 'exp1'").fetchone()[0] == 1
