"""Every format runwatch reads, on a small sample written here, with the exact points expected;
then the real logs in ``../shared/corpus`` (skipped when it is absent)."""

import csv
import json
import math

import pytest

from connectors.aliases import AliasTable
from connectors.files import LogFile, open_source
from connectors.formats import LinePattern, Record, assemble, sniff
from tests.corpus import CORPUS


def write(path, text, mode="a"):
    with open(path, mode, newline="") as handle:
        handle.write(text)
    return path


def values(batch, tag):
    rows = batch.points[batch.points["tag"] == tag]
    return list(zip(rows["step"], rows["value"], strict=True))


def read(path, *, patterns=(), final=True, cursor=None):
    source = LogFile(path, "r", patterns=patterns)
    batch = source.read(cursor, final=final)
    return source, batch


# -- JSON lines -------------------------------------------------------------------------------
def test_llamafactory_trainer_log(tmp_path):
    log = write(tmp_path / "trainer_log.jsonl",
                '{"current_steps": 5, "total_steps": 20, "loss": 2.3, "lr": 1e-06, "epoch": 0.1, '
                '"percentage": 25.0, "elapsed_time": "0:32:48", "remaining_time": "9 days, 1:00"}\n'
                '{"current_steps": 10, "total_steps": 20, "loss": 2.1, "lr": 2e-06, "epoch": 0.2, '
                '"percentage": 50.0, "elapsed_time": "1:05:36", "remaining_time": "0:30:00"}\n')
    source, batch = read(log)
    assert source.format == "llamafactory_jsonl"
    assert values(batch, "train/loss") == [(5, 2.3), (10, 2.1)]
    assert values(batch, "lr") == [(5, 1e-06), (10, 2e-06)]
    assert batch.meta == {"total_steps": 20}
    assert batch.skipped_values == 0 and set(batch.points["tag"]) == {"train/loss", "lr", "epoch"}


def test_a_step_beyond_what_sqlite_stores_is_a_malformed_line(tmp_path):
    """Step 1e30 is a whole number, but no 64-bit integer: storing it crashed the whole
    batch (sqlite3 OverflowError). It is counted and skipped like any bad step."""
    log = write(tmp_path / "run.jsonl", '{"step": 1, "loss": 2.0}\n{"step": 1e30, "loss": 2.0}\n'
                                        '{"step": 3, "loss": 1.9}\n')
    _, batch = read(log)
    assert values(batch, "train/loss") == [(1, 2.0), (3, 1.9)]
    assert batch.malformed == [(2, "step 1e+30 is not a non-negative integer below 2**63")]


# -- CSV --------------------------------------------------------------------------------------
def test_keras_csvlogger_uses_the_epoch_as_step(tmp_path):
    log = write(tmp_path / "training.log", "epoch,accuracy,loss,val_accuracy,val_loss\n"
                                          "0,0.41,1.716,0.47,1.444\n1,0.46,1.526,0.36,7.417\n")
    source, batch = read(log)
    assert source.format == "keras_csv"
    assert values(batch, "train/loss") == [(0, 1.716), (1, 1.526)]
    assert values(batch, "eval/loss") == [(0, 1.444), (1, 7.417)]
    assert "epoch" not in set(batch.points["tag"])


def test_lightning_metrics_csv_with_sparse_cells(tmp_path):
    log = write(tmp_path / "metrics.csv",
                "epoch,step,train_acc,train_loss_epoch,train_loss_step,val_acc,val_loss\n"
                "0,9,,,1.67,,\n0,19,,,2.18,,\n0,19,,,,0.82,0.48\n0,19,0.73,0.77,,,\n"
                "1,29,,,1.26,,\n")
    source, batch = read(log)
    assert source.format == "lightning_csv"
    assert values(batch, "train/loss") == [(9, 1.67), (19, 2.18), (29, 1.26)]
    assert values(batch, "eval/loss") == [(19, 0.48)]
    assert values(batch, "train_loss_epoch") == [(19, 0.77)]


