""""What was changed then?" (seed §1.2): one service over the versions and change events the
training-side helpers and ``runwatch launch`` record (``connectors.training.versions``), used by
``/run changes`` and ``runwatch changes``, by the alert's "changed since the previous attempt"
line (:func:`change_line`, set by the engine on each finding) and by the daily digest's
"settings changed" (:func:`changes_since`): one list of changes, :func:`run_changes`.

Three questions, one answer shape (:class:`ChangeReport`):

* ``RUN`` — every change event of the run, attempt by attempt;
* ``RUN STEP`` — the change in force at STEP (the latest event at or before it) and what
  came after;
* ``RUN OTHER`` — config, data, model, code and environment of two runs side by side.

Changes are counted as *variables* (one config key, one dataset, the model, the code, the
environment) and more than one is a warning: change one variable at a time (seed §5.2).
What was never recorded is said to be missing, never taken for "unchanged".

An eval suite that changed version (a new suite file, a bumped ``version``; recorded by the
store, :meth:`bot.store.Store.record_suite_versions`) is a change event too, under
``eval_suites.<name>``: the numbers before and after it measure different things.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from bot.store import Store, UnknownRun
from connectors.training.versions import MISSING, diff

PARTS = ("config", "data", "model", "code", "environment")
SUITES = "eval_suites"  # changed keys eval_suites.<name>: a suite's version
ONE_VARIABLE = ("change one variable at a time (seed §5.2): with more than one changed, no "
                "single change explains the difference")


def variable(key: str) -> str:
    """The variable a changed key belongs to: each config key is one; a dataset, the model,
    the code and the environment are one each, however many of their fields changed.

    >>> [variable(k) for k in ("config.lr", "data.train.files[a.jsonl].xxh3", "code.dirty",
    ...                        "eval_suites.mmlu")]
    ['config.lr', 'data.train', 'code', 'eval_suites.mmlu']
    """
    if key.startswith(("config.", f"{SUITES}.")):
        return key
    head, _, rest = key.partition(".")
    if head == "data" and rest:
        return f"data.{rest.split('.')[0].split('[')[0]}"
    return head


@dataclass
class Change:
    """What differs between two sides: dotted key → (before, after)."""

    step: int | None
    attempt: int | None
    changed: dict[str, tuple[Any, Any]]
    at: float | None = None

    @property
    def variables(self) -> list[str]:
        return sorted({variable(k) for k in self.changed})


@dataclass
class ChangeReport:
    run: str
    question: str  # "run", "step" or "runs"
    step: int | None = None
    other: str | None = None
    changes: list[Change] = field(default_factory=list)  # oldest first
    missing: list[str] = field(default_factory=list)  # sentences: what was never recorded

    @property
    def warnings(self) -> list[str]:
        return [f"{len(c.variables)} variables changed"
                + (f" at step {c.step}" if c.step is not None else "")
                + f" ({', '.join(c.variables)}) — {ONE_VARIABLE}"
                for c in self.changes if len(c.variables) > 1]


def _recorded(info: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    meta = json.loads(info.get("meta") or "{}")
    config = json.loads(info["config"]) if info.get("config") else None
    versions = meta.get("versions") if isinstance(meta.get("versions"), dict) else {}
    recorded = {"config": config} if config else {}
    recorded.update({k: v for k, v in versions.items() if k in PARTS})
    return recorded, meta


def _info(store: Store, run: str) -> dict[str, Any]:
    info = store.run(run)
    if info is None:
        raise UnknownRun(run, store.run_names())
    return info


def _events(meta: dict[str, Any]) -> list[Change]:
    events = meta.get("changes") if isinstance(meta.get("changes"), list) else []
    return [Change(step=e.get("step"), attempt=e.get("attempt"), at=e.get("at"),
                   changed={k: tuple(v) for k, v in (e.get("changes") or {}).items()})
            for e in events if isinstance(e, dict)]


def suite_changes(store: Store, run: str) -> list[Change]:
    """Each time one of the run's eval suites changed version (between attempts, or
    mid-attempt as its log declared), oldest first."""
    last: dict[str, str] = {}
    changes = []
    for row in store.suite_history(run):
        before = last.get(row["suite"])
        if before is not None and before != row["version"]:
            changes.append(Change(step=row["step"], attempt=row["attempt"],
                                  at=row["recorded_at"],
                                  changed={f"{SUITES}.{row['suite']}": (before, row["version"])}))
        last[row["suite"]] = row["version"]
    return changes


def current_suites(store: Store, run: str) -> dict[str, tuple[str, str]]:
    """Suite → (version, metric prefix) the run's latest evaluations used."""
    return {row["suite"]: (row["version"], row["prefix"]) for row in store.suite_history(run)}


