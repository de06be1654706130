"""`runwatch bench real`: the scorer on a hand-made labelled set whose outcome is known
(found, missed, false alarm, borderline ignored, excluded skipped), and the bench end to end
on three tiny files."""

from __future__ import annotations

import json
import math

import numpy as np
from rich.console import Console

from analyzers import Finding
from benchmarks.real import (
    Event,
    FileRead,
    load_corpus,
    main_real,
    matches,
    outcome_lines,
    read_file,
    score,
    summarise,
)

LABELS = """
[[file]]
path = "files/jsonl/nan.jsonl"
status = "event"
note = "loss NaN at 30"

[[file.event]]
family = "loss"
kind = "nonfinite"
metric = "loss"
onset = 30
grade = "clear"
note = "NaN"

[[file.event]]
family = "grad_norm"
kind = "spike"
metric = "grad_norm"
onset = 60
grade = "mild"
note = "8x"

[[file.event]]
family = "loss"
kind = "spike"
metric = "loss"
onset = 10
grade = "borderline"
note = "one point +40%"

[[file]]
path = "files/jsonl/healthy.jsonl"
status = "healthy"
note = "falls smoothly"

[[file]]
path = "files/jsonl/short.jsonl"
status = "excluded"
reason = "too_short"
note = "3 points"
"""


def _finding(signal: str, metric: str, onset: int, detected: int | None = None, *,
             severity: str = "warning", resolved: int | None = None) -> Finding:
    return Finding(run="r", signal=signal, severity=severity, metric=metric, onset_step=onset,
                   detected_step=onset if detected is None else detected, summary="",
                   evidence={}, fixes=[], kind="not_learning", source="test",
                   state="firing" if resolved is None else "resolved", resolved_step=resolved)


def _steps() -> dict[str, np.ndarray]:
    return {"train/loss": np.arange(100), "grad_norm": np.arange(100)}


