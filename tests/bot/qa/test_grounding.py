import pytest

from bot.qa.facts import FactSheet, Source
from bot.qa.grounding import check, numbers_in


@pytest.fixture
def sheet():
    s = FactSheet(question="q", run="exp1", kinds=["value"])
    s.add("value", "train/loss of exp1 at step 2000: 1.923.", 1.923, 2000,
          source=Source("exp1", 2000))
    s.add("min", "The lowest eval/loss of exp1 is 0.000312, at step 1500.", 0.000312, 1500,
          source=Source("exp1", 1500))
    s.add("rollback", "Recommended rollback: the checkpoint at step 1000 "
                      "(/ckpt/exp1/checkpoint-1000), +20.5% above best.", 1000,
          source=Source("exp1", 1000))
    s.add("status", "exp1 should finish in about 1h 40m.", source=Source("exp1"))
    return s


def kinds(violations):
    return [(v.kind, v.token) for v in violations]


@pytest.mark.parametrize("answer", [
    "The loss at step 2000 was 1.923.",
    "The loss at step 2,000 was 1.92, rounded.",
    "At 2k steps the loss was about 1.9.",
    "Lowest eval loss 3.12e-4 at step 1500.",
    "Roll back to checkpoint-1000 (/ckpt/exp1/checkpoint-1000); it is 20% above best.",
    "exp1 should be done in 1h 40m.",
])
def test_grounded_answers_pass(sheet, answer):
    assert check(answer, sheet, all_runs=["exp1", "exp2"]) == []


def test_numbers_steps_paths_and_names_not_in_the_facts_fail(sheet):
    answer = ("The loss at step 2500 was 1.7; roll back to /ckpt/exp1/checkpoint-1500, "
              "like exp9 did. exp2 is better.")
    assert kinds(check(answer, sheet, all_runs=["exp1", "exp2"])) == [
        ("run", "exp2"), ("path", "/ckpt/exp1/checkpoint-1500"), ("name", "exp9"),
        ("number", "2500"), ("number", "1.7")]


def test_rounding_is_tolerated_but_not_more(sheet):
    assert check("loss 1.92", sheet) == []
    assert kinds(check("loss 1.93", sheet)) == [("number", "1.93")]
    assert kinds(check("at step 2001", sheet)) == [("number", "2001")]


def test_claims_of_actions_fail(sheet):
    assert kinds(check("I have stopped exp1.", sheet))[0][0] == "action"
    assert kinds(check("exp1 was rolled back to step 1000.", sheet))[0][0] == "action"
    assert check("Use /run rollback exp1 1000 to roll back.", sheet) == []


def test_number_parsing():
    parsed = numbers_in("1,500 steps, 2k, 0.25, 3e-4, 20%")
    assert [n.value for n in parsed] == pytest.approx([1500, 2000, 0.25, 3e-4, 20])
    assert [n.tolerance for n in parsed] == pytest.approx([0.5, 500, 0.005, 0.5e-4, 0.5])
    assert [n.percent for n in parsed] == [False, False, False, False, True]


def test_a_step_tied_to_an_event_must_be_the_one_the_facts_tie_to_it():
    """SmolLM2-135M in the demo copied "began at step 150" into "resolved at step 150": both
    numbers are in the facts, so only the step the facts give the event can catch it."""
    s = FactSheet(question="q", run="demo", kinds=["finding"])
    s.add("finding", "Alert spike on demo (critical, resolved at step 157) began at step 150, "
                     "seen at step 150: train/loss jumped to 10.45 at step 150.", 150, 150, 157,
          source=Source("demo", 150))
    assert check("The spike began at step 150 and resolved at step 157.", s) == []
    assert kinds(check("Alert spike on demo (critical, resolved at step 150) began at step 150",
                       s)) == [("step", "resolved at step 150")]
    assert kinds(check("It was seen at step 157.", s)) == [("step", "seen at step 157")]
    # An event the facts never tie to a step is left to the number check.
    assert check("Training started at step 150.", s) == []


@pytest.mark.parametrize("answer", [
    "The loss was 0.000312 at step 2000.",  # the lowest eval loss's value, at another step
    "At step 1500 the loss was 1.923.",
    "at step 1,500: 1.92",
])
def test_a_value_at_a_step_must_be_stated_with_that_step_by_one_fact(sheet, answer):
    """Both numbers are in the facts, so only their pairing can be wrong."""
    assert [v.kind for v in check(answer, sheet)] == ["pair"]


@pytest.mark.parametrize("answer", [
    "The loss was 1.92 at step 2000; the lowest eval loss 3.12e-4 at step 1500.",
    "At step 2,000 the train/loss was 1.923.",
    "At step 2000 train loss = 1.92.",
    "The checkpoint at step 1000 is 20.5% above best.",
])
def test_values_stated_with_their_own_step_pass(sheet, answer):
    assert check(answer, sheet) == []


def test_a_percentage_is_one_the_facts_write_as_one(store):
    """Set c, C55: "… flat from step 2410 to step 3000, with a loss of 1.966% between the
    halves' means" — 1.966 is the loss at step 2410; the change was -0.9%."""
    from benchmarks.qa import NOW
    from bot.qa.service import build_facts

    sheet = build_facts(store, "exp3", "train loss trend?", visible=lambda r: True, now=NOW)
    assert any("1.966" in f.text and "-0.9%" in f.text for f in sheet.facts)
    assert [v.kind for v in check("exp3's loss is flat, a change of 1.966%.", sheet)] == [
        "number"]
    assert check("exp3's loss is flat, a change of 0.9%.", sheet) == []
    status = build_facts(store, "exp1", "progress?", visible=lambda r: True, now=NOW)
    assert check("exp1 is 66.7% done.", status) == [] and check("exp1 is 67% done.", status) == []
