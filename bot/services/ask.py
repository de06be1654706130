"""Answering a question about a run, for Slack, the console and the command line's callers:
which runs the asker may see, the bot's one chat model, and the answer as a message."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from bot.config import Settings
from bot.services.visibility import visible_runs
from bot.store import Store, UnknownRun
from bot.views.actions import refusal_message
from bot.views.message import Message

if TYPE_CHECKING:  # bot.qa loads the model libraries: imported when first asked
    from bot.qa.service import _Done
    from bot.qa.worker import Job

ANSWER_TIMEOUT_S = 120.0  # the console's wait; Slack's questions wait for no one

log = logging.getLogger("runwatch.qa")


class Answerer:
    """One chat model for the bot (None: answers built from the facts alone)."""

    def __init__(self, store: Store, settings: Settings) -> None:
        from bot.qa import warm
        from bot.qa.models import build_chat_model

        self.store = store
        self.settings = settings
        self.model = build_chat_model(settings.config.qa)
        warm(self.model)  # in the background: the first question need not wait for it

    def visible(self, channel: str | None) -> set[str] | None:
        config = self.settings.config
        return visible_runs(self.store, config.alerting, config.slack.channel, channel)

    def answer(self, run: str, question: str, *, channel: str | None,
               alert: str | None = None) -> Message:
        """The answer as a message, waiting for it (the console, the demo); an unknown or
        invisible run is one line."""
        try:
            job = self._submit(run, question, channel, alert)
        except UnknownRun as exc:
            return refusal_message(str(exc))
        job.result(ANSWER_TIMEOUT_S)
        return answer_message(run, job.future)

    def ask(self, run: str, question: str, *, channel: str | None, alert: str | None = None,
            say: Callable[[Message], None], answered: Callable[[Message], None],
            started: Callable[[], None] | None = None,
            partial: Callable[[str], None] | None = None) -> None:
        """Start answering and return at once: Slack's listeners must not wait for a model.

        ``say`` hears at once, on this thread, what is known now: the refusal for a run the
        asker may not see, or how many questions are ahead of this one. ``answered`` gets
        the answer when it is ready, on the model's worker thread: it should hand its Slack
        call to a thread of its own, or the next question waits for it. So should
        ``started`` (the model's turn came) and ``partial`` (the model's checked sentences so
        far, as they pass the claim check), which streaming uses."""
        try:
            job = self._submit(run, question, channel, alert, started=started,
                               partial=partial)
        except UnknownRun as exc:
            say(refusal_message(str(exc)))
            return
        if ahead := job.position():
            say(queued_message(ahead))
        job.future.add_done_callback(lambda done: answered(answer_message(run, done)))

    def details(self, run: str, question: str, *, channel: str | None,
                alert: str | None = None) -> str:
        """Every fact behind an answer (the Details button), read again for the asker."""
        from bot.qa.service import build_facts, full_answer, visibility

        try:
            sheet = build_facts(self.store, run, question,
                                visible=visibility(self.visible(channel)), alert=alert)
        except UnknownRun as exc:
            return str(exc)
        return full_answer(sheet)

    def _submit(self, run: str, question: str, channel: str | None, alert: str | None, *,
                started: Callable[[], None] | None = None,
                partial: Callable[[str], None] | None = None) -> Job | _Done:
        """The question's job on its model's device (reads the facts now: an unknown run
        raises :class:`UnknownRun` here)."""
        from bot.qa import submit

        return submit(self.store, run, question, model=self.model,
                      visible_runs=self.visible(channel), alert=alert, on_start=started,
                      on_partial=partial)


def queued_message(ahead: int) -> Message:
    """Said to a question that waits for the device: the README promises it."""
    return Message(text=f":hourglass_flowing_sand: Queued behind {ahead} question"
                        f"{'s' if ahead > 1 else ''}; the answer follows.", kind="queued")


def answer_message(run: str, done: Future[Any]) -> Message:
    """A finished question's answer as posted; a failure (a bug: model errors fall back to
    the facts' own answer) is one line, logged in full."""
    if (exc := done.exception()) is not None:
        log.error("the question about %s failed: %r", run, exc, exc_info=exc)
        return refusal_message(f"The question about {run} could not be answered "
                               f"({type(exc).__name__}); the bot's logs have the details.")
    from bot.views.answer import answer_blocks

    answer = done.result()
    return Message(text=answer.render(), blocks=answer_blocks(
        answer.text, answer.sources, run=answer.run, question=answer.question,
        alert=answer.alert), kind="answer",
        data={"run": run, "model": answer.model, "fallback": answer.fallback})
