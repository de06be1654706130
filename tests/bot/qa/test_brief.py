"""Short answers over the generated histories: two to four sentences, the key numbers, the
facts behind a Details view, and the questions of issue 25."""

from analyzers.catalog import CATALOG
from benchmarks.qa import NOW
from bot.qa import ask
from bot.qa.claims import sentences
from bot.qa.facts import num


def test_answers_are_short_and_keep_the_full_facts_for_details(store):
    answer = ask(store, "exp1", "What was the loss at step 400?", now=NOW)
    assert 1 <= len(sentences(answer.text)) <= 4
    assert "Neighbouring" not in answer.text and "Neighbouring" in answer.details
    assert "Details:" in answer.render(verbose=True) and "Details:" not in answer.render()


def test_a_summary_mentions_the_nan(store):
    answer = ask(store, "exp4", "Summarize exp4 in one sentence.", now=NOW)
    assert "NaN at step 1700" in answer.text and "step 1600 of 3000" in answer.text
    assert "exp4 is on attempt 2" in answer.text  # and the rollback that made it
    assert 'Action rollback on exp4 by "U_ALICE": done' in answer.text


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


# ---- stop 33: the classes the held-out dev half found (phrasings here are not its own) ----
def test_a_decision_about_the_run_is_a_next_step_question(store):
    stop = ask(store, "exp3", "should we stop exp3 or let it go on?", now=NOW)
    assert stop.facts.intent == "next_step"
    assert "The worst open alert on exp3 is overfit" in stop.text
    calm = ask(store, "exp2", "the spike is over, do I need to do anything?", now=NOW)
    assert "No alert is open on exp2, so nothing needs doing now" in calm.text
    assert "spike from step 1500, is resolved" in calm.text


def test_why_a_nan_gives_the_nan_its_candidate_causes_and_what_was_done(store):
    answer = ask(store, "exp4", "how come the loss went nan?", now=NOW)
    assert answer.facts.intent == "why"
    assert "train/loss of exp4 was NaN at step 1700 in attempt 1" in answer.text
    assert "Candidate causes of a NaN or infinite loss" in answer.text
    assert "rollback on exp4" in answer.text and "raised no" not in answer.text
    assert "Attempt 2 of exp4 started at step 1010" in answer.details
    wrong = ask(store, "exp1", "why did exp1 NaN?", now=NOW)  # a false premise
    assert "exp1 logged no NaN or infinite value" in wrong.text


def test_whether_another_run_logged_a_nan_reads_every_visible_run(store):
    answer = ask(store, "exp4", "did any other run go NaN too?", now=NOW)
    assert answer.facts.intent == "similar"
    assert "None of the 8 other visible runs logged a NaN or infinite value" in answer.text
    hidden = ask(store, "exp4", "did any other run go NaN too?", now=NOW,
                 visible_runs=["exp4", "exp1"])
    assert "None of the 1 other visible runs" in hidden.details


def test_rollback_says_when_nothing_calls_for_one_and_checks_the_asked_target(store):
    calm = ask(store, "exp1", "where would we roll exp1 back to?", now=NOW)
    assert calm.text.startswith("No alert is open on exp1, so nothing calls for a rollback")
    late = ask(store, "exp3", "is rolling exp3 back to 1500 safe?", now=NOW)
    assert "exp3 has a checkpoint at step 1500" in late.text
    assert "Step 1500 is not before the onset of the open overfit alert on exp3" in late.text
    assert "The latest checkpoint of exp3 before step 1500" not in late.details
    gone = ask(store, "exp1", "restore exp1 to checkpoint 1250?", now=NOW)
    assert "exp1 has no checkpoint at step 1250; the latest before it is step 1000" in gone.text


def test_better_at_an_asked_step_and_at_the_last_step_both_logged(store):
    at = ask(store, "exp1", "was exp1 or exp2 lower on eval loss at step 1500?", now=NOW)
    one, two = (store.value_at(r, 1, "eval/loss", 1500) for r in ("exp1", "exp2"))
    (win, lo), (lose, hi) = sorted((("exp1", one), ("exp2", two)), key=lambda p: p[1])
    assert at.text.startswith(f"{win} has the lower eval/loss at step 1500: {num(lo)}, against "
                              f"{num(hi)} for {lose}.")
    later = ask(store, "exp1", "which is better on eval loss, exp1 or exp2?", now=NOW)
    assert "At step 2000, the latest step both logged, " in later.details


def test_throughput_slang_compares_throughput_higher_is_better(store):
    answer = ask(store, "exp5", "tput exp5 vs exp1?", now=NOW)
    assert "exp1 has the higher latest throughput" in answer.text
    assert "train/loss" not in answer.text


def test_a_latest_value_of_one_run_is_not_a_comparison(store):
    answer = ask(store, "exp6", "current lr on exp6?", now=NOW)
    assert answer.facts.intent == "value"
    assert answer.text.startswith("Latest lr of exp6:")
    old = ask(store, "old1", "which eval loss did old1 finish with, the final one?", now=NOW)
    assert "names no second run" not in old.text and "Latest eval/loss of old1" in old.text


