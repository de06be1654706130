"""The leakage check on real files of each format, with planted exact and near duplicates and a
hard negative (half the words shared) that must not be reported."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bot.cli import main
from connectors.training.leakcheck import LeakInputError, check

EVAL = [
    "What is the capital city of France and when was it founded?",
    "Explain gradient clipping to a new engineer in two sentences.",
    "Translate the following sentence into German: the cat sleeps on the mat.",
    "List three reasons a training loss can suddenly spike upwards.",
    "Write a haiku about checkpoints being saved at midnight.",
    "How many legs does a spider have, and why does it matter?",
]
# eval row → the copy planted in train
EXACT = {0: "  what is the CAPITAL city of france, and when was it founded ?? "}
NEAR = {1: "Explain gradient clipping to a junior engineer in two sentences."}
HARD_NEGATIVE = "Translate the following sentence into German: my dog barks at every car."


def _train_texts(rows: int = 300) -> list[str]:
    rng = random.Random(3)
    words = ["alpha", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima",
             "mike", "oscar", "papa", "romeo", "sierra", "tango", "victor", "whiskey"]
    texts = [" ".join(rng.choices(words, k=12)) for _ in range(rows)]
    texts[17] = EXACT[0]
    texts[123] = NEAR[1]
    texts[200] = HARD_NEGATIVE
    return texts


def _write(path: Path, texts: list[str], field: str = "text") -> Path:
    name = path.name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps({field: t, "id": i}) + "\n"
                                for i, t in enumerate(texts)))
    elif name.endswith(".parquet"):
        pq.write_table(pa.table({field: texts, "id": list(range(len(texts)))}), path)
    elif name.endswith(".csv"):
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["id", field])
            writer.writerows(enumerate(texts))
    else:  # the layout `datasets.Dataset.save_to_disk` writes: arrow stream files + state.json
        path.mkdir()
        table = pa.table({field: texts})
        with pa.ipc.new_stream(path / "data-00000-of-00001.arrow", table.schema) as writer:
            writer.write_table(table, max_chunksize=100)
        (path / "state.json").write_text(json.dumps(
            {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": "train"}))
        (path / "dataset_info.json").write_text("{}")
    return path


@pytest.mark.parametrize("train_name", ["train.jsonl", "train.parquet", "train.csv", "train_ds"])
def test_planted_duplicates_are_found_in_each_format(tmp_path: Path, train_name: str) -> None:
    train = _write(tmp_path / train_name, _train_texts())
    eval_ = _write(tmp_path / "eval.jsonl", EVAL)
    report = check(train, eval_, "text", threshold=0.7)
    assert report.train_rows == 300 and report.eval_rows == len(EVAL)
    assert report.matched_rows == [0, 1]  # not row 2, whose half-shared copy is a negative
    assert (report.eval_exact, report.eval_near) == (1, 1)
    assert report.overlap_rate == pytest.approx(2 / len(EVAL))
    exact, near = report.examples
    assert (exact.kind, exact.eval_row, exact.train_row) == ("exact", 0, 17)
    assert (near.kind, near.eval_row, near.train_row) == ("near", 1, 123)
    assert 0.7 <= near.similarity < 1.0
    assert report.complete and report.skipped == {"train": 0, "eval": 0}


def test_a_folder_saved_by_the_real_datasets_library_is_read(tmp_path: Path) -> None:
    """The same planted set, saved by ``datasets`` itself (not the layout written above)."""
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": _train_texts(), "id": list(range(300))}).save_to_disk(
        str(tmp_path / "train_ds"))
    report = check(tmp_path / "train_ds", _write(tmp_path / "eval.jsonl", EVAL), "text")
    assert report.train_rows == 300 and report.matched_rows == [0, 1]
    assert [(m.kind, m.train_row) for m in report.examples] == [("exact", 17), ("near", 123)]


def test_clean_sets_report_no_overlap_and_the_cli_exits_0(tmp_path: Path, capsys) -> None:
    train = _write(tmp_path / "train.jsonl", _train_texts()[:10])
    eval_ = _write(tmp_path / "eval.jsonl", EVAL)
    assert main(["leakcheck", str(train), str(eval_)]) == 0
    assert "0 of 6 eval rows (0.00%)" in capsys.readouterr().out


def test_cli_json_lists_every_matched_row_and_exits_1(tmp_path: Path, capsys) -> None:
    train = _write(tmp_path / "train.parquet", _train_texts(), field="prompt")
    eval_ = _write(tmp_path / "eval.csv", EVAL, field="prompt")
    assert main(["leakcheck", str(train), str(eval_), "--field", "prompt", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["matched_rows"] == [0, 1]
    assert report["overlap_rate"] == pytest.approx(2 / 6)


def test_rows_without_text_are_counted_not_fatal(tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    lines = [json.dumps({"text": t}) for t in _train_texts()]
    lines[5] = "{not json"
    lines[6] = json.dumps({"text": None})
    lines[7] = json.dumps({"text": 42})
    train.write_text("\n".join(lines) + "\n")
    report = check(train, _write(tmp_path / "eval.jsonl", EVAL))
    assert report.skipped["train"] == 3 and report.train_rows == 297
    assert report.matched_rows == [0, 1]


@pytest.mark.parametrize("case, expected", [
    ("missing_field", "no field 'text' (fields: prompt, id); choose one with --field"),
    ("missing_file", "no such file or folder"),
    ("bad_parquet", "not a readable Parquet file"),
    ("unknown_format", "unknown format; use one of"),
    ("empty_folder", "no data files in this folder"),
])
def test_bad_input_is_one_line_that_says_what_to_do(tmp_path: Path, capsys, case: str,
                                                   expected: str) -> None:
    eval_ = _write(tmp_path / "eval.jsonl", EVAL)
    train = {"missing_field": lambda: _write(tmp_path / "t.jsonl", EVAL, field="prompt"),
             "missing_file": lambda: tmp_path / "nope.jsonl",
             "bad_parquet": lambda: _bad_parquet(tmp_path / "t.parquet"),
             "unknown_format": lambda: _text_file(tmp_path / "t.xlsx"),
             "empty_folder": lambda: _folder(tmp_path / "empty")}[case]()
    with pytest.raises(LeakInputError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        check(train, eval_)
    assert main(["leakcheck", str(train), str(eval_)]) == 2
    err = capsys.readouterr().err
    assert expected.split(";")[0] in " ".join(err.split()) and "Traceback" not in err


def _bad_parquet(path: Path) -> Path:
    _write(path, EVAL)
    path.write_bytes(path.read_bytes()[:40])
    return path


def _text_file(path: Path) -> Path:
    path.write_text("x")
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    (path / "README.md").write_text("nothing here")
    return path


def test_a_spent_time_budget_marks_the_report_a_lower_bound(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", _train_texts(3000))
    report = check(train, _write(tmp_path / "eval.jsonl", EVAL), time_budget_s=0.0)
    assert not report.complete and report.train_rows < 3000
    assert "lower bound" in report.summary()


def test_reading_a_csv_of_long_texts_leaves_the_processs_csv_limit_as_it_was(tmp_path):
    """csv.field_size_limit is one for the whole process: the check raises it while it parses
    a row, and puts it back (runwatch's log reader counts an over-long field as malformed)."""
    import csv

    from connectors.training.leakcheck import check

    long = "word " * 40_000  # 200 KB: over csv's default 128 KiB limit
    (tmp_path / "train.csv").write_text(f"text\n{long}\nshort one\n")
    (tmp_path / "eval.csv").write_text("text\nshort one\n")
    before = csv.field_size_limit()
    report = check(tmp_path / "train.csv", tmp_path / "eval.csv")
    assert csv.field_size_limit() == before
    assert (report.train_rows, report.eval_exact) == (2, 1)  # the long text was read too
