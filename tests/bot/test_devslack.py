"""Tests for benchmarks.devslack: the local Slack Web API / Socket Mode endpoint."""

from __future__ import annotations

import importlib
import importlib.util
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from slack_bolt import App
from slack_bolt.adapter.wsgi import SlackRequestHandler
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

from benchmarks.devslack import (
    Call,
    LocalSlack,
    signed_headers,
    slash_command_body,
    slash_command_payload,
)

SIGNING_SECRET = "test-secret"
SOCKET_MODE_ADAPTERS = {
    "builtin": "slack_bolt.adapter.socket_mode",
    "websocket_client": "slack_bolt.adapter.socket_mode.websocket_client",
}


@pytest.fixture
def local() -> Iterator[LocalSlack]:
    with LocalSlack(signing_secret=SIGNING_SECRET) as server:
        yield server


@pytest.fixture
def socket_local() -> Iterator[LocalSlack]:
    with LocalSlack(signing_secret=SIGNING_SECRET, socket_mode=True) as server:
        yield server


@pytest.fixture
def client(local: LocalSlack) -> WebClient:
    return WebClient(base_url=local.api_url, token="xoxb-test")


def make_app(local: LocalSlack) -> App:
    # App() calls auth.test right away (token verification), so the server must be up.
    return App(
        client=WebClient(base_url=local.api_url, token="xoxb-test"),
        signing_secret=local.signing_secret,
    )


def close_socket_mode(handler: Any, local: LocalSlack) -> None:
    """Shut a Bolt Socket Mode handler down quickly.

    The websocket-client session's select() only wakes on socket activity (10 s timeout), and
    the builtin one reads with a 3 s socket timeout, so stop reconnects and let the server close
    the connections before calling close(). These poke at slack_sdk internals (3.48).
    """
    client = handler.client
    client.auto_reconnect_enabled = False
    session = client.current_session
    if session is not None and hasattr(session, "keep_running"):  # websocket-client
        client.current_session_runner.event.set()  # don't run_forever() again
        session.keep_running = False
    local.drop_socket_connections()
    client.closed = True  # process_messages() polls its queue with a 1 s timeout: wake it
    client.message_queue.put(None)
    handler.close()


@pytest.fixture(params=sorted(SOCKET_MODE_ADAPTERS))
def socket_app(request: pytest.FixtureRequest, socket_local: LocalSlack) -> Iterator[App]:
    app = make_app(socket_local)
    module = importlib.import_module(SOCKET_MODE_ADAPTERS[request.param])
    handler = module.SocketModeHandler(app, app_token="xapp-test")
    handler.connect()
    try:
        socket_local.wait_for_connection(timeout=5)
        yield app
    finally:
        close_socket_mode(handler, socket_local)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_app(local: LocalSlack) -> Iterator[tuple[App, str]]:
    app = make_app(local)
    server = make_server(
        "127.0.0.1",
        0,
        SlackRequestHandler(app),
        server_class=_ThreadingWSGIServer,
        handler_class=_QuietHandler,
    )
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield app, f"http://127.0.0.1:{server.server_port}/slack/events"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def post(url: str, body: str, headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# -- Web API ------------------------------------------------------------------------------------


def test_urls(local: LocalSlack) -> None:
    assert local.url == f"http://127.0.0.1:{local.port}/"
    assert local.api_url == local.url + "api/"
    assert local.port > 0
    assert local.socket_mode_url is None


def test_chat_post_message_is_recorded(local: LocalSlack, client: WebClient) -> None:
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "*loss spike*"}}]
    first = client.chat_postMessage(channel="C0ALERTS", text="loss spike", blocks=blocks)
    second = client.chat_postMessage(channel="C0ALERTS", text="again", thread_ts=first["ts"])

    assert first["ok"] and first["channel"] == "C0ALERTS"
    assert first["message"]["blocks"] == blocks
    assert first["message"]["ts"] == first["ts"]
    assert second["message"]["thread_ts"] == first["ts"]
    assert float(second["ts"]) > float(first["ts"])
    assert len(first["ts"].split(".")[1]) == 6

    [call1, call2] = local.wait_for("chat.postMessage", count=2)
    assert isinstance(call1, Call)
    assert call1.args["text"] == "loss spike"
    assert call1.args["blocks"] == blocks  # JSON form fields are decoded
    assert call1.token == "xoxb-test"
    assert call1.headers["authorization"] == "Bearer xoxb-test"
    assert not call1.failed
    assert call1.response is not None and call1.response["ts"] == first["ts"]
    assert call2.args["thread_ts"] == first["ts"]
    assert call1.at <= call2.at
    assert local.calls_to("chat.postMessage") == [call1, call2]