def test_tensorboard_csv_export_names_the_tag_after_the_file(tmp_path):
    log = write(tmp_path / "run-exp1-tag-train_loss.csv",
                "Wall time,Step,Value\n1700000000.5,10,2.5\n1700000010.25,20,2.25\n")
    source, batch = read(log)
    assert source.format == "tensorboard_csv"
    assert values(batch, "train/loss") == [(10, 2.5), (20, 2.25)]
    assert list(batch.points["wall_time"]) == [1700000000.5, 1700000010.25]


def test_wandb_csv_export_drops_the_min_max_bands(tmp_path):
    log = write(tmp_path / "wandb_export.csv",
                '"Step","fine-sun-3 - loss","fine-sun-3 - loss__MIN","fine-sun-3 - loss__MAX"\n'
                '"1","2.5","2.4","2.6"\n"2","2.25","2.2","2.3"\n')
    source, batch = read(log)
    assert source.format == "wandb_csv"
    assert values(batch, "train/loss") == [(1, 2.5), (2, 2.25)]
    assert set(batch.points["tag"]) == {"train/loss"}


def test_wandb_csv_export_of_several_runs_keeps_them_apart(tmp_path):
    log = write(tmp_path / "compare.csv", "Step,a - loss,b - loss\n1,2.5,3.5\n")
    _, batch = read(log)
    assert values(batch, "a - loss") == [(1, 2.5)] and values(batch, "b - loss") == [(1, 3.5)]


def test_csv_without_a_step_column_counts_rows(tmp_path):
    log = write(tmp_path / "sweep.csv", "lr_0.1,lr_0.01\n4.6,4.62\n4.39,4.23\n")
    source, batch = read(log)
    assert source.format == "csv"
    assert values(batch, "lr_0.1") == [(1, 4.6), (2, 4.39)]


def test_a_text_log_whose_first_line_has_a_comma_is_not_csv():
    head = b"2025-03-02 05:16:20,348 - INFO - ##### Epoch 1 #####\n" \
           b"2025-03-02 05:16:20,962 - INFO - Epoch 1 - Batch loss: 12.1336\n"
    assert sniff("train.log", head).name == "text"
    assert sniff("events.out.tfevents.1", b"\x00\x01binary") is None
    assert sniff("config.json", b'{"hidden_size": 768}') is None


# -- documents --------------------------------------------------------------------------------
def trainer_state(entries, **extra):
    return json.dumps({"global_step": entries[-1]["step"] if entries else 0,
                       "log_history": entries, "max_steps": 40, "logging_steps": 10, **extra},
                      indent=2, sort_keys=True)


def test_trainer_state_json(tmp_path):
    state = write(tmp_path / "trainer_state.json", trainer_state([
        {"epoch": 0.25, "grad_norm": 1.5, "learning_rate": 1e-4, "loss": 2.0, "step": 10},
        {"epoch": 0.5, "eval_loss": 2.2, "eval_runtime": 3.5, "step": 10},
        {"epoch": 0.5, "loss": 1.8, "step": 20},
        {"epoch": 0.5, "step": 20, "total_flos": 1e12, "train_loss": 1.9, "train_runtime": 50.0},
    ]))
    source, batch = read(state)
    assert source.format == "hf_trainer_state"
    assert values(batch, "train/loss") == [(10, 2.0), (20, 1.8)]
    assert values(batch, "eval/loss") == [(10, 2.2)]
    assert values(batch, "grad_norm") == [(10, 1.5)]
    assert batch.meta["total_steps"] == 40
    assert batch.meta["config"] == {"logging_steps": 10}
    assert batch.meta["summary"]["train_loss"] == 1.9  # the run's mean, not a point


def test_megatron_golden_values_nan_strings_are_gaps(tmp_path):
    golden = write(tmp_path / "golden_values_dev.json", json.dumps({
        "lm loss": {"start_step": 1, "end_step": 15, "step_interval": 5,
                    "values": {"1": 10.5, "5": 10.25, "10": "nan", "15": "nan"}},
        "iteration-time": {"start_step": 1, "end_step": 15, "step_interval": 5,
                           "values": {"1": "nan", "5": 1.5, "10": 1.25, "15": "nan"}}}))
    source, batch = read(golden)
    assert source.format == "megatron_golden_json"
    assert values(batch, "train/loss") == [(1, 10.5), (5, 10.25)]
    assert values(batch, "iteration-time") == [(5, 1.5), (10, 1.25)]
    assert batch.meta == {"total_steps": 15}


