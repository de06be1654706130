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