def test_other_methods(local: LocalSlack, client: WebClient) -> None:
    auth = client.auth_test()
    assert auth["user_id"] == "U0BOT" and auth["team_id"] == "T0001" and auth["bot_id"] == "B0001"
    posted = client.chat_postMessage(text="no channel given", channel="")
    assert posted["channel"] == "C0ALERTS"
    updated = client.chat_update(channel="C1", ts=posted["ts"], text="edited")
    assert (updated["channel"], updated["ts"], updated["text"]) == ("C1", posted["ts"], "edited")
    assert client.chat_postEphemeral(channel="C1", user="U1", text="psst")["message_ts"]
    assert client.chat_delete(channel="C1", ts=posted["ts"])["ok"]
    assert client.reactions_add(channel="C1", timestamp=posted["ts"], name="eyes")["ok"]
    view = {"type": "home", "blocks": []}
    published = client.views_publish(user_id="U1", view=view)
    assert published["view"]["id"].startswith("V")
    opened = client.views_open(trigger_id="1.2.3", view={"type": "modal", "blocks": []})
    updated_view = client.views_update(view_id=opened["view"]["id"], view=view)
    assert updated_view["view"]["id"] == opened["view"]["id"]
    assert client.conversations_info(channel="C0ALERTS")["channel"]["id"] == "C0ALERTS"
    assert client.users_info(user="U123")["user"]["id"] == "U123"

    # views.* are sent as JSON bodies by slack_sdk; they are parsed like form bodies
    [publish] = local.calls_to("views.publish")
    assert "json" in publish.headers["content-type"]
    assert publish.args["view"] == view

    with pytest.raises(SlackApiError) as err:
        client.api_call("admin.teams.create", params={"team_name": "x"})
    assert err.value.response["error"] == "unknown_method"
    assert local.calls_to("admin.teams.create")[0].args == {"team_name": "x"}


def test_get_requests(local: LocalSlack) -> None:
    with urllib.request.urlopen(local.api_url + "auth.test?token=xoxb-get", timeout=5) as resp:
        data = json.loads(resp.read())
    assert data["ok"] and data["user_id"] == "U0BOT"
    [call] = local.calls_to("auth.test")
    assert call.token == "xoxb-get"

    client = WebClient(base_url=local.api_url, token="xoxb-test")
    assert client.api_call("auth.test", http_verb="GET")["ok"]


def test_fail_500_raises(local: LocalSlack, client: WebClient) -> None:
    local.fail("chat.postMessage", status=500)
    with pytest.raises(SlackApiError) as err:
        client.chat_postMessage(channel="C1", text="boom")
    assert err.value.response.status_code == 500
    assert client.chat_postMessage(channel="C1", text="fine")["ok"]  # only `times` failures
    failed, ok = local.calls_to("chat.postMessage")
    assert failed.failed and not ok.failed
    assert failed.args["text"] == "boom"


def test_fail_with_error(local: LocalSlack, client: WebClient) -> None:
    local.fail("chat.update", times=2, error="message_not_found")
    for _ in range(2):
        with pytest.raises(SlackApiError) as err:
            client.chat_update(channel="C1", ts="1.2", text="x")
        assert err.value.response.status_code == 200
        assert err.value.response["error"] == "message_not_found"
    assert client.chat_update(channel="C1", ts="1.2", text="x")["ok"]
    assert [c.failed for c in local.calls_to("chat.update")] == [True, True, False]


def test_rate_limit_without_retry_handler_raises(local: LocalSlack, client: WebClient) -> None:
    local.fail("chat.postMessage", status=429, retry_after=7)
    with pytest.raises(SlackApiError) as err:
        client.chat_postMessage(channel="C1", text="x")
    assert err.value.response.status_code == 429
    assert err.value.response.headers["Retry-After"] == "7"
    assert err.value.response["error"] == "ratelimited"


def test_rate_limit_retry_handler_retries(local: LocalSlack) -> None:
    client = WebClient(
        base_url=local.api_url,
        token="xoxb-test",
        retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=2)],
    )
    # The handler sleeps Retry-After + random() seconds, so keep Retry-After at 0.
    local.fail("chat.postMessage", times=2, status=429, retry_after=0)
    resp = client.chat_postMessage(channel="C1", text="eventually")
    assert resp["ok"]
    calls = local.calls_to("chat.postMessage")
    assert [c.failed for c in calls] == [True, True, False]
    assert all(c.args["text"] == "eventually" for c in calls)