# -- text logs --------------------------------------------------------------------------------
MEGATRON = (" iteration      100/    1000 | consumed samples:        12800 | elapsed time per "
            "iteration (ms): 812.5 | learning rate: 3.000E-04 | global batch size:   128 | "
            "lm loss: {loss} | loss scale: 65536.0 | grad norm: 1.234 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |\n")


def test_megatron_lines(tmp_path):
    log = write(tmp_path / "train.log",
                "using world size: 8\n" + MEGATRON.format(loss="2.300000E+00")
                + "time (ms)\n"
                + MEGATRON.replace("100/", "110/").format(loss="nan")
                + " validation loss at iteration 110 | lm loss value: 2.250000E+00 | "
                  "lm loss PPL: 9.487736E+00 | \n")
    source, batch = read(log)
    assert source.format == "text" and batch.cursor["state"]["family"] == "megatron_deepspeed"
    loss = values(batch, "train/loss")
    assert loss[0] == (100, 2.3) and loss[1][0] == 110 and math.isnan(loss[1][1])
    assert values(batch, "lr") == [(100, 3e-4), (110, 3e-4)]
    assert values(batch, "grad_norm")[0] == (100, 1.234)
    assert values(batch, "iteration_time_ms")[0] == (100, 812.5)
    assert values(batch, "loss_scale")[0] == (100, 65536.0)
    assert values(batch, "eval/loss") == [(110, 2.25)]
    assert values(batch, "eval/perplexity") == [(110, 9.487736)]
    assert batch.meta == {"total_steps": 1000}


def test_deepspeed_lines(tmp_path):
    log = write(tmp_path / "ds.log",
                "***** Evaluating perplexity, Epoch 0/2 *****\nppl: 4998.25\n"
                "[2023-04-18 01:46:53,259] [INFO] [loss_scaler.py:181:update_scale] [deepspeed] "
                "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
                "[2023-04-18 01:46:59,142] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, "
                "skipped=6, lr=[9.5e-06, 9.5e-06], mom=[(0.9, 0.95), (0.9, 0.95)]\n"
                "[2023-04-18 01:46:59,171] [INFO] [timer.py:199:stop] epoch=0/micro_step=10/"
                "global_step=10, RunningAvgSamplesPerSec=173.4, CurrSamplesPerSec=171.5, "
                "MemAllocated=3.96GB, MaxMemAllocated=22.95GB\n"
                "***** Evaluating perplexity, Epoch 1/2 *****\nppl: 2.5\n")
    _, batch = read(log)
    assert values(batch, "eval/perplexity") == [(0, 4998.25), (10, 2.5)]
    assert values(batch, "overflow_loss_scale") == [(0, 32768.0)]
    assert values(batch, "lr") == [(10, 9.5e-06)]
    assert values(batch, "skipped_steps") == [(10, 6.0)]
    assert values(batch, "throughput") == [(10, 171.5)]
    assert values(batch, "gpu_mem") == [(10, 3.96)]
    step10 = batch.points[batch.points["step"] == 10]
    assert step10["wall_time"].iloc[0] == pytest.approx(1681782419.142)


def test_olmo_blocks_with_thousands_separators(tmp_path):
    log = write(tmp_path / "train.log",
                "2025-12-27 21:58:46.033\thost:0\tolmo.train:990\tINFO\tPre-train system metrics\n"
                "    System/Peak GPU Memory (MB)=173.0\n"
                "2025-12-27 21:59:12.287\thost:0\tolmo.train:990\tINFO\t[step=10/10000,epoch=0]\n"
                "    optim/total_grad_norm=6.914\n"
                "    train/CrossEntropyLoss=9.099\n"
                "    train/Perplexity=8,949\n"
                "    throughput/device/tokens_per_second=298,300\n"
                "    result = agent.run()\n")
    _, batch = read(log)
    assert values(batch, "gpu_mem_mb") == [(0, 173.0)]
    assert values(batch, "train/loss") == [(10, 9.099)]
    assert values(batch, "grad_norm") == [(10, 6.914)]
    assert values(batch, "train_perplexity") == [(10, 8949.0)]
    assert values(batch, "throughput") == [(10, 298300.0)]
    wall = batch.points[batch.points["step"] == 10]["wall_time"].iloc[0]
    assert wall == pytest.approx(1766872752.287)
    assert batch.meta == {"total_steps": 10000}


