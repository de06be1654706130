"""Generations run on worker threads, one generation per device at a time.

Callers submit a job and get a :class:`Job` back at once: its :meth:`Job.position` says
how many generations are ahead of it (0: running now), so Slack can say "queued behind 2
questions". The CLI waits with :meth:`Job.result`; Slack never waits (its listeners must
return at once) and posts the answer from a callback on :attr:`Job.future`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Job:
    def __init__(self, worker: DeviceWorker, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.future: Future[Any] = Future()
        self._worker = worker

    def position(self) -> int:
        """Generations ahead of this one: 0 while it runs (or once done)."""
        return self._worker.position(self)

    def result(self, timeout: float | None = None) -> Any:
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()


class DeviceWorker:
    """A FIFO of jobs for one device, served by one daemon thread."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._queue: deque[Job] = deque()
        self._running: Job | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name=f"runwatch-llm-{device}",
                                        daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> Job:
        job = Job(self, fn)
        with self._cond:
            self._queue.append(job)
            self._cond.notify()
        return job

    def position(self, job: Job) -> int:
        with self._cond:
            if job is self._running or job.future.done():
                return 0
            try:
                index = self._queue.index(job)
            except ValueError:
                return 0
            return index + (1 if self._running is not None else 0)

    def busy(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._queue) + (1 if self._running is not None else 0)

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                job = self._queue.popleft()
                self._running = job
            if job.future.set_running_or_notify_cancel():
                try:
                    job.future.set_result(job.fn())
                except BaseException as exc:  # handed to whoever waits on the job
                    job.future.set_exception(exc)
            with self._cond:
                self._running = None


_workers: dict[str, DeviceWorker] = {}
_workers_lock = threading.Lock()


def worker_for(device: str) -> DeviceWorker:
    """The one worker of ``device`` in this process."""
    with _workers_lock:
        if device not in _workers:
            _workers[device] = DeviceWorker(device)
        return _workers[device]