def test_a_run_named_as_the_reference_is_not_the_subject(store):
    answer = ask(store, "exp3", "what did we change relative to exp1?", now=NOW)
    assert answer.facts.run == "exp3"
    assert "config.epochs: 8 in exp3, 3 in exp1" in answer.details
    setup = ask(store, "exp7", "what data version does exp7 use compared with exp1?", now=NOW)
    assert setup.text.startswith("Missing, so not compared: exp7 records no config; exp7 "
                                 "records no data version")


def test_seen_before_names_the_alert_it_compared(store):
    answer = ask(store, "exp3", "have we hit overfitting before?", now=NOW)
    assert answer.facts.intent == "similar"
    assert "earlier alert(s) on visible runs is like overfit on exp3 from step 1300" in \
        answer.text
    assert "diminishing_returns" not in answer.text


def test_why_at_a_step_checks_the_value_there(store):
    answer = ask(store, "exp1", "do you know why exp1's loss jumped at step 1500?", now=NOW)
    assert answer.facts.intent == "why"
    assert "runwatch has raised no alert on exp1" in answer.text
    assert "train/loss of exp1 at step 1500: 2.044" in answer.text


# ---- stop 33: classes a second dev set (set c, written outside the project) found --------
def test_several_steps_and_two_windows_are_each_answered(store):
    steps = ask(store, "exp6", "lr of exp6 @1990 and @2010?", now=NOW)
    assert "lr of exp6 at step 1990: " in steps.text and "lr of exp6 at step 2010: " in \
        steps.text
    windows = ask(store, "exp1", "mean eval loss over 1000-1500 vs 1500-2000?", now=NOW)
    assert "The mean eval/loss of exp1 between steps 1500 and 2000 (" in windows.text
    assert ") is lower (" in windows.text and "than between steps 1000 and 1500 (" in \
        windows.text


def test_how_one_run_is_set_up_or_that_it_records_nothing(store):
    v2 = ask(store, "exp3", "which data version is exp3 trained on?", now=NOW)
    assert 'The data version of exp3: "v2".' in v2.text
    none = ask(store, "exp7", "is this one on the new data?", now=NOW)
    assert none.text.startswith("exp7 records no config, no data version, no environment.")
    diff = ask(store, "exp2", "is the config any different from the baseline?", now=NOW)
    assert "config.lr: 0.0006 in exp2, 0.0003 in exp1" in diff.text  # a diff, not a listing
    assert "The config of exp2" not in diff.text


def test_a_step_named_by_its_event(store):
    spike = ask(store, "exp2", "grad norm at the spike?", now=NOW)
    assert "grad_norm of exp2 at step 1500: 48" in spike.text
    before = ask(store, "exp4", "what was the loss just before the nan?", now=NOW)
    assert "train/loss of exp4 at step 1690: " in before.text
    ckpt = ask(store, "exp4", "last good checkpoint before the nan?", now=NOW)
    assert ("The latest checkpoint of exp4 before step 1700 (the first NaN or infinite value) "
            "is step 1500") in ckpt.text


def test_which_attempt_and_a_move_at_a_step(store):
    attempt = ask(store, "exp4", "which attempt is exp4 on?", now=NOW)
    assert "exp4 is on attempt 2" in attempt.text
    jump = ask(store, "exp6", "why did the lr jump at 2k?", now=NOW)
    assert "Around step 2000, lr of exp6 went from 0.000168 to 0.000489" in jump.text


def test_a_rollback_target_a_few_words_away_and_a_run_not_there_yet(store):
    answer = ask(store, "exp4", "I'd like to roll this run back to step 1250", now=NOW)
    assert "exp4 has no checkpoint at step 1250; the latest before it is step 1000" in \
        answer.text
    far = ask(store, "exp1", "exp1 vs exp6 lr at step 2500", now=NOW)
    assert "exp1 has not reached step 2500: its latest lr is at step 2000" in far.text
    assert "near step 2500" not in far.details


def test_quoted_words_do_not_route_the_question(store):
    answer = ask(store, "exp1", "loss at step 400? then reply 'no action needed'", now=NOW)
    assert answer.facts.intent == "value" and "train/loss of exp1 at step 400" in answer.text


def test_what_changed_between_attempts_leads_with_the_attempts_and_the_rollback(store):
    answer = ask(store, "exp4", "what's different in the retry?", now=NOW)
    assert answer.text.startswith("Attempt 2 of exp4 started at step 1010 after attempt 1 had "
                                  "reached step 1800.")
    assert '"to checkpoint-1000, skip 10 batches, lr x0.67"' in answer.text


def test_before_and_after_a_step_is_the_move_there(store):
    answer = ask(store, "exp5", "throughput pre/post step 1000?", now=NOW)
    assert "Around step 1000, throughput of exp5 went from 51985 to 23384 (-55.0%" in \
        answer.text


def test_is_it_fixed_reads_the_alert_state(store):
    fixed = ask(store, "exp2", "so is that spike thing resolved?", now=NOW)
    assert fixed.facts.intent == "next_step" and "is resolved" in fixed.text
    still = ask(store, "exp5", "is the slowdown fixed yet?", now=NOW)
    assert "The worst open alert on exp5 is throughput_drop" in still.text


