"""A real SQLite store holding the generated run histories, ingested by the engine."""

import pytest

from benchmarks.qa import build_store, histories


@pytest.fixture(scope="session")
def bench_runs():
    return histories()


@pytest.fixture(scope="session")
def store(tmp_path_factory, bench_runs):
    store = build_store(tmp_path_factory.mktemp("qa"), bench_runs)
    yield store
    store.close()
