"""`ask`: a question about a run → a grounded answer with its sources.

Facts first, words second: the facts come from the store (:mod:`bot.qa.retrieve`,
:mod:`bot.qa.brief`), chosen for what the question asks (:mod:`bot.qa.router`); the answer
is two to four of them (:func:`bot.qa.brief.short_answer`), the rest behind "Details". A
chat model, when one is given, only phrases the short answer's facts; every sentence it
writes goes through the claim check (:mod:`bot.qa.claims`): failing sentences are dropped,
and when what is left no longer answers the question the model is asked once more with the
rejections named, then the facts' own short answer is posted. This module imports no action
code: an answer can say what the /run commands would do, never do it.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from analyzers.stats.metric import higher_is_better
from bot.qa import prompts
from bot.qa.brief import (
    cant_answer_line,
    gap_line,
    gather_more,
    key_facts,
    short_answer,
    short_sources,
)
from bot.qa.claims import Rejection, content_words, review
from bot.qa.entities import extract
from bot.qa.facts import Fact, FactSheet, num, run_pattern
from bot.qa.grounding import check, numbers_in
from bot.qa.models import ModelError, model_name
from bot.qa.retrieve import (
    Context,
    attempt_for_step,
    baseline,
    baseline_for,
    current_attempt,
    finding_fact,
    gather,
    level_moves,
    tags,
)
from bot.qa.router import against_baseline, asks, neutral, route
from bot.qa.similar import SimilarIncidents
from bot.qa.worker import Job, worker_for
from bot.store import Store, UnknownRun

MAX_SENTENCES = 4
BUDGET_S = 9.0  # a model's whole share of one answer: both tries, before the fallback
PART_SIMILARITY = 0.7  # an ask after the first, routed by meaning, must be this near
MAX_QUESTION = 500  # characters of a question passed on to a model
Visible = Collection[str] | Callable[[str], bool] | None

_similar = SimilarIncidents()
log = logging.getLogger("runwatch.qa")


@dataclass
class Attempt:
    """One model output and what the claim check rejected in it."""

    text: str
    violations: list[Rejection]  # every rejected sentence, by kind (bot.qa.claims)
    seconds: float


@dataclass
class Answer:
    run: str
    question: str
    text: str
    sources: list[str]
    facts: FactSheet
    model: str  # "deterministic" or the model that phrased the text
    fallback: str | None = None  # why the deterministic answer replaced the model's
    attempts: list[Attempt] = field(default_factory=list)
    seconds: float = 0.0
    alert: str | None = None  # the alert whose thread asked (Details reads its facts again)

    @property
    def covered(self) -> bool:
        return not self.facts.gaps

    @property
    def details(self) -> str:
        """Every fact behind the answer, and what the record lacks."""
        return full_answer(self.facts)

    def render(self, verbose: bool = False) -> str:
        """The answer as posted: the text, then its sources (then every fact, verbose)."""
        sources = "; ".join(self.sources) if self.sources else "none"
        text = f"{self.text}\n\nSources: {sources}"
        return f"{text}\n\nDetails:\n{self.details}" if verbose else text


def visibility(visible_runs: Visible) -> Callable[[str], bool]:
    if visible_runs is None:
        return lambda run: True
    if callable(visible_runs):
        return visible_runs
    allowed = frozenset(visible_runs)
    return allowed.__contains__


def runs_named(store: Store, text: str, visible_runs: Visible = None) -> list[str]:
    """The visible runs a free text names, in order (an app mention: which run it is about)."""
    visible = visibility(visible_runs)
    known = [r for r in store.run_names() if visible(r)]
    return extract(text, known_runs=known, now=time.time()).runs


# The kinds of facts each intent needs; None keeps the kinds the question's words asked for
# and adds the intent's own.
INTENT_KINDS: dict[str, list[str] | None] = {
    "where": ["status"], "summary": ["status", "summary"], "next_step": ["next"],
    "eta": ["status", "eta"], "better": ["compare", "better"], "why": None, "changed": None,
    "rollback": None, "compare": None, "similar": None, "value": None,
}
_OWN_KIND = {"why": "why", "changed": "changed", "rollback": "rollback", "compare": "compare",
             "similar": "similar"}
_KIND_INTENT = {"status": "where", "value": "value", "min": "value", "max": "value",
                "trend": "value", "changed": "changed", "why": "why", "rollback": "rollback",
                "compare": "compare", "similar": "similar"}


def _kinds_for(intent: str, ents: Any, run: str, question: str) -> tuple[str, list[str]]:
    """The intent the answer takes and the fact kinds it reads (keywords and meaning)."""
    if intent == "unknown":
        if not ents.matched:
            return "unknown", ents.kinds
        intent = _KIND_INTENT.get(ents.kinds[0], "value")
    if intent in ("compare", "better") and len(set(ents.runs) | {run}) < 2 \
            and not against_baseline(question):
        # one run: "tell me about exp1" is near "compare exp1 with exp2", "final eval loss
        # for old1?" near "which has the lower loss?"
        intent = "value" if ents.metrics else "summary"
    if intent == "compare" and ("changed" in ents.kinds or ents.settings):
        intent = "changed"  # "which config is exp7 using, against exp1?": the settings first
    if intent == "why" and ents.metrics and ents.steps and "value" not in ents.kinds:
        ents.kinds.append("value")  # "why did the loss spike at 1500?": was it high there?
    fixed = INTENT_KINDS.get(intent)
    if intent == "next_step" and ents.decision:  # stop or go on: how much is left weighs
        fixed = ["next", "status", "eta"]
    if fixed is not None:
        return intent, list(fixed)
    kinds = list(ents.kinds)
    own = _OWN_KIND.get(intent)
    if own and own not in kinds:
        kinds.insert(0, own)
    if intent == "value" and not set(kinds) & {"value", "min", "max", "trend"}:
        kinds.append("value")
    return intent, [k for k in kinds if k != "status" or intent == "where"] or kinds


_EVENT_SIGNALS = {"spike": ("spike", "grad_norm", "divergence"), "jump": ("spike", "grad_norm",
                  "lr_schedule"), "blowup": ("spike", "divergence", "grad_norm"),
                  "blow-up": ("spike", "divergence", "grad_norm"),
                  "drop": ("throughput_drop",), "slowdown": ("throughput_drop",),
                  "slow-down": ("throughput_drop",), "crash": ("stalled",), "alert": ()}


def anchor_event(store: Store, run: str, question: str, ents: Any) -> None:
    """Set the step (or window) of the event a question names instead of a step: the first
    non-finite value for "the NaN", else the onset of the run's latest alert of that kind, else
    the run's biggest level move ("the lr jump" no alert covers); "before" it is the last point
    logged before, "after" it the window from it."""
    if ents.steps or ents.step_range is not None:
        return
    if ents.event is None and ents.just_before is None and ents.metrics and re.search(
            r"\b(ckpts?|checkpoints?)\b", question, re.I) and ents.rollback_to is None and not \
            re.search(r"\broll(ed|ing)? ?-?back|\brestor|\brevert|\bgo back\b", question, re.I):
        # "latest ckpt + its eval loss", "eval loss of the best checkpoint": the metric there
        cps = store.checkpoints(run)
        tag = ents.metrics[0]
        logged = dict(store.series(run, current_attempt(store, run), tag))
        scored = [c for c in cps if math.isfinite(logged.get(c.step, math.nan))]
        if re.search(r"\bbest\b", question, re.I) and scored:
            pick = max if higher_is_better(tag) else min
            which, cp = "best", pick(scored, key=lambda c: (logged[c.step], -c.step))
        elif cps:
            which, cp = "latest", cps[-1]
        else:
            return
        ents.at_checkpoint = (which, cp.step, cp.path)
        ents.steps = [cp.step]
        if not {"value", "min", "max", "trend"} & set(ents.kinds):
            ents.kinds.append("value")
        return
    if ents.event is None and ents.just_before is None:
        return
    when, event = ents.event or ("before", "step")
    step = None
    if ents.just_before is not None:
        step = ents.just_before
    elif event == "nan":
        bad = store.nonfinite_points(run)
        step = bad[0]["step"] if bad else None
    else:
        wanted = _EVENT_SIGNALS.get(event, ())
        rows = [r for r in store.findings(run=run) if not wanted or r["signal"] in wanted]
        step = rows[-1]["onset_step"] if rows else None
        if step is None and event != "alert":  # "the lr jump" no alert covers: the move
            moves = level_moves(store, run, covered_too=True)
            step = moves[0][1] if moves else None
    if step is None:
        return
    ents.event_step = step
    if when == "either side" and ents.metrics:  # the last point before it and the first from it
        points = store.series(run, attempt_for_step(store, run, step), ents.metrics[0])
        prior = [s for s, _ in points if s < step][-1:]
        ents.steps = prior + [s for s, _ in points if s >= step][:1]
    elif when.endswith("before") and ents.window_before and ents.metrics:
        ents.step_range = (max(0, step - ents.window_before), step - 1)  # "the 100 steps before"
    elif when.endswith("before"):
        if not ents.metrics:  # "the last checkpoint before the NaN": rollback reads the NaN
            return
        tag = ents.metrics[0]
        attempt = attempt_for_step(store, run, step)
        prior = [s for s, _ in store.series(run, attempt, tag) if s < step]
        if prior:
            ents.steps = [prior[-1]]
    elif when.endswith("after"):
        ents.step_range = (step, None)
    else:
        ents.steps = [step]
    if ents.metrics and ents.steps and not {"value", "min", "max", "trend", "why",
                                            "compare"} & set(ents.kinds):
        ents.kinds.append("value")


def _other_asks(question: str, ents: Any, intent: str, run: str, known: list[str],
                store: Store, now: float) -> dict[str, list[str]]:
    """The intents, with their fact kinds, of the asks of a question after the one routing
    chose ("ETA? and how much sooner would it be done …", "did it NaN too, or did it recover
    on its own?"): the answer says something of each."""
    pieces = asks(question)
    if len(pieces) < 2 or intent == "unknown":
        return {}
    found: dict[str, list[str]] = {}
    for piece in pieces:
        if not re.search(r"[a-z]{3,}", neutral(piece, known).replace("RUN", ""), re.I):
            continue  # "exp7 — how many steps left?": a run's name alone asks nothing
        part = extract(piece, known_runs=known, tags=tags(store, run), now=now)
        part.runs = part.runs or ents.runs
        routed = route(piece, part)
        if routed.intent in ("unknown", intent) or routed.intent in found or (
                routed.by == "embedding" and routed.score < PART_SIMILARITY):
            continue  # a short ask is pulled to a wrong example easily: only a near one counts
        part_intent, part_kinds = _kinds_for(routed.intent, part, run, piece.lower())
        if part_intent == "value" and intent in ("why", "similar"):
            continue  # "why the NaN? grad norm creeping up?": the why answer has the metrics
        if part_intent not in ("unknown", intent):
            found[part_intent] = part_kinds
    return found


def _alerted(store: Store, run: str, signals: list[str]) -> bool:
    return any(f["signal"] in signals for f in store.findings(run=run))


def _reference(question: str, run: str) -> bool:
    """Whether ``question`` names ``run`` as what to measure against ("what did we change
    from exp1 for this one?" in exp3's thread asks about exp3), not as its subject."""
    return re.search(r"\b(from|vs\.?|versus|against|compared (to|with)|than|relative to)\s+"
                     + run_pattern(run), question, re.I) is not None


def build_facts(store: Store, run: str, question: str, *, visible: Callable[[str], bool],
                now: float | None = None, alert: str | None = None) -> FactSheet:
    """The fact sheet for ``question`` asked about ``run`` (the thread's run)."""
    now = time.time() if now is None else now
    known = [r for r in store.run_names() if visible(r)]
    if run not in known:
        raise UnknownRun(run, known)
    ents = extract(question, known_runs=known, tags=tags(store, run), now=now)
    anchor_event(store, ents.runs[0] if ents.runs and run not in ents.runs else run, question,
                 ents)
    intent, kinds = _kinds_for(route(question, ents).intent, ents, run, question.lower())
    also = _other_asks(question, ents, intent, run, known, store, now)
    for part_kinds in also.values():
        kinds += [k for k in part_kinds if k not in kinds]
    unrecorded = ents.unrecorded
    if unrecorded and any(u in t.lower() for u in unrecorded.split(" or ")
                          for t in tags(store, run)):
        unrecorded = None  # a run that logs eval/mmlu/acc does record "mmlu"
    if unrecorded and not (ents.metrics or ents.setup or also):
        intent, kinds = "unknown", ["status"]  # "what did exp1 cost?": no log records it
    ents.kinds = kinds
    primary = run
    if ents.runs and run not in ents.runs:
        primary = ents.runs[0]
    if primary != run and len(ents.runs) == 1 and (
            {"compare", "better", "similar"} & set(kinds) or (
            "changed" in kinds and (_reference(question, primary) or ents.settings))):
        # "is it the 2 workers? exp1 has how many": the thread's run, measured against exp1
        primary, ents.runs = run, [run, *ents.runs]
    elif primary != run and len(ents.runs) == 1 and intent in ("why", "next_step") \
            and ents.signals and _alerted(
            store, run, ents.signals) and not _alerted(store, primary, ents.signals):
        # "is the slowdown the workers? exp1 doesn't have this problem": the trouble is the
        # thread's run's, the run named is what it is measured against
        primary, ents.runs = run, [run, *ents.runs]
    gaps = []
    if intent in ("compare", "better", "value", "summary") and not set(ents.runs) - {primary} \
            and ents.across:  # "which run has the best eval loss?"
        intent, kinds = "rank", ["rank"]
        ents.kinds = kinds
    elif (intent in ("compare", "better") or ents.baseline and intent in (
            "summary", "where", "value") and not baseline_for(store, primary, visible)) and not \
            set(ents.runs) - {primary} and not baseline(store, primary, visible):
        # nothing to compare with: say so, answer what can be ("the baseline" in the thread of
        # the run other runs name as theirs is the run itself)
        gaps.append(f"{primary} names no baseline run and the question names no other run to "
                    f"compare it with")
        if intent in ("compare", "better"):
            ents.kinds = [k for k in ents.kinds if k not in ("compare", "better")]
            intent, kinds = _kinds_for("value" if ents.metrics else "summary", ents, run,
                                       question.lower())
            ents.kinds = kinds
    if not ents.metrics and ents.signals and {"value", "trend", "min", "max"} & set(kinds):
        # "is its overfitting getting worse?": the metric the run's alert of it watches
        ents.metrics = [f["metric"] for f in store.findings(run=primary)
                        if f["signal"] in ents.signals][-1:]
    sheet = FactSheet(question=question, run=primary, kinds=kinds, intent=intent,
                      also=[i for i in also if i != intent], asked=ents)
    for gap in gaps:
        sheet.gap(gap)
    if unrecorded and (intent == "unknown" or not ents.metrics):  # the rest is answered
        sheet.gap(f"{unrecorded} — runwatch keeps {primary}'s metrics, config, data version, "
                  f"environment, alerts and actions, nothing else")
    ctx = Context(store=store, run=primary, entities=ents, now=now, visible=visible,
                  alert=alert if primary == run else None, similar=_similar)
    gather(ctx, sheet)
    gather_more(ctx, sheet)
    if intent == "unknown":
        del sheet.facts[1:]  # one line of status behind Details, not a dump
        sheet.kinds = ["status"]
    return sheet


def deterministic_answer(sheet: FactSheet) -> str:
    """The short answer built from the facts alone (:func:`bot.qa.brief.short_answer`)."""
    return short_answer(sheet)


def full_answer(sheet: FactSheet) -> str:
    """Every fact, then what the record lacks: what "Details" and ``--verbose`` show."""
    lines = [fact.text for fact in sheet.facts]
    if sheet.gaps:
        lines.append(gap_line(sheet))
    return "\n".join(lines)


def prompt_facts(sheet: FactSheet) -> str:
    """What the model is shown: the facts of the short answer (a small model given the whole
    sheet copies the wrong lines), then what the record lacks."""
    keys = key_facts(sheet)
    lines = [f"- {f.text}" for f in keys] or [f"- {f.text}" for f in sheet.facts[:3]]
    lines += [f"NOT IN THE RECORD: {gap}" for gap in sheet.gaps]
    return "\n".join(lines) if lines else "(no facts)"


def messages_for(sheet: FactSheet, question: str) -> list[BaseMessage]:
    return [SystemMessage(prompts.render("system")),
            HumanMessage(prompts.render("answer", run=sheet.run, facts=prompt_facts(sheet),
                                        question=_clip(question),
                                        max_sentences=MAX_SENTENCES))]


def retry_messages(sheet: FactSheet, question: str, first: list[BaseMessage], answer: str,
                   violations: list[Any]) -> list[BaseMessage]:
    named = "; ".join(v.describe() for v in violations[:6])
    return [*first, AIMessage(answer),
            HumanMessage(prompts.render("regenerate", violations=named,
                                        facts=prompt_facts(sheet), question=_clip(question)))]


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_QUESTION else text[:MAX_QUESTION] + "…"


_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
_FINISHED = re.compile(r"[.!?](?=\s)|\n")  # a sentence end the text has gone on past


def tidy(text: str) -> str:
    """What a model wrote, less the scaffolding small models copy from the prompt: source
    tags, a leading ``FACTS:`` header, lines repeated word for word and list markers."""
    text = re.sub(r"\s*\[source:[^\]]*(?:\]|$)", "", text)
    text = re.sub(r"^\s*(?:FACTS|ANSWER)[^:\n]{0,40}:\s*", "", text, flags=re.I)
    lines: list[str] = []
    for line in text.splitlines():
        line = re.sub(r"^\s*[-*•]\s+", "", line)
        if line.strip() and line.strip() in (x.strip() for x in lines):
            continue
        lines.append(line)
    return "\n".join(lines).strip()


def _generate(model: BaseChatModel, messages: list[BaseMessage], reader: _Reader,
              max_time: float) -> tuple[str, str]:
    """The model's reply, read as it streams, and the words a limit cut off at its end.
    The reading stops (and the model with it) once the reader has the most sentences an
    answer posts — whatever came next would be cut. A reply a limit ended ("length": its
    tokens or time ran out) ends mid-sentence as like as not, mid-number even ("… at step
    2500: 2." of 2.194): what follows its last finished sentence is no part of it."""
    text, cut = "", False
    chunks = model.stream(messages, max_time=max_time)
    try:
        for chunk in chunks:
            text += str(chunk.content)
            reason = (getattr(chunk, "response_metadata", None) or {}).get("finish_reason")
            cut = reason == "length" if reason else cut
            if reader(tidy(text)):
                return reader.read, ""
    finally:
        chunks.close()  # a model still writing is told to stop
    text = tidy(text)
    if cut:  # a reply of one unfinished sentence is no reply ("…; highest 2." of 2.117)
        end = max((m.end() for m in _FINISHED.finditer(text)), default=0)
        return text[:end].strip(), text[end:].strip()
    return text, ""


def known_sentences(sheet: FactSheet) -> list[str]:
    """Sentences the code itself writes, which the claim check passes like facts."""
    return [gap_line(sheet), cant_answer_line()]


class _Reader:
    """A reply read as it streams. At each sentence end the claim check judges the sentences
    so far; the ones it keeps — exactly the ones the finished answer keeps — go to
    ``on_partial`` (Slack's streaming), so nothing unchecked is shown, even for a moment. A
    rejected sentence (a copied ``FACTS:`` header, an echoed question) is left out and the
    stream goes on past it. Calling the reader says whether the answer is whole: once
    ``MAX_SENTENCES`` sentences are kept, the rest would not be posted."""

    def __init__(self, sheet: FactSheet, question: str, runs: list[str],
                 on_partial: Callable[[str], None] | None = None) -> None:
        self.sheet, self.question, self.runs, self.on_partial = sheet, question, runs, on_partial
        self.read = ""  # the text up to its last sentence end, as last judged
        self.shown = ""
        self.whole = False

    def __call__(self, text: str) -> bool:
        ends = [m.end() for m in _FINISHED.finditer(text)]
        prefix = text[:ends[-1]].strip() if ends else ""
        if not prefix or prefix == self.read:
            return self.whole
        self.read = prefix
        kept = review(prefix, self.sheet, self.question, all_runs=self.runs,
                      known=known_sentences(self.sheet)).kept
        self.whole = len(kept) >= MAX_SENTENCES
        shown = " ".join(kept[:MAX_SENTENCES])
        # a verdict rests on the sentence and the ones before it, so what was kept stays
        # kept; the check is kept in case the sentence splitter reads a longer text anew
        if self.on_partial and shown and shown != self.shown and shown.startswith(self.shown):
            self.shown = shown
            self.on_partial(shown)
        return self.whole


def _direct(sheet: FactSheet) -> list[Fact]:
    """The facts that are the direct answer (the next step itself for "what should I do"),
    which a model's answer must keep: a model that drops them answered another question.
    A why-question's answer keeps its candidate causes too, and a rollback question with no
    recommended target its checkpoints ("no alert is open" alone does not say where)."""
    keys = key_facts(sheet)
    if not keys or sheet.intent == "unknown":
        return []
    own = {"next_step": "Next step:", "eta": "should finish in about"}.get(sheet.intent)
    direct = [f for f in keys if own and own in f.text]
    if sheet.intent == "changed":  # what differs, not only how many settings do
        direct = [f for f in keys if f.kind == "config" and _SETTING_LINE.match(f.text)]
    first = direct[0] if direct else keys[0]
    extra: list[Fact] = []
    if sheet.intent == "why":  # the causes, or with no alert what moved at the step
        extra = [f for f in keys if f.kind == "cause" and "Candidate causes" in f.text] or [
            f for f in keys if f.kind == "shift" and f.text.startswith("Around step")]
    elif sheet.intent == "summary":  # what happened: a NaN, the alerts, not only the step
        extra = [f for f in keys if f.kind == "nonfinite"
                 or (f.kind == "history" and f.text.startswith("runwatch raised"))
                 or (f.kind == "move" and f.text.startswith("No alert covers it"))]
    elif sheet.intent in ("where", "eta"):  # "status of exp3": its open alerts, not only the step
        extra = [f for f in keys if f.text.startswith("Open alerts on")]
    elif sheet.intent == "compare":  # the other metric too: an overfit run wins on train only
        extra = [f for f in keys if f.kind == "better" and f is not first][:1]
    elif sheet.intent == "changed" and sheet.asked.attempts:  # how they compare, what was done
        extra = ([f for f in keys if "the latest step both attempts" in f.text][:1]
                 + [f for f in keys if f.kind == "action"][:1])
    elif sheet.intent == "rollback":  # a warning about the asked target; where to go
        extra = [f for f in keys if " is not before the " in f.text]
        if sheet.asked.all_checkpoints:
            extra += [f for f in keys if f.kind == "checkpoint"]  # "list the checkpoints"
        elif not any(f.text.startswith("Recommended rollback") for f in keys):
            extra += [f for f in keys if f.kind == "checkpoint" or f.text.startswith(
                ("The latest checkpoint of", f"{sheet.run} has a"))][:1]
    limit = 2 if sheet.intent == "rollback" or (sheet.intent == "changed"
                                                and sheet.asked.attempts) else 1
    return [first] + [f for f in extra[:limit] if f is not first]


_SETTING_LINE = re.compile(r"^\S+: .+ in \S+, .+ in \S+\.$")
_NONE_OPEN = re.compile(r"\b(no|nothing|none|not)\b", re.I)
_WARNED = re.compile(r"\b(not before|after|already|past|may (already )?hold|too late)\b", re.I)


def _missing_direct(text: str, sheet: FactSheet) -> list[str]:
    """What of the direct answer ``text`` leaves out: another run it names, its first two
    numbers (the value and its step, the step and the total), or, for a fact without
    numbers, its words; that no alert is open, where that is the answer."""
    missing: list[str] = []
    for fact in _direct(sheet):
        # another run the direct answer names ("a spike on old1 from step 800") is part of it
        missing += [r for r in sorted(sheet.runs - {sheet.run})
                    if _names(fact.text, r) and not _names(text, r)]
        if fact.kind == "action":  # one of what it did ("checkpoint-1000", "lr x0.67") will do
            said = numbers_in(text)
            if fact.numbers and not any(abs(abs(s.value) - w) <= s.tolerance for w in fact.numbers
                                        for s in said):
                missing.append(f"what '{fact.text}' did")
        elif fact.text.startswith("Open alerts on "):  # the alerts by name; their steps may go
            run = fact.text[len("Open alerts on "):].split(":")[0]
            missing += [f"the open alert {a}" for a in sorted(sheet.open_alerts.get(run, ()))
                        if not re.search(a.replace("_", "[ _]"), text, re.I)]
        else:
            missing += _missing_values(text, fact)
        if fact.text.startswith("No alert is open") and not _NONE_OPEN.search(text):
            missing.append("that no alert is open")
        if " is not before the " in fact.text and not _WARNED.search(text):
            missing.append(f"the warning '{fact.text}'")
    return list(dict.fromkeys(missing))


def _names(text: str, run: str) -> bool:
    return re.search(run_pattern(run), text) is not None


def _missing_values(text: str, fact: Fact) -> list[str]:
    wanted = [n for n in fact.numbers if n != 0][:2]
    if not wanted:
        words = set(content_words(fact.text))
        said = set(content_words(text))
        return [] if not words or len(words & said) / len(words) >= 0.6 else [
            f"the words of '{fact.text}'"]
    said_numbers = numbers_in(text)
    return [num(n) for n in wanted
            if not any(abs(s.value - abs(n)) <= s.tolerance * (1 + 1e-9) + 1e-12
                       or (s.percent and abs(s.value / 100 - abs(n)) <= s.tolerance / 100)
                       for s in said_numbers)]


def answer_with_model(store: Store, sheet: FactSheet, question: str, model: BaseChatModel,
                      on_partial: Callable[[str], None] | None = None,
                      budget_s: float = BUDGET_S) -> Answer:
    """The model's checked sentences when they still answer the question (a second try
    when the first fails and the budget leaves room), else the facts' own short answer.
    Loading the model (once per process, see :func:`warm`) is not counted in ``budget_s``."""
    runs = store.run_names()
    answer = Answer(run=sheet.run, question=question, text=deterministic_answer(sheet),
                    sources=short_sources(sheet), facts=sheet, model="deterministic")
    if sheet.intent == "unknown":  # nothing for a model to phrase
        answer.fallback = "the question matched nothing runwatch records"
        return answer
    try:
        _load(model)
    except (ModelError, OSError) as exc:
        answer.fallback = f"the model failed to load ({exc})"
        return answer
    started = time.perf_counter()
    first = messages_for(sheet, question)
    messages = first
    shown = ""
    for round_ in range(2):
        t0 = time.perf_counter()
        left = budget_s - (t0 - started)
        if round_ and left < answer.attempts[-1].seconds:
            answer.fallback = ("the model's answer failed the claim check and there was no "
                               "time left to try again")
            break
        # the first try is streamed, and the second when the first showed nothing
        reader = _Reader(sheet, question, runs, None if shown else on_partial)
        try:
            text, tail = _generate(model, messages, reader, left)
        except (ModelError, TimeoutError, OSError) as exc:
            answer.fallback = f"the model failed ({exc})"
            break
        spent = time.perf_counter() - t0
        shown = shown or reader.shown
        checked = review(text, sheet, question, all_runs=runs, known=known_sentences(sheet))
        rejected = list(checked.rejected)
        if tail:
            rejected.append(Rejection("unfinished", tail, "the model's limit ended it "
                                                          "mid-sentence"))
        if not text:
            rejected.append(Rejection("fragment", "", "the answer is empty"))
        elif spent >= 0.95 * left and not _SENTENCE_END.search(text):
            rejected.append(Rejection("cut", text, "it was cut off by the time limit"))
        kept = " ".join(checked.kept[:MAX_SENTENCES])  # short: the rest is not posted
        missing = _missing_direct(kept, sheet) if kept else []
        if kept and missing:
            rejected.append(Rejection("incomplete", kept, "it leaves out "
                                      + ", ".join(missing) + " from the direct answer"))
        answer.attempts.append(Attempt(text, rejected, spent))
        if rejected:  # said where the operator looks: why the model's words were not posted
            log.info("run %s: %s's answer (try %d, %.1f s): %d sentence(s) rejected: %s",
                     sheet.run, model_name(model), round_ + 1, spent, len(rejected),
                     "; ".join(r.describe() for r in rejected))
        if kept and not missing and not any(r.kind == "cut" for r in rejected):
            if sheet.gaps and not re.search(r"does not show|not in the (?:run )?(?:history|"
                                            r"record)|no (?:data|record)", kept, re.I):
                kept = f"{kept} {gap_line(sheet, kept)}".rstrip()  # what the record lacks, once
            for fact in key_facts(sheet):  # and so is what a compare could not compare
                if fact.text.startswith("Missing, so not compared") and fact.text not in kept:
                    kept += " " + fact.text
            answer.text, answer.model = kept, model_name(model)
            answer.fallback = None
            break
        answer.fallback = "the model's answer failed the claim check twice"
        messages = retry_messages(sheet, question, first, text, rejected)
    answer.seconds = time.perf_counter() - started
    return answer


def _loader(model: BaseChatModel | None) -> Callable[[], None] | None:
    """How a model that loads its weights in-process (the transformers backend) loads them
    (a no-op once loaded); None for a served model, which has nothing to load."""
    load = getattr(model, "load", None)
    return load if callable(load) else None


def _load(model: BaseChatModel) -> None:
    if (load := _loader(model)) is not None:
        load()


def warm(model: BaseChatModel | None) -> Job | None:
    """Load ``model`` on its device's worker now, so the first question does not wait for
    it (questions asked meanwhile queue behind it); None when there is nothing to load."""
    if model is None or (load := _loader(model)) is None:
        return None
    job = worker_for(_device(model)).submit(load)

    def said(future: Future[Any]) -> None:
        if (exc := future.exception()) is not None:  # the operator hears of it at start
            log.warning("could not load %s (%s): answers come from the facts alone until "
                        "it loads", model_name(model), exc)

    job.future.add_done_callback(said)
    return job


def _device(model: BaseChatModel) -> str:
    return str(getattr(model, "device_key", None) or model._llm_type)


def ask(store: Store, run: str, question: str, *, model: BaseChatModel | None = None,
        visible_runs: Visible = None, alert: str | None = None, now: float | None = None,
        on_partial: Callable[[str], None] | None = None, wait_s: float | None = None,
        budget_s: float = BUDGET_S) -> Answer:
    """Answer ``question`` about ``run`` from the store, phrased by ``model`` when given.

    ``visible_runs`` (a set of names or a predicate) limits every fact to runs the asker may
    see; a run outside it is reported exactly like an unknown one. ``alert`` is the
    fingerprint of the alert whose thread the question came from. The generation waits its
    turn on the model's device (one at a time); :func:`submit` returns at once instead.
    ``budget_s`` bounds the model's generations (both tries) once its turn has come.
    Raises :class:`bot.services.status.UnknownRun`.
    """
    return submit(store, run, question, model=model, visible_runs=visible_runs, alert=alert,
                  now=now, on_partial=on_partial, budget_s=budget_s).result(wait_s)


def submit(store: Store, run: str, question: str, *, model: BaseChatModel | None = None,
           visible_runs: Visible = None, alert: str | None = None, now: float | None = None,
           on_partial: Callable[[str], None] | None = None,
           on_start: Callable[[], None] | None = None,
           budget_s: float = BUDGET_S) -> Job | _Done:
    """Start answering; the returned job has ``position()`` (generations ahead of it) and
    ``result(timeout)``. Facts are read before this returns, so an unknown run raises here.
    ``on_start`` hears, on the model's worker, that this question's turn came (a queued one
    waits for it); ``on_partial`` then hears each longer run of checked sentences."""
    started = time.perf_counter()
    sheet = build_facts(store, run, question, visible=visibility(visible_runs), now=now,
                        alert=alert)
    if model is None:
        answer = Answer(run=sheet.run, question=question, text=deterministic_answer(sheet),
                        sources=short_sources(sheet), facts=sheet, model="deterministic",
                        seconds=time.perf_counter() - started, alert=alert)
        return _Done(answer)

    def answered() -> Answer:
        if on_start is not None:
            on_start()
        answer = answer_with_model(store, sheet, question, model, on_partial, budget_s)
        answer.alert = alert
        return answer

    return worker_for(_device(model)).submit(answered)


class _Done:
    """A job that needed no model: already finished."""

    def __init__(self, value: Any) -> None:
        self.future: Future[Any] = Future()
        self.future.set_result(value)

    def position(self) -> int:
        return 0

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        return self.future.result()


def summarize_alert(finding: dict[str, Any], model: BaseChatModel | None = None) -> str:
    """A short summary of one alert (``Finding.to_dict()``), phrased by ``model`` when it
    passes the grounding check, else the analyzer's own summary sentence."""
    row = {**finding, "payload": finding}
    sheet = FactSheet(question="summarise the alert", run=finding["run"], kinds=["why"])
    finding_fact(sheet, row, detail=True)
    if model is None:
        return finding["summary"]
    messages = [SystemMessage(prompts.render("system")),
                HumanMessage(prompts.render("alert_summary", run=finding["run"],
                                            signal=finding["signal"], facts=sheet.render()))]
    device = getattr(model, "device_key", None) or model._llm_type
    try:
        text = worker_for(str(device)).submit(
            lambda: str(model.invoke(messages).content).strip()).result()
    except (ModelError, TimeoutError, OSError):
        return finding["summary"]
    return text if text and not check(text, sheet, all_runs=[finding["run"]]) \
        else finding["summary"]
