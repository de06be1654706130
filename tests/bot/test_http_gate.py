"""The HTTP entry point as a stranger meets it: the bot served by waitress on a free port, real
HTTP requests, Slack's signatures made the way Slack makes them, and the local Slack stand-in
recording every outbound call (a ``response_url`` included)."""

import hashlib
import hmac
import http.client
import io
import json
import logging
import socket
import time
import urllib.error
import urllib.request

import pytest
from slack_bolt.request import BoltRequest

from benchmarks.devslack import event_callback_body, slash_command_body
from bot.cli import setup_logging
from bot.config import Config, SourceConfig
from bot.slack.httpgate import WINDOW, SlackGate, _Expiring
from tests.helpers import running_bot

SECRET = "gate-secret"
# a long run of word characters: what rich's log highlighter backtracked over for minutes
FILLER = "x" * 900_000


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


def post(url, body: str | bytes, headers: dict[str, str]) -> tuple[int, dict, float]:
    """(status, response headers, seconds to the answer)."""
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            return response.status, dict(response.headers), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), time.monotonic() - started


@pytest.fixture
def production_logging():
    """`runwatch serve`'s logging (rich's handler, INFO, which Bolt's loggers copy when the app
    is built), with pytest's capture handlers kept so that caplog sees every record."""
    root = logging.getLogger()
    kept, level = root.handlers[:], root.level
    noisy = {name: logging.getLogger(name).level
             for name in ("apscheduler", "slack_bolt", "slack_sdk", "urllib3")}
    for handler in kept:
        root.removeHandler(handler)  # setup_logging's force=True would close them
    setup_logging()
    for handler in kept:
        root.addHandler(handler)
    yield
    for handler in root.handlers[:]:
        if handler not in kept:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    for name, old in noisy.items():
        logging.getLogger(name).setLevel(old)


@pytest.fixture
def bot_and_slack(tmp_path):
    write_run(tmp_path)
    config = Config(poll_interval=3600, sources=[SourceConfig(path=str(tmp_path / "runs"))],
                    slack={"channel": "C0ALERTS", "host": "127.0.0.1", "port": 0})
    with running_bot(tmp_path, config, SECRET) as (bot, local):
        yield bot, local, f"http://127.0.0.1:{bot.http_port}/slack/events"


def status_is_answered(local, url) -> None:
    """A valid signed `/run status exp1` is acknowledged and answered: the bot still serves."""
    answered = len(local.calls_to("response_url"))
    body = slash_command_body(text="status exp1", response_url=local.new_response_url())
    status, _, took = post(url, body, sign(body))
    assert status == 200 and took < 3.0
    reply = local.wait_for("response_url", count=answered + 1, timeout=10)[-1]
    assert "step 20 of 100" in reply.args["text"]


def outbound(local) -> list:
    """Every call the bot made to Slack after starting (auth.test is Bolt's, at start)."""
    return [c.method for c in local.calls if c.method != "auth.test"]


# -- defect 1: one unsigned POST froze the bot -------------------------------------------------


@pytest.mark.slow
def test_an_unsigned_post_is_refused_in_milliseconds_and_no_byte_of_it_is_logged(
        production_logging, bot_and_slack, caplog):
    bot, local, url = bot_and_slack
    body = f"text={FILLER}"
    status, _, took = post(url, body, sign(body, secret="not-the-secret"))
    assert status == 401 and took < 1.0
    status_is_answered(local, url)
    assert bot.server.gate.counts["bad signature"] == 1
    logged = [r.getMessage() for r in caplog.records]
    assert ["refused a request from 127.0.0.1: bad signature (401 Unauthorized)"] == [
        m for m in logged if m.startswith("refused")]
    assert not any("xxxxxxxx" in m or SECRET in m for m in logged)


