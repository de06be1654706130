"""The repetition analyzer over logged sample generations: exact firing and resolve steps."""

from __future__ import annotations

import json
import warnings

import pytest

from analyzers import Checkpoint, RunData
from analyzers.base import generations_frame
from analyzers.catalog import CATALOG
from analyzers.repetition import Repetition
from tests.helpers import poll_like_a_full_read, record_reads

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
        "10 of 10 sample generations loop (repeated 4-gram rate ≥ 20%) at step 1200: 100% "
        "against 0% over the 3 baseline evaluations to step 600 (threshold 20%, margin +10 "
        "points; Fisher p < 0.0001), for 2 evaluations in a row; mean repeated 4-gram rate "
        "0% → 82%, distinct-2 0.39 → 0.06")
    evidence = finding.evidence
    assert (evidence["baseline_steps"], evidence["baseline_outputs"]) == ([200, 600], 30)
    assert (evidence["loops"], evidence["outputs"], evidence["share"]) == (10, 10, 1.0)
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
    """Calm for ``patience`` evaluations in a row (1600 and 1800) resolves, at the last."""
    [finding] = Repetition().detect(run(generations(1000, 1600)))
    assert (finding.state, finding.resolved_step) == ("resolved", 1800)


def test_one_calm_evaluation_inside_a_loop_does_not_resolve_it() -> None:
    rows = [r for r in generations(1000) if r["step"] != 1400]
    rows += evaluation(1400, varied)  # one lucky sample of prompts among the loops
    [finding] = Repetition().detect(run(rows))
    assert (finding.onset_step, finding.detected_step, finding.state) == (1000, 1200, "firing")
    assert Repetition(patience=1).detect(run(rows))[0].resolved_step == 1400


def mixed(loops: int, outputs: int = 20):
    """An evaluation where ``loops`` of the outputs fall into a loop, the rest vary."""
    return lambda i: looping(i) if i < loops else varied(i)


def test_a_third_of_the_outputs_looping_fires_though_the_mean_rate_is_low() -> None:
    """Degeneration starts on a minority of prompts: 6–7 of 20 outputs loop over their
    second half, so the evaluation's mean repeated 4-gram rate stays under 20%, but the
    share of looping outputs is well above it and far above the baseline's none."""

    def half_loop(i: int) -> str:
        return varied(i) + " " + " ".join(["I hope this helps."] * 4)

    rows = [r for s in range(200, 1001, 200) for r in evaluation(s, varied, 20)]
    for s, loops in ((1200, 6), (1400, 7), (1600, 6)):
        rows += evaluation(s, lambda i, k=loops: half_loop(i) if i < k else varied(i), 20)
    [finding] = Repetition().detect(run(rows))
    assert (finding.onset_step, finding.detected_step) == (1200, 1400)
    assert finding.evidence["mean_rate"] < 0.2 < finding.evidence["share"]
    assert finding.summary.startswith("7 of 20 sample generations loop")


def test_a_task_whose_answers_often_repeat_wobbles_without_firing() -> None:
    """A fifth of the answers repeat by nature (links, tables); a later sample of prompts
    with twice as many is within sampling noise of the 60-output baseline (Fisher p ≈ 0.2):
    the share exceeds the threshold and the margin, yet nothing fires."""
    rows = [r for s in range(200, 2001, 200)
            for r in evaluation(s, mixed(8 if s in (1000, 1200) else 4), 20)]
    assert Repetition().detect(run(rows)) == []
    # Without the test, the shares alone (40% > max(20%, 20% + 10 points)) would fire.
    assert Repetition(alpha=0.999).detect(run(rows)) != []