def _with_suites(events: list[Change], suites: list[Change]) -> list[Change]:
    """The training side's change events and the suite version changes, by time; a suite
    change the training side also recorded is not said twice."""
    def key(name: str, pair: tuple[Any, Any]) -> str:  # values may be lists: not hashable
        return json.dumps([name, list(pair)], sort_keys=True, default=str)

    said = {key(k, v) for e in events for k, v in e.changed.items()}
    fresh = [c for c in suites if not all(key(k, v) in said for k, v in c.changed.items())]
    return sorted(events + fresh, key=lambda c: c.at if c.at is not None else 0.0)


def run_changes(store: Store, run: str) -> list[Change]:
    """Every change of the run, oldest first: the training side's change events and its eval
    suites' version changes. Raises :class:`bot.store.UnknownRun`."""
    _, meta = _recorded(_info(store, run))
    return _with_suites(_events(meta), suite_changes(store, run))


def changes_since(store: Store, run: str, since: float) -> list[Change]:
    """The run's changes made at or after the time ``since`` (the digest's day)."""
    return [c for c in run_changes(store, run) if c.at is not None and c.at >= since]


def change_line(changes: list[Change], step: int) -> str | None:
    """The change in force at ``step`` among ``changes`` (:func:`run_changes`: a suite's new
    version included) in one line for an alert, or None when none came at or before it.

    >>> change_line([Change(50, 2, {"config.lr": (3e-4, 1.5e-4)}),
    ...              Change(90, 3, {"eval_suites.mmlu": ("a1", "b2")})], 80)
    'at step 50: lr 0.0003 → 0.00015'
    """
    before = sorted((c for c in changes if c.step is not None and c.step <= step and c.changed),
                    key=lambda c: c.step)  # stable: the latest in time last among equal steps
    if not before:
        return None
    return f"at step {before[-1].step}: {change_summary(before[-1], 3)}"


def _not_recorded(run: str, recorded: dict[str, Any]) -> list[str]:
    absent = [p for p in PARTS if p not in recorded]
    if not absent:
        return []
    if len(absent) == len(PARTS):
        return [f"{run} recorded no versions (no config, data, model, code or environment): "
                f"log it with runwatch's RunLogger, HF or Lightning callback to know what "
                f"changed"]
    return [f"{run}: {', '.join(absent)} not recorded"]


def what_changed(store: Store, run: str, arg: str | None = None) -> ChangeReport:
    """Answer ``/run changes RUN [STEP|OTHER]``; ``arg`` is a step when it is a number."""
    info = _info(store, run)
    recorded, meta = _recorded(info)
    if arg is not None and not arg.lstrip("-").isdigit():
        other_recorded, _ = _recorded(_info(store, arg))
        for side, name in ((recorded, run), (other_recorded, arg)):
            side[SUITES] = {k: v for k, (v, _) in current_suites(store, name).items()}
        changed = diff(recorded, other_recorded)
        # a part recorded on one side only is missing information, not a change
        absent = {p for p in PARTS if (p in recorded) != (p in other_recorded)}
        changed = {k: v for k, v in changed.items() if k.split(".")[0] not in absent
                   and not (k.startswith(f"{SUITES}.") and MISSING in v)}
        missing = _not_recorded(run, recorded) + _not_recorded(arg, other_recorded)
        return ChangeReport(run=run, question="runs", other=arg, missing=missing,
                            changes=[Change(step=None, attempt=None, changed=changed)]
                            if changed else [])
    events = run_changes(store, run)
    missing = _not_recorded(run, recorded)
    if arg is None:
        return ChangeReport(run=run, question="run", changes=events, missing=missing)
    step = int(arg)
    before = [e for e in events if e.step is not None and e.step <= step]
    after = [e for e in events if e.step is not None and e.step > step]
    return ChangeReport(run=run, question="step", step=step,
                        changes=before[-1:] + after[:1], missing=missing)


def fmt_setting(value: Any) -> str:
    if value == MISSING:
        return "(not set)"
    if value is None:
        return "none"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:39] + "…"


def change_summary(change: Change, limit: int = 4) -> str:
    """``lr 0.0003 → 0.0006, eval suite mmlu v3 → v4`` — one line for an alert or a list.

    >>> change_summary(Change(50, 2, {"config.lr": (3e-4, 6e-4), "eval_suites.mmlu":
    ...                                ("v3", "v4"), "code.dirty": (False, True)}), 2)
    'lr 0.0003 → 0.0006, eval suite mmlu v3 → v4, 1 more'
    """
    parts = []
    for key, (old, new) in list(change.changed.items())[:limit]:
        name = key.removeprefix("config.")
        if name.startswith(f"{SUITES}."):
            name = f"eval suite {name.removeprefix(SUITES + '.')}"
        parts.append(f"{name} {fmt_setting(old)} → {fmt_setting(new)}")
    if len(change.changed) > limit:
        parts.append(f"{len(change.changed) - limit} more")
    return ", ".join(parts)
