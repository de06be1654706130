"""Pieces several test modules use: a notifier that records what it was asked to send, a
running bot wired to the local Slack Web API server, and a fake chat model that streams its
reply word by word."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk

from benchmarks.devslack import LocalSlack
from bot.alerting.notify import SendResult
from bot.config import Config, Secrets, Settings
from bot.qa.models import ModelError
from bot.serve import Bot


class Recorder:
    """A transport that records what it was asked to send (the logic under test is upstream):
    ``(kind, text, thread_ts)`` per post."""

    def __init__(self):
        self.sent = []

    def post(self, channel, message, thread_ts=None):
        self.sent.append((message.kind, message.text, thread_ts))
        return SendResult(True, channel=channel, ts=f"1.{len(self.sent)}")


@contextmanager
def running_bot(tmp_path, config: Config, secret: str) -> Iterator[tuple[Bot, LocalSlack]]:
    """The bot, started without its poll loop against a local Slack signed with ``secret``,
    after one poll of its sources."""
    with LocalSlack(signing_secret=secret) as local:
        secrets = Secrets(slack_bot_token="xoxb-t", slack_signing_secret=secret,
                          slack_api_url=local.api_url)
        settings = Settings(config=config, secrets=secrets, config_path=None,
                            db_path=str(tmp_path / "rw.db"))
        with Bot(settings).start(poll=False) as bot:
            bot.engine.poll()
            yield bot, local


def record_reads(analyzer) -> list:
    """Make a text analyzer note each evaluation it reads (its step) in the list returned;
    a watcher's poll should read only evaluations that are new or changed."""
    read = []
    evaluate = analyzer._evaluate
    analyzer._evaluate = lambda step, prompts, outputs: (read.append(step)
                                                         or evaluate(step, prompts, outputs))
    return read


def poll_like_a_full_read(watcher, datas) -> None:
    """Poll ``watcher`` with each of ``datas`` (a growing run) in turn: every poll finds
    what a fresh instance of its class finds reading that data whole."""
    for data in datas:
        assert watcher.detect(data) == type(watcher)().detect(data)


class Replying(FakeListChatModel):
    """A fake chat model whose stream is its ``_call``'s reply in one piece (LangChain's own
    streams its canned replies without calling ``_call``): subclasses override ``_call`` to
    record, fail, wait or load, and the answerer, which reads every reply as a stream, sees
    the same."""

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        reply = self._call(messages, stop, run_manager, **kwargs)
        yield ChatGenerationChunk(message=AIMessageChunk(content=reply))


class WordByWord(FakeListChatModel):
    """Streams its reply a word at a time, as the CPU model does: ``delay`` real seconds a
    word, or ``dt`` seconds of a fake ``clock`` (one with ``advance``); ``fail_at``: the model
    server dies before that word. A ``device_key`` of its own keeps its worker apart."""

    delay: float = 0.0
    clock: Any = None
    dt: float = 0.1
    fail_at: int | None = None
    device_key: str = "word-by-word"

    def _stream(self, messages, stop=None, run_manager=None, **kwargs):
        for n, word in enumerate(self._call(messages).split(" ")):
            if self.clock is not None:
                self.clock.advance(self.dt)
            else:
                time.sleep(self.delay)
            if n == self.fail_at:
                raise ModelError("connection reset by the model server")
            yield ChatGenerationChunk(message=AIMessageChunk(content=word + " "))
