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
