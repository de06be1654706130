"""A model's answer in a Slack thread, posted as it is checked: the first checked sentence
(or, when none is ready soon after the model starts, a short placeholder) is posted, the
same message is redrawn with ``chat.update`` as more sentences pass the claim check, and the
last redraw is the answer's full view (its Sources line and Details button).

Slack allows about one ``chat.update`` a second per message, so redraws are paced: at most
one per ``interval`` seconds, and sentences that arrive meanwhile go out together in the
next one (the final view too). Only what :func:`bot.qa.service.submit` hands to
``on_partial`` is ever shown: sentences that passed the claim check, never a rejected or
unfinished one. Nothing here runs on the model's thread: sends go to the listeners' own pool
(:class:`bot.slack.listeners.work.Work`), one at a time per answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from bot.alerting.notify import SendResult
from bot.views.message import Message

log = logging.getLogger("runwatch.slack")

UPDATE_INTERVAL_S = 1.0  # Slack: about one chat.update per second per message
PLACEHOLDER_AFTER_S = 1.0  # after the model starts, without a checked sentence yet
PLACEHOLDER = "_thinking…_"


class Clock(Protocol):
    """The time, and running a function later (off the caller's thread)."""

    def now(self) -> float:
        ...

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        ...


class Sender(Protocol):
    """Posts a message in a thread, or redraws one (a :class:`SlackNotifier`)."""

    def post(self, channel: str, message: Message, thread_ts: str | None = None) -> SendResult:
        ...

    def update(self, channel: str, ts: str, message: Message) -> SendResult:
        ...


class PoolClock:
    """The monotonic clock; a call later runs on ``run`` (the listeners' pool) when due."""

    def __init__(self, run: Callable[[Callable[[], None]], Any]) -> None:
        self._run = run

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        if delay <= 0:
            self._hand_over(fn)
            return
        timer = threading.Timer(delay, self._hand_over, (fn,))
        timer.daemon = True
        timer.start()

    def _hand_over(self, fn: Callable[[], None]) -> None:
        try:
            self._run(fn)
        except RuntimeError:  # the pool was closed: the bot is stopping, nobody reads it
            log.debug("dropped a streamed answer's send: the bot is stopping")


class StreamedAnswer:
    """One answer's message in a thread: :meth:`started` when the model begins,
    :meth:`partial` with the checked text so far (each call a longer run of whole, checked
    sentences), :meth:`finish` with the answer's view, which replaces whatever was shown
    (the model's full answer, or the facts' own when the model's failed)."""

    def __init__(self, sender: Sender, channel: str, thread_ts: str | None, clock: Clock, *,
                 interval: float | None = None, placeholder_after: float | None = None
                 ) -> None:
        self.sender = sender
        self.channel = channel
        self.thread_ts = thread_ts
        self.clock = clock
        self.interval = UPDATE_INTERVAL_S if interval is None else interval
        self.placeholder_after = (PLACEHOLDER_AFTER_S if placeholder_after is None
                                  else placeholder_after)
        self._lock = threading.Lock()
        self._pending: str | None = None  # the newest checked text, not sent yet
        self._shown: str | None = None  # what the message says now
        self._final: Message | None = None
        self._ts: str | None = None  # the message, once posted
        self._last: float | None = None  # when it was last sent
        self._busy = False  # a send is scheduled or running (one at a time)
        self._done = False  # the final view was sent

    def started(self) -> None:
        """The model began on this question: a placeholder follows unless a sentence does."""
        self.clock.call_later(self.placeholder_after, self._placeholder)

    def partial(self, text: str) -> None:
        with self._lock:
            if self._final is not None or not text.strip():
                return
            self._pending = text
        self._kick()

    def finish(self, message: Message) -> None:
        with self._lock:
            self._final = message
        self._kick()

    def _placeholder(self) -> None:
        with self._lock:
            if self._last is not None or self._busy or self._pending or self._final:
                return
            self._pending = PLACEHOLDER
        self._kick()

    def _wait(self) -> float | None:
        """Seconds until the next send may go, or None with nothing to send (under lock)."""
        if self._done or (self._final is None and self._pending in (None, self._shown)):
            return None
        if self._last is None:
            return 0.0
        return max(0.0, self._last + self.interval - self.clock.now())

    def _kick(self) -> None:
        with self._lock:
            if self._busy or (wait := self._wait()) is None:
                return
            self._busy = True
        self.clock.call_later(wait, self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                wait = self._wait()
                if wait is None:
                    self._busy = False
                    return
                if wait > 0:  # coalesce: whatever arrives meanwhile goes in this send
                    self.clock.call_later(wait, self._drain)
                    return
                final = self._final
                message = final or Message(text=self._pending or "", kind="answer_partial")
                self._shown = message.text
                ts = self._ts
            result = self._send(message, ts, final is not None)
            with self._lock:
                self._last = self.clock.now()
                if result.ok and ts is None:
                    self._ts = result.ts
                if final is not None:
                    self._done = True
                    return

    def _send(self, message: Message, ts: str | None, final: bool) -> SendResult:
        try:
            return self._send_once(message, ts, final)
        except Exception as exc:  # a bug in a send must not keep the final view unsent
            log.error("could not answer in %s: %r", self.channel, exc, exc_info=exc)
            return SendResult(False, reason=repr(exc))

    def _send_once(self, message: Message, ts: str | None, final: bool) -> SendResult:
        if ts is None:
            result = self.sender.post(self.channel, message, self.thread_ts)
        else:
            result = self.sender.update(self.channel, ts, message)
            if not result.ok and final:  # the answer must not be lost behind a partial one
                log.warning("could not redraw the answer in %s (%s); posting it anew",
                            self.channel, result.reason)
                result = self.sender.post(self.channel, message, self.thread_ts)
        if not result.ok:
            log.warning("could not answer in %s: %s", self.channel, result.reason)
        return result
