"""A real ``mlflow server`` on a free loopback port, for tests and benchmarks (the full
``mlflow`` package, a test extra, provides the server; the bot itself needs only the client).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# Offline and quiet: no telemetry, no job runner (it would start a Huey consumer).
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
              "DO_NOT_TRACK": "true"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    """``mlflow server`` with a SQLite backend in ``root``; stop and start it again on the same
    port and database to play an outage."""

    def __init__(self, root: Path, *, prefix: str = "") -> None:
        self.root = root
        self.port = free_port()
        self.prefix = prefix
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0

    @property
    def address(self) -> str:
        """What follows ``mlflow://``, before the query."""
        return f"127.0.0.1:{self.port}{self.prefix}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self, timeout: float = 90.0) -> None:
        command = [sys.executable, "-m", "mlflow", "server",
                   "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
                   "--default-artifact-root", str(self.root / "art"),
                   "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        if self.prefix:
            command += ["--static-prefix", self.prefix]
        started = time.perf_counter()
        log = open(self.root / "server.log", "ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **SERVER_ENV},
                                        start_new_session=True)
        log.close()
        while time.perf_counter() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                    if response.status == 200:
                        self.start_seconds = time.perf_counter() - started
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"mlflow server not healthy after {timeout} s: {self.log_tail()}")

    def stop(self) -> None:
        """Ends the server and the worker it started (its own process group)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def log_tail(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")[-2000:]