@pytest.mark.slow
def test_a_body_over_the_limit_is_refused_before_it_is_read(production_logging, bot_and_slack):
    bot, local, url = bot_and_slack
    with socket.create_connection(("127.0.0.1", bot.http_port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /slack/events HTTP/1.1\r\nHost: bot\r\n"
                     b"Content-Type: application/x-www-form-urlencoded\r\n"
                     b"Content-Length: 5000000\r\n\r\n")
        answer = sock.recv(4096)  # before a byte of the body was sent
        assert answer.startswith(b"HTTP/1.1 413 ") and time.monotonic() - started < 1.0
        try:
            sock.sendall(b"text=" + b"x" * 5_000_000)  # and the whole 5 MB anyway
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server had closed the connection: it reads none of it
    status_is_answered(local, url)


# -- defect 2: an unverified request made the bot call the URL in its body ---------------------


@pytest.mark.slow
@pytest.mark.parametrize("timestamp, signature", [
    ("not-a-number", None),
    ("9" * 5000, None),  # int() refuses over 4,300 digits
    (None, "v0=" + "\xe9" * 64),  # compare_digest refuses non-ASCII str
])
def test_a_malformed_timestamp_or_signature_is_refused_and_nothing_is_called(
        bot_and_slack, timestamp, signature):
    bot, local, url = bot_and_slack
    body = slash_command_body(text="status exp1", response_url=local.new_response_url())
    headers = sign(body)
    headers["X-Slack-Request-Timestamp"] = timestamp or headers["X-Slack-Request-Timestamp"]
    headers["X-Slack-Signature"] = signature or headers["X-Slack-Signature"]
    assert post(url, body, headers)[0] == 401
    time.sleep(0.5)  # what a wrongly answered request would have sent by now
    assert outbound(local) == []
    status_is_answered(local, url)


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


# -- defect 9: a replay ran again; Slack's retries are idempotent ------------------------------


@pytest.mark.slow
def test_an_exact_replay_is_refused_and_the_command_runs_once(bot_and_slack):
    bot, local, url = bot_and_slack
    body = slash_command_body(text="status exp1", response_url=local.new_response_url())
    headers = sign(body)
    assert post(url, body, headers)[0] == 200
    local.wait_for("response_url")
    assert post(url, body, headers)[0] == 401
    time.sleep(0.5)
    assert len(local.calls_to("response_url")) == 1
    assert bot.server.gate.counts["replayed signature"] == 1


@pytest.mark.slow
def test_slacks_retry_of_a_delivery_is_acknowledged_and_runs_once(bot_and_slack):
    bot, local, url = bot_and_slack
    body = slash_command_body(text="status exp1", response_url=local.new_response_url())
    now = int(time.time())
    assert post(url, body, sign(body, now))[0] == 200
    local.wait_for("response_url")
    retry = {**sign(body, now + 1), "X-Slack-Retry-Num": "1",
             "X-Slack-Retry-Reason": "http_timeout"}  # signed anew, as Slack does
    status, headers, _ = post(url, body, retry)
    assert status == 200 and headers.get("X-Slack-No-Retry") == "1"
    time.sleep(0.5)
    assert len(local.calls_to("response_url")) == 1
    assert bot.server.gate.counts == {"passed": 1, "retry_acked": 1}


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


# -- the server ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_server_keeps_a_connection_alive_and_stops_at_once(bot_and_slack):
    bot, local, _ = bot_and_slack
    connection = http.client.HTTPConnection("127.0.0.1", bot.http_port, timeout=5)
    for _ in range(2):  # HTTP/1.1: both on one connection
        body = slash_command_body(text="status exp1", response_url=local.new_response_url())
        connection.request("POST", "/slack/events", body, sign(body))
        response = connection.getresponse()
        response.read()
        assert response.status == 200 and response.version == 11
    connection.request("GET", "/elsewhere")
    response = connection.getresponse()
    assert response.status == 404 and response.read() == b"not found"
    connection.close()
    local.wait_for("response_url", count=2)
    started = time.monotonic()
    bot.server.shutdown()
    bot.server.server_close()
    assert time.monotonic() - started < 2.0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", bot.http_port), timeout=1)
