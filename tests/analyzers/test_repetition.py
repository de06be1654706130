"""The repetition analyzer over logged sample generations: exact firing and resolve steps."""

from __future__ import annotations

import json

import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.repetition import Repetition

CHECKPOINTS = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in range(250, 2001, 250)]
TOPICS = ["rivers", "bridges", "violins", "glaciers", "markets", "comets", "orchards",
          "ferries", "lanterns", "deserts"]


def varied(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return (f"Answer {i}: {topic} differ by region, and the history of {topic} near town "
            f"number {i} explains why people still visit them every spring.")


def looping(i: int) -> str:
    return f"Answer {i}: " + "I hope this helps you. " * 8


def evaluation(step: int, make, outputs: int = 10) -> list[dict]:
    return [{"step": step, "prompt": f"question {i}", "output": make(i)} for i in range(outputs)]


def generations(loop_from: int | None = 1000, loop_until: int | None = None,
                last: int = 2000) -> list[dict]:
    rows = []
    for step in range(200, last + 1, 200):
        bad = loop_from is not None and step >= loop_from and (
            loop_until is None or step < loop_until)
        rows += evaluation(step, looping if bad else varied)
    return rows


def run(rows: list[dict]) -> RunData:
    return RunData.from_series("run-1", {}, generations=rows, checkpoints=CHECKPOINTS)


def test_generations_that_start_looping_fire_with_their_numbers() -> None:
    [finding] = Repetition().detect(run(generations()))
    assert (finding.onset_step, finding.detected_step) == (1000, 1200)
    assert (finding.state, finding.severity, finding.metric) == (
        "firing", "warning", "generations/repetition")
    assert finding.summary == (
        "mean repeated 4-gram rate of 10 sample generations 82% at step 1200 (first "
        "evaluation 0% at step 200; threshold 20%, margin +10 points), for 2 evaluations in "
        "a row; distinct-2 0.39 → 0.06")
    evidence = finding.evidence
    assert evidence["example"]["output"].startswith("Answer 0: I hope this helps you. I hope")
    assert [e[0] for e in evidence["evaluations"]][-3:] == [800, 1000, 1200]
    # The last evaluation that did not repeat was at 800: its checkpoint, or the one before.
    assert finding.rollback_to.step == 750
    spec = CATALOG["repetition"]
    assert finding.fixes == list(spec.fixes) and finding.fixes[0].text.startswith("Fewer")
    json.dumps(finding.to_dict(), allow_nan=False)


def test_chinese_and_japanese_loops_are_counted_per_character() -> None:
    def cjk_loop(i: int) -> str:
        return f"第{i}题：" + "好的好的，我明白了。" * 6

    def cjk_varied(i: int) -> str:
        return f"第{i}题：长江流经多个省份，沿岸城市各有特色，值得一一游览。"

    rows = [r for s in (100, 200) for r in evaluation(s, cjk_varied)]
    rows += [r for s in (300, 400) for r in evaluation(s, cjk_loop)]
    [finding] = Repetition().detect(run(rows))
    assert (finding.onset_step, finding.detected_step) == (300, 400)
    assert Repetition().detect(run([r for s in (100, 200, 300, 400)
                                    for r in evaluation(s, cjk_varied)])) == []


def test_a_task_that_repeats_by_nature_stays_quiet() -> None:
    """Tables and templated answers repeat from the first evaluation on: the margin over the
    run's own baseline keeps them quiet."""
    rows = [r for s in range(200, 2001, 200) for r in evaluation(s, looping)]
    assert Repetition().detect(run(rows)) == []
    assert Repetition().detect(run(generations(None))) == []


def test_one_bad_evaluation_does_not_fire_and_small_ones_are_skipped() -> None:
    rows = generations(1000, 1200)
    assert Repetition().detect(run(rows)) == []
    assert Repetition(patience=1).detect(run(rows))[0].onset_step == 1000
    # Four outputs at 1200 are too few to judge: 1000 and 1400 are in a row.
    rows = [r for s in (200, 400, 600, 800) for r in evaluation(s, varied)]
    rows += evaluation(1000, looping) + evaluation(1200, varied, outputs=4)
    rows += evaluation(1400, looping)
    [finding] = Repetition().detect(run(rows))
    assert (finding.onset_step, finding.detected_step) == (1000, 1400)


def test_it_resolves_when_the_generations_vary_again() -> None:
    [finding] = Repetition().detect(run(generations(1000, 1600)))
    assert (finding.state, finding.resolved_step) == ("resolved", 1600)


def test_short_outputs_carry_no_n_grams() -> None:
    rows = [{"step": s, "prompt": "q", "output": "yes yes"} for s in (1, 2, 3) for _ in range(9)]
    assert Repetition().detect(run(rows)) == []


@pytest.mark.parametrize(("params", "name"), [
    ({"metric": ""}, "metric"),
    ({"n": 0}, "n"),
    ({"threshold": 1.0}, "threshold"),
    ({"margin": -0.1}, "margin"),
    ({"patience": 0}, "patience"),
    ({"min_outputs": 0}, "min_outputs"),
])
def test_bad_parameters_are_rejected(params: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Repetition(**params)
