"""Rollback and stop as people ask for them: access check, confirmation, idempotency, audit.

A request goes through one state machine, stored in ``action_requests`` and mirrored, one
row per transition, in the append-only audit log (``actions``)::

    requested ──confirm──▶ confirmed ──▶ running ──▶ done | failed | refused
        │ └──cancel──▶ cancelled
        └──(not confirmed in time)──▶ expired
    (asked by someone not allowed: denied; unknown run, no checkpoint…: failed)

Every transition is a conditional UPDATE, so a Slack retry or a double click that confirms
the same request twice runs it once; the request id is also the control protocol's id, so
the training side never acts on it twice either. Nothing here reads text as a command: the
values that reach a backend are a run known to the store, a checkpoint found on disk inside
the run's directory, integers and a number in (0, 1].
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.config import ActionsConfig, RunActions
from bot.store import Store
from connectors import checkpoints as registry
from connectors.backends import ActionSpec, Backend, CommandBackend, ControlFileBackend, Outcome
from connectors.training.launcher import launch_dir, launcher_alive, read_state

log = logging.getLogger("runwatch.actions")

OPEN_STATES = ("requested", "confirmed", "running")
VERBS = {"rollback": "roll back", "stop": "stop"}


class ActionRefused(Exception):
    """The request cannot go on; the message is for the person who asked."""


@dataclass
class Actor:
    """Who asks, from where. ``groups`` resolves the user's Slack user groups when needed."""

    user: str
    channel: str | None = None
    console: bool = False
    groups: Callable[[], set[str]] = field(default=lambda: set(), repr=False)

    @property
    def mention(self) -> str:
        return "the console" if self.console else f"<@{self.user}>"


@dataclass
class ActionRequest:
    id: str
    run: str
    action: str
    state: str
    params: dict[str, Any]
    requested_by: str
    channel: str | None = None
    thread_ts: str | None = None
    fingerprint: str | None = None
    confirmed_by: str | None = None
    backend: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    existing: bool = False  # returned again for a repeated request

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ActionRequest:
        return cls(id=row["id"], run=row["run"], action=row["action"], state=row["state"],
                   params=json.loads(row["params"] or "{}"), requested_by=row["requested_by"],
                   channel=row["channel"], thread_ts=row["thread_ts"],
                   fingerprint=row["fingerprint"], confirmed_by=row["confirmed_by"],
                   backend=row["backend"], result=json.loads(row["result"] or "{}"),
                   created_at=row["created_at"] or 0.0)

    def describe(self) -> str:
        """The request in one sentence: run, checkpoint and options."""
        p = self.params
        if self.action == "stop":
            return f"stop *{self.run}*"
        text = f"roll back *{self.run}* to `{Path(p['checkpoint']).name}` (step {p['step']})"
        if p.get("skip_batches"):
            first, last = p["skip_batches"]
            text += f", skipping batches {first}–{last}"
        if p.get("lr_scale") not in (None, 1.0):
            text += f", learning rate ×{p['lr_scale']:g}"
        return text