def test_the_baseline_pools_the_first_evaluations_that_were_not_bad() -> None:
    """Loops from the second evaluation: it is bad against the first, so it stays out of
    the baseline, which keeps pooling the next good ones."""
    rows = evaluation(200, varied) + evaluation(400, looping) + evaluation(600, looping)
    [finding] = Repetition().detect(run(rows))
    assert (finding.onset_step, finding.detected_step) == (400, 600)
    assert finding.evidence["baseline_steps"] == [200, 200]
    assert "over the 1 baseline evaluation to step 200" in finding.summary


def test_short_outputs_carry_no_n_grams() -> None:
    rows = [{"step": s, "prompt": f"q{i}", "output": "yes yes"} for s in (1, 2, 3)
            for i in range(9)]
    assert Repetition().detect(run(rows)) == []


def test_generations_logged_twice_count_once() -> None:
    """A log read (or concatenated) twice repeats every row; each counts once, so the
    Fisher test sees 2 of 8 looping, not 4 of 16 (p = 0.0029). Different outputs to one
    prompt at one step are samples, and all count."""
    rows = [r for s in (100, 200, 300) for r in evaluation(s, varied, 8)]
    rows += [r for s in (400, 500) for r in evaluation(s, mixed(2), 8)]
    assert Repetition().detect(run(rows)) == []
    assert Repetition().detect(run(rows + rows)) == []
    assert generations_frame(rows + rows).equals(generations_frame(rows))
    samples = [{"step": 1, "prompt": "q", "output": text} for text in ("a", "b", "a")]
    assert generations_frame(samples)["output"].tolist() == ["a", "b"]
    marked = [{"step": 1, "prompt": "q", "output": "a", "probe": flag} for flag in (1, 0, 1)]
    assert generations_frame(marked)["probe"].tolist() == [True, False]


def test_a_step_beyond_int64_is_dropped_like_other_bad_steps() -> None:
    """A step of 1e30 once became -2**63 (with a RuntimeWarning): the first evaluation,
    looping, was the baseline, and the loops from 1000 did not fire."""
    rows = [{"step": step, "prompt": "q", "output": "x"}
            for step in (1e30, 2.0**63, 10**30, "1e30", 2**62, 7)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = generations_frame(rows)
    assert frame["step"].tolist() == [2**62, 7]
    [finding] = Repetition().detect(run(evaluation(1e30, looping) + generations()))
    assert (finding.onset_step, finding.detected_step) == (1000, 1200)


def test_a_watcher_reads_each_evaluation_once_and_finds_what_a_full_read_does() -> None:
    """A watcher's poll hands the whole log again: only new or changed evaluations are
    read, and the findings are a fresh instance's at every poll."""
    rows = generations(1000, 1600)
    steps = sorted({r["step"] for r in rows})
    watcher = Repetition()
    read = record_reads(watcher)
    poll_like_a_full_read(watcher, (run([r for r in rows if r["step"] <= last]) for last in steps))
    assert watcher.detect(run(rows))[0].resolved_step == 1800
    assert read == steps
    # The same number of rows at 400, one output rewritten: 400 alone is read again.
    rewritten = [dict(r, output=looping(0)) if (r["step"], r["prompt"]) == (400, "question 0")
                 else r for r in rows]
    assert watcher.detect(run(rewritten)) == Repetition().detect(run(rewritten))
    assert read == [*steps, 400]
    assert watcher.detect(run(rows[:30])) == Repetition().detect(run(rows[:30])) == []
    assert read == [*steps, 400, 400]


@pytest.mark.parametrize(("params", "name"), [
    ({"metric": ""}, "metric"),
    ({"n": 0}, "n"),
    ({"threshold": 1.0}, "threshold"),
    ({"margin": -0.1}, "margin"),
    ({"patience": 0}, "patience"),
    ({"min_outputs": 0}, "min_outputs"),
    ({"loop_rate": 0.0}, "loop_rate"),
    ({"baseline": 0}, "baseline"),
    ({"alpha": 0.0}, "alpha"),
    ({"alpha": 1.0}, "alpha"),
])
def test_bad_parameters_are_rejected(params: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Repetition(**params)
