"""The action service over a real store and real run folders: access, confirmation,
idempotency, audit, dry runs, and the follow-up after a rollback."""

import json
import sys

import pytest
import torch

from bot.actions import ActionRefused, Actions, Actor
from bot.commands import ActionContext, handle_run_command
from bot.config import ActionsConfig, Config, Secrets, Settings, SourceConfig
from bot.engine import Engine
from bot.views.actions import result_message

SCRIPT = "import sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + '\\n')"


def loss(step):
    return 10.0 if 150 <= step <= 152 else 2.0 + 1.0 / step


def write_run(root, steps, *, checkpoints=(50, 100, 150), mode="a", value=loss):
    run = root / "runs" / "exp1"
    run.mkdir(parents=True, exist_ok=True)
    for step in checkpoints:
        folder = run / f"checkpoint-{step}"
        if not folder.exists():
            folder.mkdir()
            torch.save({"step": step}, folder / "state.pt")
    with open(run / "metrics.jsonl", mode) as fh:
        for step in steps:
            fh.write(json.dumps({"step": step, "loss": value(step)}) + "\n")
    return run


def make(tmp_path, clock=None, **actions):
    record = tmp_path / "ran.txt"
    actions.setdefault("permissions", {"rollback": {"users": ["U1"], "usergroups": ["S9"]},
                                       "stop": {"users": ["U1"], "channels": ["C1"]}})
    actions.setdefault("runs", [{"run": "exp*", "backend": "command",
                                 "stop": [sys.executable, "-c", SCRIPT, str(record), "stop",
                                          "{run}"],
                                 "rollback": [sys.executable, "-c", SCRIPT, str(record),
                                              "rollback", "{checkpoint}", "{step}",
                                              "{skip_first}", "{skip_last}"]}])
    config = Config(sources=[SourceConfig(path=str(tmp_path / "runs"))],
                    actions=ActionsConfig(**actions))
    settings = Settings(config=config, secrets=Secrets(), config_path=None,
                        db_path=str(tmp_path / "rw.db"))
    engine = Engine(settings)
    kwargs = {"clock": clock} if clock else {}
    return engine, Actions(engine.store, config.actions, **kwargs), record


def spike(engine):
    [row] = [f for f in engine.store.findings("exp1") if f["signal"] == "spike"]
    return row


U1 = Actor("U1", "C1")


def test_rollback_from_an_alert_is_planned_confirmed_run_once_and_audited(tmp_path):
    write_run(tmp_path, range(1, 161))
    engine, actions, record = make(tmp_path)
    engine.poll(dispatch=False)
    finding = spike(engine)
    req = actions.request("rollback", "exp1", U1, fingerprint=finding["fingerprint"])
    # the checkpoint at the onset (150) is never offered; the skip goes past the episode's
    # end (about 156) as far past the onset as the checkpoint lies before it (PaLM's rule)
    end = 200
    assert finding["resolved_step"] < end
    assert req.state == "requested" and req.params["step"] == 100
    assert req.params["skip_batches"] == [101, end]
    assert "checkpoint-100" in req.describe() and f"101–{end}" in req.describe()
    assert not record.exists()  # nothing runs before a confirmation
    again = actions.request("rollback", "exp1", U1, fingerprint=finding["fingerprint"])
    assert again.existing and again.id == req.id  # a double click asks once
    confirmed = actions.confirm(req.id, Actor("U2", "C1", groups=lambda: {"S9"}))
    assert confirmed.state == "confirmed" and confirmed.confirmed_by == "U2"
    assert actions.confirm(req.id, U1).existing  # a replay confirms nothing twice
    done = actions.execute(req.id)
    assert done.state == "done" and done.result["exit_status"] == 0
    assert actions.execute(req.id).existing
    lines = record.read_text().splitlines()
    assert lines == [f"rollback {tmp_path / 'runs/exp1/checkpoint-100'} 100 101 {end}"]
    audit = [(r["status"], r["actor"]) for r in actions.audit_log("exp1")]
    assert audit == [("requested", "U1"), ("confirmed", "U2"), ("running", "U2"),
                     ("done", "U2")]
    assert "Rollback of *exp1* done" in result_message(done).text


