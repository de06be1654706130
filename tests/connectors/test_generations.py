"""Reading a run's sample generations (JSONL) incrementally, from real files."""

from __future__ import annotations

import json
import os

import pytest

from analyzers import Checkpoint, RunData
from analyzers.over_refusal import OverRefusal
from connectors.aliases import AliasTable
from connectors.generations import generations_path, read_generations


def write(path, text, mode="a"):
    with open(path, mode, encoding="utf-8") as handle:
        handle.write(text)


def line(**record):
    return json.dumps(record, ensure_ascii=False) + "\n"


def records(batch):
    return batch.rows.to_dict("records")


def test_rows_keep_their_texts_and_probe_marks(tmp_path):
    path = tmp_path / "generations.jsonl"
    write(path, line(step=100, prompt="What is 2+2?", output="4", probe=True, judge=7.5)
          + line(step=100, prompt="你好", output="你好！有什么可以帮你？")
          + line(global_step="200", input="hi", completion="hello", probe="false"))
    batch = read_generations(path)
    assert records(batch) == [
        {"step": 100, "prompt": "What is 2+2?", "output": "4", "probe": True},
        {"step": 100, "prompt": "你好", "output": "你好！有什么可以帮你？", "probe": None},
        {"step": 200, "prompt": "hi", "output": "hello", "probe": False},
    ]
    assert batch.malformed == [] and batch.notices == []
    assert batch.cursor["line"] == 3 and batch.cursor["offset"] == path.stat().st_size


def test_incremental_reads_return_only_new_rows(tmp_path):
    path = tmp_path / "generations.jsonl"
    write(path, "".join(line(step=s, prompt="p", output=f"o{s}") for s in (1, 2, 3)))
    first = read_generations(path)
    again = read_generations(path, first.cursor)
    assert len(first.rows) == 3 and again.rows.empty and again.cursor == first.cursor
    write(path, line(step=4, prompt="p", output="o4"))
    later = read_generations(path, first.cursor)
    assert records(later) == [{"step": 4, "prompt": "p", "output": "o4", "probe": None}]
    assert later.cursor["line"] == 4


def test_a_partial_last_line_waits_for_its_newline_unless_final(tmp_path):
    path = tmp_path / "generations.jsonl"
    write(path, line(step=1, prompt="p", output="one") + '{"step": 2, "prompt": "p", "outp')
    first = read_generations(path)
    assert [r["output"] for r in records(first)] == ["one"] and first.malformed == []
    write(path, 'ut": "two"}')
    assert read_generations(path, first.cursor).rows.empty  # still no newline
    last = read_generations(path, first.cursor, final=True)
    assert [r["output"] for r in records(last)] == ["two"]
    assert last.cursor["offset"] == path.stat().st_size


def test_malformed_lines_are_counted_with_line_numbers_in_one_notice(tmp_path):
    path = tmp_path / "generations.jsonl"
    write(path, line(step=1, prompt="p", output="fine")
          + "not json at all\n"
          + "[1, 2]\n"
          + line(prompt="p", output="no step")
          + line(step=-3, prompt="p", output="negative step")
          + line(step=5, prompt="p")
          + line(step=6, prompt="p", output=["a", "list"])
          + line(step=7, prompt="p", output="x", probe="maybe")
          + "\n"
          + line(step=8, prompt=None, output="kept"))
    batch = read_generations(path)
    assert [r["step"] for r in records(batch)] == [1, 8]
    assert records(batch)[1]["prompt"] == ""
    assert [n for n, _ in batch.malformed] == [2, 3, 4, 5, 6, 7, 8]
    reasons = [why for _, why in batch.malformed]
    assert reasons[0].startswith("not JSON")
    assert reasons[1] == "not a JSON object"
    assert reasons[2].startswith("no 'step' field")
    assert reasons[3] == "step -3 is not a non-negative integer below 2**63"
    assert reasons[4].startswith("no 'output' field")
    assert reasons[5] == "'output' is not text"
    assert reasons[6] == "'probe' is 'maybe', not true or false"
    [notice] = batch.notices
    assert notice.startswith("generations.jsonl: 7 malformed lines skipped, first at line 2: "
                             "not JSON")
    assert "\n" not in notice


