"""ask() over a real store: facts, sources, the grounding loop with a fake chat model."""

import logging
import threading
import time

import pytest

from benchmarks.qa import NOW
from bot.qa import ask, deterministic_answer, submit, warm
from bot.qa.grounding import check
from bot.qa.models import ModelError
from bot.qa.service import tidy
from bot.qa.worker import DeviceWorker
from bot.store import UnknownRun
from tests.helpers import Replying


class Scripted(Replying):
    """Queued replies; records the prompts it was given."""

    seen: list = []

    def _call(self, messages, stop=None, run_manager=None, **kwargs):
        self.seen.append(messages)
        return super()._call(messages, stop, run_manager, **kwargs)


class Failing(Replying):
    def _call(self, *args, **kwargs):
        raise ModelError("connection refused")


RUNNING = "exp1 is running at step 2000 of 3000."  # what the store says, phrased


def scripted(*replies):
    return Scripted(responses=list(replies), seen=[])


def test_value_question_lists_facts_and_sources(store, bench_runs):
    exp1 = bench_runs[0]
    answer = ask(store, "exp1", "What was the loss at step 400?", now=NOW)
    assert f"{exp1.series['train/loss'][400]:.4g}" in answer.text
    assert answer.model == "deterministic" and answer.sources[0] == "exp1 step 400"
    assert "Sources: exp1 step 400" in answer.render()


def test_grounded_model_answer_is_used(store, bench_runs):
    value = f"{bench_runs[0].series['train/loss'][400]:.4g}"
    model = scripted(f"The loss at step 400 was {value}.")
    answer = ask(store, "exp1", "What was the loss at step 400?", model=model, now=NOW)
    assert answer.text == f"The loss at step 400 was {value}."
    assert answer.model != "deterministic" and answer.fallback is None
    prompt = model.seen[0][-1].content
    assert "FACTS about run exp1" in prompt and value in prompt


def test_ungrounded_answer_is_regenerated_once_with_the_violations_named(store, bench_runs):
    value = f"{bench_runs[0].series['train/loss'][400]:.4g}"
    model = scripted("The loss at step 400 was 7.77.", f"It was {value} at step 400.")
    answer = ask(store, "exp1", "What was the loss at step 400?", model=model, now=NOW)
    assert answer.text == f"It was {value} at step 400."
    assert [bool(a.violations) for a in answer.attempts] == [True, False]
    assert "the number 7.77 is not in the facts" in model.seen[1][-1].content


def test_twice_ungrounded_falls_back_to_the_deterministic_answer(store):
    model = scripted("It was 7.77.", "It was 8.88 at step 12345.")
    answer = ask(store, "exp1", "What was the loss at step 400?", model=model, now=NOW)
    assert answer.model == "deterministic" and "claim check" in answer.fallback
    assert answer.text == deterministic_answer(answer.facts)
    assert "7.77" not in answer.text and "8.88" not in answer.text


def test_a_failing_model_falls_back(store):
    answer = ask(store, "exp1", "How is exp1 doing?", model=Failing(responses=["x"]), now=NOW)
    assert answer.model == "deterministic" and "connection refused" in answer.fallback


def test_deterministic_answers_are_grounded_for_every_kind(store):
    for run, question in [("exp2", "Why did exp2 alert?"), ("exp3", "Where should we roll back?"),
                          ("exp6", "What changed at step 2000?"), ("exp2", "Compare with exp1"),
                          ("exp2", "Have we seen this before?"), ("exp1", "How is it doing?"),
                          ("exp4", "What is the loss after the rollback?")]:
        answer = ask(store, run, question, now=NOW)
        assert check(answer.text, answer.facts, all_runs=store.run_names()) == [], question


def test_what_the_facts_do_not_cover_is_said(store):
    answer = ask(store, "exp1", "What was the reward at step 500?", now=NOW)
    assert "does not show" in answer.text and "no reward" in answer.text
    assert not answer.covered
    answer = ask(store, "exp1", "Where should we roll back?", now=NOW)
    assert "checkpoint" in answer.text.lower()


def test_similar_incidents_find_the_same_trouble_on_another_run(store):
    answer = ask(store, "exp2", "Have we seen this before?", now=NOW)
    assert "Similar past incident: spike on old1" in answer.text
    assert any(s.startswith("old1 step 800 alert") for s in answer.sources)


def test_unknown_run_raises_with_known_runs(store):
    with pytest.raises(UnknownRun, match="known runs: exp1"):
        ask(store, "nope", "how is it?", now=NOW)


def test_tidy_drops_scaffolding_and_loops():
    text = "FACTS:\n- a is 1. [source: x]\n- a is 1. [source: x]\n- b is 2 and"
    assert tidy(text) == "a is 1.\nb is 2 and"  # the cut-off end is the claim check's
    assert tidy("- a is 1.\n- b is 2.") == "a is 1.\nb is 2."