@pytest.mark.parametrize(("lines", "expected"), [
    ("iter 0: loss 10.9, time 120.5ms, mfu -100.00%\niter 10: loss 9.5, time 30.25ms, mfu 12.5%\n"
     "step 20: train loss 8.8, val loss 8.9\n",
     {"train/loss": [(0, 10.9), (10, 9.5)], "step_time_ms": [(0, 120.5), (10, 30.25)],
      "eval/loss": [(20, 8.9)], "train_loss_estimate": [(20, 8.8)]}),
    ("step    1/74 | train loss 11.009 | norm 15.37 | lr 6.00e-06 | 1245.14 ms | 421057 tok/s\n"
     "val loss 10.5\n",
     {"train/loss": [(1, 11.009)], "grad_norm": [(1, 15.37)], "lr": [(1, 6e-06)],
      "eval/loss": [(1, 10.5)]}),
    ("s:0 tel:11.0092\ns:0 trl:11.0091 lr:0.000001 norm:15.37\ns:1 trl:10.9598 lr:0.000002 "
     "norm:15.24\n",
     {"train/loss": [(0, 11.0091), (1, 10.9598)], "eval/loss": [(0, 11.0092)],
      "grad_norm": [(0, 15.37), (1, 15.24)]}),
    ("import torch\nprint0(f'step:{step}/{n} val_loss:{v:.4f}')\n"
     "step:0/6200 val_loss:10.9264 train_time:285ms step_avg:nanms\n"
     "step:1/6200 train_loss:10.9184 train_time:74701ms step_avg:nanms\n",
     {"eval/loss": [(0, 10.9264)], "train/loss": [(1, 10.9184)],
      "train_time_ms": [(0, 285.0), (1, 74701.0)]}),
])
def test_nanogpt_and_llmc_lines(tmp_path, lines, expected):
    _, batch = read(write(tmp_path / "main.log", lines))
    assert batch.cursor["state"]["family"] == "nanogpt"
    for tag, points in expected.items():
        assert values(batch, tag) == points, tag


def test_modded_nanogpt_nan_step_average_is_a_value(tmp_path):
    _, batch = read(write(tmp_path / "r.txt", "step:1/10 train_loss:10.9 train_time:7ms "
                                              "step_avg:nanms\n"))
    assert math.isnan(values(batch, "step_avg_ms")[0][1])


HF_BAR = " {pct:2d}%|█         | {n}/{total} [00:10<01:00,  1.50s/it]"


def test_hf_console_unbuffered_dicts_follow_the_progress_bar(tmp_path):
    bar = "\r".join(HF_BAR.format(pct=n, n=n, total=40) for n in range(0, 11))
    text = (f"{bar}{{'loss': 2.0, 'grad_norm': 1.5, 'learning_rate': 1e-04, 'epoch': 0.25}}\n"
            + "\r".join(HF_BAR.format(pct=n, n=n, total=40) for n in range(11, 21))
            + "{'loss': 1.8, 'grad_norm': nan, 'learning_rate': 2e-04, 'epoch': 0.5}\n"
            "\r  0%|          | 0/8 [00:00<?, ?it/s]\x1b[A\n"
            "\r100%|██████████| 8/8 [00:01<00:00,  5.1it/s]\x1b[A\n"
            "{'eval_loss': 2.2, 'eval_runtime': 1.5, 'epoch': 0.5}\n"
            "{'train_runtime': 50.0, 'train_loss': 1.9, 'epoch': 1.0}\n")
    source, batch = read(write(tmp_path / "train.log", text))
    assert batch.cursor["state"]["family"] == "hf_console"
    assert values(batch, "train/loss") == [(10, 2.0), (20, 1.8)]
    assert values(batch, "eval/loss") == [(20, 2.2)]
    assert math.isnan(values(batch, "grad_norm")[1][1])
    assert batch.meta == {"total_steps": 40}
    assert "train_runtime" not in set(batch.points["tag"])


