"""A model's answer streamed into one Slack message: the service's checked sentences go to
:class:`bot.slack.stream.StreamedAnswer`, which posts, then paces its ``chat.update``s (one
a second at most, sentences coalesced), and ends with the answer's full view. A fake clock
drives both the fake model's words and the pacing, so nothing here sleeps."""

import heapq
import itertools
from concurrent.futures import Future

from benchmarks.qa import NOW
from bot.alerting.notify import SendResult
from bot.qa import ask
from bot.services.ask import answer_message
from bot.slack.stream import PLACEHOLDER, StreamedAnswer
from bot.views.message import Message
from tests.helpers import WordByWord

GOOD = ["exp1 is running at step 2000 of 3000.", "Its train/loss was 1.995 at step 2000.",
        "Latest eval/loss of exp1 was 2.149 at step 2000.", "No alerts are open on exp1."]
BAD = "It has used 7 GPUs."  # the claim check rejects it: 7 is in no fact


class FakeClock:
    """Time moves only when told; calls due by then run in order, on the caller's thread."""

    def __init__(self):
        self.t = 0.0
        self._due = []
        self._seq = itertools.count()

    def now(self):
        return self.t

    def call_later(self, delay, fn):
        heapq.heappush(self._due, (self.t + max(0.0, delay), next(self._seq), fn))

    def advance(self, dt):
        end = self.t + dt
        while self._due and self._due[0][0] <= end:
            at, _, fn = heapq.heappop(self._due)
            self.t = max(self.t, at)
            fn()
        self.t = end


class Recorder:
    """A Slack stand-in: every post and update, with the fake time it was sent at."""

    def __init__(self, clock):
        self.clock = clock
        self.sent = []

    def post(self, channel, message, thread_ts=None):
        self.sent.append(("post", self.clock.now(), message))
        return SendResult(True, channel=channel, ts="1.1")

    def update(self, channel, ts, message):
        assert ts == "1.1"
        self.sent.append(("update", self.clock.now(), message))
        return SendResult(True, channel=channel, ts=ts)


def streamed(store, question, reply, **model):
    """Ask with a word-by-word fake model; what Slack was sent, and the answer's view."""
    clock = FakeClock()
    slack = Recorder(clock)
    stream = StreamedAnswer(slack, "C1", "9.9", clock, interval=1.0, placeholder_after=1.0)
    stream.started()
    answer = ask(store, "exp1", question, model=WordByWord(responses=[reply], clock=clock,
                                                         **model),
                 now=NOW, on_partial=stream.partial, budget_s=60)
    done = Future()
    done.set_result(answer)
    view = answer_message("exp1", done)
    stream.finish(view)
    clock.advance(5)
    return slack.sent, view, answer


def test_sentences_are_posted_then_redrawn_at_most_once_a_second(store):
    # sentences end at 0.48, 0.9, 1.44 and 1.8 s: the update due at 1.48 s carries two
    sent, view, answer = streamed(store, "How is exp1 doing?", " ".join(GOOD), dt=0.06)
    assert answer.model != "deterministic"
    methods = [m for m, _, _ in sent]
    assert methods[0] == "post" and set(methods[1:]) == {"update"}
    # the first checked sentence is posted the moment it ends, not after a placeholder
    assert sent[0][2].text == GOOD[0] and sent[0][1] < 1.0
    times = [t for _, t, _ in sent]
    assert all(b - a >= 1.0 - 1e-9 for a, b in zip(times, times[1:], strict=False))
    texts = [m.text for _, _, m in sent[:-1]]
    assert all(any(t == " ".join(GOOD[:k]) for k in range(1, 5)) for t in texts)
    assert texts == [GOOD[0], " ".join(GOOD[:3])]  # the second and third went together
    # the last redraw is the answer's view: its text, Sources line and Details button
    final = sent[-1][2]
    assert final is view and final.blocks and "Sources:" in final.text
    assert final.text.startswith(" ".join(GOOD))


def test_a_rejected_sentence_is_never_sent_even_briefly(store):
    reply = " ".join([GOOD[0], GOOD[1], BAD, GOOD[2], GOOD[3]])
    sent, view, answer = streamed(store, "How is exp1 doing?", reply)
    assert all("GPU" not in m.text and "7 " not in m.text for _, _, m in sent)
    texts = [m.text for _, _, m in sent[:-1]]
    assert texts[0] == GOOD[0]
    assert all(any(t == " ".join(GOOD[:k]) for k in range(1, 5)) for t in texts)
    # the stream goes on past the bad sentence, as the finished answer does
    assert texts[-1].startswith(" ".join(GOOD[:3]))
    assert sent[-1][2] is view and view.text.startswith(" ".join(GOOD))


def test_a_header_the_model_copies_is_skipped_not_the_end_of_the_stream(store):
    reply = "The answer to the question is:\n" + " ".join(GOOD)
    sent, view, answer = streamed(store, "How is exp1 doing?", reply, dt=0.05)
    assert answer.model != "deterministic"
    assert sent[0][0] == "post" and sent[0][2].text == GOOD[0] and sent[0][1] < 1.0
    assert all("answer to the question" not in m.text for _, _, m in sent)
    assert any(r.kind == "fragment" for r in answer.attempts[0].violations)