class Actions:
    """The action service shared by Slack, the console and the scheduler's follow-ups."""

    def __init__(self, store: Store, config: ActionsConfig, *,
                 clock: Callable[[], float] = time.time, workers: int = 2) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="action")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # access -------------------------------------------------------------------------------
    def refusal(self, action: str, actor: Actor) -> tuple[str, str] | None:
        """Why ``actor`` may not ask for ``action`` — what the audit log records, and what
        they are told — or None if they may. Who they are is checked before where they ask
        from, so the reason names what actually refused them."""
        verb = VERBS[action]
        add_me = (f"You are not allowed to {verb} runs: ask whoever runs runwatch to add you "
                  f"to actions.permissions.{action} (users or usergroups).")
        if actor.console:
            return None if self.config.console else (
                "the console may not act (actions.console = false)",
                f"The console may not {verb} runs: set actions.console = true.")
        rule = self.config.permissions.get(action)
        if rule is None:
            return f"actions.permissions.{action} is not configured: no one may {verb}", add_me
        if actor.user not in rule.users and not (rule.usergroups and
                                                 set(rule.usergroups) & actor.groups()):
            return f"{actor.user} is not in the users or user groups allowed to {verb}", add_me
        if rule.channels and actor.channel not in rule.channels:
            return (f"not allowed from channel {actor.channel}",
                    f"You are not allowed to {verb} runs from this channel: ask in "
                    f"{', '.join(f'<#{c}>' for c in rule.channels)}.")
        return None

    def _deny(self, action: str, run: str, actor: Actor, refused: tuple[str, str],
              request_id: str | None = None) -> None:
        detail, told = refused
        self.audit(request_id, run, action, actor.user, "denied", detail)
        raise ActionRefused(told)

    # audit --------------------------------------------------------------------------------
    def audit(self, request_id: str | None, run: str, action: str, actor: str, status: str,
              detail: str = "", *, exit_status: int | None = None, output_tail: str = "") -> None:
        self.store.record_action(at=self.clock(), run=run, action=action, actor=actor,
                                 status=status, detail=detail, request_id=request_id,
                                 exit_status=exit_status, output_tail=output_tail or None)
        log.info("action %s %s on %s by %s: %s %s", request_id or "-", action, run, actor,
                 status, detail)

    def audit_log(self, run: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return self.store.audit_log(run, limit)

    # requests -----------------------------------------------------------------------------
    def get(self, request_id: str) -> ActionRequest | None:
        row = self.store.action_request(request_id)
        return ActionRequest.from_row(row) if row else None

    def request(self, action: str, run: str, actor: Actor, *, step: int | None = None,
                fingerprint: str | None = None, skip: bool | tuple[int, int] | None = None,
                lr_scale: float | None = None, thread_ts: str | None = None) -> ActionRequest:
        """Check, plan and record a request; it runs only once someone confirms it.

        A request for the same action on the same run while one is still open returns the
        open one (``existing``), so a double click asks for confirmation once.
        """
        if action not in VERBS:
            raise ActionRefused(f"unknown action {action!r}; runwatch can roll back or stop")
        if refused := self.refusal(action, actor):  # before anything that tells what runs exist
            self._deny(action, run, actor, refused)
        if self.store.run(run) is None:
            self.audit(None, run, action, actor.user, "failed", "unknown run")
            known = ", ".join(self.store.run_names()[:10]) or "none yet"
            raise ActionRefused(f"Unknown run `{run}`; known runs: {known}.")
        for row in self.store.action_requests_in(run, action, OPEN_STATES):
            pending = ActionRequest.from_row(row)
            if pending.state != "requested" or not self._expired(pending):
                pending.existing = True
                return pending
        if action == "rollback" and fingerprint is None:
            # `/run rollback RUN` is about the run's trouble, as the alert's button would be
            trouble = self._trouble(run)
            fingerprint = trouble["fingerprint"] if trouble else None
        try:
            params = self._plan(action, run, step=step, fingerprint=fingerprint, skip=skip,
                                lr_scale=lr_scale)
        except ActionRefused as exc:
            self.audit(None, run, action, actor.user, "failed", str(exc))
            raise
        now = self.clock()
        req = ActionRequest(id=f"rw-{uuid.uuid4().hex[:12]}", run=run, action=action,
                            state="requested", params=params, requested_by=actor.user,
                            channel=actor.channel, thread_ts=thread_ts, fingerprint=fingerprint,
                            created_at=now)
        self.store.add_action_request(request_id=req.id, run=run, action=action, params=params,
                                      requested_by=actor.user, channel=actor.channel,
                                      thread_ts=thread_ts, fingerprint=fingerprint, now=now)
        self.audit(req.id, run, action, actor.user, "requested", req.describe())
        return req

    def _plan(self, action: str, run: str, *, step: int | None, fingerprint: str | None,
              skip: bool | tuple[int, int] | None, lr_scale: float | None) -> dict[str, Any]:
        params: dict[str, Any] = {"attempt": self.store.run(run)["attempt"]}
        finding = self.store.finding(fingerprint) if fingerprint else None
        if fingerprint and (finding is None or finding["run"] != run):
            raise ActionRefused(f"That alert ({fingerprint}) is not one of {run}'s.")
        if action == "stop":
            return params
        data = json.loads(finding["data"]) if finding else None
        onset = data["onset_step"] if data else None
        try:
            run_dir: Path | None = self.run_dir(run)
        except ActionRefused:  # e.g. an MLflow run: its recorded checkpoints still count
            run_dir = None
        found = registry.discover(run_dir, [(c.step, c.path)
                                            for c in self.store.checkpoints(run)])
        try:
            chosen = registry.choose(found, onset=onset, step=step)
        except registry.NoCheckpoint as exc:
            raise ActionRefused(f"Cannot roll back {run}: {exc}.") from None
        params.update(checkpoint=chosen.path, step=chosen.step)
        if data:
            params.update(onset_step=data["onset_step"], signal=data["signal"],
                          finding_attempt=data["attempt"])
        if isinstance(skip, tuple):
            first, last = skip
            if not 0 <= first <= last:
                raise ActionRefused(f"skip range {first}-{last} is not two steps A <= B")
            params["skip_batches"] = [first, last]
        elif (skip if skip is not None else self.config.skip_batches) and data:
            # PaLM restarted ~100 steps before a spike and skipped 200-500 batches, about as
            # many past the spike as it went back before it. Skip from the checkpoint through
            # the end of the episode (while it still fires: the last step logged), and at
            # least as far past the onset as the checkpoint lies before it.
            if data.get("resolved_step") is not None:
                end = data["resolved_step"] - 1
            else:
                end = self.store.last_step(run, data["attempt"]) or 0
            onset = data["onset_step"]
            end = max(end, data["detected_step"], onset + (onset - chosen.step))
            params["skip_batches"] = [chosen.step + 1, end]
        scale = lr_scale if lr_scale is not None else (self.config.lr_scale if data else 1.0)
        if not 0 < scale <= 1:
            raise ActionRefused(f"lr scale must be in (0, 1], got {scale:g}")
        if scale != 1.0:
            params["lr_scale"] = scale
        return params

    def _trouble(self, run: str) -> dict[str, Any] | None:
        """What a rollback of the run is about: of its current attempt's findings, the firing
        one that began first, else the latest one that offered a rollback."""
        attempt = self.store.run(run)["attempt"]
        current = [f for f in self.store.findings(run) if f["attempt"] == attempt]
        firing = [f for f in current if f["state"] == "firing"]
        if firing:
            return min(firing, key=lambda f: f["onset_step"])
        offered = [f for f in current if json.loads(f["data"]).get("rollback_to")]
        return max(offered, key=lambda f: f["onset_step"], default=None)

    def _expired(self, req: ActionRequest) -> bool:
        return self.clock() - req.created_at > self.config.confirm_within_s

    def _transition(self, request_id: str, from_states: tuple[str, ...], to: str,
                    **values: Any) -> bool:
        """Move a request on only from ``from_states``; False when someone else got there."""
        return self.store.move_action_request(request_id, from_states, to, now=self.clock(),
                                              **values)

    def confirm(self, request_id: str, actor: Actor) -> ActionRequest:
        """Confirm a request. Confirming it again returns it unchanged (``existing``)."""
        req = self.get(request_id)
        if req is None:
            raise ActionRefused(f"No action request `{request_id}`; ask again with /run "
                                f"rollback or /run stop.")
        if refused := self.refusal(req.action, actor):
            self._deny(req.action, req.run, actor, refused, req.id)
        if req.state == "requested" and self._expired(req):
            if self._transition(req.id, ("requested",), "expired"):
                self.audit(req.id, req.run, req.action, actor.user, "expired",
                           f"not confirmed within {self.config.confirm_within_s:g} s")
            raise ActionRefused("This request has expired; ask again if it still applies.")
        if not self._transition(req.id, ("requested",), "confirmed", confirmed_by=actor.user):
            req = self.get(request_id)
            req.existing = True
            return req
        self.audit(req.id, req.run, req.action, actor.user, "confirmed", req.describe())
        return self.get(request_id)

    def cancel(self, request_id: str, actor: Actor) -> ActionRequest:
        req = self.get(request_id)
        if req is None:
            raise ActionRefused(f"No action request `{request_id}`.")
        if req.requested_by != actor.user and (refused := self.refusal(req.action, actor)):
            self._deny(req.action, req.run, actor, refused, req.id)
        if self._transition(req.id, ("requested",), "cancelled"):
            self.audit(req.id, req.run, req.action, actor.user, "cancelled")
            return self.get(request_id)
        req.existing = True
        return req

    # carrying out ---------------------------------------------------------------------------
    def run_dir(self, run: str) -> Path:
        rule = self.rule(run)
        if rule is not None and rule.dir:
            return Path(rule.dir)
        row = self.store.run(run)
        scheme, _, where = ((row or {}).get("log_path") or "").partition(":")
        # A log file's run is its folder; an HF output or TensorBoard folder is the run's.
        if scheme in ("file", "hf", "tb") and where.startswith("/"):
            path = Path(where)
            return path.parent if scheme == "file" else path
        raise ActionRefused(f"runwatch does not know the directory of {run} (it is read from "
                            f"{scheme or 'an unknown source'}); set dir for it under "
                            f"[[actions.runs]].")

    def rule(self, run: str) -> RunActions | None:
        return next((r for r in self.config.runs if fnmatch.fnmatchcase(run, r.run)), None)

    def backend(self, run: str) -> Backend:
        rule = self.rule(run)
        kind = rule.backend if rule else "auto"
        root = self.run_dir(run)
        if kind == "command":
            return CommandBackend({"stop": rule.stop, "rollback": rule.rollback}, rule.values,
                                  cwd=root if root.is_dir() else None, timeout_s=rule.timeout_s)
        state = read_state(root)
        if kind == "process" or (kind == "auto" and state is not None and launcher_alive(state)):
            if state is None or not launcher_alive(state):
                raise ActionRefused(f"{run} has no live `runwatch launch` supervisor in "
                                    f"{launch_dir(root)}; start the training with runwatch "
                                    f"launch, or use the control backend.")
            return ControlFileBackend(launch_dir(root), checkpoint_root=root, name="process",
                                      timeout_s=self.config.ack_timeout_s)
        return ControlFileBackend(root, checkpoint_root=root, name="control",
                                  timeout_s=self.config.ack_timeout_s)

    def submit(self, request_id: str,
               on_done: Callable[[ActionRequest], None] | None = None) -> Future:
        """Carry out a confirmed request on a worker thread (Slack handlers must return)."""
        def work() -> ActionRequest:
            req = self.execute(request_id)
            if on_done is not None:
                try:
                    on_done(req)
                except Exception:
                    log.exception("action %s: reporting the result failed", request_id)
            return req

        return self._pool.submit(work)

    def execute(self, request_id: str) -> ActionRequest:
        """Run a confirmed request once; any later call returns it as it is."""
        req = self.get(request_id)
        if req is None or not self._transition(request_id, ("confirmed",), "running"):
            if req is not None:
                req.existing = True
            return req
        actor = req.confirmed_by or req.requested_by
        try:
            backend = self.backend(req.run)
            spec = self._spec(req)
            if req.action == "rollback":
                problem = registry.check(req.params["checkpoint"])
                if problem:
                    raise ActionRefused(f"the checkpoint is no longer usable: {problem}")
        except ActionRefused as exc:
            outcome, backend_name = Outcome("failed", str(exc)), None
        else:
            backend_name = backend.name
            self.audit(req.id, req.run, req.action, actor, "running",
                       f"{backend.name}: {backend.describe(spec)}")
            if self.config.dry_run:
                outcome = Outcome("done", f"dry run: would {backend.describe(spec)}")
            else:
                try:
                    outcome = backend.execute(spec)
                except Exception as exc:  # a backend bug must still end in an audit row
                    log.exception("action %s failed", req.id)
                    outcome = Outcome("failed", f"internal error: {exc!r}")
        state = outcome.status if outcome.status in ("done", "failed", "refused") else "failed"
        if req.action == "rollback" and state == "done" and not self.config.dry_run:
            # the run logs its next attempt from now (the old process stopped, or the loop
            # answered that it rolled back). Only needed when no step will go back: the
            # resume skips every batch up to past the last step the old attempt logged
            skip = req.params.get("skip_batches")
            resumes_after = skip[1] if skip else req.params["step"]
            run = self.store.run(req.run)
            logged = self.store.last_step(req.run, run["attempt"]) if run else None
            if logged is not None and resumes_after >= logged:
                self.store.begin_attempt(req.run, time.time())
        result = {"status": outcome.status, "detail": outcome.detail, "step": outcome.step,
                  "exit_status": outcome.exit_status, "output_tail": outcome.output_tail,
                  "dry_run": self.config.dry_run}
        self._transition(req.id, ("running",), state, backend=backend_name,
                         result=json.dumps(result))
        self.audit(req.id, req.run, req.action, actor,
                   "dry-run" if self.config.dry_run and outcome.ok else state,
                   outcome.detail, exit_status=outcome.exit_status,
                   output_tail=outcome.output_tail)
        return self.get(request_id)

    def _spec(self, req: ActionRequest) -> ActionSpec:
        p = req.params
        skip = tuple(p["skip_batches"]) if p.get("skip_batches") else None
        return ActionSpec(id=req.id, action=req.action, run=req.run,
                          checkpoint=p.get("checkpoint"), checkpoint_step=p.get("step"),
                          skip_batches=skip, lr_scale=p.get("lr_scale"))

    # after a rollback -------------------------------------------------------------------------
    def followups(self) -> list[tuple[ActionRequest, str]]:
        """Rollbacks whose outcome is now known: (request, message) for the alert thread.

        ``recovered`` once the new attempt passes the old onset without the signal there;
        ``same position again`` when the signal fires again near the old onset (SIGNALS.md
        ``spike``: the same position failing twice is data, not chance).
        """
        out = []
        for row in self.store.rollbacks_awaiting_followup():
            req = ActionRequest.from_row(row)
            if req.result.get("dry_run"):
                continue
            p = req.params
            run = self.store.run(req.run)
            onset, signal = p.get("onset_step"), p.get("signal")
            if run is None or onset is None or run["attempt"] <= p.get("finding_attempt", 0):
                continue
            tolerance = max(5, int(0.02 * onset))
            again = [f for f in self.store.findings(req.run)
                     if f["attempt"] == run["attempt"] and f["signal"] == signal
                     and abs(f["onset_step"] - onset) <= tolerance]
            if again:
                first = p["step"] + 1
                text = (f":repeat: Same position again: {signal} on {req.run} at step "
                        f"{again[0]['onset_step']} after rolling back to step {p['step']} "
                        f"(it first began at {onset}). Likely data, not chance: inspect batches "
                        f"{first}–{max(onset, again[0]['onset_step'])} and skip them.")
                kind = "again"
            else:
                latest = self.store.last_step(req.run, run["attempt"])
                if latest is None or latest < onset + tolerance:
                    continue
                text = (f":white_check_mark: Recovered: {req.run} passed step {latest} after "
                        f"rolling back to step {p['step']}, with no {signal} near step {onset} "
                        f"this time.")
                kind = "recovered"
            self.store.set_followup(req.id, kind)
            self.audit(req.id, req.run, req.action, "runwatch", kind, text)
            out.append((req, text))
        return out


def console_actor() -> Actor:
    return Actor(user=f"console:{os.environ.get('USER', 'local')}", console=True)
