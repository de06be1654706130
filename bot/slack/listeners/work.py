"""Work a listener hands off once it has acknowledged.

Bolt runs every listener on one small pool of threads (five) and answers Slack only when a
listener has called ``ack()``: a request that finds all five busy is never acknowledged,
and Slack shows the user an error after 3 s. Five questions waiting for a model took the
bot off Slack that way. So a listener acks, hands whatever can take time (reading facts,
drawing a chart, posting) to :class:`Work` and returns; nothing in a listener waits for a
model — an answer is posted from the model's job's completion, through this pool too.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger("runwatch.slack")

WORKERS = 4


class Work:
    """A small pool of threads of the Slack side's own (not Bolt's listener threads)."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="slack-work")

    def submit(self, fn: Callable[..., Any], *args: Any,
               failed: Callable[[str], None] | None = None) -> Future[None]:
        """Run ``fn(*args)`` on the pool. Nobody waits for it, so a failure is logged with an
        incident id here (Bolt's error handler no longer sees it) and, with ``failed``, told
        to the person who asked in one line."""
        def run() -> None:
            try:
                fn(*args)
            except Exception as exc:
                incident = uuid.uuid4().hex[:8]
                log.error("incident %s: %r in %s", incident, exc,
                          getattr(fn, "__name__", fn), exc_info=exc)
                if failed is not None:
                    failed(f"Something went wrong (incident {incident}); the bot's logs have "
                           f"the details.")

        return self._pool.submit(run)

    def close(self) -> None:
        """Drop what has not started; what runs finishes on its own (a post, an upload)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
