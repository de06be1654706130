"""A real ``mlflow server`` on a free loopback port, for tests that read through the client.

``running_server(tmp)`` starts one (≈ 6 s) and ends it with its worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from benchmarks.devmlflow import SERVER_ENV, MlflowServer, free_port  # noqa: F401 (re-exported)


@contextmanager
def running_server(root: Path, *, prefix: str = "") -> Iterator[MlflowServer]:
    """A started server, and a test process whose own MLflow client stays offline too.

    Wrap it in a module-scoped fixture so that the server starts once per module.
    """
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SERVER_ENV.items():
            patch.setenv(name, value)
        server = MlflowServer(root, prefix=prefix)
        server.start()
        try:
            yield server
        finally:
            server.stop()
