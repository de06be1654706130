"""The HTTP entry point as a stranger meets it, and the HTTP gate alone: requests signed the
way Slack signs them, and the local Slack stand-in recording every outbound call (a
``response_url`` included)."""

import hashlib
import hmac
import io
import json
import time

import pytest
from slack_bolt.request import BoltRequest

from bot.config import Config, SourceConfig
from bot.devslack import event_callback_body, slash_command_body
from bot.httpgate import WINDOW, SlackGate, _Expiring
from tests.helpers import running_bot

SECRET = "gate-secret"


def write_run(root, name="exp1"):
    run = root / "runs" / name
    run.mkdir(parents=True)
    lines = [json.dumps({"meta": {"total_steps": 100}})]
    lines += [json.dumps({"step": s, "loss": 3.0 - 0.02 * s, "time": time.time()})
              for s in range(1, 21)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def sign(body: str, timestamp: int | None = None, secret: str = SECRET) -> dict[str, str]:
    """Slack's headers: ``v0=`` + HMAC-SHA256 of ``v0:{ts}:{body}`` under the signing secret."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), f"v0:{ts}:{body}".encode(), hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}",
            "Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def bot_and_slack(tmp_path):
    write_run(tmp_path)
    config = Config(poll_interval=3600, sources=[SourceConfig(path=str(tmp_path / "runs"))],
                    slack={"channel": "C0ALERTS", "host": "127.0.0.1", "port": 0})
    with running_bot(tmp_path, config, SECRET) as (bot, local):
        yield bot, local, f"http://127.0.0.1:{bot.http_port}/slack/events"


def outbound(local) -> list:
    """Every call the bot made to Slack after starting (auth.test is Bolt's, at start)."""
    return [c.method for c in local.calls if c.method != "auth.test"]


# -- defect 2: an unverified request made the bot call the URL in its body ---------------------


@pytest.mark.slow
def test_the_error_handler_never_answers_a_request_that_did_not_pass_verification(
        bot_and_slack):
    """Behind the gate too: Bolt given an unverifiable request directly says 500, calls no one."""
    bot, local, _ = bot_and_slack
    body = slash_command_body(text="status exp1", response_url=local.new_response_url())
    request = BoltRequest(body=body, headers={
        "content-type": "application/x-www-form-urlencoded",
        "x-slack-request-timestamp": "not-a-number", "x-slack-signature": "v0=0"})
    assert bot.app.dispatch(request).status == 500
    time.sleep(0.5)
    assert outbound(local) == []


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