def test_generations_queue_one_per_device_with_positions():
    worker = DeviceWorker("test-device")
    gate = threading.Event()
    first = worker.submit(gate.wait)
    second = worker.submit(lambda: "second")
    third = worker.submit(lambda: "third")
    deadline = time.time() + 5
    while first.position() != 0 or worker.busy() != 3:
        assert time.time() < deadline
        time.sleep(0.01)
    assert (second.position(), third.position()) == (1, 2)
    gate.set()
    assert third.result(5) == "third" and second.result(5) == "second"
    assert third.position() == 0


def test_submit_returns_a_job_off_the_callers_thread(store):
    model = scripted(RUNNING)
    threads = []
    model_call = model._call

    def record(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return model_call(*args, **kwargs)

    object.__setattr__(model, "_call", record)
    job = submit(store, "exp1", "How is exp1 doing?", model=model, now=NOW)
    assert job.result(10).text == RUNNING
    assert threads and threads[0].startswith("runwatch-llm-")


def test_partial_text_never_shows_an_ungrounded_sentence(store, bench_runs):
    value = f"{bench_runs[0].series['train/loss'][400]:.4g}"
    shown = []
    model = scripted(f"The loss at step 400 was {value}. It then fell to 0.123. Done.")
    ask(store, "exp1", "What was the loss at step 400?", model=model, now=NOW,
        on_partial=shown.append)
    assert shown and all("0.123" not in s for s in shown)
    assert shown[-1] == f"The loss at step 400 was {value}."


def test_runs_named_in_a_mention_are_the_visible_ones(store):
    from bot.qa import runs_named

    assert runs_named(store, "<@U1> is exp3 overfitting? compare with exp1") == ["exp3", "exp1"]
    assert runs_named(store, "is exp3 overfitting?", visible_runs={"exp1"}) == []


def test_what_changed_since_a_time(store):
    answer = ask(store, "exp6", "What changed in the last 2 hours?", now=NOW)
    assert "the biggest move of lr of exp6 was at step 2000" in answer.text
    assert "baseline" not in answer.text


def test_a_model_answer_that_skips_what_is_missing_gets_it_appended(store):
    model = scripted("The run exp1 is fine.")
    answer = ask(store, "exp1", "What was the reward at step 500?", model=model, now=NOW)
    assert answer.text.startswith("The run exp1 is fine. The run history does not show this:")
    assert "no reward" in answer.text


def test_a_model_answer_that_states_what_is_missing_does_not_get_it_again(store):
    model = scripted("exp1 has no reward points.")  # bench run F: said twice, word for word
    answer = ask(store, "exp1", "What was the reward at step 500?", model=model, now=NOW)
    assert answer.text == "exp1 has no reward points."
    assert answer.model != "deterministic"


def test_alert_summaries_are_checked_too(store):
    import json

    from bot.qa import summarize_alert

    finding = json.loads(store.findings(run="exp2")[0]["data"])
    good = "train/loss jumped to 9.50 at step 1500; roll back to the last checkpoint first."
    assert summarize_alert(finding, scripted(good)) == good
    assert summarize_alert(finding, scripted("Loss hit 99 at step 7.")) == finding["summary"]
    assert summarize_alert(finding) == finding["summary"]


class Slow(Replying):
    """Replies after ``delay`` seconds, as a model stopped by its time limit would."""

    delay: float = 0.0

    def _call(self, *args, **kwargs):
        time.sleep(self.delay)
        return super()._call(*args, **kwargs)


def test_a_reply_cut_off_by_the_time_limit_before_a_sentence_ended_is_not_posted(store):
    """Under load the demo's model posted "FAC" (the start of a header it copies): the
    generation had run out of time, and a fragment without numbers passed every check."""
    model = Slow(responses=["FAC", "FAC"], delay=0.3)
    answer = ask(store, "exp1", "How is exp1 doing?", model=model, now=NOW, budget_s=0.3)
    assert answer.model == "deterministic" and "FAC" not in answer.text
    assert "cut" in [v.kind for v in answer.attempts[0].violations]
    # The same reply in good time is still a fragment: the claim check drops it.
    quick = ask(store, "exp1", "How is exp1 doing?", model=Slow(responses=["FAC"] * 2),
                now=NOW)
    assert quick.model == "deterministic" and "FAC" not in quick.text
    assert [v.kind for v in quick.attempts[0].violations] == ["fragment"]


class LazyLoading(Replying):
    """Loads its weights on first use, as the transformers backend does: ``load_s`` seconds."""

    load_s: float = 0.0
    loads: int = 0
    broken: bool = False

    def load(self):
        if self.broken:
            raise ModelError("no weights at /models/missing")
        if not self.loads:
            time.sleep(self.load_s)
        self.loads += 1

    def _call(self, *args, **kwargs):
        self.load()
        return super()._call(*args, **kwargs)


def test_loading_the_model_is_not_counted_against_the_answers_time(store):
    """The demo's first question loaded SmolLM2 inside its 9 s: the reply, whole and in
    good time once loaded, was judged cut off by the time limit and never posted."""
    model = LazyLoading(responses=[RUNNING], load_s=0.5)
    answer = ask(store, "exp1", "How is exp1 doing?", model=model, now=NOW, budget_s=0.3)
    assert answer.fallback is None and answer.text == RUNNING
    assert [a.violations for a in answer.attempts] == [[]]


def test_a_model_that_fails_to_load_falls_back_and_says_why(store):
    model = LazyLoading(responses=["FAC"], broken=True)
    answer = ask(store, "exp1", "How is exp1 doing?", model=model, now=NOW)
    assert answer.model == "deterministic" and answer.attempts == []
    assert answer.fallback == "the model failed to load (no weights at /models/missing)"


def test_warm_loads_the_model_on_its_worker_before_any_question():
    model = LazyLoading(responses=["FAC"])
    warm(model).result(5)
    assert model.loads == 1
    assert warm(None) is None and warm(scripted("x")) is None  # nothing to load


def test_a_model_that_fails_to_load_at_start_is_said_then(caplog):
    with caplog.at_level(logging.WARNING, logger="runwatch.qa"):
        job = warm(LazyLoading(responses=["FAC"], broken=True))
        with pytest.raises(ModelError):
            job.result(5)
        deadline = time.monotonic() + 5  # the callback runs on the worker, after the result
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
    assert [r.getMessage() for r in caplog.records] == [
        "could not load fake-list-chat-model (no weights at /models/missing): answers come "
        "from the facts alone until it loads"]


def test_a_model_compare_that_leaves_out_a_missing_config_gets_it_said(store):
    model = scripted("At step 1500, the latest step both logged, exp7 has the lower train/loss:"
                     " 2.04, against 2.055 for exp8. exp8 has the lower latest train/loss, 2.024"
                     " at step 1700, against 2.04 at step 1500 for exp7.")
    answer = ask(store, "exp7", "Compare exp7 with exp8", model=model, now=NOW)
    assert answer.model != "deterministic"
    assert "exp7 and exp8 record no config" in answer.text


def test_a_model_compare_on_the_latest_values_alone_is_replaced_when_it_misleads(store):
    """Bench run F, F315: "exp8 has the lower latest train/loss: 2.024 at step 1700, against
    2.04 at step 1500 for exp7" — true, but at step 1500, the last step both logged, exp7 is
    lower: the fair comparison leads, and a model answer without it is not posted."""
    reply = "exp8 has the lower latest train/loss, 2.024 at step 1700, against 2.04 for exp7."
    answer = ask(store, "exp7", "Compare exp7 with exp8", model=scripted(reply, reply), now=NOW)
    assert answer.model == "deterministic"
    assert answer.text.startswith("At step 1500, the latest step both logged, exp7 has the lower "
                                  "train/loss")
    assert "eval/loss" in answer.text  # both losses, not the train loss alone


def test_a_model_status_that_drops_the_open_alerts_is_replaced(store):
    """Bench run F, F38: "status of exp3" answered with the step alone; two alerts are open."""
    reply = "exp3 is running at step 3000 of 4000 (75% done)."
    answer = ask(store, "exp3", "status of exp3", model=scripted(reply, reply), now=NOW)
    assert answer.model == "deterministic" and "overfit" in answer.text
    named = reply + " The open alerts on exp3 are diminishing_returns and overfit."
    answer = ask(store, "exp3", "status of exp3", model=scripted(named), now=NOW)
    assert answer.model != "deterministic" and answer.text == named


def test_an_answer_that_leaves_out_the_other_run_its_direct_fact_names_is_replaced(store):
    """"Have we seen this before?" — SmolLM2 wrote "The previous incident was a spike on
    step 800, resolved at step 850.": true of old1, but old1 was never named."""
    question = "Have we seen this before?"
    reply = "The previous incident was a spike on step 800, resolved at step 850."
    answer = ask(store, "exp2", question, model=scripted(reply, reply), now=NOW)
    assert answer.model == "deterministic" and "old1" in answer.text
    # (its steps, said of no run, are read as exp2's, which has no step 800: a tie too)
    assert answer.attempts[0].violations
    from bot.qa.service import _missing_direct
    assert _missing_direct(reply, answer.facts) == ["old1"]
    named = "The previous incident was a spike on old1 at step 800, resolved at step 850."
    assert ask(store, "exp2", question, model=scripted(named), now=NOW).text == named


def test_a_diff_that_does_not_say_which_setting_differs_is_replaced(store):
    """Held-out H22, "diff vs baseline config?" — SmolLM2 wrote "1 setting(s) differ between
    exp5 and exp1. 1 setting(s) is not the baseline.": true count, meaningless rest, and the
    setting itself (num_workers) never named."""
    question = "diff vs baseline config?"
    reply = "1 setting(s) differ between exp5 and exp1. 1 setting(s) is not the baseline."
    answer = ask(store, "exp5", question, model=scripted(reply, reply), now=NOW)
    assert answer.model == "deterministic"
    assert "config.num_workers: 2 in exp5, null in exp1" in answer.text
    named = "The setting config.num_workers is 2 in exp5 and null in exp1."
    kept = ask(store, "exp5", question, model=scripted(named), now=NOW)
    assert kept.model != "deterministic" and kept.text.startswith(named)


@pytest.mark.parametrize("run, question, reply, needed", [
    # held-out dev H16: the NaN, but not what caused it
    ("exp4", "what caused the NaN", "Train/loss of exp4 was NaN at step 1700 in attempt 1.",
     "Candidate causes of a NaN or infinite loss"),
    # H28: that nothing calls for a rollback, but not where one would go
    ("exp6", "if I roll back, which checkpoint should I go to?",
     "No alert is open on exp6, so nothing calls for a rollback now.", "Checkpoints of exp6"),
    # H12: the spike resolved, but not that nothing needs doing
    ("exp2", "spike seems gone. do i need to do anything?",
     "The latest spike from step 1500 has been resolved.", "nothing needs doing"),
    # set c, C21: a summary that is only the progress line
    ("exp3", "plain English summary of this run?",
     "exp3 is running at step 3000 of 4000 (75% done).", "runwatch raised 2 alerts on exp3"),
    # set c, C52: no alert, and not what moved at the step
    ("exp6", "why did lr jump at 2k??", "Runwatch has raised no alert on exp6.",
     "Around step 2000, lr of exp6 went from"),
])
def test_an_answer_without_the_rest_of_the_direct_answer_is_replaced(store, run, question,
                                                                     reply, needed):
    answer = ask(store, run, question, model=scripted(reply, reply), now=NOW)
    assert answer.model == "deterministic" and needed in answer.text


def test_a_rollback_answer_keeps_the_warning_about_its_target(store):
    """Set b, B26: the model kept "exp6 has a checkpoint at step 2000" and dropped that step
    2000 is not before the lr move no alert covers."""
    question = "safe to roll back to the step 2000 checkpoint or is that past the lr bug?"
    reply = ("No alert is open on exp6, so nothing calls for a rollback now. exp6 has a "
             "checkpoint at step 2000.")
    answer = ask(store, "exp6", question, model=scripted(reply, reply), now=NOW)
    assert answer.model == "deterministic"
    assert "Step 2000 is not before the move at step 2000" in answer.text


def test_asked_for_the_checkpoints_an_answer_keeps_their_list(store):
    """Bench run E: "list the checkpoints" on exp2 — the model gave the recommended target
    and left the list (and the latest, 2000) out."""
    reply = ("No alert is open on exp2, so nothing calls for a rollback now. Recommended "
             "rollback for the spike alert on exp2: the checkpoint at step 1000.")
    answer = ask(store, "exp2", "list the checkpoints", model=scripted(reply, reply), now=NOW)
    assert answer.model == "deterministic" and "steps 500, 1000, 1500, 2000" in answer.text


def test_a_model_answer_on_two_attempts_keeps_their_comparison_and_what_was_done(store):
    """Set i, I24: "compare attempt 1 vs attempt 2 at the same steps" answered only with when
    attempt 2 started; and the action's id ("action id 1") is not what it did."""
    question = "compare attempt 1 vs attempt 2 at the same steps pls"
    bare = "Attempt 2 of exp4 started at step 1010 after attempt 1 had reached step 1800."
    answer = ask(store, "exp4", question, model=scripted(bare, bare), now=NOW)
    assert answer.model == "deterministic"
    assert "At step 1600, the latest step both attempts of exp4 logged" in answer.text
    full = (bare + " At step 1600, the latest step both attempts of exp4 logged, train/loss was "
            "2.026 in attempt 2 against 2.031 in attempt 1. U_ALICE rolled it back to "
            "checkpoint-1000 with the lr x0.67.")
    answer = ask(store, "exp4", question, model=scripted(full), now=NOW)
    assert answer.model != "deterministic", answer.attempts
