"""The HTTP gate alone: what reaches the WSGI app behind it, with requests signed the way
Slack signs them."""

import hashlib
import hmac
import io
import json
import time

from bot.devslack import event_callback_body
from bot.httpgate import WINDOW, SlackGate, _Expiring

SECRET = "gate-secret"


def sign(body: str, timestamp: int | None = None, secret: str = SECRET) -> dict[str, str]:
    """Slack's headers: ``v0=`` + HMAC-SHA256 of ``v0:{ts}:{body}`` under the signing secret."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), f"v0:{ts}:{body}".encode(), hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}",
            "Content-Type": "application/x-www-form-urlencoded"}


# -- the gate alone (a WSGI app counting what reaches it) --------------------------------------


class Recording:
    def __init__(self, status="200 OK"):
        self.status = status
        self.bodies = []

    def __call__(self, environ, start_response):
        self.bodies.append(environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"])))
        start_response(self.status, [])
        return [b""]


class Stream(io.BytesIO):
    """A request body that counts what was read of it."""

    read_bytes = 0

    def read(self, size=-1):
        data = super().read(size)
        self.read_bytes += len(data)
        return data


def call(gate, body: bytes, headers: dict[str, str], length: bool = True):
    stream = Stream(body)
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/slack/events", "wsgi.input": stream,
               "REMOTE_ADDR": "192.0.2.1",
               **{"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}}
    if length:
        environ["CONTENT_LENGTH"] = str(len(body))
    statuses = []
    gate(environ, lambda status, headers: statuses.append(status))
    return statuses[0], stream.read_bytes


def test_without_a_length_no_more_than_the_limit_is_read():
    gate = SlackGate(Recording(), SECRET, max_body=1000)
    status, read = call(gate, b"x" * 5_000_000, {}, length=False)
    assert (status, read) == ("413 Content Too Large", 1001)
    status, read = call(gate, b"x" * 5_000_000, {})
    assert (status, read) == ("413 Content Too Large", 0)


def test_a_signed_chunked_body_reaches_bolt_with_its_length():
    app = Recording()
    body = "token=t&text=status"
    assert call(SlackGate(app, SECRET), body.encode(), sign(body), length=False)[0] == "200 OK"
    assert app.bodies == [body.encode()]


def test_an_events_retry_is_known_by_its_event_id():
    app = Recording()
    gate = SlackGate(app, SECRET)
    first = event_callback_body({"type": "app_mention", "text": "hi"}, "Ev1")
    # the same event, its JSON written out differently
    retry = json.dumps(json.loads(first), indent=1)
    assert call(gate, first.encode(), sign(first))[0] == "200 OK"
    assert call(gate, retry.encode(), {**sign(retry), "X-Slack-Retry-Num": "1"})[0] == "200 OK"
    assert len(app.bodies) == 1
    # a retry of a delivery that never arrived (the bot was down) is the first: it runs
    lost = event_callback_body({"type": "app_mention", "text": "hi"}, "Ev2")
    assert call(gate, lost.encode(), {**sign(lost), "X-Slack-Retry-Num": "2"})[0] == "200 OK"
    assert len(app.bodies) == 2


def test_a_retry_of_a_delivery_that_failed_runs():
    app = Recording("500 Internal Server Error")
    gate = SlackGate(app, SECRET)
    body = event_callback_body({"type": "app_mention", "text": "hi"}, "Ev1")
    assert call(gate, body.encode(), sign(body))[0] == "500 Internal Server Error"
    app.status = "200 OK"
    retry = {**sign(body, int(time.time()) + 1), "X-Slack-Retry-Num": "1"}
    assert call(gate, body.encode(), retry)[0] == "200 OK"
    assert len(app.bodies) == 2 and gate.counts == {"passed": 2}


def test_stale_and_future_timestamps_are_refused():
    gate = SlackGate(Recording(), SECRET)
    for skew in (-WINDOW - 5, WINDOW + 5):
        body = "text=status"
        assert call(gate, body.encode(), sign(body, int(time.time()) + skew))[0] == (
            "401 Unauthorized")
    assert gate.counts == {"stale timestamp": 2}


def test_seen_signatures_are_forgotten_when_they_expire_and_are_bounded():
    seen = _Expiring(size=2)
    assert seen.add_new("a", expires=10, now=0) and not seen.add_new("a", expires=10, now=5)
    assert seen.add_new("a", expires=20, now=10)  # expired: the timestamp check refuses it
    assert seen.add_new("b", 20, 10) and seen.add_new("c", 20, 10)
    assert seen.add_new("a", 20, 10)  # the oldest went first