def test_users_outside_the_allow_list_are_refused_and_audited(tmp_path):
    write_run(tmp_path, range(1, 40))
    engine, actions, record = make(tmp_path)
    engine.poll(dispatch=False)
    with pytest.raises(ActionRefused, match="not allowed to stop runs from this channel"):
        actions.request("stop", "exp1", Actor("U1", "C2"))  # right user, wrong channel
    with pytest.raises(ActionRefused, match="actions.permissions.stop"):
        actions.request("stop", "exp1", Actor("U7", "C1"))
    # a permitted request cannot be confirmed by someone who may not ask for it
    req = actions.request("stop", "exp1", U1)
    with pytest.raises(ActionRefused, match="not allowed"):
        actions.confirm(req.id, Actor("U7", "C1"))
    assert actions.get(req.id).state == "requested"
    statuses = [(r["status"], r["actor"]) for r in actions.audit_log("exp1")]
    assert statuses == [("denied", "U1"), ("denied", "U7"), ("requested", "U1"),
                        ("denied", "U7")]
    # each denial says what refused it: the channel for U1, the allow-list for U7
    details = [r["detail"] for r in actions.audit_log("exp1") if r["status"] == "denied"]
    assert details[0] == "not allowed from channel C2"
    assert details[1] == details[2] == "U7 is not in the users or user groups allowed to stop"
    # nobody may act when no permission is configured
    (tmp_path / "other").mkdir()
    engine2, open_actions, _ = make(tmp_path / "other", permissions={})
    with pytest.raises(ActionRefused, match="not allowed"):
        open_actions.request("stop", "exp1", U1)
    assert [r["detail"] for r in open_actions.audit_log("exp1")] == \
        ["actions.permissions.stop is not configured: no one may stop"]
    # a user in none of the listed groups, with no channel restriction
    with pytest.raises(ActionRefused) as refused:
        actions.request("rollback", "exp1", Actor("U8", "C5", groups=lambda: {"S1"}))
    assert "from this channel" not in str(refused.value)
    assert actions.audit_log("exp1")[-1]["detail"] == \
        "U8 is not in the users or user groups allowed to roll back"
    assert not record.exists()


def test_unknown_run_missing_checkpoint_and_failing_command_each_say_why(tmp_path):
    write_run(tmp_path, range(1, 161), checkpoints=())
    engine, actions, record = make(tmp_path, runs=[{"run": "exp*", "backend": "command",
                                                    "stop": [sys.executable, "-c",
                                                             "import sys; print('no such job');"
                                                             " sys.exit(1)"]}])
    engine.poll(dispatch=False)
    with pytest.raises(ActionRefused, match="Unknown run `nope`; known runs: exp1"):
        actions.request("stop", "nope", U1)
    with pytest.raises(ActionRefused, match="no usable checkpoint before the onset at step 150"):
        actions.request("rollback", "exp1", U1, fingerprint=spike(engine)["fingerprint"])
    req = actions.request("stop", "exp1", U1)
    actions.confirm(req.id, U1)
    done = actions.execute(req.id)
    assert done.state == "failed" and done.result["exit_status"] == 1
    assert "no such job" in done.result["output_tail"]
    rows = actions.audit_log()
    assert [r["status"] for r in rows] == ["failed", "failed", "requested", "confirmed",
                                           "running", "failed"]
    assert rows[-1]["exit_status"] == 1 and "no such job" in rows[-1]["output_tail"]


def test_an_explicit_step_after_the_onset_of_a_firing_alert_is_refused(tmp_path):
    write_run(tmp_path, range(1, 152))  # the spike is still going on
    engine, actions, _ = make(tmp_path)
    engine.poll(dispatch=False)
    with pytest.raises(ActionRefused, match="step 150 is not at least 2 steps before the onset "
                                            "at step 150"):
        actions.request("rollback", "exp1", U1, step=150)
    assert actions.request("rollback", "exp1", U1, step=50).params["step"] == 50


