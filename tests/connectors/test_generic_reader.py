"""Any text log with numbers (the generic ``key value`` reader), runs exported one CSV per
metric, and files that are only partly readable: each on small samples written here, with the
exact points expected."""

import math

import pytest

from connectors.files import LogDirectory, LogFile, MetricCsvFolder, open_source
from connectors.formats import KEY_VALUE, LinePattern, sniff


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(path, "ab") as handle:
        handle.write(data)
    return path


def read(path, cursor=None, final=True):
    source = LogFile(path, "r")
    return source, source.read(cursor, final=final)


def values(batch, tag):
    rows = batch.points[batch.points["tag"] == tag]
    return [(int(s), pytest.approx(v)) for s, v in zip(rows["step"], rows["value"], strict=True)]


def points(batch):
    return sorted((int(s), t, v) for s, t, v in
                  batch.points[["step", "tag", "value"]].itertuples(index=False))


@pytest.mark.parametrize(("lines", "expected"), [
    (["step 710 | loss 4.5123 | lm 4.49 | ppl 89.1 | lr 3.0e-04 | tok/s 512"],
     [(710, "lm", 4.49), (710, "lr", 3e-4), (710, "perplexity", 89.1),
      (710, "throughput", 512.0), (710, "train/loss", 4.5123)]),
    (["iter 100: loss 4.2, lr 1e-3, time 35ms", "iter 200: loss 4.0, lr 1e-3, time 36ms"],
     [(100, "lr", 1e-3), (100, "time_ms", 35.0), (100, "train/loss", 4.2),
      (200, "lr", 1e-3), (200, "time_ms", 36.0), (200, "train/loss", 4.0)]),
    (["global_step=20 loss=3.1 grad_norm=0.9"],
     [(20, "grad_norm", 0.9), (20, "train/loss", 3.1)]),
    (["step: 5, loss: 2.5, learning rate: 1e-4"],
     [(5, "lr", 1e-4), (5, "train/loss", 2.5)]),
    (["Step 30/500 - train loss: 1.25 - val loss: 1.5"],
     [(30, "eval/loss", 1.5), (30, "train/loss", 1.25)]),
    (["2025-01-02 03:04:05 INFO epoch 1 global_step 900 step 3 loss 0.5 dt 5.2 ms"],
     [(900, "dt", 5.2), (900, "epoch", 1.0), (900, "train/loss", 0.5)]),
    (["[it 7] loss nan | tok/s 8,949"],
     [(7, "throughput", 8949.0), (7, "train/loss", math.nan)]),
    (["epoch 001:    100 / 500 loss=3.1, ppl=8.6, gnorm=0.7, tok/sec=1200, num_updates=100"],
     [(100, "epoch", 1.0), (100, "grad_norm", 0.7), (100, "perplexity", 8.6),
      (100, "throughput", 1200.0), (100, "train/loss", 3.1)]),
    (["iteration: 10 / 100 | consumed_tokens: 1.31M | elapsed_time_per_iteration_ms: 1.2K | "
      "tokens_per_sec: 1.1M | lm_loss: 10.2 | grad_norm: 0.57"],
     [(10, "consumed_tokens", 1.31e6), (10, "elapsed_time_per_iteration_ms", 1200.0),
      (10, "grad_norm", 0.57), (10, "throughput", 1.1e6), (10, "train/loss", 10.2)]),
], ids=["pipes", "colon", "equals", "key-colon", "dashes", "prose-around", "nan-thousands",
        "fairseq-ish", "nanotron-scales"])
def test_generic_layouts(tmp_path, lines, expected):
    source, batch = read(write(tmp_path / "train.log", "\n".join(lines) + "\n"))
    assert batch.cursor["state"]["family"] == KEY_VALUE
    got = points(batch)
    assert [(s, t) for s, t, _ in got] == [(s, t) for s, t, _ in expected]
    for (_, _, value), (_, _, want) in zip(got, expected, strict=True):
        assert value == pytest.approx(want, nan_ok=True)
    assert batch.malformed == []


def test_generic_reads_the_total_and_the_time(tmp_path):
    _, batch = read(write(tmp_path / "train.log",
                          "2025-01-02 03:04:05 step 710/5000 | loss 4.5\n"
                          "2025-01-02 03:04:15 step 720/5000 | loss 4.4\n"))
    assert batch.meta["total_steps"] == 5000
    walls = sorted(set(batch.points["wall_time"]))
    assert walls[1] - walls[0] == 10


