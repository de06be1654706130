import json
import math
import os

import pytest

from connectors.aliases import AliasTable
from connectors.files import LogDirectory, LogFile, SourceMissing, open_source


def write(path, text, mode="a"):
    with open(path, mode) as handle:
        handle.write(text)


def values(batch, tag):
    rows = batch.points[batch.points["tag"] == tag]
    return list(zip(rows["step"], rows["value"], strict=True))


def test_jsonl_maps_aliases_and_keeps_unknown_names(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, '{"step": 1, "loss": 2.5, "learning_rate": 0.001, "my_metric": 7}\n'
               '{"step": 1, "eval_loss": 2.9}\n')
    batch = LogFile(log, "r").read()
    assert values(batch, "train/loss") == [(1, 2.5)]
    assert values(batch, "lr") == [(1, 0.001)]
    assert values(batch, "eval/loss") == [(1, 2.9)]
    assert values(batch, "my_metric") == [(1, 7.0)]


def test_user_alias_overrides(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, '{"step": 3, "ce": 1.5}\n')
    batch = LogFile(log, "r", AliasTable({"ce": "train/loss"})).read()
    assert values(batch, "train/loss") == [(3, 1.5)]


def test_partial_last_line_waits_for_its_newline(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, '{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    first = LogFile(log, "r").read()
    assert values(first, "train/loss") == [(1, 2.0)]
    assert first.malformed == []
    write(log, 'ss": 1.9}\n')
    second = LogFile(log, "r").read(first.cursor)
    assert values(second, "train/loss") == [(2, 1.9)]
    assert second.cursor["line"] == 2


def test_incremental_reads_return_only_new_points(tmp_path):
    log = tmp_path / "m.jsonl"
    source = LogFile(log, "r")
    write(log, "".join(f'{{"step": {i}, "loss": {i}}}\n' for i in range(1, 6)))
    first = source.read()
    again = source.read(first.cursor)
    assert len(first.points) == 5 and len(again.points) == 0
    write(log, '{"step": 6, "loss": 6}\n')
    assert values(source.read(first.cursor), "train/loss") == [(6, 6.0)]


def test_bad_lines_are_counted_with_line_numbers_and_skipped(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, '{"step": 1, "loss": 2.0}\n'
               'not json at all\n'
               '[1, 2]\n'
               '{"loss": 3.0}\n'
               '{"step": "abc", "loss": 1}\n'
               '{"step": 2, "loss": "NaN", "grad_norm": "inf", "note": "hello", "lr": null}\n')
    batch = LogFile(log, "r").read()
    assert [line for line, _ in batch.malformed] == [2, 3, 4, 5]
    assert "not JSON" in batch.malformed[0][1]
    assert "no 'step'" in batch.malformed[2][1]
    loss = values(batch, "train/loss")
    assert loss[0] == (1, 2.0) and loss[1][0] == 2 and math.isnan(loss[1][1])
    assert values(batch, "grad_norm") == [(2, math.inf)]
    assert batch.skipped_values == 2  # "hello" and null: that key only, the line is kept


def test_json_nan_literals_are_values(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, '{"step": 1, "loss": NaN}\n{"step": 2, "loss": -Infinity}\n')
    loss = values(LogFile(log, "r").read(), "train/loss")
    assert math.isnan(loss[0][1]) and loss[1][1] == -math.inf


def test_csv_with_header_and_empty_cells(tmp_path):
    log = tmp_path / "metrics.csv"
    write(log, "step,train_loss,val_loss\n1,2.0,\n2,1.8,2.1\n3,oops,\n4,1.6\n")
    batch = LogFile(log, "r").read()
    assert values(batch, "train/loss") == [(1, 2.0), (2, 1.8)]
    assert values(batch, "eval/loss") == [(2, 2.1)]
    assert batch.skipped_values == 1
    assert batch.malformed == [(5, "2 fields, the header has 3")]
    write(log, "5,1.5,1.9\n")
    more = LogFile(log, "r").read(batch.cursor)
    assert values(more, "train/loss") == [(5, 1.5)]


def test_truncated_file_is_read_again_with_a_notice(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, "".join(f'{{"step": {i}, "loss": 1}}\n' for i in range(1, 50)))
    first = LogFile(log, "r").read()
    write(log, '{"step": 1, "loss": 5}\n', mode="w")
    second = LogFile(log, "r").read(first.cursor)
    assert second.notices and "reading it again from the start" in second.notices[0]
    assert values(second, "train/loss") == [(1, 5.0)]


def test_replaced_file_with_other_content_is_read_from_the_start(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, '{"step": 1, "loss": 1}\n')
    first = LogFile(log, "r").read()
    rotated = tmp_path / "new.jsonl"
    write(rotated, '{"step": 2, "loss": 0.9}\n{"step": 3, "loss": 0.8}\n')
    os.replace(rotated, log)
    second = LogFile(log, "r").read(first.cursor)
    assert "replaced by another file" in second.notices[0]
    assert [s for s, _ in values(second, "train/loss")] == [2, 3]


def test_a_copy_of_the_same_log_is_read_on_from_the_offset(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, "".join(f'{{"step": {i}, "loss": 1}}\n' for i in range(1, 400)))
    first = LogFile(log, "r").read()
    copy = tmp_path / "synced.jsonl"  # rsync writes a new file and renames it over the old
    copy.write_bytes(log.read_bytes() + b'{"step": 400, "loss": 0.5}\n')
    os.replace(copy, log)
    second = LogFile(log, "r").read(first.cursor)
    assert second.notices == []
    assert values(second, "train/loss") == [(400, 0.5)]


def test_final_read_takes_a_last_line_without_newline(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9}')
    assert len(LogFile(log, "r").read().points) == 1
    assert values(LogFile(log, "r").read(final=True), "train/loss") == [(1, 2.0), (2, 1.9)]


def test_step_and_time_keys_go_through_the_alias_table(tmp_path):
    log = tmp_path / "trainer_log.jsonl"
    write(log, '{"current_steps": 5, "loss": 1.2, "timestamp": 1700000000}\n'
               '{"it": 6, "loss": 1.1}\n')
    batch = LogFile(log, "r", AliasTable({"it": "step"})).read()
    assert values(batch, "train/loss") == [(5, 1.2), (6, 1.1)]
    assert batch.points["wall_time"].iloc[0] == 1700000000.0
    assert math.isnan(batch.points["wall_time"].iloc[1])


def test_checkpoints_from_folders_and_events(tmp_path):
    run = tmp_path / "exp1"
    run.mkdir()
    (run / "checkpoint-100").mkdir()
    (run / "checkpoint-200").mkdir()
    (run / "checkpoint-x").mkdir()
    write(run / "metrics.jsonl", '{"step": 250, "event": "checkpoint", "path": "ck-250"}\n')
    batch = LogFile(run / "metrics.jsonl", "exp1").read()
    assert [c.step for c in batch.checkpoints] == [100, 200, 250]
    assert batch.checkpoints[-1].path == str(run / "ck-250")
    assert len(batch.points) == 0


def test_meta_line_sets_total_steps(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, json.dumps({"meta": {"total_steps": 300, "config": {"lr": 0.003}}}) + "\n")
    assert LogFile(log, "r").read().meta == {"total_steps": 300, "config": {"lr": 0.003}}


def test_directory_discovers_runs_as_they_appear(tmp_path):
    watched = LogDirectory(tmp_path / "runs")
    with pytest.raises(SourceMissing):
        watched.discover()
    (tmp_path / "runs").mkdir()
    assert watched.discover() == []
    write(tmp_path / "runs" / "flat.jsonl", '{"step": 1, "loss": 1}\n')
    (tmp_path / "runs" / "exp2").mkdir()
    write(tmp_path / "runs" / "exp2" / "metrics.jsonl", '{"step": 1, "loss": 1}\n')
    (tmp_path / "runs" / "empty").mkdir()
    assert sorted(f.run for f in watched.discover()) == ["exp2", "flat"]


def test_open_source_rejects_unknown_formats(tmp_path):
    other = tmp_path / "events.bin"
    other.write_bytes(b"\x00")
    with pytest.raises(ValueError, match="unsupported log format"):
        open_source(other)
    assert isinstance(open_source(tmp_path), LogDirectory)
    assert open_source(tmp_path / "x.jsonl").run == "x"
    assert open_source(tmp_path / "exp3" / "metrics.jsonl").run == "exp3"
    named = open_source(tmp_path / "exp4", run="exp4")  # its log may appear later
    assert (named.run, named.path.name) == ("exp4", "metrics.jsonl")


def test_registry_knows_paths_and_rejects_unknown_schemes(tmp_path):
    from connectors.registry import open_source as open_uri

    assert isinstance(open_uri(str(tmp_path)), LogDirectory)
    assert open_uri(f"file://{tmp_path / 'a.jsonl'}").run == "a"
    with pytest.raises(ValueError, match=r"unknown source scheme 'ftp://'.*known schemes: file://"):
        open_uri("ftp://host/x")
