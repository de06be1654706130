"""``runwatch serve`` on a real PostgreSQL server (skipped, saying why, where the machine
has none); the engine alerting a NaN and resolving it on either store is
``test_engine.py::test_spike_alerts_once_and_resolves_in_its_thread``."""

import logging
import socket

import pytest

from bot.config import Config, Secrets, Settings, SourceConfig
from bot.instance import AlreadyRunning
from bot.pgstore import PgStore
from bot.serve import Bot, serve
from tests.bot.test_engine import append


def test_serve_runs_on_postgresql_and_refuses_a_second_bot_until_the_first_stops(
        tmp_path, postgres):
    url = postgres.create_database("serve")
    settings = Settings(config=Config(sources=[SourceConfig(path=str(tmp_path / "runs"))]),
                        secrets=Secrets(), config_path=None, db_path=url)
    first = Bot(settings)
    try:
        assert isinstance(first.store, PgStore) and first.mode == "console"
        append(tmp_path / "runs" / "exp1.jsonl", range(1, 5))
        assert first.engine.poll().analysed == ["exp1"]
        with pytest.raises(AlreadyRunning, match="already serving"):
            Bot(settings)
    finally:
        assert first.stop()
    Bot(settings).stop()  # the lock went with the first's connection


def test_an_unreachable_postgresql_is_one_line_not_a_traceback(tmp_path, caplog):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(config=Config(sources=[SourceConfig(path=str(tmp_path / "runs"))]),
                        secrets=Secrets(), config_path=None,
                        db_path=f"postgresql://runwatch:secret@127.0.0.1:{port}/runwatch")
    with caplog.at_level(logging.ERROR, logger="runwatch.serve"):
        assert serve(settings) == 1
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("cannot reach the PostgreSQL store at postgresql://runwatch:***@")
    assert "\n" not in line and "secret" not in line
