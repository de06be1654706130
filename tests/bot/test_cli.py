import json
import math
import subprocess
import sys

import pytest

from bot.cli import build_parser, main

REQUIRED = {"run", "signal", "severity", "onset_step", "detected_step", "summary", "evidence",
            "fixes", "rollback_to"}


def spiky_log(path, spike_at=60, steps=80):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        for step in range(1, steps + 1):
            loss = 2.0 + 1.0 / step + 0.01 * (step % 3)
            if step == spike_at:
                loss = 12.0
            handle.write(json.dumps({"step": step, "loss": loss}) + "\n")
        handle.write("garbage\n")


def test_analyze_json_prints_one_object_per_finding(tmp_path, capsys):
    run = tmp_path / "exp1"
    spiky_log(run / "metrics.jsonl")
    (run / "checkpoint-50").mkdir()
    (run / "checkpoint-60").mkdir()
    assert main(["analyze", str(run / "metrics.jsonl"), "--json"]) == 0
    out, err = capsys.readouterr()
    findings = [json.loads(line) for line in out.splitlines()]
    [spike] = [f for f in findings if f["signal"] == "spike"]
    assert REQUIRED <= spike.keys()
    assert (spike["run"], spike["onset_step"], spike["detected_step"]) == ("exp1", 60, 60)
    assert spike["rollback_to"]["step"] == 50  # checkpoint-60 holds the bad update
    assert spike["fixes"][0]["text"].startswith("Roll back")
    assert "1 malformed lines skipped, first at line 81" in err


def test_analyze_directory_and_readable_output(tmp_path, capsys):
    spiky_log(tmp_path / "runs" / "a" / "metrics.jsonl", spike_at=50)
    spiky_log(tmp_path / "runs" / "b.jsonl", spike_at=70)
    assert main(["analyze", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "a · spike" in out and "b · spike" in out
    assert "2 runs" in out


def test_analyze_missing_path_is_one_clear_line(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    binary = tmp_path / "metrics.parquet"
    binary.write_bytes(b"PAR1\x00\x01")
    assert main(["analyze", str(binary)]) == 2
    assert "unsupported log format" in capsys.readouterr().err
    assert main(["analyze", "ftp://host/run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown source scheme 'ftp://'" in err


def test_status_cli_and_unknown_run(tmp_path, capsys, monkeypatch):
    from bot.config import load_settings
    from bot.engine import Engine

    spiky_log(tmp_path / "runs" / "exp1" / "metrics.jsonl", spike_at=1000)
    (tmp_path / "runwatch.toml").write_text(f'[[sources]]\npath = "{tmp_path / "runs"}"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNWATCH_DB", str(tmp_path / "rw.db"))
    Engine(load_settings()).poll()
    assert main(["status", "exp1"]) == 0
    out = capsys.readouterr().out
    assert "step 80" in out and "train loss" in out
    assert "1 malformed lines skipped, first at line 81: not JSON" in out
    assert main(["status", "exp9"]) == 1
    assert capsys.readouterr().err.strip() == "unknown run 'exp9'; known runs: exp1"


def test_config_check_reports_the_bad_key(tmp_path, capsys, monkeypatch):
    (tmp_path / "runwatch.toml").write_text("[slack]\nchanel = 'x'\n")
    monkeypatch.chdir(tmp_path)
    assert main(["config", "check"]) == 2
    assert "unknown key 'slack.chanel'" in capsys.readouterr().err
    (tmp_path / "runwatch.toml").write_text("[slack]\nchannel = '#ml'\n")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-very-secret-token")
    assert main(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert "#ml" in out and "very-secret" not in out


def test_every_command_has_help():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert {"serve", "demo", "analyze", "status", "config", "bench"} <= set(commands)
    for name in commands:
        result = subprocess.run([sys.executable, "-m", "bot.cli", name, "--help"],
                                capture_output=True, text=True)
        assert result.returncode == 0 and "usage:" in result.stdout, name


@pytest.mark.parametrize("value", ["nan", "NaN", "inf"])
def test_non_finite_strings_are_critical_spikes(tmp_path, capsys, value):
    log = tmp_path / "r.jsonl"
    lines = [json.dumps({"step": s, "loss": 2.0}) for s in range(1, 30)]
    lines.append(json.dumps({"step": 30, "loss": value}))
    log.write_text("\n".join(lines) + "\n")
    assert main(["analyze", str(log), "--json"]) == 0
    [finding] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert finding["severity"] == "critical" and finding["onset_step"] == 30
    assert not math.isfinite(float(finding["evidence"]["peak"]))


def test_audit_prints_every_transition_with_who_and_the_outcome(tmp_path, capsys,
                                                                 monkeypatch):
    from bot.actions import Actions, Actor
    from bot.config import ActionsConfig, Config, Secrets, Settings, SourceConfig
    from bot.engine import Engine

    spiky_log(tmp_path / "runs" / "exp1" / "metrics.jsonl")
    config = Config(sources=[SourceConfig(path=str(tmp_path / "runs"))], actions=ActionsConfig(
        permissions={"stop": {"users": ["U1"]}},
        runs=[{"run": "exp1", "backend": "command",
               "stop": [sys.executable, "-c", "import sys; print('bye'); sys.exit(2)"]}]))
    db = str(tmp_path / "rw.db")
    engine = Engine(Settings(config=config, secrets=Secrets(), config_path=None, db_path=db))
    engine.poll(dispatch=False)
    actions = Actions(engine.store, config.actions)
    req = actions.request("stop", "exp1", Actor("U1", "C1"))
    actions.confirm(req.id, Actor("U1", "C1"))
    actions.execute(req.id)
    monkeypatch.setenv("RUNWATCH_DB", db)
    monkeypatch.chdir(tmp_path)
    assert main(["audit", "--run", "exp1", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["status"], r["actor"]) for r in rows] == [
        ("requested", "U1"), ("confirmed", "U1"), ("running", "U1"), ("failed", "U1")]
    assert rows[-1]["exit_status"] == 2 and "bye" in rows[-1]["output_tail"]
    assert main(["audit", "--run", "nosuch"]) == 0
    assert "no actions recorded for nosuch" in capsys.readouterr().out
    assert main(["audit"]) == 0
    table = capsys.readouterr().out
    assert "requested" in table and "failed" in table and req.id[:8] in table


def test_launch_refuses_a_missing_command_or_a_bad_template(tmp_path, capsys):
    assert main(["launch", "--run", "x", "--run-dir", str(tmp_path)]) == 2
    assert "give the training command after --" in capsys.readouterr().err
    assert main(["launch", "--run", "x", "--run-dir", str(tmp_path), "--resume-args",
                 "--from {checkpoint!r}", "--", "true"]) == 2
    assert "conversion or format spec" in capsys.readouterr().err
    assert main(["launch", "--run", "x", "--run-dir", str(tmp_path), "--",
                 "no-such-trainer-binary"]) == 127
    assert "command not found" in capsys.readouterr().err


def test_launch_runs_the_command_and_exits_with_its_status(tmp_path):
    assert main(["launch", "--run", "x", "--run-dir", str(tmp_path), "--", sys.executable,
                 "-c", "import sys; sys.exit(3)"]) == 3
    state = json.loads((tmp_path / ".runwatch-launch" / "launch.json").read_text())
    assert state["finished"] and state["exit_status"] == 3
