"""Short answers over the generated histories: two to four sentences, the key numbers, the
facts behind a Details view, and the questions of issue 25."""

from analyzers.catalog import CATALOG
from benchmarks.qa import NOW
from bot.qa import ask
from bot.qa.claims import sentences


def test_answers_are_short_and_keep_the_full_facts_for_details(store):
    answer = ask(store, "exp1", "What was the loss at step 400?", now=NOW)
    assert 1 <= len(sentences(answer.text)) <= 4
    assert "Neighbouring" not in answer.text and "Neighbouring" in answer.details
    assert "Details:" in answer.render(verbose=True) and "Details:" not in answer.render()


def test_a_summary_mentions_the_nan(store):
    answer = ask(store, "exp4", "Summarize exp4 in one sentence.", now=NOW)
    assert "NaN at step 1700" in answer.text and "step 1600 of 3000" in answer.text


def test_the_next_step_is_the_first_fix_of_the_worst_open_alert(store):
    answer = ask(store, "exp3", "what should I do about exp3?", now=NOW)
    assert "The worst open alert on exp3 is overfit (warning)" in answer.text
    first_fix = CATALOG["overfit"].fixes[0].text
    assert f"Next step: {first_fix[:40]}" in answer.text
    assert "diminishing_returns" not in answer.text  # info: not the worst
    calm = ask(store, "exp1", "what should I do about exp1?", now=NOW)
    assert "nothing needs doing" in calm.text


def test_which_step_is_it_at_now(store, bench_runs):
    answer = ask(store, "exp2", "Which step is exp2 at now?", now=NOW)
    assert answer.text.startswith(f"exp2 is running at step {bench_runs[1].last} of 3000")


def test_compare_says_what_is_missing_never_the_same(store):
    answer = ask(store, "exp7", "Compare exp7 with exp8", now=NOW)
    assert "exp7 and exp8 record no config" in answer.text
    assert "same config" not in answer.text and "same config" not in answer.details


def test_which_run_is_better_follows_the_metric(store):
    answer = ask(store, "exp1", "which is better on eval loss, exp1 or exp2?", now=NOW)
    assert answer.text.startswith("exp2 has the lower latest eval/loss")


def test_eta_and_its_absence(store):
    assert "should finish in about" in ask(store, "exp1", "when will exp1 finish?",
                                           now=NOW).text
    assert "cannot be estimated" in ask(store, "exp8", "when will exp8 finish?", now=NOW).text


def test_a_question_about_nothing_recorded_says_what_can_be_asked(store):
    answer = ask(store, "exp1", "What's the weather in Paris?", now=NOW)
    assert answer.text.startswith("I can't answer that from the run history.")
    assert "which run is better on a metric" in answer.text