def test_files_upload_v2(local: LocalSlack, client: WebClient) -> None:
    data = bytes(range(256)) * 10
    resp = client.files_upload_v2(
        content=data,
        filename="loss.png",
        title="loss curve",
        channel="C0ALERTS",
        initial_comment="loss spiked at step 1200",
    )
    assert resp["ok"]
    file_id = resp["file"]["id"]
    assert resp["file"]["title"] == "loss curve"
    assert resp["file"]["size"] == len(data)

    [get_url] = local.calls_to("files.getUploadURLExternal")
    assert get_url.args["filename"] == "loss.png" and int(get_url.args["length"]) == len(data)
    [upload] = local.calls_to("upload")
    assert upload.args == {"file_id": file_id, "length": len(data), "content": data}
    [complete] = local.calls_to("files.completeUploadExternal")
    assert complete.args["files"][0]["id"] == file_id
    assert complete.args["channel_id"] == "C0ALERTS"
    assert local.uploaded(file_id) == data
    assert [c.method for c in local.calls] == [
        "files.getUploadURLExternal",
        "upload",
        "files.completeUploadExternal",
    ]


def test_response_url_is_recorded(local: LocalSlack) -> None:
    url1, url2 = local.new_response_url(), local.new_response_url()
    assert url1 != url2 and url1.startswith(local.url + "response/")
    status, _ = post(url2, json.dumps({"text": "done"}), {"Content-Type": "application/json"})
    assert status == 200
    [call] = local.wait_for("response_url")
    assert call.args == {"text": "done"}
    assert url2.endswith(call.path)


def test_wait_for_timeout_lists_methods(local: LocalSlack, client: WebClient) -> None:
    client.auth_test()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"chat\.postMessage.*auth\.test x1"):
        local.wait_for("chat.postMessage", timeout=0.1)
    assert time.monotonic() - start < 2


def test_wait_for_blocks_until_call_arrives(local: LocalSlack, client: WebClient) -> None:
    timer = threading.Timer(0.1, lambda: client.chat_postMessage(channel="C1", text="late"))
    timer.start()
    try:
        [call] = local.wait_for("chat.postMessage", timeout=5)
    finally:
        timer.join()
    assert call.args["text"] == "late"


def test_clear(local: LocalSlack, client: WebClient) -> None:
    calls = local.calls
    client.auth_test()
    local.clear()
    assert local.calls == [] and calls is local.calls


def test_connections_open_without_socket_mode(local: LocalSlack) -> None:
    client = WebClient(base_url=local.api_url)
    with pytest.raises(SlackApiError):
        client.apps_connections_open(app_token="xapp-test")


def test_signed_headers_and_body() -> None:
    body = slash_command_body(text="rollback exp1", response_url="http://x/response/1")
    headers = signed_headers(body, "s3cret", timestamp=1700000000)
    assert headers["X-Slack-Request-Timestamp"] == "1700000000"
    assert headers["X-Slack-Signature"].startswith("v0=")
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert "command=%2Frun" in body and "text=rollback+exp1" in body
    assert slash_command_payload()["command"] == "/run"


# -- Bolt over Socket Mode ------------------------------------------------------------------------


def test_socket_mode_slash_command(socket_app: App, socket_local: LocalSlack) -> None:
    seen: list[dict[str, Any]] = []

    @socket_app.command("/run")
    def run(ack, command, say, respond) -> None:
        seen.append(command)
        ack(f"running {command['text']}")
        say(f"status for {command['text']}")
        respond("done")

    # Bolt's first Web API call is auth.test (App() verifies the token), then Socket Mode
    # fetches the ws:// URL with the app-level token.
    assert socket_local.calls[0].method == "auth.test"
    [opened, *_] = socket_local.calls_to("apps.connections.open")
    assert opened.token == "xapp-test"

    payload = slash_command_payload(text="exp1", response_url=socket_local.new_response_url())
    envelope_id = socket_local.send_envelope(
        "slash_commands", payload, accepts_response_payload=True
    )
    ack = socket_local.wait_for_ack(envelope_id)
    assert ack["envelope_id"] == envelope_id
    assert ack["payload"] == {"text": "running exp1"}

    [message] = socket_local.wait_for("chat.postMessage")
    assert message.args["channel"] == "C123"
    assert message.args["text"] == "status for exp1"
    assert message.token == "xoxb-test"
    [response] = socket_local.wait_for("response_url")
    assert response.args["text"] == "done"
    assert seen[0]["command"] == "/run"


