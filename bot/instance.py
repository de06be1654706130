"""One bot per database: a second `runwatch serve` on the same SQLite file is refused at start.

Two watchers on one database each read every log from the stored cursor and store what they
read: points were stored twice, attempts multiplied and "Resolved" was posted once per bot.
The first bot holds an exclusive ``flock`` on ``<db>.lock`` for as long as it runs; the
kernel releases it when the process ends, however it ends (a ``kill -9`` included), so a
crashed bot never blocks the next start. The file holds the holder's PID, only to name it in
the refusal.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class AlreadyRunning(RuntimeError):
    """Another process holds the database's instance lock."""


class InstanceLock:
    def __init__(self, db_path: str) -> None:
        self.db_path = db_path
        self.path = Path(f"{db_path}.lock")
        self._fd: int | None = None

    def acquire(self) -> InstanceLock:
        """Take the lock or raise :class:`AlreadyRunning` naming the holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(
                f"another runwatch (pid {holder}) is already serving {self.db_path}; stop "
                f"it first, or give this one its own database (RUNWATCH_DB=…)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None
