"""The `process` and `command` backends with real processes: a supervisor that owns a
training command, and argv templates that never reach a shell."""

import json
import subprocess
import sys
import threading
import time

import pytest
import torch

from bot.cli import main as cli_main
from bot.config import Config, Settings, SourceConfig
from bot.engine import Engine
from bot.services.changes import what_changed
from connectors.backends import ActionSpec, CommandBackend, ControlFileBackend
from connectors.training import versions
from connectors.training.control import REQUEST_FILE, ControlRequest, read_request, write_request
from connectors.training.launcher import (
    Launcher,
    TemplateError,
    Templates,
    launch_dir,
    launcher_alive,
    read_state,
    render,
)

# A stand-in for a training script: prints its argv, then a line a step until stopped.
TRAIN = """
import json, signal, sys, time
if sys.argv[1:2] == ["--ignore-term"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ARGV " + json.dumps(sys.argv[1:]), flush=True)
for step in range(1, 100000):
    print(f"step {step}", flush=True)
    time.sleep(0.05)
"""


def wait_until(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "exp1"
    (folder / "checkpoint-100").mkdir(parents=True)
    torch.save({"step": 100}, folder / "checkpoint-100" / "state.pt")
    return folder


def start(run_dir, *args, grace=5.0, templates=None, linger=30.0):
    launcher = Launcher("exp1", [sys.executable, "-c", TRAIN, *args], run_dir,
                        templates=templates, grace_s=grace, linger_s=linger, echo=None,
                        log=lambda text: None)
    stop = threading.Event()
    thread = threading.Thread(target=launcher.serve, kwargs={"should_exit": stop.is_set},
                              daemon=True)
    thread.start()
    assert wait_until(lambda: (read_state(run_dir) or {}).get("running"))
    return launcher, stop, thread


def backend(run_dir, timeout=20.0):
    return ControlFileBackend(launch_dir(run_dir), checkpoint_root=run_dir, name="process",
                              timeout_s=timeout)


def test_stop_terminates_the_command_and_reports_how(run_dir):
    launcher, stop, thread = start(run_dir)
    state = read_state(run_dir)
    assert launcher_alive(state) and state["pid"] == launcher.child.pid
    outcome = backend(run_dir).execute(ActionSpec("req-stop-1", "stop", "exp1"))
    assert outcome.status == "done"
    assert "stopped with SIGTERM" in outcome.detail and "exit status -15" in outcome.detail
    assert "step " in outcome.output_tail  # the command's last lines come back
    assert launcher.child.poll() is not None
    stop.set()
    thread.join(10)
    assert not launcher_alive(read_state(run_dir))


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(run_dir):
    launcher, stop, thread = start(run_dir, "--ignore-term", grace=0.5)
    outcome = backend(run_dir).execute(ActionSpec("req-stop-2", "stop", "exp1"))
    assert outcome.status == "done" and "SIGKILL" in outcome.detail
    assert launcher.child.returncode == -9
    stop.set()
    thread.join(10)


def test_stopping_a_dead_process_fails_with_its_exit_status(run_dir):
    launcher, stop, thread = start(run_dir)
    launcher.child.kill()
    launcher.child.wait()
    outcome = backend(run_dir).execute(ActionSpec("req-stop-3", "stop", "exp1"))
    assert outcome.status == "failed" and "already exited with status -9" in outcome.detail
    stop.set()
    thread.join(10)


def test_rollback_restarts_with_rendered_resume_arguments(run_dir):
    templates = Templates.from_strings("--resume-from {checkpoint}",
                                       "--skip-batches {skip_first}-{skip_last}",
                                       "--lr-scale {lr_scale}")
    launcher, stop, thread = start(run_dir, templates=templates)
    first_pid = launcher.child.pid
    spec = ActionSpec("req-rb-1", "rollback", "exp1", checkpoint=str(run_dir / "checkpoint-100"),
                      checkpoint_step=100, skip_batches=(101, 152), lr_scale=0.9)
    outcome = backend(run_dir).execute(spec)
    assert outcome.status == "done", outcome.detail
    assert outcome.step == 100 and "relaunched as pid" in outcome.detail
    assert launcher.child.pid != first_pid
    output = launch_dir(run_dir) / "output.log"
    def argvs():
        return [json.loads(line[5:]) for line in output.read_text().splitlines()
                if line.startswith("ARGV ")]

    assert wait_until(lambda: len(argvs()) == 2)
    argv = argvs()[-1]
    assert argv == ["--resume-from", str((run_dir / "checkpoint-100").resolve()),
                    "--skip-batches", "101-152", "--lr-scale", "0.9"]
    # The same request again (a retry) is not carried out twice.
    assert backend(run_dir, timeout=1.0).execute(spec).status == "done"
    assert len(argvs()) == 2
    stop.set()
    thread.join(10)


def test_rollback_refuses_before_stopping_when_it_cannot_resume(run_dir):
    (run_dir / "checkpoint-50").mkdir()  # incomplete
    launcher, stop, thread = start(run_dir, templates=Templates.from_strings(
        "--resume-from {checkpoint}", None, None))
    pid = launcher.child.pid
    broken = ActionSpec("req-rb-2", "rollback", "exp1", checkpoint=str(run_dir / "checkpoint-50"))
    outcome = backend(run_dir).execute(broken)
    assert outcome.status == "refused" and "incomplete" in outcome.detail
    skip = ActionSpec("req-rb-3", "rollback", "exp1",
                      checkpoint=str(run_dir / "checkpoint-100"), skip_batches=(101, 120))
    outcome = backend(run_dir).execute(skip)
    assert outcome.status == "refused" and "--skip-args" in outcome.detail
    assert launcher.running() and launcher.child.pid == pid  # still the same, untouched
    stop.set()
    thread.join(10)


# A training script that knows nothing of runwatch: a text log, resumed from --resume-from.
PLAIN_SCRIPT = """
import sys, time
argv = sys.argv
out = argv[argv.index("--out") + 1]
start = int(argv[argv.index("--resume-from") + 1].rsplit("-", 1)[1]) + 1 \\
    if "--resume-from" in argv else 1
with open(out + "/train.log", "a") as log:
    for step in range(start, start + 100000):
        log.write(f"step {step} | loss {2.0 - step * 1e-4:.4f}\\n")
        log.flush()
        time.sleep(0.05)
"""


def test_launch_records_versions_without_the_script_and_a_rollback_is_a_change_event(
        run_dir, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text(PLAIN_SCRIPT)
    for argv in (["init", "-q"], ["add", "train.py"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    (repo / "train.py").write_text(PLAIN_SCRIPT + "# edited, not committed\n")
    data, eval_data = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    data.write_text('{"text": "a"}\n')
    eval_data.write_text('{"text": "A!"}\n{"text": "an eval row seen nowhere else"}\n')
    launcher = Launcher("exp1", [sys.executable, str(repo / "train.py"), "--lr", "3e-4",
                                 "--out", str(run_dir)], run_dir, data=data,
                        eval_data=eval_data, echo=None,
                        templates=Templates.from_strings(
                            "--resume-from {checkpoint}", "--skip-batches {skip_first}-{skip_last}",
                            "--lr-scale {lr_scale}"), grace_s=5, linger_s=30,
                        log=lambda text: None)
    stop = threading.Event()
    thread = threading.Thread(target=launcher.serve, kwargs={"should_exit": stop.is_set},
                              daemon=True)
    thread.start()
    try:
        history = run_dir / versions.HISTORY_FILE
        assert wait_until(history.is_file)
        [first] = json.loads(history.read_text())["attempts"]
        assert first["source"] == "launch" and first["step"] is None
        assert first["config"] == {"command": [sys.executable, str(repo / "train.py")],
                                   "lr": 3e-4, "out": str(run_dir)}
        assert first["versions"]["code"] == {"dir": str(repo), "commit": commit, "dirty": True}
        assert first["versions"]["data"]["train"]["files"][0]["size"] == 14
        assert first["versions"]["environment"]["packages_count"] > 20
        # both datasets known: the leakage check ran at start and found the planted copy
        assert (first["leakcheck"]["eval_exact"], first["leakcheck"]["eval_rows"]) == (1, 2)
        assert wait_until(lambda: (run_dir / "train.log").is_file())
        spec = ActionSpec("req-rb-v", "rollback", "exp1", checkpoint_step=100,
                          checkpoint=str(run_dir / "checkpoint-100"), skip_batches=(101, 152),
                          lr_scale=0.5)
        assert backend(run_dir).execute(spec).status == "done"
        event = versions.recorded(run_dir)["changes"][-1]
        assert event["step"] == 100 and event["attempt"] == 2
        assert event["changes"] == {"config.lr_scale": ["missing", 0.5],
                                    "config.skip_batches": ["missing", [101, 152]]}
        # the bot reads them beside the script's own log, and /run changes answers from them
        assert wait_until(lambda: "step 101 " in (run_dir / "train.log").read_text())
        settings = Settings(config=Config(sources=[SourceConfig(
            path=str(run_dir / "train.log"), run="exp1")]), secrets={}, config_path=None,
            db_path=str(tmp_path / "rw.db"))
        engine = Engine(settings)
        engine.poll(dispatch=False)
        store = engine.store
        [change] = what_changed(store, "exp1").changes
        assert (change.step, change.attempt) == (100, 2)
        assert change.variables == ["config.lr_scale", "config.skip_batches"]
        assert json.loads(store.run("exp1")["config"])["lr"] == 3e-4
        assert json.loads(store.run("exp1")["meta"])["leakcheck"]["overlap_rate"] == 0.5
    finally:
        stop.set()
        thread.join(10)
    assert not launcher.running()


def test_launch_option_for_missing_data_is_one_clear_line(tmp_path, capsys):
    code = cli_main(["launch", "--run", "x", "--run-dir", str(tmp_path), "--data",
                     str(tmp_path / "nope.jsonl"), "--", sys.executable, "-c", "pass"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--data" in err and "no such file or folder" in err
    assert not (tmp_path / versions.HISTORY_FILE).exists()


def test_no_launcher_means_no_answer_and_the_request_is_withdrawn(run_dir):
    launch_dir(run_dir).mkdir()
    outcome = backend(run_dir, timeout=0.5).execute(ActionSpec("req-stop-4", "stop", "exp1"))
    assert outcome.status == "failed" and "withdrawn" in outcome.detail
    assert not (launch_dir(run_dir) / REQUEST_FILE).exists()


def test_a_pending_request_is_not_replaced(run_dir):
    launch_dir(run_dir).mkdir()
    write_request(launch_dir(run_dir), ControlRequest("req-old", "stop"))
    outcome = backend(run_dir, timeout=0.5).execute(ActionSpec("req-new", "stop", "exp1"))
    assert outcome.status == "failed" and "still waiting" in outcome.detail
    assert read_request(launch_dir(run_dir)).id == "req-old"


# -- templates ---------------------------------------------------------------------------------

def test_values_are_single_arguments_never_shell_text():
    evil = "/runs/exp1/checkpoint-1; rm -rf / #"
    assert render(["--resume-from", "{checkpoint}"], {"checkpoint": evil}) == \
        ["--resume-from", evil]
    with pytest.raises(TemplateError, match="control characters"):
        render(["{checkpoint}"], {"checkpoint": "a\nb"})
    with pytest.raises(TemplateError, match="no value for"):
        render(["{step}"], {})
    with pytest.raises(TemplateError, match="not a placeholder"):
        render(["{secret}"], {"secret": "x"})
    with pytest.raises(TemplateError, match="list of strings"):
        Templates(resume_args="--resume-from {checkpoint}")


def test_command_backend_runs_argv_and_reports_exit_status_and_output(tmp_path):
    script = "import sys; print('ARGS', sys.argv[1:]); sys.exit(int(sys.argv[1]))"
    spec = ActionSpec("req-cmd", "stop", "exp1")
    ok = CommandBackend({"stop": [sys.executable, "-c", script, "0", "{job_id}", "{run}"]},
                        {"job_id": "4242; reboot"}).execute(spec)
    assert ok.status == "done" and ok.exit_status == 0
    assert "ARGS ['0', '4242; reboot', 'exp1']" in ok.output_tail
    failed = CommandBackend({"stop": [sys.executable, "-c", script, "3"]}, {}).execute(spec)
    assert failed.status == "failed" and failed.exit_status == 3
    assert "exited with status 3" in failed.detail and "ARGS" in failed.output_tail
    missing = CommandBackend({"stop": ["no-such-command-runwatch"]}, {}).execute(spec)
    assert missing.status == "failed" and "command not found" in missing.detail
    none = CommandBackend({"stop": [sys.executable, "-c", script, "0"]}, {}).execute(
        ActionSpec("req-cmd-2", "rollback", "exp1", checkpoint="/x"))
    assert none.status == "refused" and "no rollback command is configured" in none.detail
    slow = CommandBackend({"stop": [sys.executable, "-c", "import time; time.sleep(5)"]}, {},
                          timeout_s=0.3).execute(spec)
    assert slow.status == "failed" and "did not finish" in slow.detail
