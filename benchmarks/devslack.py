"""A local Slack-compatible endpoint for tests, benchmarks and offline development.

`LocalSlack` is a small HTTP server (standard library only) that speaks enough of the
Slack Web API for ``slack_sdk.WebClient`` and Bolt apps to run against it with no network::

    with LocalSlack() as local:
        client = WebClient(base_url=local.api_url, token="xoxb-test")
        client.chat_postMessage(channel="C0ALERTS", text="loss spike")
        [call] = local.wait_for("chat.postMessage")
        assert call.args["text"] == "loss spike"

Every request is recorded as a `Call` (``local.calls``); ``local.messages`` holds each posted
message as ``chat.update`` left it, which ``conversations.history`` and
``conversations.replies`` read back. ``local.fail(...)`` injects HTTP errors, rate limits or
``{"ok": false}`` answers. ``new_response_url()`` hands out
``response_url`` targets, and ``files.getUploadURLExternal`` hands out upload URLs served
here too, so ``WebClient.files_upload_v2`` works end to end.

With ``socket_mode=True`` a WebSocket server (the optional ``websockets`` package, imported
only then) is started as well; ``apps.connections.open`` returns its ``ws://`` URL, and
``send_envelope`` / ``wait_for_ack`` drive a Bolt app through Socket Mode. Use Bolt's
builtin adapter (``slack_bolt.adapter.socket_mode.SocketModeHandler``) or the
websocket-client one; both take the app's ``app.client``, so build the app with
``WebClient(base_url=local.api_url, ...)``. Note that ``slack_bolt.App(...)`` calls
``auth.test`` in its constructor, so start the server first.

`signed_headers` and `slash_command_body` build signed HTTP requests the way Slack sends
them, for testing an app served over HTTP.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from slack_sdk.signature import SignatureVerifier

__all__ = [
    "Call",
    "LocalSlack",
    "signed_headers",
    "slash_command_body",
    "slash_command_payload",
]

TEAM_ID = "T0001"
BOT_USER_ID = "U0BOT"
BOT_ID = "B0001"
APP_ID = "A0001"
DEFAULT_CHANNEL = "C0ALERTS"

# Form fields that Slack clients send as JSON strings (slack_sdk json.dumps these).
JSON_FORM_FIELDS = frozenset(
    {
        "attachments",
        "blocks",
        "files",
        "inputs",
        "metadata",
        "outputs",
        "unfurls",
        "user_auth_blocks",
        "view",
    }
)


@dataclass
class Call:
    """One request the local server received.

    ``method`` is the Web API method (``"chat.postMessage"``), ``"response_url"`` for a POST to
    a URL from `LocalSlack.new_response_url`, or ``"upload"`` for a file upload. ``headers``
    keys are lower-cased. ``failed`` is True when `LocalSlack.fail` answered this call with an
    error; ``response`` is the JSON body that was sent back.
    """

    method: str
    args: dict[str, Any]
    headers: dict[str, str]
    at: float
    failed: bool = False
    path: str = ""
    response: dict[str, Any] | None = None

    @property
    def token(self) -> str | None:
        """The token the client sent (``Authorization: Bearer`` header, else a ``token`` arg)."""
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        token = self.args.get("token")
        return token if isinstance(token, str) else None


@dataclass
class _Failure:
    status: int
    error: str | None
    retry_after: float | int | None


@dataclass
class _Upload:
    file_id: str
    filename: str | None
    length: int | None
    content: bytes | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    local: LocalSlack


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "devslack/1.0"
    # Idle keep-alive connections are dropped after this many seconds.
    timeout = 10
    server: _HTTPServer

    def do_GET(self) -> None:
        self.server.local._handle_http(self)

    def do_POST(self) -> None:
        self.server.local._handle_http(self)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _read_body(h: BaseHTTPRequestHandler) -> bytes:
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(h.rfile.read(size))
            h.rfile.readline()
    length = int(h.headers.get("Content-Length") or 0)
    return h.rfile.read(length) if length > 0 else b""


def _parse_form(text: str) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for key, values in parse_qs(text, keep_blank_values=True).items():
        value: Any = values[0] if len(values) == 1 else values
        if key in JSON_FORM_FIELDS and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                pass
        args[key] = value
    return args


def _parse_body(raw: bytes, content_type: str) -> dict[str, Any]:
    if not raw:
        return {}
    text = raw.decode("utf-8", errors="replace")
    if "json" in content_type.lower() or (not content_type and text.lstrip()[:1] in "{["):
        try:
            data = json.loads(text)
        except ValueError:
            return {"_raw": text}
        return data if isinstance(data, dict) else {"_json": data}
    return _parse_form(text)


MESSAGE_METHODS = ("chat.postMessage", "chat.update", "chat.postEphemeral", "response_url")
VIEW_METHODS = ("views.publish", "views.open", "views.update", "views.push")
MAX_TEXT = 40_000  # Slack truncates a message's text beyond this


def block_kit_problems(method: str, args: dict[str, Any]) -> list[str]:
    """What Slack would reject or cut in a message or view the bot sends (empty: none).

    Each block is parsed with slack_sdk's Block Kit models, whose validation knows the
    length limits of texts, headers and fields; counts that the models leave to Slack are
    checked here: blocks per message (50) or view (100), elements per actions (25) and
    context (10) block, button texts (75), and the fallback text (40,000).
    """
    from slack_sdk.errors import SlackObjectFormationError
    from slack_sdk.models.blocks import Block

    problems: list[str] = []
    view = args.get("view") if method in VIEW_METHODS else None
    if isinstance(view, str):
        view = json.loads(view)
    blocks = view.get("blocks") if isinstance(view, dict) else args.get("blocks")
    if isinstance(blocks, str):
        try:
            blocks = json.loads(blocks)
        except ValueError:
            return [f"{method}: blocks are not JSON"]
    text = args.get("text")
    if isinstance(text, str) and len(text) > MAX_TEXT:
        problems.append(f"{method}: text of {len(text)} characters (max {MAX_TEXT})")
    if method in MESSAGE_METHODS and not blocks and not text and "attachments" not in args:
        problems.append(f"{method}: neither text nor blocks")
    if not blocks:
        return problems
    limit = 100 if method in VIEW_METHODS else 50
    if len(blocks) > limit:
        problems.append(f"{method}: {len(blocks)} blocks (max {limit})")
    for i, raw in enumerate(blocks):
        where = f"{method} block {i} ({raw.get('type') if isinstance(raw, dict) else raw!r})"
        block = Block.parse(raw) if isinstance(raw, dict) else None
        if block is None:
            problems.append(f"{where}: not a Block Kit block")
            continue
        try:
            block.validate_json()
        except SlackObjectFormationError as exc:
            problems.append(f"{where}: {exc}")
        elements = raw.get("elements") or []
        cap = {"actions": 25, "context": 10}.get(raw.get("type"))
        if cap is not None and len(elements) > cap:
            problems.append(f"{where}: {len(elements)} elements (max {cap})")
        for element in elements:
            label = (element.get("text") or {}).get("text", "") \
                if element.get("type") == "button" else ""
            if len(label) > 75:
                problems.append(f"{where}: button text of {len(label)} characters (max 75)")
    return problems


class LocalSlack:
    """A local server speaking the Slack Web API (and optionally Socket Mode).

    Use as a context manager or call `start` / `stop`. Point clients at `api_url`.
    Every message and view it receives is checked with :func:`block_kit_problems`; the
    problems are in ``block_errors``, and leaving the context manager raises
    ``AssertionError`` when there are any (``strict_blocks=False`` turns that off).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        signing_secret: str = "test-secret",
        socket_mode: bool = False,
        strict_blocks: bool = True,
    ) -> None:
        self.host = host
        self.strict_blocks = strict_blocks
        self.block_errors: list[str] = []
        self.port = port
        self.signing_secret = signing_secret
        self.socket_mode = socket_mode
        self.calls: list[Call] = []
        # (channel, ts) → the message as it stands now: posted, then edited by chat.update
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self.socket_messages: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._failures: dict[str, list[_Failure]] = {}
        self._uploads: dict[str, _Upload] = {}
        self._ts = itertools.count(100)
        self._ids = itertools.count(1)
        self._response_urls = itertools.count(1)
        self._httpd: _HTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._ws_server: Any = None
        self._ws_thread: threading.Thread | None = None
        self._ws_port: int | None = None
        self._ws_conns: list[Any] = []
        self._acks: dict[str, dict[str, Any]] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> LocalSlack:
        if self._httpd is not None:
            return self
        httpd = _HTTPServer((self.host, self.port), _Handler)
        httpd.local = self
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._http_thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"devslack-http-{self.port}",
            daemon=True,
        )
        self._http_thread.start()
        if self.socket_mode:
            try:
                self._start_socket_mode()
            except BaseException:
                self.stop()
                raise
        return self

    def stop(self) -> None:
        if self._ws_server is not None:
            self._ws_server.shutdown()
            if self._ws_thread is not None:
                self._ws_thread.join(timeout=5)
            self._ws_server = None
            self._ws_thread = None
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            if self._http_thread is not None:
                self._http_thread.join(timeout=5)
            self._httpd = None
            self._http_thread = None

    def __enter__(self) -> LocalSlack:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        if self.strict_blocks and self.block_errors and exc_info[0] is None:
            raise AssertionError("messages Slack would reject:\n" + "\n".join(self.block_errors))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def api_url(self) -> str:
        """What ``WebClient(base_url=...)`` takes."""
        return self.url + "api/"

    @property
    def socket_mode_url(self) -> str | None:
        """The ``ws://`` URL that ``apps.connections.open`` returns (None without Socket Mode)."""
        if self._ws_port is None:
            return None
        return f"ws://{self.host}:{self._ws_port}/"

    # -- recorded calls ----------------------------------------------------------------------

    def _record(self, call: Call) -> None:
        problems = (block_kit_problems(call.method, call.args)
                    if call.method in (*MESSAGE_METHODS, *VIEW_METHODS) else [])
        with self._cond:
            self.block_errors.extend(problems)
            self.calls.append(call)
            self._cond.notify_all()

    def calls_to(self, method: str) -> list[Call]:
        with self._cond:
            return [c for c in self.calls if c.method == method]

    def wait_for_post(self, predicate: Callable[[Call], bool], timeout: float = 30.0) -> Call:
        """The first ``chat.postMessage`` call that ``predicate`` accepts, waiting for it."""
        def found() -> Call | None:
            return next((c for c in self.calls if c.method == "chat.postMessage"
                         and predicate(c)), None)

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None, timeout=timeout):
                texts = [c.args.get("text") for c in self.calls
                         if c.method == "chat.postMessage"]
                raise TimeoutError(f"no such message within {timeout}s; posted: {texts}")
            return found()

    def wait_for(self, method: str, count: int = 1, timeout: float = 5.0) -> list[Call]:
        """Block until at least `count` calls to `method` (failed ones included) were made."""

        def ready() -> bool:
            return sum(1 for c in self.calls if c.method == method) >= count

        with self._cond:
            if not self._cond.wait_for(ready, timeout=timeout):
                seen = Counter(c.method for c in self.calls)
                got = seen.get(method, 0)
                listing = ", ".join(f"{m} x{n}" for m, n in sorted(seen.items())) or "none"
                raise TimeoutError(
                    f"expected {count} call(s) to {method!r} within {timeout}s, got {got}; "
                    f"methods seen: {listing}"
                )
            return [c for c in self.calls if c.method == method]

    def clear(self) -> None:
        """Forget recorded calls, socket messages and acks (pending `fail` rules stay)."""
        with self._cond:
            self.calls.clear()
            self.socket_messages.clear()
            self._acks.clear()

    # -- behaviour control ------------------------------------------------------------------

    def fail(
        self,
        method: str,
        times: int = 1,
        status: int = 500,
        error: str | None = None,
        retry_after: float | int | None = None,
    ) -> None:
        """Make the next `times` calls to `method` fail.

        Without `error` they answer HTTP `status` (a 429 carries ``Retry-After``, `retry_after`
        or 1 s); with `error` they answer HTTP 200 ``{"ok": false, "error": error}``.
        `method` may also be ``"response_url"`` or ``"upload"``. Failed calls are recorded with
        ``failed=True``.
        """
        with self._cond:
            rules = self._failures.setdefault(method, [])
            rules.extend(_Failure(status, error, retry_after) for _ in range(times))

    def new_response_url(self) -> str:
        """A URL to use as a ``response_url``; POSTs to it are recorded as ``response_url``."""
        return f"{self.url}response/{next(self._response_urls)}"

    def sign(self, body: str, timestamp: int | None = None) -> dict[str, str]:
        """`signed_headers` with this server's signing secret."""
        return signed_headers(body, self.signing_secret, timestamp)

    # -- HTTP --------------------------------------------------------------------------------

    def _next_ts(self) -> str:
        n = next(self._ts)
        return f"{1700000000 + n // 1_000_000}.{n % 1_000_000:06d}"

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):08X}"

    def _handle_http(self, h: _Handler) -> None:
        parts = urlsplit(h.path)
        raw = _read_body(h)
        headers = {k.lower(): v for k, v in h.headers.items()}
        segments = [s for s in parts.path.split("/") if s]
        if len(segments) == 2 and segments[0] == "api":
            method = segments[1]
            args = _parse_form(parts.query) if parts.query else {}
            args.update(_parse_body(raw, headers.get("content-type", "")))
        elif len(segments) == 2 and segments[0] == "response":
            method = "response_url"
            args = _parse_body(raw, headers.get("content-type", "application/json"))
        elif len(segments) == 2 and segments[0] == "upload":
            method = "upload"
            args = {"file_id": segments[1], "length": len(raw), "content": raw}
        else:
            self._send(h, 404, {"ok": False, "error": "not_found"})
            return

        call = Call(method=method, args=args, headers=headers, at=time.time(), path=parts.path)
        with self._cond:
            rules = self._failures.get(method)
            failure = rules.pop(0) if rules else None
        extra_headers: dict[str, str] = {}
        if failure is not None:
            call.failed = True
            if failure.error is not None:
                status, body = 200, {"ok": False, "error": failure.error}
            else:
                status = failure.status
                body = {"ok": False, "error": "ratelimited" if status == 429 else "fatal_error"}
                if status == 429 or failure.retry_after is not None:
                    extra_headers["Retry-After"] = str(
                        failure.retry_after if failure.retry_after is not None else 1
                    )
        else:
            status = 200
            try:
                body = self._respond(method, args)
            except Exception as e:  # a bug here should show up as an answer, not a hang
                status, body = 500, {"ok": False, "error": f"devslack_error: {e!r}"}
        call.response = body
        self._record(call)
        self._send(h, status, body, extra_headers)

    @staticmethod
    def _send(
        h: _Handler, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json; charset=utf-8")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def _respond(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        if method == "upload":
            return self._upload(args)
        if method == "response_url":
            return {"ok": True}
        handler = _API.get(method)
        if handler is None:
            return {"ok": False, "error": "unknown_method"}
        return handler(self, args)

    # -- Web API methods ----------------------------------------------------------------------

    def _auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": self.url,
            "team": "T",
            "team_id": TEAM_ID,
            "user": "runwatch",
            "user_id": BOT_USER_ID,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _chat_post_message(self, args: dict[str, Any]) -> dict[str, Any]:
        ts = self._next_ts()
        message: dict[str, Any] = {
            "type": "message",
            "user": BOT_USER_ID,
            "bot_id": BOT_ID,
            "app_id": APP_ID,
            "team": TEAM_ID,
            "text": args.get("text", ""),
            "ts": ts,
        }
        for key in ("blocks", "attachments", "thread_ts", "metadata", "reply_broadcast"):
            if key in args:
                message[key] = args[key]
        channel = args.get("channel") or DEFAULT_CHANNEL
        with self._cond:
            self.messages[(channel, ts)] = message
        return {
            "ok": True,
            "channel": channel,
            "ts": ts,
            "message": message,
        }

    def _chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        resp = {
            "ok": True,
            "channel": args.get("channel") or DEFAULT_CHANNEL,
            "ts": args.get("ts") or self._next_ts(),
            "text": args.get("text", ""),
        }
        if "blocks" in args:
            resp["message"] = {"text": resp["text"], "blocks": args["blocks"]}
        with self._cond:
            message = self.messages.setdefault((resp["channel"], resp["ts"]),
                                               {"type": "message", "ts": resp["ts"]})
            message.update(text=resp["text"], edited={"user": BOT_USER_ID})
            if "blocks" in args:
                message["blocks"] = args["blocks"]
        return resp

    def _conversation(self, args: dict[str, Any], replies: bool) -> dict[str, Any]:
        channel = args.get("channel") or DEFAULT_CHANNEL
        include_metadata = str(args.get("include_all_metadata", "")).lower() in ("1", "true")
        oldest = float(args.get("oldest") or 0)
        parent = args.get("ts")
        with self._cond:
            found = [dict(m) for (c, _), m in self.messages.items() if c == channel]
        if replies:
            found = [m for m in found if m["ts"] == parent or m.get("thread_ts") == parent]
            found.sort(key=lambda m: float(m["ts"]))
        else:
            found = [m for m in found if m.get("thread_ts") in (None, m["ts"])
                     and float(m["ts"]) > oldest]
            found.sort(key=lambda m: -float(m["ts"]))
        if not include_metadata:
            for m in found:
                m.pop("metadata", None)
        return {"ok": True, "messages": found, "has_more": False}

    def _conversations_history(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._conversation(args, replies=False)

    def _conversations_replies(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._conversation(args, replies=True)

    def _chat_post_ephemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "message_ts": self._next_ts()}

    def _chat_delete(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "channel": args.get("channel") or DEFAULT_CHANNEL,
            "ts": args.get("ts", ""),
        }

    def _ok(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    def _views(self, args: dict[str, Any]) -> dict[str, Any]:
        view = args.get("view")
        view = dict(view) if isinstance(view, dict) else {}
        view["id"] = args.get("view_id") or self._next_id("V")
        view.setdefault("team_id", TEAM_ID)
        view.setdefault("app_id", APP_ID)
        view.setdefault("bot_id", BOT_ID)
        view.setdefault("hash", f"{time.time():.6f}")
        return {"ok": True, "view": view}

    def _conversations_info(self, args: dict[str, Any]) -> dict[str, Any]:
        cid = args.get("channel") or DEFAULT_CHANNEL
        return {
            "ok": True,
            "channel": {
                "id": cid,
                "name": "alerts" if cid == DEFAULT_CHANNEL else cid.lower(),
                "is_channel": cid.startswith("C"),
                "is_private": cid.startswith("G"),
                "is_im": cid.startswith("D"),
                "is_member": True,
                "is_archived": False,
                "context_team_id": TEAM_ID,
            },
        }

    def _users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        uid = args.get("user") or "U123"
        name = "runwatch" if uid == BOT_USER_ID else f"user-{uid.lower()}"
        return {
            "ok": True,
            "user": {
                "id": uid,
                "team_id": TEAM_ID,
                "name": name,
                "real_name": name,
                "is_bot": uid == BOT_USER_ID,
                "is_admin": False,
                "deleted": False,
                "tz": "UTC",
                "tz_offset": 0,
                "profile": {"real_name": name, "display_name": name},
            },
        }

    def _files_get_upload_url(self, args: dict[str, Any]) -> dict[str, Any]:
        file_id = self._next_id("F")
        length = args.get("length")
        with self._cond:
            self._uploads[file_id] = _Upload(
                file_id=file_id,
                filename=args.get("filename"),
                length=int(length) if length not in (None, "") else None,
            )
        return {"ok": True, "upload_url": f"{self.url}upload/{file_id}", "file_id": file_id}

    def _upload(self, args: dict[str, Any]) -> dict[str, Any]:
        with self._cond:
            upload = self._uploads.get(args["file_id"])
            if upload is None:
                return {"ok": False, "error": "file_not_found"}
            upload.content = args["content"]
        return {"ok": True}

    def _files_complete_upload(self, args: dict[str, Any]) -> dict[str, Any]:
        files = args.get("files")
        if not isinstance(files, list) or not files:
            return {"ok": False, "error": "invalid_arguments"}
        channels = args.get("channel_id") or args.get("channels") or ""
        out = []
        for f in files:
            fid = f.get("id") if isinstance(f, dict) else None
            with self._cond:
                upload = self._uploads.get(fid or "")
            if upload is None:
                return {"ok": False, "error": "file_not_found"}
            if upload.content is None:
                return {"ok": False, "error": "file_not_uploaded"}
            out.append(
                {
                    "id": fid,
                    "name": upload.filename,
                    "title": f.get("title") or upload.filename,
                    "size": len(upload.content),
                    "channels": [c for c in str(channels).split(",") if c],
                    "url_private": f"{self.url}files/{fid}",
                    "permalink": f"{self.url}files/{fid}/permalink",
                }
            )
        return {"ok": True, "files": out}

    def _files_info(self, args: dict[str, Any]) -> dict[str, Any]:
        fid = args.get("file", "")
        with self._cond:
            upload = self._uploads.get(fid)
        if upload is None:
            return {"ok": False, "error": "file_not_found"}
        size = len(upload.content) if upload.content is not None else upload.length
        return {"ok": True, "file": {"id": fid, "name": upload.filename, "size": size}}

    def _apps_connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        url = self.socket_mode_url
        if url is None:
            return {"ok": False, "error": "socket_mode_not_enabled"}
        return {"ok": True, "url": url}

    def uploaded(self, file_id: str) -> bytes | None:
        """The bytes uploaded for `file_id` (None when nothing arrived yet)."""
        with self._cond:
            upload = self._uploads.get(file_id)
            return upload.content if upload is not None else None

    # -- Socket Mode -------------------------------------------------------------------------

    def _start_socket_mode(self) -> None:
        from websockets.sync.server import serve  # optional dependency, only for Socket Mode

        server = serve(
            self._ws_handler,
            self.host,
            0,
            ping_interval=None,
            close_timeout=1,
            compression=None,
        )
        self._ws_server = server
        self._ws_port = server.socket.getsockname()[1]
        self._ws_thread = threading.Thread(
            target=server.serve_forever, name=f"devslack-ws-{self._ws_port}", daemon=True
        )
        self._ws_thread.start()

    def _ws_handler(self, conn: Any) -> None:
        hello = {
            "type": "hello",
            "num_connections": 1,
            "connection_info": {"app_id": APP_ID},
            "debug_info": {},
        }
        with self._cond:
            conn.send(json.dumps(hello))
            self._ws_conns.append(conn)
            self._cond.notify_all()
        try:
            for message in conn:
                try:
                    data = json.loads(message)
                except (TypeError, ValueError):
                    continue
                if not isinstance(data, dict):
                    continue
                with self._cond:
                    self.socket_messages.append(data)
                    if data.get("envelope_id"):
                        self._acks[data["envelope_id"]] = data
                    self._cond.notify_all()
        except Exception:  # connection dropped: just forget it
            pass
        finally:
            with self._cond:
                if conn in self._ws_conns:
                    self._ws_conns.remove(conn)
                self._cond.notify_all()

    @property
    def socket_connections(self) -> int:
        with self._cond:
            return len(self._ws_conns)

    def wait_for_connection(self, count: int = 1, timeout: float = 5.0) -> None:
        """Block until `count` Socket Mode clients are connected."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._ws_conns) >= count, timeout=timeout):
                raise TimeoutError(
                    f"expected {count} Socket Mode connection(s) within {timeout}s, "
                    f"have {len(self._ws_conns)}"
                    + ("" if self.socket_mode else " (LocalSlack(socket_mode=True) not set)")
                )

    def drop_socket_connections(self) -> int:
        """Close every Socket Mode connection from the server side; returns how many.

        Clients with auto-reconnect will call ``apps.connections.open`` again. Closing here
        first also lets the builtin slack_sdk client shut down without waiting for its 3 s
        socket read timeout.
        """
        with self._cond:
            conns = list(self._ws_conns)
        for conn in conns:
            conn.close()
        return len(conns)

    def send_socket_message(self, message: dict[str, Any], broadcast: bool = False) -> None:
        """Send a raw JSON message (e.g. ``{"type": "disconnect"}``) to the newest client.

        Waits up to 5 s for a client; with `broadcast` every connected client gets it.
        """
        self.wait_for_connection(timeout=5.0)
        from websockets.exceptions import ConnectionClosed

        text = json.dumps(message)
        with self._cond:
            targets = list(reversed(self._ws_conns))
        sent = False
        for conn in targets:
            try:
                conn.send(text)
            except ConnectionClosed:
                continue
            sent = True
            if not broadcast:
                break
        if not sent:
            raise ConnectionError("no open Socket Mode connection to send to")

    def send_envelope(
        self,
        type: str,
        payload: dict[str, Any],
        accepts_response_payload: bool = False,
        broadcast: bool = False,
    ) -> str:
        """Send a Socket Mode envelope (``"slash_commands"``, ``"interactive"``,
        ``"events_api"``) and return its ``envelope_id``; see `wait_for_ack`.

        Like Slack, one envelope goes to one connection (the newest) unless `broadcast`.
        """
        envelope_id = str(uuid.uuid4())
        envelope: dict[str, Any] = {
            "envelope_id": envelope_id,
            "type": type,
            "payload": payload,
            "accepts_response_payload": accepts_response_payload,
        }
        if type == "events_api":
            envelope.update({"retry_attempt": 0, "retry_reason": ""})
        self.send_socket_message(envelope, broadcast=broadcast)
        return envelope_id

    def wait_for_ack(self, envelope_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """The message the client sent back for `envelope_id` (with any ``"payload"``)."""
        with self._cond:
            if not self._cond.wait_for(lambda: envelope_id in self._acks, timeout=timeout):
                raise TimeoutError(
                    f"no ack for envelope {envelope_id} within {timeout}s "
                    f"({len(self._ws_conns)} Socket Mode connection(s), "
                    f"{len(self._acks)} other ack(s))"
                )
            return self._acks[envelope_id]


_API: dict[str, Callable[[LocalSlack, dict[str, Any]], dict[str, Any]]] = {
    "api.test": LocalSlack._ok,
    "auth.test": LocalSlack._auth_test,
    "chat.postMessage": LocalSlack._chat_post_message,
    "chat.update": LocalSlack._chat_update,
    "chat.postEphemeral": LocalSlack._chat_post_ephemeral,
    "chat.delete": LocalSlack._chat_delete,
    "reactions.add": LocalSlack._ok,
    "reactions.remove": LocalSlack._ok,
    "views.publish": LocalSlack._views,
    "views.open": LocalSlack._views,
    "views.update": LocalSlack._views,
    "views.push": LocalSlack._views,
    "conversations.info": LocalSlack._conversations_info,
    "conversations.history": LocalSlack._conversations_history,
    "conversations.replies": LocalSlack._conversations_replies,
    "users.info": LocalSlack._users_info,
    "files.getUploadURLExternal": LocalSlack._files_get_upload_url,
    "files.completeUploadExternal": LocalSlack._files_complete_upload,
    "files.info": LocalSlack._files_info,
    "apps.connections.open": LocalSlack._apps_connections_open,
}


# -- signed requests (Slack -> app over HTTP) ----------------------------------------------------


def signed_headers(body: str, signing_secret: str, timestamp: int | None = None) -> dict[str, str]:
    """Headers Slack sends with `body`: timestamp, ``v0=`` signature, form content type."""
    ts = str(int(time.time()) if timestamp is None else int(timestamp))
    signature = SignatureVerifier(signing_secret).generate_signature(timestamp=ts, body=body)
    return {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature,
        "Content-Type": "application/x-www-form-urlencoded",
    }


def slash_command_payload(
    command: str = "/run",
    text: str = "status exp1",
    user_id: str = "U123",
    channel_id: str = "C123",
    response_url: str | None = None,
    trigger_id: str | None = None,
) -> dict[str, str]:
    """A slash command's fields as Slack sends them (also the Socket Mode payload).

    Pass ``response_url=local.new_response_url()`` so ``respond()`` reaches a `LocalSlack`.
    """
    return {
        "token": "verification-token",
        "team_id": TEAM_ID,
        "team_domain": "runwatch-dev",
        "channel_id": channel_id,
        "channel_name": "alerts" if channel_id == DEFAULT_CHANNEL else channel_id.lower(),
        "user_id": user_id,
        "user_name": f"user-{user_id.lower()}",
        "command": command,
        "text": text,
        "api_app_id": APP_ID,
        "is_enterprise_install": "false",
        "response_url": response_url or f"https://hooks.slack.com/commands/{TEAM_ID}/1/devslack",
        "trigger_id": trigger_id or f"{int(time.time())}.1.{uuid.uuid4().hex[:16]}",
    }


def slash_command_body(
    command: str = "/run",
    text: str = "status exp1",
    user_id: str = "U123",
    channel_id: str = "C123",
    response_url: str | None = None,
    trigger_id: str | None = None,
) -> str:
    """`slash_command_payload` urlencoded, as the HTTP body Slack POSTs."""
    return urlencode(
        slash_command_payload(command, text, user_id, channel_id, response_url, trigger_id)
    )


def block_actions_body(action_id: str, value: str, *, user_id: str = "U123",
                       channel_id: str = DEFAULT_CHANNEL, message_ts: str | None = None,
                       thread_ts: str | None = None, response_url: str | None = None) -> str:
    """The form body Slack POSTs when someone clicks a button (``block_actions``)."""
    payload = {
        "type": "block_actions", "api_app_id": APP_ID, "token": "verification-token",
        "trigger_id": f"{int(time.time())}.1.{uuid.uuid4().hex[:12]}",
        "user": {"id": user_id, "username": user_id.lower(), "team_id": TEAM_ID},
        "team": {"id": TEAM_ID, "domain": "runwatch-dev"},
        "channel": {"id": channel_id, "name": channel_id.lower()},
        "container": {"type": "message", "message_ts": message_ts, "channel_id": channel_id,
                      "is_ephemeral": False},
        "message": {"type": "message", "ts": message_ts, "thread_ts": thread_ts, "text": ""},
        "response_url": response_url or f"https://hooks.slack.com/actions/{TEAM_ID}/1/devslack",
        "actions": [{"action_id": action_id, "block_id": "b", "type": "button", "value": value,
                     "action_ts": f"{time.time():.6f}",
                     "text": {"type": "plain_text", "text": action_id}}],
    }
    return urlencode({"payload": json.dumps(payload)})


def event_callback_body(event: dict[str, Any], event_id: str | None = None) -> str:
    """The JSON body of an Events API delivery (``app_mention``, ``message``, …)."""
    return json.dumps({"token": "verification-token", "team_id": TEAM_ID, "api_app_id": APP_ID,
                       "type": "event_callback", "event_id": event_id or f"Ev{uuid.uuid4().hex}",
                       "event_time": int(time.time()), "event": event})


def post_signed(url: str, body: str, signing_secret: str, *, timestamp: int | None = None,
                timeout: float = 10.0) -> tuple[int, str]:
    """POST ``body`` to an app's request URL signed as Slack would; (status, response text).

    A body starting with ``{`` is sent as JSON (events), anything else as a form.
    """
    headers = signed_headers(body, signing_secret, timestamp)
    if body.startswith("{"):
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
