"""``runwatch inspect``: what runwatch read from a file or a folder, for people and as JSON;
then every file of the shared corpus (skipped when it is absent) reads points."""

import json

import pytest

from bot.cli import main
from tests.connectors.test_formats import corpus_files
from tests.corpus import CORPUS


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def custom_log(path):
    return write(path, "starting\n"
                 + "".join(f"iter {s}/300 | loss {4 - s / 100:.3f} | tok/s 512\n"
                           for s in range(10, 301, 10))
                 + "iter 310 | loss abc\n")


def folder(tmp_path):
    custom_log(tmp_path / "runs" / "custom" / "train.log")
    write(tmp_path / "runs" / "exp1" / "train_loss.csv",
          "Wall time,Step,Value\n1,0,2.0\n2,10,1.5\n3,20,1.2\n")
    write(tmp_path / "runs" / "exp1" / "val_loss.csv", "Wall time,Step,Value\n2,10,1.7\n3,20,1.6\n")
    write(tmp_path / "runs" / "m.jsonl", '{"step": 1, "loss": 2.0}\nnot json\n'
                                         '{"step": 2, "loss": 1.9}\n')
    write(tmp_path / "runs" / "notes.txt", "the loss went down\n")
    return tmp_path / "runs"


def test_inspect_a_file_as_json(tmp_path, capsys):
    log = custom_log(tmp_path / "custom.log")
    assert main(["inspect", str(log), "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    report = json.loads(out)
    [run] = report["runs"]
    assert (run["run"], run["format"]) == ("custom", "text (generic 'key value' lines)")
    assert (run["points"], run["steps"], run["total_steps"]) == (60, [10, 300], 300)
    assert run["tags"] == [
        {"tag": "throughput", "points": 30, "first_step": 10, "last_step": 300},
        {"tag": "train/loss", "points": 30, "first_step": 10, "last_step": 300}]
    assert report["points"] == 60 and report["errors"] == []


def test_inspect_a_folder_for_people(tmp_path, capsys):
    assert main(["inspect", str(folder(tmp_path))]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as read, whatever the terminal's width
    assert "3 runs, 67 points" in out
    assert "run custom: text (generic 'key value' lines), steps 10…300 of 300" in out
    assert "run exp1: tensorboard_csv × 2 (train_loss.csv, val_loss.csv), steps 0…20" in out
    assert "eval/loss" in out and "train/loss" in out
    assert "1 malformed line skipped, first at line 2: not JSON" in out


def test_inspect_a_folder_as_json(tmp_path, capsys):
    assert main(["inspect", str(folder(tmp_path)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    runs = {r["run"]: r for r in report["runs"]}
    assert sorted(runs) == ["custom", "exp1", "m"]
    assert [(t["tag"], t["points"]) for t in runs["exp1"]["tags"]] == [("eval/loss", 2),
                                                                       ("train/loss", 3)]
    assert runs["exp1"]["attempts"] == 1  # the second file's first step is no restart
    assert runs["m"]["malformed_lines"] == 1
    assert runs["m"]["first_malformed"]["line"] == 2
    assert runs["custom"]["skipped_values"] == 0  # "loss abc" has no number: no record
    [not_read] = report["not_read"]
    assert "notes.txt: unsupported log format" in not_read and "[[patterns]]" in not_read


def test_inspect_what_cannot_be_read_says_so_in_one_line(tmp_path, capsys):
    notes = write(tmp_path / "notes.txt", "hello\nthe loss went down\n")
    assert main(["inspect", str(notes), "--json"]) == 1
    [run] = json.loads(capsys.readouterr().out)["runs"]
    assert run["points"] == 0 and run["steps"] is None
    assert "unsupported log format" in run["notice"] and "[[patterns]]" in run["notice"]
    assert main(["inspect", str(notes)]) == 1
    assert "run notes: text, no points" in " ".join(capsys.readouterr().out.split())
    binary = tmp_path / "metrics.parquet"
    binary.write_bytes(b"PAR1\x00\x01\x02\x03")
    assert main(["inspect", str(binary)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unsupported log format" in err
    assert main(["inspect", str(tmp_path / "nope.log")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize("row", corpus_files())
def test_inspect_reads_points_from_every_corpus_file(row, capsys):
    assert main(["inspect", str(CORPUS / row["file"]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["points"] > 0 and report["errors"] == []
