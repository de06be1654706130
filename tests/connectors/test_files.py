import json
import math
import os

import pytest

from connectors.aliases import AliasTable
from connectors.files import HfOutputDir, LogDirectory, LogFile, SourceMissing, open_source


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


# -- incremental reading of every kind -------------------------------------------------------
def test_a_text_log_remembers_its_family_and_step_between_reads(tmp_path):
    log = tmp_path / "train.log"
    write(log, "2025-12-27 21:59:12.287\thost:0\tolmo.train:990\tINFO\t[step=10/100,epoch=0]\n"
               "    train/CrossEntropyLoss=9.5\n")
    source = LogFile(log, "r")
    first = source.read()
    write(log, "    optim/total_grad_norm=2.5\n"
               "2025-12-27 21:59:30.001\thost:0\tolmo.train:990\tINFO\t[step=20/100,epoch=0]\n"
               "    train/CrossEntropyLoss=8.5\n")
    second = source.read(first.cursor)
    assert values(first, "train/loss") == [(10, 9.5)]
    assert values(second, "grad_norm") == [(10, 2.5)]
    assert values(second, "train/loss") == [(20, 8.5)]


def test_hf_console_steps_carry_on_across_reads(tmp_path):
    log = tmp_path / "train.log"
    bar = " {n}%|█         | {n}/100 [00:10<01:00,  1.50s/it]"
    write(log, "\r".join(bar.format(n=n) for n in range(11)) + "{'loss': 2.0}\n")
    source = LogFile(log, "r")
    first = source.read()
    write(log, "\r".join(bar.format(n=n) for n in range(11, 21)) + "{'loss': 1.5}\n"
               "{'eval_loss': 1.75}\n")
    second = source.read(first.cursor)
    assert values(first, "train/loss") == [(10, 2.0)]
    assert values(second, "train/loss") == [(20, 1.5)]
    assert values(second, "eval/loss") == [(20, 1.75)]


def test_a_poll_that_finds_nothing_new_parses_nothing(tmp_path, monkeypatch):
    import connectors.files as files

    log = tmp_path / "train.log"
    write(log, "s:1 trl:2.5\ns:2 trl:2.4\n")
    state = tmp_path / "trainer_state.json"
    write(state, json.dumps({"log_history": [{"step": 1, "loss": 2.0}]}))
    cursors = {p: LogFile(p, "r").read().cursor for p in (log, state)}

    def fail(*args, **kwargs):
        raise AssertionError("parsed although nothing changed")

    for name in ("assemble", "read_document", "sniff"):
        monkeypatch.setattr(files, name, fail)
    for path, cursor in cursors.items():
        again = LogFile(path, "r").read(cursor)
        assert again.cursor == cursor and len(again.points) == 0


def test_incremental_reads_only_parse_the_new_lines(tmp_path, monkeypatch):
    from connectors.formats import TextLines

    log = tmp_path / "main.log"
    write(log, "".join(f"s:{i} trl:{i}\n" for i in range(1000)))
    source = LogFile(log, "r")
    first = source.read()
    fed: list[int] = []
    real_feed = TextLines.feed
    monkeypatch.setattr(TextLines, "feed",
                        lambda self, line_no, text: fed.append(line_no) or real_feed(self, line_no,
                                                                                     text))
    write(log, "s:1000 trl:0.5\n")
    second = source.read(first.cursor)
    assert fed == [1001] and values(second, "train/loss") == [(1000, 0.5)]


def test_a_trainer_state_rewritten_with_more_history_gives_only_new_points(tmp_path):
    state = tmp_path / "trainer_state.json"
    history = [{"step": s, "loss": 3.0 - s / 100} for s in range(10, 110, 10)]
    write(state, json.dumps({"log_history": history[:5], "max_steps": 100}, indent=2), mode="w")
    source = LogFile(state, "out")
    first = source.read()
    write(state, json.dumps({"log_history": history, "max_steps": 100}, indent=2), mode="w")
    second = source.read(first.cursor)
    assert [s for s, _ in values(first, "train/loss")] == [10, 20, 30, 40, 50]
    assert [s for s, _ in values(second, "train/loss")] == [60, 70, 80, 90, 100]
    assert second.notices == []