def test_hf_console_buffered_dicts_come_in_bursts(tmp_path):
    """Under nohup the dicts (stdout) arrive in bursts after the bar (stderr) moved on."""
    bar = "\r".join(HF_BAR.format(pct=n, n=n, total=100) for n in range(0, 31))
    burst = "".join(f"{{'loss': {3 - i / 10}, 'epoch': {i / 10}}}\n" for i in range(1, 4))
    later = "\r".join(HF_BAR.format(pct=n, n=n, total=100) for n in range(31, 41))
    _, batch = read(write(tmp_path / "train.log",
                          f"{bar}{burst}{later}{{'loss': 2.6, 'epoch': 0.4}}\n"))
    assert values(batch, "train/loss") == [(10, 2.9), (20, 2.8), (30, 2.7), (40, 2.6)]


def test_hf_console_uses_the_logging_steps_it_printed(tmp_path):
    _, batch = read(write(tmp_path / "out.log",
                          "TrainingArguments(\nlogging_steps=5,\n)\n"
                          "{'loss': 2.0, 'epoch': 0.1}\n{'loss': 1.9, 'epoch': 0.2}\n"))
    assert values(batch, "train/loss") == [(5, 2.0), (10, 1.9)]


def test_hf_console_without_progress_counts_dicts(tmp_path):
    _, batch = read(write(tmp_path / "out.log", "{'loss': 2.0}\n{'loss': 1.9}\n"))
    assert values(batch, "train/loss") == [(1, 2.0), (2, 1.9)]


def test_python_logging_steps_restart_every_epoch(tmp_path):
    line = ("INFO:__main__:Epoch {e} | Step {s:4d}/100 | Loss: {loss} | PPL: 7.5 | "
            "LR: 3.27e-05 | Grad: 2.5 | Time: 0.5s\n")
    _, batch = read(write(tmp_path / "train.log", line.format(e=0, s=90, loss=1.5)
                          + "INFO:__main__:📊 Evaluation Results:\n"
                          + line.format(e=1, s=0, loss=1.25)))
    assert values(batch, "train/loss") == [(90, 1.5), (100, 1.25)]
    assert values(batch, "grad_norm") == [(90, 2.5), (100, 2.5)]
    assert values(batch, "step_time_s") == [(90, 0.5), (100, 0.5)]


def test_batch_loss_lines_count_steps_and_epoch_lines_join_the_last(tmp_path):
    _, batch = read(write(tmp_path / "train.log",
                          "2025-03-02 05:16:20,348 - INFO - ##### Epoch 1 #####\n"
                          "2025-03-02 05:16:20,962 - INFO - Epoch 1 - Batch loss: 12.5\n"
                          "2025-03-02 05:16:22,229 - INFO - Epoch 1 - Batch loss: 14.25\n"
                          "2025-03-02 05:24:38,655 - INFO - Epoch 1 - Average Train Loss: 13.0\n"
                          "2025-03-02 05:34:00,482 - INFO - Epoch 1 - Validation BLEU: BLEU-1 "
                          "71.65, BLEU-2 65.76, BLEU-3 46.57, BLEU-4 31.75\n"))
    assert values(batch, "train/loss") == [(1, 12.5), (2, 14.25)]
    assert values(batch, "train_loss_epoch") == [(2, 13.0)]
    assert values(batch, "eval/validation/bleu-4") == [(2, 31.75)]
    walls = batch.points[batch.points["tag"] == "train/loss"]["wall_time"]
    assert list(walls.diff().round(3).dropna()) == [1.267]