def test_steps_that_restart_every_epoch_are_numbered_on(tmp_path):
    log = write(tmp_path / "train.log", "".join(
        f"Epoch {e}/3, Step {s}/200, Loss: {3 - e - s / 1000}\n"
        for e in (1, 2) for s in (100, 200)))
    source, first = read(log, final=False)
    assert values(first, "train/loss") == [(100, 1.9), (200, 1.8), (300, 0.9), (400, 0.8)]
    assert "total_steps" not in first.meta  # 200 is an epoch's
    write(log, "Epoch 3/3, Step 100/200, Loss: 0.5\n")
    assert points(source.read(first.cursor)) == [(500, "Epoch", 3.0), (500, "train/loss", 0.5)]
    resumed = write(tmp_path / "resumed.log", "Epoch 1, Step 300/500, Loss: 2\n"
                                              "Epoch 1, Step 200/500, Loss: 2.1\n")
    assert values(read(resumed)[1], "train/loss") == [(300, 2.0), (200, 2.1)]  # a resume


def test_generic_reads_on_from_its_cursor(tmp_path):
    log = write(tmp_path / "train.log", "booting\nstep 1 | loss 2.0\n")
    source, first = read(log, final=False)
    write(log, "step 2 | loss 1.5\nstep 3 | lo")
    second = source.read(first.cursor)
    assert points(second) == [(2, "train/loss", 1.5)]
    write(log, "ss 1.0\n")
    assert points(source.read(second.cursor)) == [(3, "train/loss", 1.0)]


def test_a_trainers_own_format_wins_over_the_generic_reader(tmp_path):
    """A config line the generic reader could take comes first; nanoGPT's lines decide."""
    nanogpt = "iter 10: loss 2.1, time 30.0ms\niter 20: loss 2.0, time 30.5ms\n"
    alone = read(write(tmp_path / "a.log", nanogpt))[1]
    behind = read(write(tmp_path / "b.log", "resume: step 0 | lr 3e-4\n" + nanogpt))[1]
    assert behind.cursor["state"]["family"] == "nanogpt"
    assert points(behind) == points(alone)


def test_the_generic_family_name_is_reserved():
    with pytest.raises(ValueError, match="generic reader"):
        LinePattern(KEY_VALUE, r"x (?P<step>\d+)")


def test_colour_codes_and_progress_bars(tmp_path):
    log = write(tmp_path / "train.log",
                "\x1b[32mstep 1\x1b[0m | loss \x1b[1m2.0\x1b[0m\n"
                " 10%|#  | 1/10 [00:01<00:09, 1.2it/s]\r 20%|## | 2/10 [00:02<00:08, 1.2it/s, "
                "step=2, loss=1.8]\r\n")
    assert points(read(log)[1]) == [(1, "train/loss", 2.0), (2, "train/loss", 1.8)]


# -- half-readable files ----------------------------------------------------------------------
def test_a_training_script_printed_before_the_log_is_not_read(tmp_path):
    script = ("import torch\nmax_iters = 5000\nfor it in range(max_iters):\n"
              "    if it % 100 == 0:\n        print(f'step {it} | loss {loss:.4f}')\n"
              "    lr = 3e-4 * min(1, it / 100)\n")
    log = write(tmp_path / "train.log", script + "step 100 | loss 3.5\nstep 200 | loss 3.1\n")
    assert points(read(log)[1]) == [(100, "train/loss", 3.5), (200, "train/loss", 3.1)]


def test_a_long_banner_before_the_first_metric_line_still_makes_a_run(tmp_path):
    """Megatron-DeepSpeed prints some 300 KB of arguments and model before iteration 1."""
    banner = "".join(f"  argument_{i} .................. {i}\n" for i in range(8000))
    write(tmp_path / "runs" / "exp.log", banner + "iter 1: loss 2.5, time 5.0ms\n")
    [reader] = LogDirectory(tmp_path / "runs").discover()
    assert points(reader.read(final=True))[-1] == (1, "train/loss", 2.5)


