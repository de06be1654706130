"""The grounding check: an answer may state only what its fact sheet states.

Every number (rounding tolerated: ``1.9`` stands for 1.923, ``2k`` for 2000), every step, every
checkpoint path and every run or other digit-bearing name in an answer must appear in the
fact sheet, and a step tied to an event ("resolved at step 157") must be one the facts tie to
that event: a number that appears elsewhere in the facts is not enough (a small model copied
"began at step 150" into "resolved at step 150"), and so must a value stated at a step ("1.92
at step 2000", "at step 2000 it was 1.92"): one fact must state both. An answer may not
claim that it carried out an action: the question-answering path cannot act.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from bot.qa.facts import FactSheet, run_pattern

_PATH = re.compile(r"(?<![\w])(?:[\w.~-]*/)+[\w.-]*\d[\w./-]*")
_CHECKPOINT = re.compile(r"\bcheckpoint[-_ ]?(\d+)\b", re.I)
_NAME = re.compile(r"(?<![\w.])(?:[A-Za-z][\w-]*\d[\w-]*|\d+[A-Za-z_][\w-]*)(?![\w])")
# A whole number as written, thousands separated or not: "2000", "2,000".
_INTEGER = r"\d{1,3}(?:,\d{3})+|\d+"
_NUMBER = re.compile(rf"(?<![\w.])[-+]?({_INTEGER})(\.\d+)?(?:[eE]([-+]?\d+))?"
                     r"(\s*[kK]\b|\s*%)?")
_K_NUMBER = re.compile(r"^\d+(?:\.\d+)?[kK]$|^\d+(?:\.\d+)?[eE][-+]?\d+$")  # numbers
_ACTION_CLAIM = re.compile(
    r"\b(?:I|we)(?:\s+have|\s+will|\s+am|\s+are|'ve|'ll|'m|'re)?\s+(?:now\s+)?"
    r"(?:stopped|stopping|stop|rolled\s+back|rolling\s+back|roll\s+back|killed|killing|"
    r"cancelled|canceled|restarted|restarting|launched|relaunched|paused|deleted)\b", re.I)

# An event the facts tie to a step, as the fact sheets word it ("resolved at step 157").
_STEP_CLAIM = re.compile(rf"\b(resolved|began|seen|started)\s+at\s+step\s+({_INTEGER})\b", re.I)
# A value stated at a step: "1.92 at step 2000", "at step 2000 the loss was 1.92", "the
# nearest point is step 1200: 2.101".
VALUE = rf"[-+]?(?:{_INTEGER})(?:\.\d+)?(?:[eE][-+]?\d+)?%?"
_VALUE_AT_STEP = re.compile(
    rf"(?<![\w.])({VALUE}),?\s+at\s+step\s+({_INTEGER})\b"
    rf"|\b(?:at\s+)?step\s+({_INTEGER})\b(?:\s*[:=]\s*|,?\s+(?:[\w/.-]+\s+){{0,3}}?(?:was|is|were|=)\s+"
    rf"(?:a\s+|an\s+|about\s+|around\s+|roughly\s+)?)({VALUE})(?!\w|\.\d)", re.I)

_PASSIVE_ACTION = re.compile(
    r"\b(?:was|were|has\s+been|have\s+been|is\s+being|will\s+be|is\s+now)\s+"
    r"(?:rolled\s+back|stopped|killed|restarted|cancelled|canceled|relaunched)\b", re.I)


@dataclass(frozen=True)
class Violation:
    kind: str  # number, name, path, run, action, step, pair, cut (by the time limit)
    token: str

    def describe(self) -> str:
        return {
            "number": f"the number {self.token} is not in the facts",
            "name": f"the name {self.token} is not in the facts",
            "path": f"the path {self.token} is not in the facts",
            "run": "it names a run that is not in the facts",
            "action": f"it claims an action ('{self.token}'); answers cannot act",
            "step": f"'{self.token}' is not what the facts say",
            "pair": f"no fact states {self.token}",
            "cut": "it was cut off by the time limit before a sentence ended",
        }[self.kind]


@dataclass(frozen=True)
class Number:
    value: float
    tolerance: float
    percent: bool
    text: str


def numbers_in(text: str) -> list[Number]:
    """The numbers a text states, each with the tolerance its written precision implies."""
    found = []
    for match in _NUMBER.finditer(text):
        whole, frac, exp, suffix = match.groups()
        decimals = len(frac) - 1 if frac else 0
        value = float(whole.replace(",", "") + (frac or ""))
        tolerance = 0.5 * 10 ** -decimals
        if exp is not None:
            value *= 10 ** int(exp)
            tolerance *= 10 ** int(exp)
        suffix = (suffix or "").strip().lower()
        if suffix == "k":
            value *= 1000
            tolerance *= 1000
        found.append(Number(value, tolerance, suffix == "%", match.group(0).strip()))
    return found


def _known_text(sheet: FactSheet) -> str:
    return "\n".join([f.text for f in sheet.facts] + sheet.gaps + sheet.sources()
                     + [sheet.run, *sheet.runs])


def _allowed(sheet: FactSheet) -> list[float]:
    values = {abs(n) for f in sheet.facts for n in f.numbers}
    values |= {abs(n.value) for n in numbers_in(_known_text(sheet))}
    return sorted(values)


def grounded(number: Number, allowed: list[float]) -> bool:
    """``number`` is one of ``allowed`` to the precision it is written with."""
    candidates = [number.value] + ([number.value / 100] if number.percent else [])
    slack = number.tolerance * (1 + 1e-9) + 1e-12
    return any(abs(abs(c) - a) <= slack or (a != 0 and math.isclose(abs(c), a, rel_tol=1e-9))
               for c in candidates for a in allowed)


def check(answer: str, sheet: FactSheet, *, all_runs: Iterable[str] = ()) -> list[Violation]:
    """What in ``answer`` the fact sheet does not support (empty: grounded).

    ``all_runs`` are every run the store knows, visible or not: naming one the facts do not
    mention is a violation even when it carries no digit.
    """
    violations: list[Violation] = []
    known = _known_text(sheet)
    known_lower = known.lower()
    known_tokens = {t.lower().strip(".-") for t in re.findall(r"[\w.-]+", known)}
    known_tokens |= {t.lower() for t in re.findall(r"[\w-]+", known)}
    allowed = _allowed(sheet)
    text = answer

    for match in _ACTION_CLAIM.finditer(text):
        violations.append(Violation("action", match.group(0)))
    for match in _PASSIVE_ACTION.finditer(text):
        if " ".join(match.group(0).lower().split()) not in " ".join(known_lower.split()):
            violations.append(Violation("action", match.group(0)))
    violations += _step_claims(answer, known)
    violations += _value_step_pairs(answer, sheet, allowed)
    for run in sorted(set(all_runs) - sheet.runs, key=len, reverse=True):
        pattern = run_pattern(run)
        if re.search(pattern, text, re.I) and run.lower() not in known_tokens:
            violations.append(Violation("run", run))
        text = re.sub(pattern, " ", text, flags=re.I)
    for match in _PATH.finditer(text):
        token = match.group(0).rstrip(".,;:)")
        if token.lower() not in known_lower:
            violations.append(Violation("path", token))
    text = _PATH.sub(" ", text)
    text = _CHECKPOINT.sub(lambda m: f" step {m.group(1)} ", text)
    for match in _NAME.finditer(text):
        token = match.group(0)
        if _K_NUMBER.match(token):
            continue
        if token.lower() not in known_tokens:
            violations.append(Violation("name", token))
    text = _NAME.sub(lambda m: m.group(0) if _K_NUMBER.match(m.group(0)) else " ", text)
    # a percentage is one the facts write as one ("-0.9%"), not a value given a % sign
    # ("a loss of 1.966%" of the value 1.966)
    percents = [n for n in numbers_in(known) if n.percent]
    for number in numbers_in(text):
        ok = (any(abs(abs(number.value) - abs(p.value)) <= max(number.tolerance, p.tolerance)
                  * (1 + 1e-9) for p in percents) if number.percent  # "66.7%" of "67%"
              else grounded(number, allowed))
        if not ok:
            violations.append(Violation("number", number.text))
    return list(dict.fromkeys(violations))


def _step_claims(answer: str, known: str) -> list[Violation]:
    """The event steps of ``answer`` that the facts tie to that event at other steps only
    (an event the facts never tie to a step is left to the number check)."""
    def claims(text: str) -> list[tuple[str, float, str]]:
        return [(m.group(1).lower(), numbers_in(m.group(2))[0].value,
                 " ".join(m.group(0).split())) for m in _STEP_CLAIM.finditer(text)]

    said: dict[str, set[float]] = {}
    for event, step, _ in claims(known):
        said.setdefault(event, set()).add(step)
    return [Violation("step", words) for event, step, words in claims(answer)
            if event in said and step not in said[event]]


def _stated_pairs(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
            for m in _VALUE_AT_STEP.finditer(text)]


def _value_step_pairs(answer: str, sheet: FactSheet, allowed: list[float]) -> list[Violation]:
    """The values stated at a step in ``answer`` that no single fact states with that step
    (a value or step that appears nowhere is left to the number check). A fact that itself
    states the value at a step must state it at this one: "lowest 2.164 at step 600" is not
    in a fact that has 2.164 at step 900 and 2.29 at step 600."""
    pairs = _stated_pairs(answer)
    if not pairs:
        return []
    per_fact = [(sorted({abs(n) for n in f.numbers} | {abs(n.value) for n in numbers_in(f.text)}),
                 [(numbers_in(v)[0], numbers_in(st)[0]) for v, st in _stated_pairs(f.text)])
                for f in sheet.facts]

    def holds(value: Number, step: Number, known: list[float],
              stated: list[tuple[Number, Number]]) -> bool:
        at = [s.value for v, s in stated if grounded(value, [abs(v.value)])]
        if at:
            return step.value in at
        return grounded(value, known) and grounded(step, known)

    out = []
    for value_text, step_text in pairs:
        value, step = numbers_in(value_text)[0], numbers_in(step_text)[0]
        if (grounded(value, allowed) and grounded(step, allowed)
                and not any(holds(value, step, known, stated) for known, stated in per_fact)):
            out.append(Violation("pair", f"{value_text} at step {step_text}"))
    return out