def _write_corpus(root) -> None:
    (root / "files" / "jsonl").mkdir(parents=True)
    rows = []
    for name, split in (("nan", "dev"), ("healthy", "test"), ("short", "dev")):
        count = 3 if name == "short" else 100
        lines = [json.dumps({"step": s, "loss": math.nan if name == "nan" and s >= 30
                             else 3.0 - 0.01 * s}) for s in range(count)]
        (root / "files" / "jsonl" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        rows.append(f"files/jsonl/{name}.jsonl,{split}")
    (root / "MANIFEST.csv").write_text("path,split\n" + "\n".join(rows) + "\n")
    (root / "LABELS.toml").write_text(LABELS)


def test_scorer_found_missed_false_alarm_and_borderline(tmp_path):
    _write_corpus(tmp_path)
    files = load_corpus(tmp_path)
    assert [(f.split, f.status, len(f.events)) for f in files] == [
        ("dev", "event", 3), ("test", "healthy", 0), ("dev", "excluded", 0)]
    reads = {
        "files/jsonl/nan.jsonl": FileRead(findings=[
            _finding("spike", "train/loss", 32, 33, severity="critical"),  # NaN: found
            _finding("spike", "train/loss", 11, resolved=12),  # the borderline spike
            _finding("spike", "eval/loss", 30),  # another metric: a false alarm
            _finding("plateau", "train/loss", 80),  # nothing labelled: a false alarm
        ], steps=_steps()),
        "files/jsonl/healthy.jsonl": FileRead(findings=[
            _finding("diminishing_returns", "eval/loss", 90, severity="info"),
            _finding("spike", "train/loss", 50),
        ], steps=_steps()),
        "files/jsonl/short.jsonl": FileRead(findings=[_finding("spike", "loss", 1)],
                                            steps={"train/loss": np.arange(3)}),
    }
    outcomes = score(files, reads)
    assert [o.file.status for o in outcomes] == ["event", "healthy"]  # excluded: skipped
    event = outcomes[0]
    [(found, finding, delay)] = event.found
    assert (found.kind, finding.detected_step, delay.points) == ("nonfinite", 33, 3)
    assert [e.family for e in event.missed] == ["grad_norm"]
    assert [f.onset_step for f in event.borderline] == [11]
    assert [f.signal for f in event.false] == ["spike", "plateau"]

    result = summarise(outcomes)
    assert result["recall, clear + mild"] == "1/2 = 0.50"
    assert result["recall: loss"].startswith("1/1 = 1.00; median delay 3 pts, 3.0%")
    assert result["recall: grad_norm"] == "0/1 = 0.00"
    assert result["recall: eval"] == "— (no event)"
    assert result["recall: non-finite"].startswith("1/1 = 1.00")
    # 1 true; 4 false: 2 on the event file, both findings of the healthy one
    assert result["precision"] == "0.20"
    assert result["F1"] == "0.29"
    assert result["false alarms by signal"] == "spike 2, plateau 1, diminishing_returns 1"
    assert result["false alarms ≥ warning (posted)"] == 3  # not the info one
    assert result["healthy files: critical findings"] == 0
    assert result["healthy files: channel messages per file (≥ warning)"] == "1.00 (1 in all)"
    assert result["healthy files: findings per file"].startswith("2.00")
    assert any("missed grad_norm/spike (mild)" in line for line in outcome_lines(outcomes))


def test_tolerance_is_five_points_or_two_percent_or_a_span():
    read = FileRead(steps={"train/loss": np.arange(0, 1000, 10)})  # 100 points, span 990
    event = Event("f", "loss", "instability", "train_loss", onset=500, grade="clear")
    # 5 points = 50 steps; 2% of the span = 19.8 steps: 5 points reach further
    assert matches(_finding("divergence", "train/loss", 550), event, read)
    assert not matches(_finding("divergence", "train/loss", 560), event, read)
    assert matches(_finding("spike", "train/loss", 450), event, read)
    assert not matches(_finding("spike", "train/loss", 440, resolved=490), event, read)
    assert matches(_finding("spike", "train/loss", 300, resolved=500), event, read)  # spans
    assert matches(_finding("divergence", "train/loss", 100), event, read)  # still firing
    assert not matches(_finding("plateau", "train/loss", 500), event, read)  # not mapped
    # a label metric runwatch read no tag of is not compared
    assert matches(_finding("spike", "ppl", 500),
                   Event("f", "loss", "spike", "Perplexity", 500, "clear"),
                   FileRead(steps={"ppl": np.arange(0, 1000, 10)}))


def test_an_onset_labelled_in_epochs_is_read_through_the_runs_epoch_tag():
    """A Lightning CSV labelled per epoch: the onset is none of the metric's steps but one
    of the run's epoch numbers, so it is that epoch's first step of the metric; an onset
    that is a logged step, or no epoch, stays as it is."""
    from benchmarks.real import LabelledFile, in_steps, score_file

    val_steps = 4 * np.arange(40) + 3  # one val_loss per epoch, at the epoch's last step
    read = FileRead(steps={"eval/loss": val_steps, "epoch": val_steps},
                    values={"eval/loss": np.ones(40), "epoch": np.arange(40.0)})
    event = Event("f", "eval", "overfit", "val_loss", onset=33, grade="mild")
    mapped = in_steps(event, read)
    assert (mapped.onset, mapped.epoch) == (135, 33)
    assert in_steps(mapped, read) == mapped  # once
    assert in_steps(Event("f", "eval", "overfit", "val_loss", 135, "mild"), read).epoch is None
    assert in_steps(Event("f", "eval", "overfit", "val_loss", 50, "mild"), read).onset == 50
    no_epoch = FileRead(steps={"eval/loss": val_steps}, values={"eval/loss": np.ones(40)})
    assert in_steps(event, no_epoch) == event
    # scored in steps: an overfit finding at epoch 34's step matches
    read.findings = [_finding("overfit", "eval/loss", 139)]
    outcome = score_file(LabelledFile("f", "dev", "event", (event,)), read)
    [(found, _, delay)] = outcome.found
    assert (found.onset, delay.points) == (135, 1)
    assert "at 135 (epoch 33)" in outcome_lines([outcome])[1]
    assert summarise([outcome])["clear + mild onsets labelled in epochs, read as steps"] == 1


def test_bench_end_to_end_on_tiny_files(tmp_path):
    _write_corpus(tmp_path)
    assert read_file(tmp_path / "files" / "jsonl" / "healthy.jsonl").points == 100
    nan = read_file(tmp_path / "files" / "jsonl" / "nan.jsonl")
    assert any(f.signal == "spike" and f.onset_step == 30 for f in nan.findings)
    output = tmp_path / "BENCHMARKS.md"
    console = Console(record=True, width=200)
    assert main_real(output=str(output), console=console, root=tmp_path) == 0
    text = output.read_text()
    assert "## Real corpus, test half: the headline (issue 22)" in text
    assert "## Real corpus, dev half: the only half tuned on (issue 22)" in text
    assert "| recall: non-finite | 1/1 = 1.00" in text
    assert "files/jsonl/nan.jsonl [event]" not in console.export_text()  # no outcomes
    tuning = Console(record=True, width=200)
    dev_only = tmp_path / "DEV.md"
    assert main_real(output=str(dev_only), console=tuning, outcomes=True, root=tmp_path) == 0
    printed = tuning.export_text()
    assert "files/jsonl/nan.jsonl [event]" in printed  # the dev half's outcomes
    assert "healthy.jsonl [healthy]" not in printed  # never the test half's
    assert "test half" not in printed and "test half" not in dev_only.read_text()
    assert "1 files read" in printed  # the test half is not even read while tuning


def test_oracle_says_what_the_points_allow_and_which_misses_are_format_issues():
    from benchmarks.real import oracle_rows, oracle_verdict

    rng = np.random.default_rng(0)
    loss = 2.0 + 0.01 * rng.standard_normal(60)
    loss[40:45] += 0.5  # +25%, far beyond its noise: an instability episode
    read = FileRead(steps={"train/loss": np.arange(60), "epoch": np.arange(60)},
                    values={"train/loss": loss, "epoch": np.arange(60) // 20})

    def verdict(kind: str, onset: int, metric: str = "loss") -> str:
        return oracle_verdict(Event("f", "loss", kind, metric, onset, "mild"), read)

    assert verdict("instability", 40) == "detectable"
    assert verdict("instability", 20) == "under the oracle's bar"  # nothing happens there
    assert verdict("instability", 40, "ppl") == "metric not read"
    assert verdict("instability", 7) == "too few points before the onset"  # warm-up
    assert verdict("divergence", 80) == "onset outside the logged steps"
    read.steps["train/loss"] = 20 * np.arange(60)  # logged per step, labelled per epoch
    read.values["epoch"] = np.arange(60, dtype=float)
    assert verdict("instability", 3) == "onset in epochs, steps read"
    assert oracle_rows([]) == []


def test_bench_oracle_reads_the_dev_half_alone(tmp_path):
    _write_corpus(tmp_path)
    console = Console(record=True, width=250)
    output = tmp_path / "ORACLE.md"
    assert main_real(output=str(output), console=console, oracle=True, root=tmp_path) == 0
    text = output.read_text()
    assert "## Real corpus, dev half: what an oracle with hindsight reaches" in text
    assert "| all | 2 | 1 | 1 | 0 | 1 |" in text  # the NaN found; the grad norm not read
    assert "test half" not in text
    assert "1 files read" not in console.export_text()  # the dev half alone
