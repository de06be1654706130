"""Routing by meaning: phrasings people use reach the intent that answers them."""

import pytest

from benchmarks.qa import NOW
from bot.qa.entities import extract
from bot.qa.router import route

RUNS = ["exp1", "exp2", "atlas-7b-sft"]


def intent(question):
    return route(question, extract(question, known_runs=RUNS, now=NOW)).intent


@pytest.mark.parametrize(("question", "expected"), [
    ("Which step is atlas-7b-sft at now?", "where"),
    ("where's exp1 at?", "where"),
    ("what iteration are we at?", "where"),
    ("summarize exp1 in one sentence", "summary"),
    ("tl;dr?", "summary"),
    ("what should I do about exp1?", "next_step"),
    ("why did it slow down?", "why"),
    ("why did the loss spike?", "why"),
    ("what happened at step 150?", "why"),
    ("what went wrong around iteration 2000 in exp1?", "why"),
    ("what happened in this run so far?", "summary"),
    ("what changed between exp1 and exp2?", "changed"),
    ("is it safe to roll back, and to where?", "rollback"),
    ("which is better on eval loss, exp1 or exp2?", "better"),
    ("have we seen this before?", "similar"),
    ("when will exp1 finish?", "eta"),
    ("what was the loss at step 400?", "value"),
    ("What's the weather in Paris?", "unknown"),
    ("write me a poem about GPUs", "unknown"),
])
def test_questions_reach_their_intent(question, expected):
    assert intent(question) == expected


def test_run_names_do_not_decide_the_intent():
    assert intent("summarize exp1") == intent("summarize atlas-7b-sft") == "summary"


def test_labelled_examples_come_only_from_measured_sets_and_name_no_run():
    """The router learns from held-out questions only once their set was measured and read:
    a question of a set still to be measured (f and later) must never be among them."""
    import json

    from benchmarks.qa_heldout import SETS
    from bot.qa.router import EXAMPLES, LABELLED

    data = json.loads(LABELLED.read_text(encoding="utf-8"))
    measured = {json.loads(SETS[s].read_text(encoding="utf-8"))[0]["id"][0] for s in "bde"} | {"H"}
    for intent_, ids in data["sources"].items():
        assert intent_ in EXAMPLES and len(ids) == len(data["intents"][intent_])
        assert {i[0] for i in ids} <= measured
        for question in data["intents"][intent_]:
            assert question in EXAMPLES[intent_]
            assert not any(run in question for run in ("exp1", "exp2", "exp5", "old1"))


@pytest.mark.parametrize(("question", "parts"), [
    ("ETA? and how much sooner without the slowdown", ["ETA", "and how much sooner without the "
                                                              "slowdown"]),
    ("did it NaN too or did it recover on its own? how long did that take",
     ["did it NaN too", "did it recover on its own", "how long did that take"]),
    ("what is the loss at step 500 and 1000?", ["what is the loss at step 500 and 1000"]),
    ("exp3 vs exp1 — what did they change?", ["exp3 vs exp1", "what did they change"]),
    ("reply 'ok? fine' please", ["reply   please"]),
])
def test_a_question_is_split_into_its_asks(question, parts):
    from bot.qa.router import asks

    assert asks(question) == parts