def test_a_second_try_is_streamed_when_the_first_showed_nothing(store):
    clock = FakeClock()
    slack = Recorder(clock)
    stream = StreamedAnswer(slack, "C1", "9.9", clock, interval=1.0, placeholder_after=1.0)
    stream.started()
    first = "What is exp1 doing? It has used 7 GPUs."  # an echo, then a number in no fact
    model = WordByWord(responses=[first, " ".join(GOOD)], clock=clock, dt=0.06)
    answer = ask(store, "exp1", "How is exp1 doing?", model=model, now=NOW,
                 on_partial=stream.partial, budget_s=60)
    assert len(answer.attempts) == 2 and answer.attempts[0].violations
    assert answer.model != "deterministic" and answer.text.startswith(" ".join(GOOD))
    partial = [m.text for _, _, m in slack.sent]
    assert partial[0] == PLACEHOLDER  # the first try gave nothing to show
    assert partial[1:] and all(t.startswith(GOOD[0]) for t in partial[1:])  # streamed
    assert all("GPU" not in t and "?" not in t for t in partial)


def test_a_placeholder_only_when_no_sentence_is_ready(store):
    sent, view, _ = streamed(store, "How is exp1 doing?", " ".join(GOOD), dt=0.3)
    assert sent[0][0] == "post" and sent[0][2].text == PLACEHOLDER and sent[0][1] == 1.0
    assert sent[1][2].text == GOOD[0] and sent[1][1] >= 2.0  # paced after the placeholder
    assert sent[-1][2] is view
    # a fast model: the sentence comes first, so no placeholder at all
    sent, _, _ = streamed(store, "How is exp1 doing?", " ".join(GOOD), dt=0.05)
    assert all(m.text != PLACEHOLDER for _, _, m in sent)


def test_a_fallback_replaces_the_streamed_sentences_with_the_facts_answer(store):
    # checked sentences, but not the answer to the question: the facts' own answer wins
    near = ["The train/loss of exp1 at step 390 was 2.436.", "At step 410 it was 2.425."]
    sent, view, answer = streamed(store, "What was the loss at step 400?", " ".join(near))
    assert answer.model == "deterministic" and answer.fallback
    assert [m.text for _, _, m in sent[:-1]] == [near[0]]  # streamed …
    assert sent[-1][0] == "update" and sent[-1][2] is view  # … and replaced
    assert view.text.startswith("train/loss of exp1 at step 400: 2.43.")


def test_the_model_server_dying_mid_stream_ends_with_the_facts_answer(store):
    sent, view, answer = streamed(store, "How is exp1 doing?", " ".join(GOOD), fail_at=12)
    assert answer.model == "deterministic" and "failed" in answer.fallback
    assert [m.text for _, _, m in sent[:-1]] == [GOOD[0]]  # whole sentences only
    assert sent[-1][2] is view and view.text.startswith("exp1 is running at step 2000")


def test_a_quick_answer_is_one_post(store):
    """No model, or one done before anything was shown: posted once, as before."""
    clock = FakeClock()
    slack = Recorder(clock)
    stream = StreamedAnswer(slack, "C1", "9.9", clock)
    done = Future()
    done.set_result(ask(store, "exp1", "How is exp1 doing?", now=NOW))
    stream.finish(answer_message("exp1", done))
    clock.advance(5)
    assert [m for m, _, _ in slack.sent] == ["post"] and slack.sent[0][2].blocks


def test_a_send_that_raises_does_not_keep_the_answer_unsent():
    clock = FakeClock()

    class Flaky(Recorder):
        def post(self, channel, message, thread_ts=None):
            if message.text == "one.":
                raise ValueError("a bug in the transport")
            return super().post(channel, message, thread_ts)

    slack = Flaky(clock)
    stream = StreamedAnswer(slack, "C1", "9.9", clock)
    stream.partial("one.")
    clock.advance(0)
    stream.finish(Message(text="one. two.\n\nSources: exp1"))
    clock.advance(5)
    assert [(m, msg.text) for m, _, msg in slack.sent] == [("post", "one. two.\n\nSources: exp1")]


def test_the_model_is_stopped_once_the_answer_has_the_sentences_it_posts(store):
    """Four checked sentences are the most an answer posts: the model is not read further
    (a small model goes on copying facts until its time runs out)."""
    more = GOOD + ["Its train/loss was 1.995 at step 2000 again.",
                   "exp1 is running at step 2000 of 3000 still."] * 3
    sent, view, answer = streamed(store, "How is exp1 doing?", " ".join(more))
    assert answer.model != "deterministic"
    assert answer.attempts[0].text == " ".join(GOOD)  # read up to the fourth, no further
    assert view.text.startswith(" ".join(GOOD) + "\n")
