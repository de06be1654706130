"""`runwatch serve`: the bot as a long-running process.

:class:`Bot` wires the store, the engine, the scheduler and one transport together and can
be started and stopped in-process (the tests and the demo do that).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any, TextIO

from rich.console import Console

from bot.actions import ActionRequest, Actions, console_actor
from bot.alerting.notify import SlackNotifier
from bot.commands import ActionContext, handle_run_command
from bot.config import Settings
from bot.console import ConsoleNotifier, render_message
from bot.engine import Engine
from bot.instance import AlreadyRunning, InstanceLock
from bot.scheduler import start_scheduler
from bot.services.ask import Answerer
from bot.services.digest import build_digest, schedule_digest
from bot.slack.app import build_app, http_server, socket_mode_handler, use_socket_mode, web_client
from bot.slack.listeners.work import Work
from bot.store import Store, is_postgres
from bot.views.actions import result_message
from bot.views.digest import digest_message
from bot.views.message import Message

log = logging.getLogger("runwatch.serve")

# SIGTERM to exit: Docker's stop waits 10 s, systemd 90 s; a pass stops between runs
STOP_SECONDS = 4.0
PROMPT_HINT = "type `/run status RUN`, `/run help`, or `quit`"


class Bot:
    def __init__(self, settings: Settings, *, console: Console | None = None) -> None:
        self.settings = settings
        self.console = console or Console()
        # before anything reads a cursor or writes: a second bot on this database is refused
        store = None
        if is_postgres(settings.db_path):
            from bot.pgstore import PgStore

            store = PgStore(settings.db_path)  # StoreUnavailable: one line
            try:
                self.lock: Any = store.serve_lock().acquire()
            except BaseException:
                store.close()
                raise
        else:
            self.lock = InstanceLock(settings.db_path).acquire()
        try:
            self._build(settings, store)
        except BaseException:
            self.lock.release()
            raise

    def _build(self, settings: Settings, store: Any = None) -> None:
        self.store = store if store is not None else Store(settings.db_path)
        self.app = None
        self.server = None
        self.socket_handler = None
        self.scheduler = None
        self._threads: list[threading.Thread] = []
        self.work = Work()  # what Slack listeners hand off once they have acked
        self.actions = Actions(self.store, settings.config.actions)
        self.answerer = Answerer(self.store, settings)
        if settings.secrets.slack_enabled:
            client = web_client(settings)
            self.app = build_app(settings, self.store, client, self.actions, self.answerer,
                                 self.work)
            notifier = SlackNotifier(client)
        else:
            notifier = ConsoleNotifier(self.console)
        self.notifier = notifier
        self.engine = Engine(settings, store=self.store, notifier=notifier)
        self.engine.after_poll.append(self.post_followups)

    def post_digest(self) -> None:
        """The daily digest, to the alert channel."""
        result = self.notifier.post(self.settings.config.slack.channel,
                                    digest_message(build_digest(self.store)))
        if not result.ok:
            log.warning("the daily digest was not posted: %s", result.reason)

    def post_followups(self) -> None:
        """After a rollback: "recovered" or "same position again" in the alert's thread."""
        for req, text in self.actions.followups():
            thread = self.store.alert_thread(req.fingerprint) if req.fingerprint else None
            channel = thread["channel"] if thread else (req.channel or
                                                        self.settings.config.slack.channel)
            self.notifier.post(channel, Message(text=text, kind="action"),
                               thread["ts"] if thread else req.thread_ts)

    @property
    def mode(self) -> str:
        if self.app is None:
            return "console"
        return "socket" if use_socket_mode(self.settings) else "http"

    @property
    def http_port(self) -> int | None:
        return self.server.server_address[1] if self.server else None

    def start(self, *, poll: bool = True) -> Bot:
        if poll:
            self.scheduler = start_scheduler(self.engine)
            if self.settings.config.slack.digest_cron:
                schedule_digest(self.scheduler, self.settings.config.slack.digest_cron,
                                self.post_digest)
        if self.mode == "http":
            slack = self.settings.config.slack
            self.server = http_server(self.app, slack.host, slack.port, slack.path)
            thread = threading.Thread(target=self.server.serve_forever, name="slack-http",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
            log.info("Slack HTTP endpoint on %s:%s%s", slack.host, self.http_port, slack.path)
        elif self.mode == "socket":
            self.socket_handler = socket_mode_handler(self.app, self.settings)
            self.socket_handler.connect()
            log.info("connected to Slack in Socket Mode")
        return self

    def stop(self, timeout: float | None = None) -> bool:
        """Stop polling, serving and sending, then close the store and free the database.

        The engine is asked to stop first: a running poll ends after the run it is on (its
        points and cursor are one transaction). With ``timeout``, the running poll and send
        get that long; if they are still busy (a send waiting on Slack), False is returned
        and the store is left open for the caller to exit the process: every write is a
        transaction and every send is marked before it is made, so the next start resumes
        exactly as after a ``kill -9``, with nothing lost and nothing sent twice.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self.engine.request_stop()
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
            self.scheduler = None
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.socket_handler is not None:
            self.socket_handler.close()
            self.socket_handler = None
        self.work.close()
        if not self.engine.wait_idle(_remaining(deadline)):
            return False
        self.actions.close()
        self.store.close()
        self.lock.release()
        return True

    def __enter__(self) -> Bot:
        return self  # `with Bot(settings).start() as bot:` — start() chooses what runs

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def console_context(actions: Actions, answerer: Answerer | None = None) -> ActionContext:
    """The terminal's actor: the person at the machine; a confirmed request runs at once,
    a question is answered at once (the console sees every run)."""
    def run_confirmed(req: ActionRequest) -> Message:
        return result_message(actions.execute(req.id))

    def ask(run: str, question: str) -> Message:
        return answerer.answer(run, question, channel=None)

    return ActionContext(actions=actions, actor=console_actor(), run_confirmed=run_confirmed,
                         ask=ask if answerer is not None else None)


def console_prompt(store: Store, console: Console, stream: TextIO = sys.stdin,
                   prompt: bool = True, actions: Actions | None = None,
                   answerer: Answerer | None = None) -> None:
    """Answer `/run …` lines typed at the terminal until `quit` or end of input."""
    ctx = console_context(actions, answerer) if actions is not None else None
    while True:
        if prompt:
            console.print("[bold cyan]runwatch>[/] ", end="")
        line = stream.readline()
        if not line:
            return
        line = line.strip()
        if line in ("quit", "exit"):
            return
        if not line:
            continue
        text = line.removeprefix("/run").strip() if line.startswith("/run") else line
        console.print(render_message(handle_run_command(text, store, ctx)))


def serve(settings: Settings) -> int:
    if not settings.config.sources:
        log.warning("no sources configured: add [[sources]] path = \"…\" to %s to watch runs",
                    settings.config_path or "runwatch.toml")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from bot.pgstore import StoreUnavailable

    try:
        bot = Bot(settings)
    except (AlreadyRunning, StoreUnavailable) as exc:
        log.error("%s", exc)
        return 1
    try:
        bot.start()
    except OSError as exc:  # the HTTP port is taken, most often
        slack = settings.config.slack
        log.error("cannot listen on %s:%s (%s); free the port or set slack.port in the config",
                  slack.host, slack.port, exc.strerror or exc)
        bot.stop(timeout=STOP_SECONDS)
        return 1
    try:
        if bot.mode == "console" and sys.stdin.isatty():
            bot.console.print(f"runwatch is watching in console mode; {PROMPT_HINT}")
            console_prompt(bot.store, bot.console, actions=bot.actions, answerer=bot.answerer)
        else:
            log.info("runwatch is running in %s mode; Ctrl-C or SIGTERM stops it", bot.mode)
            while not stop.wait(1.0):
                pass
    except KeyboardInterrupt:
        pass
    finally:
        if not bot.stop(timeout=STOP_SECONDS):
            log.warning("a pass was still running after %gs; exiting now (the next start "
                        "resumes from what was stored, nothing is sent twice)", STOP_SECONDS)
            logging.shutdown()
            os._exit(0)  # the busy thread holds the store: leave as a kill would
    return 0
