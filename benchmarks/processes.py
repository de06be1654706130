"""Stopping what a benchmark or test started, by its PID: SIGTERM, then SIGKILL when it
does not stop in time (a frozen process ignores SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess


def stop(process: subprocess.Popen, grace_s: float = 10.0, *, group: bool = False) -> None:
    """Stop ``process`` (its whole process group with ``group``, for a server that starts
    children) unless it has already exited; reap it."""
    if process.poll() is not None:
        return

    def send(sig: int) -> None:
        if group:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)

    send(signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()