# -- user patterns ----------------------------------------------------------------------------
def test_user_patterns_extend_the_table_and_come_first(tmp_path):
    mine = LinePattern("mytrainer", r"^it=(?P<step>\d+)/(?P<total>\d+) (?P<ce>\S+)",
                       names={"ce": "train/loss"},
                       pairs=r"(?P<key>[a-z]+)=(?P<value>[-\d.e]+)(?=\s|$)")
    log = write(tmp_path / "custom.log", "booting\nit=3/9 1.5 lr=0.1 gn=2\nit=4/9 1.25\n")
    _, batch = read(log, patterns=[mine])
    assert batch.cursor["state"]["family"] == "mytrainer"
    assert values(batch, "train/loss") == [(3, 1.5), (4, 1.25)]
    assert values(batch, "lr") == [(3, 0.1)] and values(batch, "gn") == [(3, 2.0)]
    assert "it" not in set(batch.points["tag"]) and batch.meta == {"total_steps": 9}


def test_a_user_pattern_joins_a_builtin_family_by_name(tmp_path):
    extra = LinePattern("nanogpt", r"^eval (?P<step>\d+): acc (?P<acc>\S+)",
                        names={"acc": "eval/general/accuracy"})
    _, batch = read(write(tmp_path / "t.log", "iter 10: loss 2.5, time 3.5ms\n"
                                              "eval 10: acc 0.5\n"), patterns=[extra])
    assert values(batch, "eval/general/accuracy") == [(10, 0.5)]
    assert values(batch, "train/loss") == [(10, 2.5)]


def test_a_malformed_step_in_a_matching_line_is_counted(tmp_path):
    mine = LinePattern("signed", r"^step (?P<step>-?\d+) loss (?P<loss>\S+)")
    _, batch = read(write(tmp_path / "t.log", "step 1 loss 2.0\nstep -5 loss 1.0\n"
                                              "step 2 loss abc\n"), patterns=[mine])
    assert values(batch, "train/loss") == [(1, 2.0)]
    assert batch.malformed == [(2, "step '-5' is not a non-negative integer below 2**63")]
    assert batch.skipped_values == 1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "x", "regex": "step (?P<step>\\d+"}, "not a valid regular expression"),
    ({"name": "x", "regex": "s", "pairs": "(\\w+)=(\\S+)"}, "named groups 'key' and 'value'"),
    ({"name": "x", "regex": "(?P<epoch_step>\\d+)"}, "epoch, epoch_step and epoch_steps"),
    ({"name": " ", "regex": "s"}, "needs a name"),
])
def test_bad_patterns_say_what_to_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LinePattern(**kwargs)


def test_a_log_no_pattern_recognises_gets_a_notice_on_a_final_read(tmp_path):
    _, batch = read(write(tmp_path / "notes.txt", "hello\nworld\n"))
    assert len(batch.points) == 0
    assert "matched a known log format" in batch.notices[0] and "[[patterns]]" in batch.notices[0]


# -- steps that go back -----------------------------------------------------------------------
def steps(assembled):
    return [(step, value) for step, tag, value, _ in assembled.rows]


def test_assemble_keeps_the_last_value_of_a_step():
    out = assemble([Record(1, {"loss": 2.0}), Record(1, {"loss": 1.5, "lr": 0.1})], None, {})
    assert sorted(out.rows) == [(1, "loss", 1.5, None), (1, "lr", 0.1, None)]


def test_assemble_sorts_unsorted_steps_into_place():
    out = assemble([Record(s, {"loss": float(s)}) for s in (1, 2, 4, 3, 5)], None, {})
    assert steps(out) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0)]
    assert out.top == 5


def test_assemble_drops_a_second_writers_repeats():
    records = [Record(1, {"loss": 2.0}), Record(2, {"loss": 1.9}),
               Record(1, {"loss": 2.0}), Record(2, {"loss": 1.9}), Record(3, {"loss": 1.8})]
    out = assemble(records, None, {})
    assert steps(out) == [(1, 2.0), (2, 1.9), (3, 1.8)] and out.duplicates == 1