def test_a_trainer_state_rewritten_from_an_earlier_step_is_a_rewind(tmp_path):
    state = tmp_path / "trainer_state.json"
    old = [{"step": s, "loss": 1.0} for s in range(1, 201)]
    write(state, json.dumps({"log_history": old}), mode="w")
    source = LogFile(state, "out")
    first = source.read()
    resumed = old[:150] + [{"step": s, "loss": 2.0} for s in range(151, 171)]
    write(state, json.dumps({"log_history": resumed}), mode="w")
    second = source.read(first.cursor)
    assert "rewritten from step 129" in second.notices[0]
    loss = values(second, "train/loss")
    # From the last digest block that still matched (entry 129): identical entries first,
    # then the resumed run's; all below the highest stored step, so a new attempt.
    assert loss[0] == (129, 1.0) and loss[-1] == (170, 2.0) and len(loss) == 42


def test_a_document_being_written_is_read_once_it_is_complete(tmp_path):
    state = tmp_path / "trainer_state.json"
    full = json.dumps({"log_history": [{"step": 1, "loss": 2.0}]})
    write(state, full[:20], mode="w")
    source = LogFile(state, "out")
    first = source.read()
    assert "not valid JSON" in first.malformed[0][1] and len(first.points) == 0
    assert source.read(first.cursor).malformed == []  # not counted again until it changes
    write(state, full, mode="w")
    assert values(source.read(first.cursor), "train/loss") == [(1, 2.0)]


# -- bad input -------------------------------------------------------------------------------
def test_bom_and_crlf(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_bytes(b'\xef\xbb\xbf{"step": 1, "loss": 2.0}\r\n{"step": 2, "loss": 1.5}\r\n')
    csv_log = tmp_path / "b.csv"
    csv_log.write_bytes(b"\xef\xbb\xbfstep,loss\r\n1,2.0\r\n2,1.5\r\n")
    text = tmp_path / "c.log"
    text.write_bytes(b"\xef\xbb\xbfiter 1: loss 2.0, time 5.0ms\r\n"
                     b"iter 2: loss 1.5, time 5.0ms\r\n")
    for log in (jsonl, csv_log, text):
        batch = LogFile(log, "r").read()
        assert values(batch, "train/loss") == [(1, 2.0), (2, 1.5)], log.name
        assert batch.malformed == []


def test_a_partial_text_line_waits_for_its_newline(tmp_path):
    log = tmp_path / "main.log"
    write(log, "s:1 trl:2.5\ns:2 tr")
    first = LogFile(log, "r").read()
    write(log, "l:2.25\n")
    second = LogFile(log, "r").read(first.cursor)
    assert values(first, "train/loss") == [(1, 2.5)]
    assert values(second, "train/loss") == [(2, 2.25)]


def test_mixed_types_and_negative_steps(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, '{"step": "1", "loss": "2.5", "lr": true, "tags": [1]}\n'
               '{"step": -3, "loss": 1.0}\n{"step": 2.5, "loss": 1.0}\n{"step": 2.0, "loss": 1}\n')
    batch = LogFile(log, "r").read()
    assert values(batch, "train/loss") == [(1, 2.5), (2, 1.0)]
    assert [line for line, _ in batch.malformed] == [2, 3]
    assert batch.skipped_values == 2


def test_unsorted_and_duplicate_steps_do_not_look_like_a_rewind(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, "".join(json.dumps({"step": s, "loss": v}) + "\n"
                       for s, v in [(1, 3.0), (2, 2.0), (4, 1.5), (3, 1.75), (5, 1.25),
                                    (4, 1.5), (5, 1.25), (6, 1.0), (6, 0.9)]))
    batch = LogFile(log, "r").read()
    assert values(batch, "train/loss") == [(1, 3.0), (2, 2.0), (3, 1.75), (4, 1.5),
                                           (5, 1.25), (6, 0.9)]
    assert "kept once" in batch.notices[0]


def test_a_rewind_stays_after_the_earlier_points(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 6)))
    first = LogFile(log, "r").read()
    write(log, "".join(json.dumps({"step": s, "loss": 2.0}) + "\n" for s in range(3, 8)))
    second = LogFile(log, "r").read(first.cursor)
    assert [s for s, _ in values(second, "train/loss")] == [3, 4, 5, 6, 7]