def test_socket_mode_events_api(socket_app: App, socket_local: LocalSlack) -> None:
    @socket_app.event("app_mention")
    def mention(event, say) -> None:
        say(text=f"hi <@{event['user']}>", thread_ts=event["ts"])

    payload = {
        "token": "verification-token",
        "team_id": "T0001",
        "api_app_id": "A0001",
        "type": "event_callback",
        "event_id": "Ev0001",
        "event_time": 1700000000,
        "event": {
            "type": "app_mention",
            "user": "U123",
            "text": "<@U0BOT> status exp1",
            "ts": "1700000000.000001",
            "channel": "C0ALERTS",
            "event_ts": "1700000000.000001",
        },
    }
    envelope_id = socket_local.send_envelope("events_api", payload)
    assert socket_local.wait_for_ack(envelope_id)["envelope_id"] == envelope_id
    [message] = socket_local.wait_for("chat.postMessage")
    assert message.args["text"] == "hi <@U123>"
    assert message.args["thread_ts"] == "1700000000.000001"


def test_send_envelope_without_client_times_out() -> None:
    with LocalSlack(socket_mode=True) as server:
        assert server.socket_mode_url is not None
        assert server.socket_mode_url.startswith("ws://127.0.0.1:")
        assert server.socket_connections == 0
        with pytest.raises(TimeoutError, match="Socket Mode connection"):
            server.wait_for_connection(timeout=0.1)


# -- Bolt over HTTP (signed requests) ---------------------------------------------------------


def test_signed_slash_command_over_http(http_app: tuple[App, str], local: LocalSlack) -> None:
    app, url = http_app

    @app.command("/run")
    def run(ack, command, respond) -> None:
        ack(f"on it: {command['text']}")
        respond(f"finished {command['text']}")

    body = slash_command_body(text="status exp1", response_url=local.new_response_url())
    status, text = post(url, body, signed_headers(body, SIGNING_SECRET))
    assert status == 200
    assert "on it: status exp1" in text
    [response] = local.wait_for("response_url")
    assert response.args["text"] == "finished status exp1"


def test_wrong_signature_is_rejected(http_app: tuple[App, str]) -> None:
    _, url = http_app
    body = slash_command_body()
    status, _ = post(url, body, signed_headers(body, "not-the-secret"))
    assert status == 401


def test_stale_timestamp_is_rejected(http_app: tuple[App, str]) -> None:
    _, url = http_app
    body = slash_command_body()
    stale = int(time.time()) - 6 * 60
    status, _ = post(url, body, signed_headers(body, SIGNING_SECRET, timestamp=stale))
    assert status == 401


def test_block_kit_problems_catch_what_slack_would_reject():
    from benchmarks.devslack import block_kit_problems

    ok = {"text": "t", "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}]}
    assert block_kit_problems("chat.postMessage", ok) == []
    long_header = {"text": "t", "blocks": [{"type": "header", "text": {
        "type": "plain_text", "text": "x" * 151}}]}
    assert "cannot exceed 150" in block_kit_problems("chat.postMessage", long_header)[0]
    many = {"text": "t", "blocks": [ok["blocks"][0]] * 51}
    assert "51 blocks (max 50)" in block_kit_problems("chat.update", many)[0]
    assert block_kit_problems("views.publish", {"view": {"type": "home",
                                                         "blocks": many["blocks"]}}) == []
    button = {"type": "button", "text": {"type": "plain_text", "text": "b" * 76},
              "action_id": "a"}
    wide = {"text": "t", "blocks": [{"type": "actions", "elements": [button] * 26}]}
    problems = block_kit_problems("chat.postMessage", wide)
    assert any("26 elements (max 25)" in p for p in problems)
    assert any("button text of 76" in p for p in problems)
    assert "not a Block Kit block" in block_kit_problems(
        "chat.postMessage", {"text": "t", "blocks": [{"type": "bogus"}]})[0]
    assert "neither text nor blocks" in block_kit_problems("chat.postMessage", {})[0]


def test_leaving_the_server_fails_on_an_invalid_message():
    from slack_sdk import WebClient

    from benchmarks.devslack import LocalSlack

    with pytest.raises(AssertionError, match="messages Slack would reject"):
        with LocalSlack() as local:
            WebClient(token="xoxb-t", base_url=local.api_url).chat_postMessage(
                channel="C1", text="t", blocks=[{"type": "header", "text": {
                    "type": "plain_text", "text": "x" * 200}}])