def test_assemble_keeps_a_rewind_after_the_earlier_points():
    records = [Record(s, {"loss": 1.0}) for s in (1, 2, 3, 4)]
    records += [Record(s, {"loss": 2.0}) for s in (3, 4, 5)]
    out = assemble(records, None, {})
    assert [s for s, _ in steps(out)] == [1, 2, 3, 4, 3, 4, 5]


def test_assemble_remembers_the_last_steps_across_reads():
    first = assemble([Record(s, {"loss": float(s)}) for s in (1, 2, 3)], None, {})
    again = assemble([Record(3, {"loss": 3.0}), Record(2, {"loss": 2.0})], first.top,
                     first.recent)
    assert again.rows == [(3, "loss", 3.0, None)] and again.duplicates == 1
    resumed = assemble([Record(2, {"loss": 9.0}), Record(3, {"loss": 8.0})], first.top,
                       first.recent)
    assert steps(resumed) == [(2, 9.0), (3, 8.0)]  # new values going back: a rewind


# -- the corpus -------------------------------------------------------------------------------
# The corpus's name for a format → runwatch's, where they differ.
FORMAT_NAME = {"custom_csv": "csv", "keras_csvlogger": "keras_csv", "custom_text": "text"}
TEXT_FAMILY = {"deepspeed_chat_text": "megatron_deepspeed", "megatron_text": "megatron_deepspeed",
               "hf_console_log": "hf_console", "olmo_text": "olmo", "llmc_text": "nanogpt",
               "modded_nanogpt_text": "nanogpt"}
# What to count where the manifest's n_points is not the train loss.
COUNTED_TAG = {
    "custom_csv/charrnn_lr_sweep_loss.csv": "learning_rate_0.005",  # one column per sweep run
    "deepspeed_chat_text/dschat_step1_sft_opt1.3b.log": "eval/perplexity",  # only ppl logged
}


def corpus_files():
    manifest = CORPUS / "MANIFEST.csv"
    if not manifest.is_file():
        return [pytest.param(None, id="corpus-absent",
                             marks=pytest.mark.skip(reason=f"{CORPUS} is absent"))]
    with manifest.open() as handle:
        return [pytest.param(row, id=row["file"]) for row in csv.DictReader(handle)]


@pytest.mark.parametrize("row", corpus_files())
def test_every_corpus_file_is_detected_and_read(row):
    source = open_source(CORPUS / row["file"])
    batch = source.read(final=True)
    assert len(batch.points) > 0
    assert batch.malformed == []
    family = TEXT_FAMILY.get(row["format"])
    if family is not None:
        assert (source.format, batch.cursor["state"]["family"]) == ("text", family)
    else:
        assert source.format == FORMAT_NAME.get(row["format"], row["format"])
    tag = COUNTED_TAG.get(row["file"], "train/loss")
    counted = int((batch.points["tag"] == tag).sum())
    assert counted == int(row["n_points"])


def test_corpus_megatron_excerpt_without_lm_loss_keeps_its_other_values():
    log = CORPUS / "megatron_text/tr8_104b_spike_it8741_then_divergence_it9027.excerpt.log"
    if not log.is_file():
        pytest.skip(f"{CORPUS} is absent")
    batch = open_source(log).read(final=True)
    assert 9027 not in set(batch.points[batch.points["tag"] == "train/loss"]["step"])
    assert values(batch, "loss_scale")[-1] == (9027, 8192.0)


def test_corpus_hf_console_steps_match_the_dicts_epochs():
    log = CORPUS / "hf_console_log/qwen3_medical_qlora_training.log"
    if not log.is_file():
        pytest.skip(f"{CORPUS} is absent")
    batch = open_source(log, aliases=AliasTable()).read(final=True)
    loss = values(batch, "train/loss")
    assert [s for s, _ in loss[:3]] == [10, 20, 30] and loss[-1][0] == 1750
    assert [s for s, _ in values(batch, "eval/loss")] == list(range(200, 1601, 200))
    epochs = dict(values(batch, "epoch"))
    assert epochs[1750] == pytest.approx(1750 / 585, abs=0.01)  # 1755 steps over 3 epochs
