r"""The HTTP entry point's gate: nothing from the network reaches Bolt before it is proven Slack's.

Bolt verifies requests too, but only after it has read the whole body, parsed it and built a
request from it; a bad signature is then logged at INFO with the entire body, and under
``runwatch serve``'s rich log handler one of the highlighter's patterns, ``[\w.]*?\(``,
backtracks quadratically over a long word (100 KB took two minutes, 5 MB would take days)
with the GIL held, so the process neither served nor stopped. A non-numeric timestamp made
Bolt's verifier raise, and the error handler then answered to the unverified body's
``response_url``.

`SlackGate` is a WSGI middleware in front of Bolt's handler that refuses, in this order, and
each with a fixed reason, a one-line log and a count in `SlackGate.counts`:

- another path (404) or method (405);
- a body over `MAX_BODY` (413), judged by ``Content-Length`` before anything is read; without
  a length at most ``MAX_BODY + 1`` bytes are read;
- a timestamp that is not a plain integer within `WINDOW` seconds of now, or a signature not
  shaped like ``v0=`` and 64 hex digits (401);
- a signature that is not HMAC-SHA256 of ``v0:{timestamp}:{body}`` under the signing secret,
  compared in constant time on bytes (401);
- a signature already seen (401): an exact replay. Seen signatures are kept until their
  timestamp leaves the window, after which the timestamp check refuses them anyway.

Only then does Bolt get the request, with the bytes the gate read. A retry (Slack marks one
with ``X-Slack-Retry-Num``) of a delivery Bolt already had and answered with a 2xx is
acknowledged with 200 and not run again; a retry of one that failed runs. Nothing of an
unverified body, and no header value, is ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable

log = logging.getLogger("runwatch.http")

# Slack's payloads are a few KB (a modal's state a few tens); nothing legitimate comes near.
MAX_BODY = 1 << 20
# Slack's own replay window for X-Slack-Request-Timestamp.
WINDOW = 5 * 60
# Slack retries an event after about 0 s, 1 min and 5 min, each signed anew; a delivery is
# remembered long enough for the last one.
RETRY_MEMORY = 2 * WINDOW
# Far more deliveries than one app gets in a window; only verified requests are remembered,
# so a stranger cannot fill it.
MAX_SEEN = 100_000

_SIGNATURE_LENGTH = len("v0=") + 64

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


class _Expiring:
    """Keys remembered until their own expiry, at most `size` of them (the oldest go first)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._expiry: OrderedDict[str, float] = OrderedDict()

    def add_new(self, key: str, expires: float, now: float) -> bool:
        """Remember `key`; False if it was already remembered and has not expired."""
        while self._expiry and next(iter(self._expiry.values())) <= now:
            self._expiry.popitem(last=False)
        if self._expiry.get(key, now) > now:
            return False
        self._expiry[key] = expires
        self._expiry.move_to_end(key)
        while len(self._expiry) > self.size:
            self._expiry.popitem(last=False)
        return True

    def forget(self, key: str) -> None:
        self._expiry.pop(key, None)


class _Refused(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class SlackGate:
    """WSGI middleware: verify a Slack request (see the module's docstring), then call `app`."""

    def __init__(self, app: WSGIApp, signing_secret: str, path: str = "/slack/events", *,
                 max_body: int = MAX_BODY, clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self.path = path
        self.max_body = max_body
        self._secret = signing_secret.encode()
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._signatures = _Expiring(MAX_SEEN)
        self._deliveries = _Expiring(MAX_SEEN)

    @property
    def counts(self) -> dict[str, int]:
        """Requests by outcome: ``passed``, ``retry_acked``, or the reason one was refused."""
        with self._lock:
            return dict(self._counts)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        try:
            body, delivery, retry = self._verify(environ)
        except _Refused as refused:
            self._count(refused.reason)
            log.warning("refused a request from %s: %s (%s)", environ.get("REMOTE_ADDR", "?"),
                        refused.reason, refused.status)
            start_response(refused.status, [("Content-Type", "text/plain"),
                                            ("Content-Length", str(len(refused.reason)))])
            return [refused.reason.encode()]
        if retry:
            self._count("retry_acked")
            log.info("acknowledged Slack's retry of a delivery already passed on")
            start_response("200 OK", [("Content-Length", "0"), ("X-Slack-No-Retry", "1")])
            return [b""]
        self._count("passed")

        def answered(status: str, headers: list, *exc_info):
            if not status.startswith("2"):  # not handled: Slack's retry of it must run
                with self._lock:
                    self._deliveries.forget(delivery)
            return start_response(status, headers, *exc_info)

        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return self.app(environ, answered)

    def _count(self, outcome: str) -> None:
        with self._lock:
            self._counts[outcome] += 1

    def _verify(self, environ: dict) -> tuple[bytes, str, bool]:
        """The body of a request proven Slack's and new, what identifies its delivery, and
        whether it is Slack's retry of a delivery already passed on; `_Refused` otherwise."""
        if environ.get("PATH_INFO") != self.path:
            raise _Refused("404 Not Found", "not found")
        if environ.get("REQUEST_METHOD") != "POST":
            raise _Refused("405 Method Not Allowed", "method not allowed")
        body = self._read_body(environ)

        timestamp = environ.get("HTTP_X_SLACK_REQUEST_TIMESTAMP", "")
        signature = environ.get("HTTP_X_SLACK_SIGNATURE", "")
        # int() alone would take " 12", "1_2", non-ASCII digits and 5,000-digit numbers
        if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
            raise _Refused("401 Unauthorized", "bad timestamp")
        now = self._clock()
        if abs(now - int(timestamp)) > WINDOW:
            raise _Refused("401 Unauthorized", "stale timestamp")
        if len(signature) != _SIGNATURE_LENGTH or not signature.startswith("v0="):
            raise _Refused("401 Unauthorized", "bad signature")
        expected = "v0=" + hmac.new(self._secret, b"v0:" + timestamp.encode() + b":" + body,
                                    hashlib.sha256).hexdigest()
        # WSGI hands header values over as latin-1 strings; bytes compare whatever they hold
        if not hmac.compare_digest(expected.encode(), signature.encode("latin-1")):
            raise _Refused("401 Unauthorized", "bad signature")

        delivery = _delivery(body)
        with self._lock:
            if not self._signatures.add_new(signature, int(timestamp) + WINDOW, now):
                raise _Refused("401 Unauthorized", "replayed signature")
            first = self._deliveries.add_new(delivery, now + RETRY_MEMORY, now)
        return body, delivery, "HTTP_X_SLACK_RETRY_NUM" in environ and not first

    def _read_body(self, environ: dict) -> bytes:
        length = environ.get("CONTENT_LENGTH") or ""
        stream = environ["wsgi.input"]
        if not length:
            body = stream.read(self.max_body + 1)
        elif not (length.isascii() and length.isdigit()):
            raise _Refused("400 Bad Request", "bad content length")
        elif int(length) > self.max_body:
            raise _Refused("413 Content Too Large", "body too large")
        else:
            body = stream.read(int(length))
        if len(body) > self.max_body:
            raise _Refused("413 Content Too Large", "body too large")
        return body


def _delivery(body: bytes) -> str:
    """What a retry has in common with its first delivery: the event's id when the body is an
    Events API callback (Slack promises it is the same), else the body's digest."""
    if body.startswith(b"{"):
        try:
            event_id = json.loads(body).get("event_id")
        except (ValueError, RecursionError, AttributeError):
            event_id = None
        if isinstance(event_id, str):
            return "event:" + event_id
    return "sha256:" + hashlib.sha256(body).hexdigest()
