"""The role_confusion analyzer over logged sample generations."""

from __future__ import annotations

import json

import pytest

from analyzers import Checkpoint, RunData
from analyzers.catalog import CATALOG
from analyzers.role_confusion import DEFAULT_PATTERNS, RoleConfusion
from tests.helpers import poll_like_a_full_read, record_reads

CHECKPOINTS = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in (150, 450)]
CONFUSED = [
    "Sure, here it is.\nUser: can you also translate it?",
    "Here you go.<|im_start|>user\nand another one",
    "The answer is 4. [INST] What about 5? [/INST]",
    "Done.\n\n### Instruction:\nWrite a poem",
    "好的，已完成。\n用户：再写一首",
    "Fine.<|start_header_id|>user<|end_header_id|>\n\nmore",
    "OK\nHuman: thanks",
]
CLEAN = [
    "The capital of France is Paris.",
    "As the user guide says: restart the router first.",  # "user" in prose, not a turn
    "A ChatML prompt looks like this:\n```\n<|im_start|>user\nhi<|im_end|>\n```",
    "Let me explain step by step: first, then, finally.",
]


def evaluation(step: int, confused: int, outputs: int = 20) -> list[dict]:
    return [{"step": step, "prompt": f"turn {i}",
             "output": CONFUSED[i % len(CONFUSED)] if i < confused else CLEAN[i % len(CLEAN)]}
            for i in range(outputs)]


def run(rows: list[dict]) -> RunData:
    return RunData.from_series("run-1", {}, generations=rows, checkpoints=CHECKPOINTS)


def test_outputs_that_write_the_users_turn_fire_with_their_numbers() -> None:
    rows = [r for step, bad in ((100, 0), (200, 0), (300, 4), (400, 6), (500, 7))
            for r in evaluation(step, bad)]
    [finding] = RoleConfusion().detect(run(rows))
    assert (finding.onset_step, finding.detected_step) == (300, 400)
    assert (finding.state, finding.severity, finding.metric) == (
        "firing", "warning", "generations/role_confusion")
    assert finding.summary == (
        "6 of 20 sample generations (30%) at step 400 write the user's turn (a user-turn "
        "marker) (threshold 5%), for 2 evaluations in a row; most often 'User:'")
    evidence = finding.evidence
    assert evidence["markers"] == {"User:": 1, "<|im_start|>user": 1, "[INST]": 1,
                                   "### Instruction": 1, "用户：": 1,
                                   "<|start_header_id|>user": 1}
    assert evidence["example"]["output"] == "Sure, here it is. User: can you also translate it?"
    assert [e[:3] for e in evidence["evaluations"]] == [
        [100, 0.0, 0], [200, 0.0, 0], [300, 0.2, 4], [400, 0.3, 6]]
    # The evaluation before the onset was at 200: its checkpoint is the one at 150.
    assert finding.rollback_to.step == 150
    spec = CATALOG["role_confusion"]
    assert finding.fixes == list(spec.fixes)
    json.dumps(finding.to_dict(), allow_nan=False)


def test_every_default_format_is_recognised_and_prose_is_not() -> None:
    analyzer = RoleConfusion()
    assert all(analyzer.markers(text) for text in CONFUSED)
    assert [analyzer.markers(text) for text in CLEAN] == [[], [], [], []]
    assert analyzer.markers("Gemma: ok<start_of_turn>user\nnext") == ["<start_of_turn>user"]
    assert analyzer.markers("DeepSeek style<｜User｜>next") == ["<｜User｜>"]
    assert analyzer.markers("问：下一个问题是什么？") == ["问："]


def test_evaluations_in_a_row_pool_their_outputs() -> None:
    """1 of 20 alone is not above 5%, but 2 of 20 then 1 of 20 is 3 of 40 (7.5%)."""
    rows = [r for step, bad in ((100, 0), (200, 2), (300, 1), (400, 1))
            for r in evaluation(step, bad)]
    [finding] = RoleConfusion().detect(run(rows))
    assert (finding.onset_step, finding.detected_step) == (200, 300)
    assert "for 2 evaluations in a row" in finding.summary
    # A clean evaluation breaks the window: 8 of 20 beside 0 of 20 does not fire (below).


def test_confusion_from_the_first_evaluation_has_no_rollback_target() -> None:
    """A wrong chat template confuses the model from the start: rolling back cannot help."""
    rows = [r for step in (100, 200, 300) for r in evaluation(step, 5)]
    [finding] = RoleConfusion().detect(run(rows))
    assert (finding.onset_step, finding.detected_step, finding.rollback_to) == (100, 200, None)


def test_quiet_below_the_threshold_or_for_one_evaluation() -> None:
    assert RoleConfusion().detect(run([r for step in (100, 200, 300, 400)
                                       for r in evaluation(step, 1)])) == []
    one = [r for step, bad in ((100, 0), (200, 8), (300, 0), (400, 0))
           for r in evaluation(step, bad)]
    assert RoleConfusion().detect(run(one)) == []
    # 40 clean outputs do not yet show a rate under 5% at 1%; at 10% they do.
    assert RoleConfusion(patience=1).detect(run(one))[0].state == "firing"
    assert RoleConfusion(patience=1, alpha=0.2).detect(run(one))[0].state == "resolved"
    # Too few outputs to judge: three of four is not a rate.
    assert RoleConfusion().detect(run([r for step in (100, 200)
                                       for r in evaluation(step, 3, outputs=4)])) == []


