import itertools

import pytest

from benchmarks.devpostgres import start_postgres


@pytest.fixture(scope="session")
def postgres():
    """One real PostgreSQL server for the session (tests make a database each)."""
    try:
        server = start_postgres()
    except (RuntimeError, ImportError) as exc:
        pytest.skip(f"no PostgreSQL server for this test: {exc}")
    yield server
    server.stop()


_names = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def open_store(request, tmp_path):
    """Opens a store on one database (SQLite, or a fresh database of the session's
    PostgreSQL server); called twice, two instances sharing it."""
    from bot.store import Store

    opened = []
    if request.param == "sqlite":
        path = str(tmp_path / "rw.db")

        def make():
            opened.append(Store(path))
            return opened[-1]
    else:
        from bot.pgstore import PgStore

        url = request.getfixturevalue("postgres").create_database(f"t{next(_names)}")

        def make():
            opened.append(PgStore(url))
            return opened[-1]
    yield make
    for store in opened:
        store.close()
