"""The composition root of the Slack side: build the Bolt app and serve it.

Socket Mode when ``SLACK_APP_TOKEN`` is set (or ``slack.mode = "socket"``), HTTP otherwise.
``SLACK_API_URL`` points the Web API client at another endpoint (a local one in tests).
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid

import waitress
from slack_bolt import App
from slack_sdk import WebClient
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
)

from bot.actions import Actions
from bot.config import ConfigError, Settings
from bot.services.ask import Answerer
from bot.slack.httpgate import SlackGate
from bot.slack.listeners import register_listeners
from bot.slack.listeners.work import Work
from bot.slack.text import SafeWebClient, oncall_mentions, safe_respond
from bot.store import Store


def web_client(settings: Settings) -> WebClient:
    kwargs = {"base_url": settings.secrets.slack_api_url} if settings.secrets.slack_api_url else {}
    client = SafeWebClient(token=settings.secrets.slack_bot_token,
                           allowed=allowed_mentions(settings), **kwargs)
    client.retry_handlers.extend([RateLimitErrorRetryHandler(max_retry_count=2)])
    if not any(isinstance(h, ConnectionErrorRetryHandler) for h in client.retry_handlers):
        client.retry_handlers.append(ConnectionErrorRetryHandler())
    return client


def allowed_mentions(settings: Settings) -> frozenset[str]:
    """The only special mentions runwatch posts: the on-call groups it is configured with."""
    alerting = settings.config.alerting
    return oncall_mentions([alerting.oncall, *(r.oncall for r in alerting.routes)])


def build_app(settings: Settings, store: Store, client: WebClient | None = None,
              actions: Actions | None = None, answerer: Answerer | None = None,
              work: Work | None = None) -> App:
    secrets = settings.secrets
    if not secrets.slack_bot_token:
        raise ConfigError("SLACK_BOT_TOKEN is not set; export it (xoxb-…) or run without Slack")
    if not secrets.slack_signing_secret and not use_socket_mode(settings):
        raise ConfigError("SLACK_SIGNING_SECRET is not set; HTTP mode needs it to verify "
                          "requests (or set SLACK_APP_TOKEN for Socket Mode)")
    app = App(client=client or web_client(settings),
              signing_secret=secrets.slack_signing_secret or "unused-in-socket-mode",
              process_before_response=False)
    allowed = allowed_mentions(settings)

    @app.middleware
    def verified(context, next) -> None:
        """Global middleware runs after Bolt's own, so a request that gets here passed its
        verification (or came over Socket Mode's authenticated connection); `on_error`
        answers only those."""
        context["verified"] = True
        if context.get("respond") is not None:  # replies quote runs, metrics, questions
            context["respond"] = safe_respond(context["respond"], allowed)
        next()

    @app.error
    def on_error(error: Exception, body: dict, logger: logging.Logger, context,
                 respond=None) -> None:
        incident = uuid.uuid4().hex[:8]
        logger.error("incident %s: %r on %s", incident, error,
                     body.get("command") or body.get("type"), exc_info=error)
        # an unverified body's response_url is anyone's URL: never call it
        if respond is not None and context.get("verified"):
            respond(text=f"Something went wrong (incident {incident}); the bot's logs have the "
                         f"details.", response_type="ephemeral")

    register_listeners(app, store, actions or Actions(store, settings.config.actions),
                       settings.config.alerting, answerer or Answerer(store, settings),
                       work or Work())
    return app


def use_socket_mode(settings: Settings) -> bool:
    mode = settings.config.slack.mode
    return mode == "socket" or (mode == "auto" and bool(settings.secrets.slack_app_token))


class HTTPServer:
    """waitress serving the gate, with the `socketserver` methods `bot.serve.Bot` uses:
    `serve_forever` in a thread, `shutdown` from another, then `server_close`.

    waitress speaks HTTP/1.1 with keep-alive, reads requests without holding a thread (a slow
    sender costs a socket, not a worker), hands complete ones to a bounded pool, refuses a
    body over the gate's limit before reading it, and closes connections idle for
    `CHANNEL_TIMEOUT` seconds.
    """

    THREADS = 8  # Bolt acks at once and runs listeners in its own pool; these only verify and ack
    CHANNEL_TIMEOUT = 30
    MAX_HEADERS = 16 * 1024  # Slack sends a dozen short headers

    def __init__(self, gate: SlackGate, host: str, port: int) -> None:
        self.gate = gate
        # bound here so that one address is served (waitress would open one socket per address
        # "localhost" resolves to) and port 0's pick is known
        sock = socket.create_server((host, port))
        self.server_address = sock.getsockname()[:2]
        self._map: dict = {}  # waitress's socket map: its loop runs until this is empty
        self._server = waitress.create_server(
            gate, map=self._map, sockets=[sock], threads=self.THREADS,
            channel_timeout=self.CHANNEL_TIMEOUT, max_request_header_size=self.MAX_HEADERS,
            max_request_body_size=gate.max_body + 1)  # waitress refuses this size and more
        self._lock = threading.Lock()
        self._state = "new"  # -> "serving" -> "stopped", or "new" -> "stopped"
        self._done = threading.Event()

    def serve_forever(self) -> None:
        with self._lock:
            if self._state != "new":
                return
            self._state = "serving"
        try:
            self._server.run()
        finally:
            self._done.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait for it. waitress's loop is not thread-safe, so the
        sockets are closed in its own thread (a trigger runs the closing there)."""
        with self._lock:
            serving, self._state = self._state == "serving", "stopped"
        if serving:
            self._server.trigger.pull_trigger(self._close_sockets)
            self._done.wait()

    def server_close(self) -> None:
        self.shutdown()
        self._close_sockets()  # for a server never served; nothing is left after the loop's
        self._server.task_dispatcher.shutdown(timeout=5)

    def _close_sockets(self) -> None:
        for dispatcher in list(self._map.values()):
            dispatcher.close()


def http_server(app: App, host: str, port: int, path: str = "/slack/events") -> HTTPServer:
    """Bolt's request handler behind the gate (`bot.slack.httpgate`), served by waitress;
    ``server.gate.counts`` says what was refused."""
    from slack_bolt.adapter.wsgi import SlackRequestHandler

    # Bolt keeps the signing secret only there; the gate checks with the same one
    return HTTPServer(SlackGate(SlackRequestHandler(app, path), app._signing_secret, path),
                      host, port)


def socket_mode_handler(app: App, settings: Settings):
    from slack_bolt.adapter.socket_mode import SocketModeHandler

    if not settings.secrets.slack_app_token:
        raise ConfigError("Socket Mode needs SLACK_APP_TOKEN (xapp-…) with connections:write")
    return SocketModeHandler(app, settings.secrets.slack_app_token)
