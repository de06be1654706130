"""`/run compare RUN RUN`: what differs between two runs, and how they did at equal steps.

"Change one variable at a time" (SIGNALS.md, 000 §5(2)): the comparison counts the settings
that differ (flattened config keys, plus the data version and environment) and warns when
more than one does, because then no single change explains the difference.

An eval suite whose version differs between the two runs, or changed within either run, is
flagged, and its metrics' numbers are not compared: they measure different things.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from analyzers.stats.metric import tags_under
from bot.services.changes import current_suites, suite_changes
from bot.services.status import STATUS_TAGS
from bot.store import Store, UnknownRun
from connectors.training.versions import comparable, flatten

META_KEYS = ("data_version", "environment", "datasets")  # versions that matter beside config


class SameRun(ValueError):
    pass


@dataclass(frozen=True)
class SettingChange:
    key: str
    kind: str  # changed, added (only in the second run), removed (only in the first)
    first: Any = None
    second: Any = None


@dataclass(frozen=True)
class SuiteChange:
    """An eval suite measured with two versions: between the runs, or within one (``run``)."""

    suite: str
    before: str
    after: str
    prefix: str
    run: str | None = None  # None: the first run used ``before``, the second ``after``
    step: int | None = None

    @property
    def line(self) -> str:
        where = (f"in {self.run}" + (f" at step {self.step}" if self.step is not None else "")
                 if self.run else "between the runs")
        return (f"eval suite {self.suite} changed version {self.before} → {self.after} "
                f"({where}): numbers not compared")


def suite_version_changes(store: Store, first: str, second: str) -> list[SuiteChange]:
    """The suites whose version differs between the runs' latest evaluations, then those
    that changed version within either run."""
    a, b = current_suites(store, first), current_suites(store, second)
    found = [SuiteChange(suite, a[suite][0], b[suite][0], b[suite][1])
             for suite in sorted(a.keys() & b.keys()) if a[suite][0] != b[suite][0]]
    for run, suites in ((first, a), (second, b)):
        for change in suite_changes(store, run):
            for key, (before, after) in change.changed.items():
                suite = key.partition(".")[2]
                found.append(SuiteChange(suite, before, after, suites[suite][1], run,
                                         change.step))
    return found


@dataclass(frozen=True)
class AtStep:
    """One metric of both runs at the latest step both logged it."""

    tag: str
    step: int
    first: float
    second: float

    @property
    def change(self) -> float | None:
        """Relative change from the first run to the second."""
        if not (math.isfinite(self.first) and math.isfinite(self.second)) or self.first == 0:
            return None
        return (self.second - self.first) / abs(self.first)


@dataclass(frozen=True)
class Best:
    value: float
    step: int


@dataclass
class Comparison:
    first: str
    second: str
    first_attempt: int
    second_attempt: int
    changes: list[SettingChange]
    configs: tuple[bool, bool]  # whether each run has a recorded config
    at_steps: list[AtStep]
    common_step: int | None  # the latest step both runs reached
    best_eval: dict[str, Best | None] = field(default_factory=dict)  # run → min eval loss
    best_eval_common: dict[str, Best | None] = field(default_factory=dict)  # ≤ common_step
    last_steps: dict[str, int | None] = field(default_factory=dict)
    suite_changes: list[SuiteChange] = field(default_factory=list)

    @property
    def changed_count(self) -> int:
        return len(self.changes)

    @property
    def one_variable(self) -> bool:
        return self.changed_count <= 1


def setting_changes(first: dict[str, Any], second: dict[str, Any]) -> list[SettingChange]:
    """Changed, added and removed keys between two flattened settings, by key."""
    changes = []
    for key in sorted(first.keys() | second.keys()):
        if key not in second:
            changes.append(SettingChange(key, "removed", first=first[key]))
        elif key not in first:
            changes.append(SettingChange(key, "added", second=second[key]))
        elif first[key] != second[key]:
            changes.append(SettingChange(key, "changed", first[key], second[key]))
    return changes


def _settings(info: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    config = json.loads(info["config"]) if info.get("config") else None
    flat = flatten(config) if isinstance(config, dict) else {}
    meta = json.loads(info.get("meta") or "{}")
    for key in META_KEYS:
        if meta.get(key) is not None:
            flat[key] = meta[key]
    if isinstance(meta.get("versions"), dict):  # recorded by runwatch's training-side helpers
        flat.update({f"versions.{k}": v for k, v in comparable(meta["versions"]).items()})
    return flat, config is not None


def _at_common_step(store: Store, a: str, aa: int, b: str, ba: int, tag: str) -> AtStep | None:
    found = store.last_common_point((a, aa), (b, ba), tag)
    if found is None:
        return None
    step, first, second = found
    return AtStep(tag, step, first, second)


def _best(store: Store, run: str, attempt: int, up_to: int | None = None) -> Best | None:
    row = store.lowest(run, attempt, "eval/loss", up_to)
    return Best(row["value"], row["step"]) if row else None


def compare_runs(store: Store, first: str, second: str) -> Comparison:
    """Compare the current attempts of two runs. Raises :class:`UnknownRun` or
    :class:`SameRun`."""
    if first == second:
        raise SameRun(f"`/run compare` needs two different runs; got {first} twice")
    infos = []
    for run in (first, second):
        info = store.run(run)
        if info is None:
            raise UnknownRun(run, store.run_names())
        infos.append(info)
    (sa, ca), (sb, cb) = _settings(infos[0]), _settings(infos[1])
    aa, ba = infos[0]["attempt"], infos[1]["attempt"]
    suites = suite_version_changes(store, first, second)
    at_steps = [p for tag in STATUS_TAGS
                if not any(tags_under([tag], c.prefix) for c in suites)
                and (p := _at_common_step(store, first, aa, second, ba, tag)) is not None]
    last = {first: store.last_step(first, aa), second: store.last_step(second, ba)}
    common = min(last.values()) if None not in last.values() else None  # type: ignore[type-var]
    comparison = Comparison(first, second, aa, ba, setting_changes(sa, sb), (ca, cb), at_steps,
                            common, last_steps=last, suite_changes=suites)
    for run, attempt in ((first, aa), (second, ba)):
        comparison.best_eval[run] = _best(store, run, attempt)
        comparison.best_eval_common[run] = _best(store, run, attempt, common)
    return comparison