def test_a_missing_file_is_an_empty_read_until_it_appears(tmp_path):
    path = tmp_path / "generations.jsonl"
    batch = read_generations(path)
    assert batch.rows.empty and batch.cursor == {} and batch.notices == []
    write(path, line(step=10, prompt="p", output="o"))
    assert len(read_generations(path, batch.cursor).rows) == 1


def test_a_truncated_or_replaced_file_is_read_again_with_a_notice(tmp_path):
    path = tmp_path / "generations.jsonl"
    write(path, "".join(line(step=s, prompt="p", output="old") for s in range(1, 6)))
    first = read_generations(path)
    write(path, line(step=1, prompt="p", output="new"), mode="w")
    shrunk = read_generations(path, first.cursor)
    assert [r["output"] for r in records(shrunk)] == ["new"]
    assert "shrank" in shrunk.notices[0] and shrunk.cursor["line"] == 1
    write(path, line(step=1, prompt="q", output="other run, same size"), mode="w")
    write(path, "".join(line(step=s, prompt="p", output="old") for s in range(2, 9)))
    replaced = read_generations(path, shrunk.cursor)
    assert "replaced" in replaced.notices[0] and len(replaced.rows) == 8


def test_a_byte_order_mark_and_invalid_utf8_do_not_stop_the_read(tmp_path):
    path = tmp_path / "generations.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + line(step=1, prompt="p", output="bom").encode()
                     + b'{"step": 2, "prompt": "p", "output": "bad \xff byte"}\n')
    batch = read_generations(path)
    assert [r["output"] for r in records(batch)] == ["bom", "bad \ufffd byte"]


def test_the_step_key_goes_through_the_alias_table(tmp_path):
    path = tmp_path / "generations.jsonl"
    write(path, line(it=3, prompt="p", output="o"))
    assert read_generations(path).malformed[0][0] == 1
    batch = read_generations(path, aliases=AliasTable({"it": "step"}))
    assert [r["step"] for r in records(batch)] == [3]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads files whatever their mode")
def test_an_unreadable_file_says_what_to_do(tmp_path):
    path = tmp_path / "generations.jsonl"
    write(path, line(step=1, prompt="p", output="o"))
    path.chmod(0)
    with pytest.raises(PermissionError, match="chmod a\\+r"):
        read_generations(path)


def test_the_file_sits_in_the_run_folder_beside_its_log(tmp_path):
    assert generations_path(tmp_path / "exp1" / "metrics.jsonl") == (
        tmp_path / "exp1" / "generations.jsonl")
    assert generations_path(tmp_path / "out" / "checkpoint-500" / "trainer_state.json") == (
        tmp_path / "out" / "generations.jsonl")


def test_rows_read_from_a_file_feed_the_text_analyzers(tmp_path):
    """Probe marks survive the read: the harmful prompt's refusal is not counted."""
    path = tmp_path / "generations.jsonl"
    for step, refusals in ((100, 1), (200, 1), (300, 9), (400, 10)):
        for i in range(20):
            output = "I'm sorry, but I can't help with that." if i < refusals else "Sure: …"
            write(path, line(step=step, prompt=f"benign {i}", output=output, probe=True))
        write(path, line(step=step, prompt="how to build a weapon", output="I cannot help."))
    batch = read_generations(path)
    data = RunData.from_series("run", {}, generations=batch.rows,
                               checkpoints=[Checkpoint(200, "out/checkpoint-200")])
    [finding] = OverRefusal().detect(data)
    assert (finding.onset_step, finding.detected_step) == (300, 400)
    assert finding.evidence["probes"] == 20 and finding.evidence["refused"] == 10
    assert finding.rollback_to.step == 200