def test_unconfirmed_requests_expire(tmp_path):
    now = [1000.0]
    write_run(tmp_path, range(1, 40))
    engine, actions, record = make(tmp_path, clock=lambda: now[0], confirm_within_s=60)
    engine.poll(dispatch=False)
    req = actions.request("stop", "exp1", U1)
    now[0] += 61
    with pytest.raises(ActionRefused, match="expired"):
        actions.confirm(req.id, U1)
    assert actions.get(req.id).state == "expired"
    assert actions.request("stop", "exp1", U1).id != req.id  # a new one can be asked
    assert not record.exists()


def test_dry_run_records_what_would_run_and_runs_nothing(tmp_path):
    write_run(tmp_path, range(1, 40))
    engine, actions, record = make(tmp_path, dry_run=True)
    engine.poll(dispatch=False)
    req = actions.request("stop", "exp1", U1)
    actions.confirm(req.id, U1)
    done = actions.execute(req.id)
    assert done.state == "done" and done.result["dry_run"]
    assert "would run" in done.result["detail"] and "stop exp1" in done.result["detail"]
    assert not record.exists()
    assert actions.audit_log()[-1]["status"] == "dry-run"


def test_rollback_followup_says_recovered_or_same_position_again(tmp_path):
    write_run(tmp_path, range(1, 161))
    resume = [{"run": "exp1", "backend": "command",
               "rollback": [sys.executable, "-c", "print('resumed')", "{checkpoint}"]}]
    engine, actions, _ = make(tmp_path, runs=resume)
    engine.poll(dispatch=False)
    req = actions.request("rollback", "exp1", U1, fingerprint=spike(engine)["fingerprint"],
                          skip=False)
    assert "skip_batches" not in req.params
    actions.confirm(req.id, U1)
    actions.execute(req.id)
    assert actions.followups() == []  # the new attempt has not started yet
    write_run(tmp_path, range(101, 171))  # resumed without skipping: the same batches fail
    engine.poll(dispatch=False)
    [(done, text)] = actions.followups()
    assert done.id == req.id and "Same position again" in text and "batches 101–150" in text
    assert actions.followups() == []  # said once

    write_run(tmp_path / "b", range(1, 161))
    engine, actions, _ = make(tmp_path / "b", runs=resume)
    engine.poll(dispatch=False)
    req = actions.request("rollback", "exp1", U1, fingerprint=spike(engine)["fingerprint"])
    actions.confirm(req.id, U1)
    actions.execute(req.id)
    write_run(tmp_path / "b", range(101, 171), value=lambda s: 2.0 + 1.0 / s)
    engine.poll(dispatch=False)
    [(_, text)] = actions.followups()
    assert text.startswith(":white_check_mark: Recovered: exp1 passed step 170")


def test_the_command_language_asks_then_confirms(tmp_path):
    write_run(tmp_path, range(1, 161))
    engine, actions, record = make(tmp_path)
    engine.poll(dispatch=False)
    ran = []
    ctx = ActionContext(actions, U1, run_confirmed=lambda req: ran.append(req.id) or
                        result_message(actions.execute(req.id)))
    asked = handle_run_command("rollback exp1 50 --skip 51-60 --lr-scale 0.9", engine.store, ctx)
    request_id = asked.data["request"]
    assert "checkpoint-50" in asked.text and "skipping batches 51–60" in asked.text
    assert "×0.9" in asked.text and ran == []
    answer = handle_run_command(f"confirm {request_id}", engine.store, ctx)
    assert ran == [request_id] and "done" in answer.text
    assert "already done" in handle_run_command(f"confirm {request_id}", engine.store, ctx).text
    assert "--skip takes a step range" in handle_run_command("rollback exp1 --skip x",
                                                             engine.store, ctx).text
    assert "Unknown run" in handle_run_command("stop nope", engine.store, ctx).text
    assert "Actions are not available" in handle_run_command("stop exp1", engine.store).text


def test_a_rollback_asked_by_name_is_about_the_runs_trouble(tmp_path):
    write_run(tmp_path, range(1, 161))  # the spike has already ended
    engine, actions, _ = make(tmp_path)
    engine.poll(dispatch=False)
    req = actions.request("rollback", "exp1", U1)
    assert req.fingerprint == spike(engine)["fingerprint"]
    assert req.params["step"] == 100 and req.params["skip_batches"][0] == 101
