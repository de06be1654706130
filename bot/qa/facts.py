"""The fact sheet: what the store says about a question, as small sourced statements.

Code retrieves the facts; a model only phrases them. Every fact carries its text (already
worded, with its numbers formatted), the numbers it states and where it comes from, so an
answer can list its sources and the grounding check knows which numbers and names exist.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from bot.qa.entities import Entities
from bot.services.status import fmt_value


@dataclass(frozen=True)
class Source:
    """Where a fact comes from: a run, optionally a step (and attempt) or an alert."""

    run: str
    step: int | None = None
    alert: str | None = None  # a finding's fingerprint
    attempt: int | None = None

    def label(self) -> str:
        parts = [self.run]
        if self.attempt is not None and self.attempt > 1:
            parts.append(f"attempt {self.attempt}")
        if self.step is not None:
            parts.append(f"step {self.step}")
        if self.alert is not None:
            parts.append(f"alert {self.alert}")
        return " ".join(parts)


@dataclass(frozen=True)
class Fact:
    """One statement from the store. ``kind`` says which retrieval produced it."""

    kind: str
    text: str
    numbers: tuple[float, ...] = ()
    source: Source | None = None


@dataclass
class AlertSeen:
    """What the facts say of one signal's alerts on a run."""

    states: set[str] = field(default_factory=set)  # "open", "resolved"
    onset: set[int] = field(default_factory=set)  # the steps they began at
    resolved: set[int] = field(default_factory=set)  # the steps they were resolved at


@dataclass
class FactSheet:
    """The facts for one question, plus what the question asked that the store cannot say."""

    question: str
    run: str
    kinds: list[str]
    facts: list[Fact] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    runs: set[str] = field(default_factory=set)  # the runs the facts are about
    intent: str = "value"  # what the question asks for (bot.qa.router)
    also: list[str] = field(default_factory=list)  # what its other asks ask for, in order
    asked: Entities = field(default_factory=Entities)  # what the question names and asks
    # run → the checkpoint steps the facts name, and those runwatch recommends rolling
    # back to: a step an answer says to go back to must be one of these
    checkpoints: dict[str, set[int]] = field(default_factory=dict)
    targets: dict[str, set[int]] = field(default_factory=dict)
    # run → signal → what the facts say of its alerts, and run → every open alert's signal
    # where a fact lists them all: an alert an answer calls open or resolved, or says began
    # or ended at a step, must be so
    alerts: dict[str, dict[str, AlertSeen]] = field(default_factory=dict)
    open_alerts: dict[str, set[str]] = field(default_factory=dict)
    # what two runs record, as the compare facts word it: "config", "data version", … →
    # "same", "different" or "missing"
    recorded: dict[str, set[str]] = field(default_factory=dict)

    def add(self, kind: str, text: str, *numbers: float, source: Source | None = None) -> None:
        if any(f.text == text for f in self.facts):
            return  # two retrievals (what changed, compare) may state the same thing
        clean = tuple(float(n) for n in numbers if n is not None and math.isfinite(float(n)))
        self.facts.append(Fact(kind, text, clean, source))
        if source is not None:
            self.runs.add(source.run)

    def checkpoint(self, run: str, *steps: int, recommended: bool = False) -> None:
        """Record checkpoints the facts name (``recommended``: as the rollback target)."""
        self.checkpoints.setdefault(run, set()).update(int(s) for s in steps)
        if recommended:
            self.targets.setdefault(run, set()).update(int(s) for s in steps)

    def alert(self, run: str, signal: str, state: str, onset: int | None = None,
              resolved: int | None = None) -> None:
        """Record an alert's state ("firing" is "open") and steps a fact states."""
        seen = self.alerts.setdefault(run, {}).setdefault(signal, AlertSeen())
        seen.states.add("open" if state in ("firing", "open") else "resolved")
        for steps, step in ((seen.onset, onset), (seen.resolved, resolved)):
            if step is not None:
                steps.add(int(step))

    def all_open(self, run: str, signals: list[str]) -> None:
        """Record the complete list of ``run``'s open alerts a fact states."""
        self.open_alerts[run] = set(signals)

    def gap(self, text: str) -> None:
        if text not in self.gaps:
            self.gaps.append(text)

    def sources(self) -> list[str]:
        """Source labels in the order the facts cite them, without repeats."""
        seen: dict[str, None] = {}
        for fact in self.facts:
            if fact.source is not None:
                seen.setdefault(fact.source.label(), None)
        return list(seen)

    def render(self) -> str:
        """The facts as the list a prompt shows the model (bullets: a numbered list would put
        numbers into the sheet that no fact states)."""
        lines = [f"- {fact.text}" + (f" [source: {fact.source.label()}]" if fact.source else "")
                 for fact in self.facts]
        lines += [f"NOT IN THE RECORD: {gap}" for gap in self.gaps]
        return "\n".join(lines) if lines else "(no facts)"


def num(value: float | None) -> str:
    """A metric value as facts state it (the grounding check tolerates rounding of it)."""
    if value is None:
        return "unknown"
    value = float(value)
    if math.isfinite(value) and 1000 <= abs(value) < 1e9:
        return f"{value:.0f}"  # 51858 tokens/s, not 5.186e+04
    return fmt_value(value)


def pct(before: float, after: float) -> float | None:
    """Relative change in percent, or None where it means nothing (zero or non-finite)."""
    if not (math.isfinite(before) and math.isfinite(after)) or before == 0:
        return None
    return round((after - before) / abs(before) * 100, 1)


def run_pattern(run: str) -> str:
    """A regular expression for ``run`` named in a text: "exp1" in "exp1's loss", not in
    "exp10" or "runs/exp1.log"."""
    return rf"(?<![\w.-]){re.escape(run)}(?![\w-])"