def test_lowest_asked_as_which_step_and_a_summary_with_its_finish(store):
    low = ask(store, "exp3", "at which step was eval loss smallest?", now=NOW)
    assert "The lowest eval/loss of exp3 is 2.244, at step 1200." in low.text
    summary = ask(store, "exp1", "summary of exp1", now=NOW)
    assert "exp1 should finish in about" in summary.text


def test_whether_a_later_attempt_had_a_nan_too(store):
    answer = ask(store, "exp4", "did the nan happen again after the retry?", now=NOW)
    assert "Attempt 2 of exp4 (steps 1010 to 1600) logged no NaN or infinite value." in \
        answer.text


# ---- stop 33: classes set b found once it was measured and read (phrasings here are new) ----
def test_an_all_clear_says_what_moved_with_no_alert(store):
    """exp6's lr tripled at step 2000 and nothing alerted: "no alert is open" alone reads as
    all clear."""
    answer = ask(store, "exp6", "is it ok to just let exp6 keep going?", now=NOW)
    assert "No alert is open on exp6" in answer.text
    assert "No alert covers it, but around step 2000 lr of exp6 went from 0.000168 to " \
           "0.000489" in answer.text
    calm = ask(store, "exp1", "any reason to worry about exp1?", now=NOW)
    assert calm.text == "No alert is open on exp1, so nothing needs doing now."


def test_a_question_about_a_past_rollback_reads_the_audit(store):
    done = ask(store, "exp4", "who rolled it back, and to where?", now=NOW)
    assert 'Action rollback on exp4 by "U_ALICE": done' in done.text
    never = ask(store, "exp5", "we rolled exp5 back last night right?", now=NOW)
    assert "No rollback or stop was recorded for exp5." in never.text


def test_the_runs_ranked_on_a_metric(store):
    answer = ask(store, "exp1", "which of our runs has the lowest eval loss?", now=NOW)
    assert answer.facts.intent == "rank"
    best = sorted((min(v for _, v in store.series(r, store.run(r)["attempt"], "eval/loss")
                       if v == v), r) for r in store.run_names()
                  if store.series(r, store.run(r)["attempt"], "eval/loss"))
    assert answer.text.startswith(f"Ranked by the lowest eval/loss each reached, of 9 visible "
                                  f"runs: {best[0][1]} {num(best[0][0])}")


def test_what_no_log_records_is_said_to_be_missing(store):
    answer = ask(store, "exp1", "how much did exp1 cost?", now=NOW)
    assert answer.text.startswith("The run history does not show this: no metric exp1 logs "
                                  "records cost.")
    share = ask(store, "exp8", "what % done is exp8?", now=NOW)
    assert "exp8 records no total step count" in share.text


def test_the_last_n_steps_and_an_open_alert_on_the_asked_metric(store):
    window = ask(store, "exp7", "loss over the last 500 steps?", now=NOW)
    assert "train/loss of exp7 over the last 500 steps (from step 1000)" in window.text
    fine = ask(store, "exp5", "throughput ok now?", now=NOW)
    assert "Alert throughput_drop on exp5 (warning, firing)" in fine.text
    where = ask(store, "exp1", "where's this one at", now=NOW)
    assert where.facts.intent == "where"


def test_decisions_phrased_as_letting_it_finish_or_keeping_it_running(store):
    for question in ("is it fine to let it finish?", "keep it running or restart it?"):
        assert ask(store, "exp5", question, now=NOW).facts.intent == "next_step", question


def test_a_rollback_target_at_or_after_an_unalerted_move_is_flagged(store):
    answer = ask(store, "exp6", "can we go back to checkpoint 2000, or is that after the lr "
                                "thing?", now=NOW)
    assert "Step 2000 is not before the move at step 2000 that no alert covers" in answer.text
    past = ask(store, "exp4", "was rolling it back to 1000 a good idea?", now=NOW)
    assert past.text.startswith('Action rollback on exp4 by "U_ALICE": done')


def test_a_move_asked_about_without_a_step_is_found_or_said_absent(store):
    jump = ask(store, "exp6", "what did the lr do when it jumped?", now=NOW)
    assert "Around step 2000 lr of exp6 went from 0.000168 to 0.000489" in jump.text
    none = ask(store, "exp1", "what was exp1's lr after it doubled?", now=NOW)
    assert "lr of exp1 moved by less than 50% at every step after its first tenth" in none.text


def test_seen_anywhere_else_is_a_question_about_other_runs(store):
    answer = ask(store, "exp5", "have you seen a slowdown like this anywhere else?", now=NOW)
    assert answer.facts.intent == "similar"
    assert "earlier alert(s) on visible runs is like throughput_drop on exp5" in answer.text


def test_a_loss_still_falling_by_under_one_percent_is_falling_slowly_not_flat(store):
    answer = ask(store, "exp3", "train loss trend?", now=NOW)
    assert "train/loss of exp3 is falling slowly from step 2410 to step 3000" in answer.text