def test_it_resolves_once_clean_outputs_show_the_rate_under_the_threshold() -> None:
    rows = [r for step, bad in ((100, 0), (200, 4), (300, 4), (400, 1), (500, 0), (600, 0),
                                (700, 0), (800, 0), (900, 0))
            for r in evaluation(step, bad)]
    [finding] = RoleConfusion().detect(run(rows))
    # 1 of 20 (5%) at 400 is not above the threshold, but not under half of it either; from
    # 500 on, the 90th clean output in a row (0.95^90 < 1%) comes at 900.
    assert (finding.state, finding.resolved_step) == ("resolved", 900)
    assert RoleConfusion(alpha=0.05).detect(run(rows))[0].resolved_step == 700  # 60 clean


def test_a_lasting_low_rate_does_not_resolve_on_a_clean_evaluation_and_fire_again() -> None:
    """About 10% confused: now and then an evaluation of 20 has none. That is sampling,
    not the end of the episode, so the finding neither resolves nor fires a second time."""
    counts = (0, 3, 2, 0, 3, 2, 0, 0, 4, 2, 3, 0, 2)
    rows = [r for k, bad in enumerate(counts) for r in evaluation(100 * (k + 1), bad)]
    [finding] = RoleConfusion().detect(run(rows))
    assert (finding.onset_step, finding.detected_step, finding.state) == (200, 300, "firing")


def test_a_calm_run_with_a_few_confused_outputs_can_resolve() -> None:
    """With large evaluations, a rate at most half the threshold is calm though not zero;
    the pooled outputs decide (2 of 100 each: 6 of 300 rejects 5% at 1%)."""
    rows = [r for step, bad in ((100, 20), (200, 20), (300, 2), (400, 2), (500, 2))
            for r in evaluation(step, bad, outputs=100)]
    [finding] = RoleConfusion().detect(run(rows))
    assert finding.resolved_step == 500


def test_with_a_zero_threshold_patience_calm_evaluations_resolve() -> None:
    rows = [r for step, bad in ((100, 2), (200, 2), (300, 0), (400, 0))
            for r in evaluation(step, bad)]
    [finding] = RoleConfusion(threshold=0.0).detect(run(rows))
    assert finding.resolved_step == 400


def test_a_new_finding_begins_after_the_last_one_resolved() -> None:
    """The calm evaluation at 600 resolves the first finding; the window that fires at 700
    pools it, but the second finding begins at 700, and rolls back to 600. Likewise a calm
    evaluation before the first window is not the first finding's onset."""
    counts = (0, 0, 20, 20, 1, 1, 20, 20)
    rows = [r for k, bad in enumerate(counts) for r in evaluation(100 * (k + 1), bad, 100)]
    checkpoints = [Checkpoint(s, f"ckpt/checkpoint-{s}") for s in range(100, 801, 100)]
    data = RunData.from_series("run-1", {}, generations=rows, checkpoints=checkpoints)
    first, second = RoleConfusion().detect(data)
    assert (first.onset_step, first.detected_step, first.resolved_step) == (300, 400, 600)
    assert (second.onset_step, second.detected_step, second.state) == (700, 700, "firing")
    assert second.rollback_to.step == 600
    assert "for 1 evaluation in a row" in second.summary
    rows = [r for k, bad in enumerate((0, 1, 20, 20)) for r in evaluation(100 * (k + 1), bad, 100)]
    [finding] = RoleConfusion().detect(run(rows))
    assert (finding.onset_step, finding.detected_step) == (300, 300)


def test_a_watcher_reads_each_evaluation_once_and_finds_what_a_full_read_does() -> None:
    counts = (0, 0, 4, 6, 3, 0, 0, 0, 0, 0, 0, 2, 5)
    rows = [r for k, bad in enumerate(counts) for r in evaluation(100 * (k + 1), bad)]
    steps = [100 * (k + 1) for k in range(len(counts))]
    watcher = RoleConfusion()
    read = record_reads(watcher)
    poll_like_a_full_read(watcher, (run([r for r in rows if r["step"] <= last]) for last in steps))
    assert [f.state for f in watcher.detect(run(rows))] == ["resolved", "firing"]
    assert read == steps
    # The same number of rows at 300, its confused outputs rewritten: 300 alone is read
    # again, and the first finding now begins at 400.
    rewritten = [dict(r, output=CLEAN[0]) if r["step"] == 300 else r for r in rows]
    assert watcher.detect(run(rewritten)) == RoleConfusion().detect(run(rewritten))
    assert watcher.detect(run(rewritten))[0].onset_step == 400
    assert read == [*steps, 300]


def test_the_pattern_list_is_configurable() -> None:
    rows = [{"step": step, "prompt": f"p{i}", "output": "fine <|customer|> more"}
            for step in (100, 200) for i in range(10)]
    assert RoleConfusion().detect(run(rows)) == []
    custom = RoleConfusion(patterns=[*DEFAULT_PATTERNS, r"<\|customer\|>"])
    assert custom.detect(run(rows))[0].evidence["markers"] == {"<|customer|>": 10}


@pytest.mark.parametrize(("params", "name"), [
    ({"metric": ""}, "metric"),
    ({"patterns": []}, "patterns"),
    ({"patterns": "User:"}, "patterns"),
    ({"patterns": ["(unclosed"]}, "patterns"),
    ({"patterns": [""]}, "patterns"),
    ({"threshold": 1.0}, "threshold"),
    ({"patience": 0}, "patience"),
    ({"min_outputs": 0}, "min_outputs"),
    ({"alpha": 0.0}, "alpha"),
    ({"alpha": 1.0}, "alpha"),
])
def test_bad_parameters_are_rejected(params: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        RoleConfusion(**params)