def test_nul_padding_is_counted_and_the_text_around_it_read(tmp_path):
    log = write(tmp_path / "train.log",
                b"\x00" * 64 + b"\nstep 1 | loss 2.0\n" + b"\x00" * 5000 + b"\nstep 2 | loss 1.5\n")
    _, batch = read(log)
    assert points(batch) == [(1, "train/loss", 2.0), (2, "train/loss", 1.5)]
    assert [n for n, _ in batch.malformed] == [1, 3]
    assert "NUL" in batch.malformed[0][1]
    jsonl = write(tmp_path / "m.jsonl", b'{"step": 1, "loss": 2.0}\n\x00\x00\x00\n')
    assert sniff(jsonl.name, jsonl.read_bytes()) is not None
    assert points(read(jsonl)[1]) == [(1, "train/loss", 2.0)]
    assert sniff("events.out.tfevents.1", b"\x00\x01\x02\x08\x12binary") is None


def test_a_header_then_prose_gives_the_rows_and_counts_the_rest(tmp_path):
    log = write(tmp_path / "metrics.csv",
                "step,loss\n1,2.0\n2,1.8\nTraceback (most recent call last):\n"
                "  File train.py, line 3, in <module>\nRuntimeError: CUDA out of memory\n")
    _, batch = read(log)
    assert points(batch) == [(1, "train/loss", 2.0), (2, "train/loss", 1.8)]
    assert [n for n, _ in batch.malformed] == [4, 5, 6]


def test_a_file_runwatch_cannot_read_gets_one_line_saying_what_to_do(tmp_path):
    _, batch = read(write(tmp_path / "notes.txt", "hello\nthe loss went down\n"))
    [notice] = batch.notices
    assert "\n" not in notice
    for said in ("unsupported log format", "JSON lines", "nanogpt", "'key value' lines",
                 "[[patterns]]", "(?P<step>"):
        assert said in notice
    binary = write(tmp_path / "metrics.parquet", b"PAR1\x00\x01\x02\x03")
    with pytest.raises(ValueError, match="unsupported log format") as caught:
        open_source(binary)
    assert "\n" not in str(caught.value) and "[[patterns]]" in str(caught.value)


# -- one CSV per metric -----------------------------------------------------------------------
def export(path, rows):
    return write(path, "Wall time,Step,Value\n"
                 + "".join(f"{1700000000 + s},{s},{v}\n" for s, v in rows))


def test_one_csv_per_metric_is_one_run_with_every_tag(tmp_path):
    export(tmp_path / "runs" / "exp1" / "train_loss.csv", [(0, 2.0), (10, 1.5), (20, 1.2)])
    export(tmp_path / "runs" / "exp1" / "val_loss.csv", [(10, 1.7), (20, 1.9)])
    [reader] = LogDirectory(tmp_path / "runs").discover()
    assert isinstance(reader, MetricCsvFolder) and reader.run == "exp1"
    batch = reader.read(final=True)
    assert list(batch.points["step"]) == sorted(batch.points["step"])  # no false restart
    assert points(batch) == [(0, "train/loss", 2.0), (10, "eval/loss", 1.7),
                             (10, "train/loss", 1.5), (20, "eval/loss", 1.9),
                             (20, "train/loss", 1.2)]
    again = reader.read(batch.cursor, final=True)
    assert again.points.empty and again.cursor == batch.cursor
    export(tmp_path / "runs" / "exp1" / "val_loss.csv", [(30, 2.2)])
    assert points(reader.read(batch.cursor, final=True)) == [(30, "eval/loss", 2.2)]
    named = open_source(tmp_path / "runs" / "exp1", run="mine")
    assert isinstance(named, MetricCsvFolder) and len(points(named.read(final=True))) == 6


def test_tensorboard_exports_of_two_runs_in_one_folder_are_two_runs(tmp_path):
    for run in ("a", "b"):
        export(tmp_path / f"run-{run}-tag-train_loss.csv", [(1, 2.0)])
        export(tmp_path / f"run-{run}-tag-val_loss.csv", [(1, 2.5)])
    export(tmp_path / "run-c-tag-loss.csv", [(1, 3.0)])  # one file alone stays a file
    runs = {r.run: r for r in LogDirectory(tmp_path).discover()}
    assert sorted(runs) == ["a", "b", "run-c-tag-loss"]
    assert {t for _, t, _ in points(runs["a"].read(final=True))} == {"train/loss", "eval/loss"}


