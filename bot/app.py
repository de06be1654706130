"""The composition root of the Slack side: build the Bolt app and serve it.

Socket Mode when ``SLACK_APP_TOKEN`` is set (or ``slack.mode = "socket"``), HTTP otherwise.
``SLACK_API_URL`` points the Web API client at another endpoint (a local one in tests).
"""

from __future__ import annotations

import logging
import uuid
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from slack_bolt import App
from slack_sdk import WebClient
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
)

from bot.actions import Actions
from bot.config import ConfigError, Settings
from bot.listeners import register_listeners
from bot.services.ask import Answerer
from bot.store import Store

log = logging.getLogger("runwatch.slack")


def web_client(settings: Settings) -> WebClient:
    kwargs = {"base_url": settings.secrets.slack_api_url} if settings.secrets.slack_api_url else {}
    client = WebClient(token=settings.secrets.slack_bot_token, **kwargs)
    client.retry_handlers.extend([RateLimitErrorRetryHandler(max_retry_count=2)])
    if not any(isinstance(h, ConnectionErrorRetryHandler) for h in client.retry_handlers):
        client.retry_handlers.append(ConnectionErrorRetryHandler())
    return client


def build_app(settings: Settings, store: Store, client: WebClient | None = None,
              actions: Actions | None = None, answerer: Answerer | None = None) -> App:
    secrets = settings.secrets
    if not secrets.slack_bot_token:
        raise ConfigError("SLACK_BOT_TOKEN is not set; export it (xoxb-…) or run without Slack")
    if not secrets.slack_signing_secret and not use_socket_mode(settings):
        raise ConfigError("SLACK_SIGNING_SECRET is not set; HTTP mode needs it to verify "
                          "requests (or set SLACK_APP_TOKEN for Socket Mode)")
    app = App(client=client or web_client(settings),
              signing_secret=secrets.slack_signing_secret or "unused-in-socket-mode",
              process_before_response=False)

    @app.middleware
    def verified(context, next) -> None:
        """Global middleware runs after Bolt's own, so a request that gets here passed its
        verification (or came over Socket Mode's authenticated connection); `on_error`
        answers only those."""
        context["verified"] = True
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
                       settings.config.alerting, answerer or Answerer(store, settings))
    return app


def use_socket_mode(settings: Settings) -> bool:
    mode = settings.config.slack.mode
    return mode == "socket" or (mode == "auto" and bool(settings.secrets.slack_app_token))


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    # socketserver's default backlog of 5 resets connections when a burst of requests
    # arrives (20 people clicking at once); Slack would then retry or show an error.
    request_queue_size = 128


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        log.debug("http %s", format % args)


def http_server(app: App, host: str, port: int, path: str = "/slack/events") -> WSGIServer:
    """A threaded WSGI server for Bolt's request handler (verification included)."""
    from slack_bolt.adapter.wsgi import SlackRequestHandler

    handler = SlackRequestHandler(app)

    def wsgi(environ, start_response):
        if environ.get("PATH_INFO") != path:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found"]
        return handler(environ, start_response)

    return make_server(host, port, wsgi, server_class=_ThreadingWSGIServer,
                       handler_class=_QuietHandler)


def socket_mode_handler(app: App, settings: Settings):
    from slack_bolt.adapter.socket_mode import SocketModeHandler

    if not settings.secrets.slack_app_token:
        raise ConfigError("Socket Mode needs SLACK_APP_TOKEN (xapp-…) with connections:write")
    return SocketModeHandler(app, settings.secrets.slack_app_token)