def test_an_unreadable_file_raises_a_clear_error(tmp_path, monkeypatch):
    from pathlib import Path

    log = tmp_path / "m.jsonl"
    write(log, '{"step": 1, "loss": 1}\n')
    real_open = Path.open

    def denied(self, *args, **kwargs):
        if self == log:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(PermissionError, match=r"m.jsonl: permission denied.*make it readable"):
        LogFile(log, "r").read()
    assert [r.run for r in LogDirectory(tmp_path).discover()] == ["m"]  # listed, so it is told


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_file_on_disk(tmp_path):
    log = tmp_path / "m.jsonl"
    write(log, '{"step": 1, "loss": 1}\n')
    log.chmod(0)
    with pytest.raises(PermissionError, match="permission denied"):
        LogFile(log, "r").read()


def test_a_binary_file_in_place_of_a_log_is_reported_once(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"\x00\x01\x02 not text")
    first = LogFile(log, "r").read()
    assert "unsupported log format" in first.notices[0] and "binary" in first.notices[0]
    assert LogFile(log, "r").read(first.cursor).notices == []


# -- finding runs ----------------------------------------------------------------------------
def trainer_state(path, steps):
    path.parent.mkdir(parents=True, exist_ok=True)
    write(path, json.dumps({"log_history": [{"step": s, "loss": 1.0 / s} for s in steps],
                            "max_steps": 100}), mode="w")


def test_a_folder_of_any_format_is_found(tmp_path):
    root = tmp_path / "runs"
    trainer_state(root / "hf_run" / "checkpoint-10" / "trainer_state.json", [5, 10])
    (root / "hf_run" / "config.json").write_text('{"hidden_size": 8}')
    for version in (0, 1):
        folder = root / "lightning_logs" / f"version_{version}"
        folder.mkdir(parents=True)
        write(folder / "metrics.csv", "epoch,step,train_loss_step\n0,9,1.5\n")
    (root / "multi").mkdir()
    write(root / "multi" / "pretrain.log", "s:1 trl:2.0\n")
    write(root / "multi" / "finetune.jsonl", '{"step": 1, "loss": 1.0}\n')
    write(root / "manifest.csv", "file,licence,points\na.log,MIT,5\nb.log,none,7\n")
    write(root / "notes.txt", "nothing to see here\n")
    write(root / "stdout.txt", "booting\niter 1: loss 2.5, time 5.0ms\n")
    found = {r.run: r for r in LogDirectory(root).discover()}
    assert sorted(found) == ["hf_run", "lightning_logs/version_0", "lightning_logs/version_1",
                             "multi/finetune", "multi/pretrain", "stdout"]
    assert isinstance(found["hf_run"], HfOutputDir)
    assert values(found["hf_run"].read(), "train/loss") == [(5, 0.2), (10, 0.1)]
    assert found["lightning_logs/version_0"].discover_checkpoints
    assert not found["multi/pretrain"].discover_checkpoints


def test_a_line_log_beside_a_trainer_state_is_the_run(tmp_path):
    out = tmp_path / "out"
    trainer_state(out / "trainer_state.json", [5])
    write(out / "trainer_log.jsonl", '{"current_steps": 5, "loss": 0.2}\n')
    (found,) = LogDirectory(tmp_path).discover()
    assert (found.run, found.path.name) == ("out", "trainer_log.jsonl")
    named = open_source(out, run="mine")
    assert named.path.name == "trainer_log.jsonl"


def test_discovery_keeps_readers_and_picks_up_new_runs(tmp_path):
    watched = LogDirectory(tmp_path)
    write(tmp_path / "a.jsonl", '{"step": 1, "loss": 1}\n')
    (first,) = watched.discover()
    write(tmp_path / "b.log", "loading\n")
    assert watched.discover() == [first]  # no pattern matched yet
    write(tmp_path / "b.log", "iter 1: loss 2.5, time 5.0ms\n")
    assert [r.run for r in watched.discover()] == ["a", "b"]
    assert watched.discover()[0] is first