def test_wandb_chart_exports_of_one_run_are_one_run(tmp_path):
    """W&B names its downloads after the time; the run is in the columns."""
    for name, metric, rows in (("wandb_export_1.csv", "train/loss", "1,2.0,1.9,2.1\n2,1.8,,\n"),
                               ("wandb_export_2.csv", "eval/loss", "2,2.2,2.1,2.3\n")):
        write(tmp_path / "exp" / name,
              f'"Step","exp1 - {metric}","exp1 - {metric}__MIN","exp1 - {metric}__MAX"\n' + rows)
    [reader] = LogDirectory(tmp_path).discover()
    assert isinstance(reader, MetricCsvFolder) and reader.run == "exp"
    assert points(reader.read(final=True)) == [(1, "train/loss", 2.0), (2, "eval/loss", 2.2),
                                               (2, "train/loss", 1.8)]


def test_ppo_names_map_to_the_rl_tags_the_analyzers_read():
    """DeepSpeed-Chat, TRL and OpenRLHF name the actor and critic losses and the reward
    their own way; divergence and reward_collapse read the canonical tags."""
    from connectors.aliases import AliasTable

    table = AliasTable()
    assert [table.canonical(n) for n in ("act_loss", "ppo/loss/policy", "cri_loss",
                                         "ppo/loss/value", "average reward score",
                                         "objective/scores")] == [
        "policy/loss", "policy/loss", "critic/loss", "critic/loss", "reward", "reward"]


def test_ppl_and_perplexity_are_one_metric():
    """A log, a label or a question that says ``ppl`` and one that says ``Perplexity`` mean
    the same series (the eval's own spellings are the eval perplexity)."""
    from connectors.aliases import AliasTable

    table = AliasTable()
    assert {table.canonical(n) for n in ("ppl", "PPL", "Perplexity", "train/ppl")} == {
        "perplexity"}
    assert {table.canonical(n) for n in ("eval_ppl", "val_ppl", "eval/ppl",
                                         "eval_perplexity")} == {"eval/perplexity"}


# -- a framework's log with the trainer's own lines between its lines --------------------------
def test_lines_a_recognised_family_has_no_pattern_for_are_read_generically(tmp_path):
    """DeepSpeed's engine lines decide the family; the example's own eval prints (their own
    step counter, twice DeepSpeed's) and ``Step at N with Perplexity`` lines are read too,
    and the two counters interleaving is no rewind."""
    engine = "[2022-11-24 00:51:45,965] [INFO] [logging.py:68:log_dist] [Rank 0] " \
             "step={}, skipped=0, lr=[5e-05, 5e-05], mom=[(0.9, 0.999), (0.9, 0.999)]\n"
    lines = []
    for step in (0, 10, 20):
        lines += [engine.format(step // 2), engine.format(step // 2 + 1),
                  f"'step':{step}, 'ppl': {60 + step / 10}, 'seq_len': 256\n"]
    lines += ["[2022-11-24 00:52:01,000] [INFO] [unfused_optimizer.py:212:_update_scale] "
              "Grad overflow on iteration: 11\n",
              "Step at 30 with Perplexity: nan\n",
              "{'enabled': True, 'schedule_config': {'require_steps': 400, 'seq_per_step': 8}}\n"]
    source, batch = read(write(tmp_path / "train.log", "".join(lines)))
    assert batch.cursor["state"]["family"] == "megatron_deepspeed"
    # ``ppl`` and ``Perplexity`` are one metric (the alias table): one series
    *finite, (step, nan) = values(batch, "perplexity")
    assert finite == [(0, 60.0), (10, 61.0), (20, 62.0)]
    assert [s for s, _ in values(batch, "lr")] == [0, 1, 5, 6, 10, 11]
    assert step == 30 and math.isnan(nan.expected)
    tags = set(batch.points["tag"])
    assert not tags & {"unfused_optimizer.py", "require_steps", "schedule_config"}
    assert list(batch.points["step"]) == sorted(batch.points["step"])  # one attempt


def test_a_tag_going_back_is_still_a_rewind_when_another_counter_interleaves(tmp_path):
    from connectors.formats import Record, assemble

    out = assemble([Record(0, {"lr": 1.0}), Record(10, {"ppl": 60.0}), Record(5, {"lr": 1.0}),
                    Record(20, {"ppl": 61.0}), Record(15, {"ppl": 70.0}),
                    Record(16, {"ppl": 69.0})], None, {})
    assert [(s, t) for s, t, _, _ in out.rows] == [
        (0, "lr"), (5, "lr"), (10, "ppl"), (20, "ppl"), (15, "ppl"), (16, "ppl")]
