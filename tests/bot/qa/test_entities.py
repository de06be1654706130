from datetime import datetime, timedelta

from bot.qa.entities import extract

NOW = datetime(2025, 6, 15, 14, 30).timestamp()
RUNS = ["exp1", "exp2", "exp10", "baseline-a"]


def ents(question, **kw):
    return extract(question, known_runs=kw.pop("runs", RUNS), tags=kw.pop("tags", None),
                   now=NOW, **kw)


def test_steps_in_their_usual_spellings():
    assert ents("what was the loss at step 2000?").steps == [2000]
    assert ents("loss at 2k").steps == [2000]
    assert ents("eval loss at step 2,500").steps == [2500]
    assert ents("what happened around 1.5k").steps == [1500]


def test_step_ranges():
    assert ents("loss between 1500 and 1800").step_range == (1500, 1800)
    assert ents("from step 1800 to 1500").step_range == (1500, 1800)
    assert ents("steps 1500-1800").step_range == (1500, 1800)
    assert ents("what changed after step 3000").step_range == (3000, None)
    assert ents("lowest loss before 1k").step_range == (None, 1000)


def test_run_names_are_not_steps_and_only_known_runs_count():
    e = ents("compare exp10 with exp2 and exp7")
    assert e.runs == ["exp10", "exp2"]
    assert e.steps == []
    assert "compare" in e.kinds
    assert ents("how is exp1 doing", runs=["exp2"]).runs == []


def test_metrics_by_alias_and_plain_words():
    assert ents("what was the validation loss at 2k").metrics == ["eval/loss"]
    assert ents("learning rate and grad norm?").metrics == ["lr", "grad_norm"]
    assert ents("val_loss trend").metrics == ["eval/loss"]
    assert ents("accuracy at step 100", tags=["eval/general/accuracy"]).metrics == [
        "eval/general/accuracy"]


def test_times():
    assert ents("how has the loss moved in the last 2 hours").since == NOW - 7200
    assert ents("loss over the past 30 minutes").since == NOW - 1800
    assert ents("loss in the last 30 min").kinds == ["trend"]
    yesterday = (datetime(2025, 6, 15) - timedelta(days=1)).timestamp()
    e = ents("what changed since yesterday")
    assert e.since == yesterday and e.until is None and e.steps == []
    assert ents("alerts yesterday").until == datetime(2025, 6, 15).timestamp()


def test_after_the_rollback():
    e = ents("what is the loss after the rollback?")
    assert e.after_rollback and e.metrics == ["train/loss"] and "trend" in e.kinds


def test_kinds():
    assert ents("How is exp1 doing?").kinds == ["status"]
    assert ents("Is exp3 overfitting, and where should we roll back?").kinds == ["why",
                                                                                "rollback"]
    assert ents("What changed at step 2000?").kinds == ["changed"]
    assert "similar" in ents("Have we seen this before?").kinds
    assert ents("What is the lowest eval loss and where?").kinds == ["min"]
    assert ents("what's the weather in Paris?").matched is False


def test_every_signal_has_its_causes_and_the_new_ones_are_named():
    """A signal added without causes answered "why?" with nothing (divergence and
    reward_collapse arrived so)."""
    from analyzers import REGISTRY
    from bot.qa.entities import extract
    from bot.qa.retrieve import CAUSES

    assert set(REGISTRY) <= set(CAUSES)
    assert "divergence" in extract("is exp1 diverging?", known_runs=["exp1"], now=0.0).signals
    assert "reward_collapse" in extract("was there a reward collapse in exp1?", known_runs=["exp1"],
                                              now=0.0).signals


def test_where_a_rollback_goes_is_not_where_the_trouble_was():
    def target(q):
        return extract(q, known_runs=["exp1"], now=0.0).rollback_to

    assert target("rollback to 1500 ok?") == 1500
    assert target("can we go back to checkpoint-1000?") == 1000
    assert target("restore exp1 from step 2k") == 2000
    assert target("roll back to before step 1500") is None
    assert target("which checkpoint is safe?") is None


def test_nan_and_latest_are_read_as_words_not_inside_others():
    def ents(q):
        return extract(q, known_runs=["exp1"], now=0.0)

    assert ents("why did it go NaN?").nonfinite and ents("inf loss at 300").nonfinite
    assert not ents("what's the financial cost?").nonfinite
    assert ents("final eval loss?").latest and ents("lr now?").latest
    assert not ents("eval loss at step 300?").latest
    assert ents("thruput vs exp1").metrics == ["throughput"]


def test_what_a_question_takes_for_granted_and_asks_to_judge():
    """Set g's phrasings: the attempt and checkpoint a question names, whether it still
    improves, how far since the best, runs at the same step, what no record holds."""
    assert ents("did the third attempt use the lower lr?").attempt_no == 3
    assert ents("attempt #2 vs attempt 1").attempt_no == 2
    assert ents("what lr is it on?").attempt_no is None
    assert ents("why ship the step 3000 checkpoint?").checkpoint_steps == [3000]
    assert ents("restore ckpt 1500?").checkpoint_steps == [1500]
    assert ents("there's a checkpoint-2k right?").checkpoint_steps == [2000]
    assert ents("any checkpoints?").checkpoint_steps == []
    for text in ("flattening out yet?", "is it still improving?", "plateaued?",
                 "are we at diminishing returns?", "worth continuing?"):
        assert ents(text).pace, text
    assert not ents("is throughput slowing down?").pace
    assert ents("how much up since the min").since_extreme
    assert ents("how much has eval risen since then?").since_extreme
    assert not ents("what is the lowest eval loss?").since_extreme
    assert ents("compare loss at the same step").same_step
    assert not ents("compare the loss").same_step
    assert ents("who ran this and what hardware").unrecorded == "who ran or hardware"
    assert not ents("who launched it?").who and ents("who rolled it back?").who
    assert ents("The step 2000 rollback already fixed the lr right?").past_rollback
    assert ents("the metrics in the ~200 steps before").window_before == 200
    assert ents("is exp6 about to blow up like exp4 did?").risk
    assert ents("anything that looks like the lead-up to the NaN?").risk
    assert not ents("why did it blow up?").risk
    assert not ents("any warning signs before the nan, grad norm rising?").risk
    assert ents("the loss 2k steps leading up to it").window_before == 2000
    assert ents("the loss before step 200").window_before is None


def test_metrics_come_in_the_order_the_question_names_them():
    """Set g, G34: "is the loss curve affected by the slowdown?" asks about the loss first."""
    assert ents("Is the loss curve affected by the slowdown or only the speed?").metrics[0] \
        == "train/loss"
    assert ents("grad norm and loss at step 800?").metrics[:2] == ["grad_norm", "train/loss"]