def test_hf_output_dir_follows_the_newest_checkpoint(tmp_path):
    from connectors.hf import open_source as open_hf

    out = tmp_path / "out"
    trainer_state(out / "checkpoint-10" / "trainer_state.json", [5, 10])
    (out / "runs").mkdir()
    source = open_hf(str(out))
    assert (source.run, source.uri, source.discover()) == ("out", f"hf://{out}", [source])
    first = source.read()
    trainer_state(out / "checkpoint-20" / "trainer_state.json", [5, 10, 15, 20])
    os.utime(out / "checkpoint-20" / "trainer_state.json", (2e9, 2e9))
    second = source.read(first.cursor)
    assert [s for s, _ in values(first, "train/loss")] == [5, 10]
    assert [s for s, _ in values(second, "train/loss")] == [15, 20]
    assert [c.step for c in second.checkpoints] == [10, 20]
    assert first.meta["total_steps"] == 100


def test_hf_scheme_through_the_registry(tmp_path):
    from connectors.registry import open_source as open_uri

    trainer_state(tmp_path / "out" / "trainer_state.json", [1])
    assert isinstance(open_uri(f"hf://{tmp_path / 'out'}"), HfOutputDir)
    single = open_uri(f"hf://{tmp_path / 'out' / 'trainer_state.json'}")
    assert (single.run, values(single.read(), "train/loss")) == ("out", [(1, 1.0)])
    missing = open_uri(f"hf://{tmp_path / 'later'}")
    with pytest.raises(SourceMissing):
        missing.discover()


def test_open_source_sniffs_content_not_suffix(tmp_path):
    keras = tmp_path / "training.log"
    write(keras, "epoch,loss\n0,1.5\n")
    assert open_source(keras).run == tmp_path.name  # training.log says nothing of the run
    config = tmp_path / "config.json"
    write(config, '{"hidden_size": 8}')
    with pytest.raises(ValueError, match="unsupported log format"):
        open_source(config)
    parquet = tmp_path / "metrics.parquet"
    parquet.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match="unsupported log format"):
        open_source(parquet)
    slurm = tmp_path / "job"
    write(slurm, "srun: starting\niter 1: loss 2.5, time 5.0ms\n")
    assert values(open_source(slurm).read(), "train/loss") == [(1, 2.5)]
    assert open_source(tmp_path / "later.log").run == "later"
    state = tmp_path / "ckpt" / "checkpoint-5" / "trainer_state.json"
    trainer_state(state, [5])
    assert open_source(state).run == "ckpt"


def test_control_files_beside_a_log_are_not_runs(tmp_path):
    from connectors.training.control import ControlAck, ControlRequest, write_request
    from connectors.training.control import _write_json_atomic as write_json

    run = tmp_path / "exp1"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    write_request(run, ControlRequest("r1", "stop"))
    write_json(run / "runwatch-control.ack.json", ControlAck("r1", "stop", "done", 1).to_json())
    assert [r.run for r in LogDirectory(tmp_path).discover()] == ["exp1"]


def test_a_folder_linked_into_itself_is_one_run_per_real_file(tmp_path):
    """``ln -s . runs/loop`` made phantom runs ``loop/x`` and ``loop/loop/x`` that shared
    x's cursor and took some of its points."""
    runs = tmp_path / "runs"
    (runs / "x").mkdir(parents=True)
    write(runs / "x" / "metrics.jsonl", '{"step": 1, "loss": 1}\n')
    write(runs / "flat.jsonl", '{"step": 1, "loss": 1}\n')
    os.symlink(".", runs / "loop")
    os.symlink("flat.jsonl", runs / "same.jsonl")  # a second name for one file
    (runs / "deeper").mkdir()
    os.symlink("..", runs / "deeper" / "up")
    found = LogDirectory(runs).discover()
    assert sorted(r.run for r in found) == ["flat", "x"]
    assert len({r.key for r in found}) == 2


def test_a_file_symlink_loop_is_a_run_that_says_what_is_wrong(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    os.symlink("b.log", runs / "a.log")
    os.symlink("a.log", runs / "b.log")
    write(runs / "ok.jsonl", '{"step": 1, "loss": 1}\n')
    found = {r.run: r for r in LogDirectory(runs).discover()}
    assert sorted(found) == ["a", "b", "ok"]
    with pytest.raises(OSError, match="symbolic link loop.*remove the link or point it at"):
        found["a"].read()
