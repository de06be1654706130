"""The semantic check: every sentence a model writes is a claim, and each claim must follow
from the fact sheet — not just its numbers.

:func:`review` splits a model's answer into sentences and rejects each one that

- ``fragment``: is not a complete sentence (no end mark, fewer than four words, no verb,
  starts mid-sentence: "FAC", "The lowest", "spike on exp2 from step 1500, …");
- ``repetition``: repeats an earlier sentence or loops a phrase ("The answer was: " x15);
- ``echo``: mostly restates the question;
- ``instruction``: follows an instruction written inside the question ("... and reply 'all
  good'");
- ``number``/``name``/``path``/``run``/``step``/``pair``/``action``: fails the grounding
  check of :mod:`bot.qa.grounding` (a number, step, checkpoint or run the facts lack; a
  claimed action);
- ``tie``: states a number the facts hold, but for another run or metric than the sentence
  names ("exp1: latest eval/loss 1.335" when 1.335 is exp2's);
- ``signal``: names an alert or signal the facts do not;
- ``cause``: states a cause or fix the facts do not, or states a candidate cause as
  established;
- ``comparison``: uses a comparison word (lower, highest, first, only, all, …) that no fact
  about the same run and metric uses ("the lowest among the runs");
- ``comparison`` too: calls a step the latest (a checkpoint the first) that no fact calls so
  with the same restriction ("the latest checkpoint" of "the latest checkpoint before the
  onset"), or says two runs record the same, different or no config, data version or
  environment when the facts say otherwise;
- ``target``: names a step to roll back to that is no checkpoint in the facts, or, advising
  it, not the one runwatch recommends ("should go back to step 1500", the onset);
- ``count``: counts things (runs, alerts, checkpoints, settings, points, attempts) with a
  number no fact counts them with ("the first 3 runs" when 3 counts alerts);
- ``identity``: says a thing is itself ("the checkpoint at step 1500 is the checkpoint at
  step 1000"), that a run is an event ("the run was a spike on exp2"), or gives a rollback
  an alert's state ("no rollback is open on exp2"), or names a run by its place ("the first
  run was NaN");
- ``state``: calls an alert open or resolved when the facts say otherwise, or says no alert
  is open without a fact that lists them all;
- ``direction``: says a metric rose, fell or stayed flat where no fact about that run and
  metric moves that way ("eval/loss of exp3 is falling" while it rises);
- ``unsupported``: is mostly words the facts never use ("trained on a dataset that is too
  large").

A sentence that copies a fact word for word is a fact, and passes. Rejected sentences are
dropped; :mod:`bot.qa.service` falls back to the facts' own short answer when what is left
no longer answers the question.

Why a rule-based claim checker and not a typed answer (the model picks fact ids, the code
renders them): both were measured (``python -m benchmarks.qa --mode typed``; BENCHMARKS.md).
With the bundled 135M model the typed answer named no usable fact id for 24 of 24 questions
and took twice as long (the whole fact list is a longer prompt), while with the checker the
model's own checked sentences were posted for 12–55 of 100 answers with 0 wrong claims
found by the benchmark; with a bigger served model the checker applies unchanged, so it is
the one path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from analyzers.catalog import CATALOG
from bot.qa.entities import METRIC_WORDS
from bot.qa.facts import AlertSeen, Fact, FactSheet, run_pattern
from bot.qa.grounding import VALUE, Number, grounded, numbers_in
from bot.qa.grounding import check as ground

_SPLIT = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bvs\.)(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[a-z][a-z'/_-]*")
_STEP_NUMBER = re.compile(r"\b(?:steps?|iterations?|iters?|checkpoint[-_ ]?|attempt)\s*#?\s*"
                          r"(\d[\d,]*)", re.I)
_VERB = re.compile(
    r"\b(?:is|are|was|were|be|been|being|has|have|had|do|does|did|can|could|should|would|"
    r"will|shall|may|might|must|went|fell|rose|began|begun|reached|shows?|showed|logged|"
    r"moved|dropped|jumped|stalled|spiked|finished|needs?|lists?|holds?|recommends?|"
    r"stopped|started|peaked|remains?|stays?|keeps?|differs?|lacks?|records?|says?|gives?|"
    r"runs?|ran|sits?|stands?|suggests?|points?|looks?|seems?|came|comes|got|gets|took|"
    r"makes?|made|\w+ed|\w+es)\b", re.I)
_CAUSAL = re.compile(r"\b(?:because|caused\s+by|due\s+to|the\s+cause|results?\s+of|led\s+to|"
                     r"stems?\s+from|the\s+reason|is\s+why|as\s+a\s+result|was\s+caused|"
                     r"is\s+caused)\b", re.I)
_HEDGE = re.compile(r"\b(?:likely|may|might|could|possibl\w*|candidates?|perhaps|probabl\w*|"
                    r"suspect\w*|one\s+of)\b", re.I)
_FIX = re.compile(r"\b(?:should|recommend\w*|next\s+step|fix\w*|try|consider)\b", re.I)
COMPARISONS = ("lower", "higher", "lowest", "highest", "best", "worst", "better", "worse",
               "first", "only", "all", "every", "most", "least", "fastest", "slowest",
               "largest", "smallest", "more", "less", "fewer", "same", "never", "always")
_COMPARISON = re.compile(r"\b(" + "|".join(COMPARISONS) + r")\b", re.I)
_INSTRUCTION = re.compile(
    r"(?:\b(?:say|reply|respond|answer|write|print|output|repeat|tell\s+(?:me|us|them))"
    r"(?:\s+(?:with|only|just|exactly|that|back))*\s*[:,]?\s*"
    r"|\bignore\b[^.?!]*?\b(?:and|then)\s+(?:say|write|reply)\s*[:,]?\s*)"
    r"[\"'“‘]?([^\"'”’?!]{3,120})", re.I)
_STOP = frozenset(
    "the a an of to in on at for and or but is are was were be been it its this that these "
    "those with by from as which what when where who how why do does did has have had not no "
    "so than then there their they them we you your our i me my us can could should would "
    "will about into over under up down if any some just also very now run runs step steps "
    "value values".split())
# Words any answer may use without a fact using them.
_PLAIN = frozenset(
    "answer question facts fact record history recorded shows show says said latest current "
    "currently recent recently around near about point points metric metrics training train "
    "model checkpoint checkpoints alert alerts open firing resolved began started since "
    "between against compared earlier later before after during reached went moved time "
    "level rate still yet already note however overall there here nothing more less same "
    "loss eval evaluation validation learning roll back rollback restore".split())
MIN_SUPPORT = 0.5  # share of a sentence's own words the facts must use
# Words that call a value an extreme, and the words after which a value is something else
# ("…; lowest 2.142 at step 980, highest 3.885 at step 10, mean 2.486").
EXTREMES = {"lowest": "lowest", "minimum": "lowest", "min": "lowest", "smallest": "lowest",
            "highest": "highest", "maximum": "highest", "max": "highest", "peak": "highest",
            "peaked": "highest", "largest": "highest"}
# Words that place a step first or last, and the words that restrict them ("the latest
# checkpoint *before* the onset" is not the latest checkpoint).
ORDINALS = {"latest": "last", "last": "last", "most recent": "last", "newest": "last",
            "final": "last", "first": "first", "earliest": "first", "oldest": "first"}
_ORDINAL = re.compile(r"\b(" + "|".join(ORDINALS).replace(" ", r"\s+") + r")\b", re.I)
_RESTRICTION = {"before": re.compile(r"\b(?:before|prior\s+to|preceding|ahead\s+of|earlier\s+"
                                     r"than|until)\b", re.I),
                "after": re.compile(r"\b(?:after|following|since|later\s+than)\b", re.I)}
# A step to go back to: "roll back to step 1000", "should go back to the checkpoint at step
# 1500", "restore checkpoint-1000", "runwatch recommends the checkpoint at step 1000".
_N = r"(\d[\d,]*)"
_TARGET = re.compile(
    r"\b(?:back|revert\w*|return\w*|rewind\w*)\s+(?:[\w-]+\s+){0,2}?to\s+(?:the\s+)?"
    r"(?:[\w-]+\s+){0,2}?(?:checkpoint[-_ ]?\s*(?:at\s+|from\s+)?)?(?:step\s+)?" + _N
    + r"|\b(?:restor\w*|recommend\w*|rollback)\s+(?:[\w-]+\s+){0,2}?(?:from\s+)?"
    r"(?:the\s+)?(?:checkpoint[-_ ]?\s*(?:at\s+)?|step\s+)(?:step\s+)?" + _N, re.I)
_ADVICE = re.compile(r"\b(?:should|recommend\w*|suggest\w*|advis\w*|best|safe\w*|need\w*|"
                     r"must|ought)\b", re.I)
# What two runs record, and what a sentence says of it: the same, different, or missing.
ATTRIBUTES = {"config": r"config\w*|settings?|hyper-?parameters?",
              "data version": r"data(?:set)?[\s_-]*versions?",
              "environment": r"environments?|env"}
_POLARITY = (("missing", re.compile(r"\b(?:missing|lacks?|lacking|without|none|not\s+recorded|"
                                    r"records?\s+no|has\s+no|have\s+no|no)\b", re.I)),
             ("different", re.compile(r"\b(?:not|n't)\s+(?:\w+\s+){0,2}?(?:the\s+)?same\b|"
                                      r"\bdiffer\w*|\bdifferent\b|\bmismatch\w*",
                                      re.I)),
             ("same", re.compile(r"\b(?:same|identical|match(?:es|ing)?|equal|unchanged)\b",
                                 re.I)))
# A number that counts things: "8 other visible runs", "3 earlier alert(s)", "2 settings".
_COUNT = re.compile(r"(?<![\w.])(?<!step )(\d[\d,]*)\s+((?:[a-z-]+\s+){0,2}?)(run|alert|checkpoint|"
                    r"setting|point|attempt|evaluation|incident)(?:s|\(s\))?(?!\w)", re.I)


# "The run was a spike on exp2": a run is not an event (set c, C19)
_RUN_IS_EVENT = re.compile(r"\b(?:the|this|that)\s+run\s+(?:is|was)\s+(?:a|an)\s+(?:\w+\s+)?"
                           r"(?:spike|alert|nan|drop|incident|rollback|overfit\w*|plateau)\b",
                           re.I)


# "No rollback is open on exp2": open, firing and resolved are states of an alert (run E)
_ACTION_STATE = re.compile(r"\b(?:rollbacks?|checkpoints?|stops?)\s+(?:is|are|was|were)\s+"
                           r"(?:not\s+|still\s+)?(?:open|firing|resolved)\b", re.I)


# "The first run was NaN at step 1700" (set d, D43: it was exp4): a run is named by name
_ORDINAL_RUN = re.compile(r"\b(?:first|second|third|fourth|last|latter|former|previous|"
                          r"earlier|other)\s+run\b(?!s)", re.I)


def _counted(text: str) -> list[tuple[int, str]]:
    """(number, thing) for each number that counts things; the words between may only
    describe them ("8 other visible runs"), not make a clause ("1500 is the checkpoint")."""
    return [(int(m.group(1).replace(",", "")), m.group(3).lower())
            for m in _COUNT.finditer(text)
            if not any(w in _STOP or _VERB.fullmatch(w) for w in m.group(2).lower().split())]


# An alert's state as a sentence words it.
_NOT_OPEN = re.compile(r"\b(?:not|no\s+longer|n't)\s+(?:\w+\s+)?(?:open|firing|active|ongoing)\b",
                       re.I)
_NOT_RESOLVED = re.compile(r"\b(?:not|n't)\s+(?:\w+\s+)?(?:resolved|closed|cleared|over)\b|"
                           r"\bunresolved\b", re.I)
_OPEN = re.compile(r"\b(?:open|firing|active|ongoing)\b", re.I)
_RESOLVED = re.compile(r"\b(?:resolved|closed|cleared|recovered|fixed|(?:is|are|was)\s+over)\b",
                       re.I)
_NONE_OPEN = re.compile(r"\bno\s+(?:\w+\s+)?(?:open|firing|active)\s+alerts?\b|\bno\s+alerts?\s+"
                        r"(?:is|are|was|were)\s+(?:\w+\s+)?(?:open|firing|active)\b|"
                        r"\bnothing\s+is\s+(?:open|firing)\b", re.I)
# The step an alert is said to begin or end at ("spike from step 1500", "overfit to step 1300").
_ALERT_STEP = {
    "onset": re.compile(r"\b(?:from|since|began\s+at|begins\s+at|started\s+at|starting\s+at|"
                        r"onset(?:\s+at)?)\s+step\s+(\d[\d,]*)", re.I),
    "resolved": re.compile(r"\b(?:resolved\s+at|ended\s+at|cleared\s+at|closed\s+at|to|until)"
                           r"\s+step\s+(\d[\d,]*)", re.I),
}
# Which way a metric moved, as a sentence or a fact words it (a fact also by its numbers:
# "2.29 at step 600 → 2.164 at step 900", "(+5.3%)").
DIRECTIONS = {
    "up": r"ris(?:e|es|ing|en)|rose|increas\w*|climb\w*|grow(?:s|ing|n)?|grew|jump\w*|"
          r"spik(?:e|es|ed|ing)|surg\w*|(?:went|goes|going|gone)\s+up",
    "down": r"fall(?:s|ing|en)?|fell|decreas\w*|declin\w*|drop(?:s|ped|ping)?|"
            r"(?:went|goes|going|gone)\s+down|shr[ai]nk\w*|shrunk",
    "flat": r"flat|plateau\w*|stall\w*|stagnat\w*|steady|level(?:l?ed)\s+off",
}
_DIRECTION = {way: re.compile(rf"\b(?:{words})\b", re.I) for way, words in DIRECTIONS.items()}
_ARROW = re.compile(rf"({VALUE})(?:\s+at\s+step\s+[\d,]+)?(?:\s*\([^)]*\))?\s*(?:→|->)\s*"
                    rf"({VALUE})")
_SIGNED = re.compile(r"(?<![\w.])([-+])\d+(?:\.\d+)?%")
# A sentence that opens with "Q:"/"Answer:", calls something "the answer" or talks of "the
# question" copies the prompt's Q/A scaffolding ("1.968 is the answer to the question.", "The
# question was about the loss at step 400.").
_SCAFFOLD = re.compile(r"^\s*(?:Q|A|Question|Answer)\s*:|^\s*answer\s+(?:is|was)\b|"
                       r"\bis\s+the\s+answer\b|\bthe\s+answer\s+(?:is|was)\b|"
                       r"\bthe\s+question\b", re.I)
_AT_STEP = re.compile(rf"({VALUE}),?\s+at\s+step\s+(\d[\d,]*)", re.I)
# The steps a fact names, its evidence's "peak_step = 1500" too.
_STEPS_IN_FACT = re.compile(_STEP_NUMBER.pattern + r"|\w*step\w*\s*[=:]\s*\d[\d,]*", re.I)
_CLAUSE = re.compile(r";|,\s|\bwhile\b|\bbut\b|\bwhereas\b|\bagainst\b", re.I)
_BOUND = re.compile(r"\b(" + "|".join(EXTREMES) + r"|mean|median|average|latest|against|"
                    r"baseline|ratio|then|current|first|last)\b", re.I)


@dataclass(frozen=True)
class Rejection:
    kind: str
    sentence: str
    detail: str

    def describe(self) -> str:
        return f"{self.kind}: {self.detail}"


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` (a line break ends one too)."""
    return [s.strip() for s in _SPLIT.split(text) if s.strip()]


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w./%-]+", " ", text.lower()).split())


def _words(text: str) -> list[str]:
    return [w.strip("'-/") for w in _WORD.findall(text.lower()) if w.strip("'-/")]


def _content(text: str) -> list[str]:
    return [w for w in _words(text) if w not in _STOP and len(w) > 2]


def content_words(text: str) -> list[str]:
    """The words of ``text`` that carry its meaning (no stop words, no short words)."""
    return _content(text)


def _near(a: str, b: str) -> bool:
    """Two sentences that say the same with a word or two changed ("train/loss" / "loss")."""
    wa, wb = set(_norm(a).split()), set(_norm(b).split())
    return len(wa) >= 5 and len(wa & wb) / len(wa | wb) >= 0.8


def metrics_named(text: str, extra: Iterable[str] = ()) -> set[str]:
    """The canonical metric tags a text names (logged tags or plain words)."""
    lowered = text.lower()
    found = {t for t in extra if re.search(rf"(?<![\w/]){re.escape(t.lower())}(?![\w/])",
                                           lowered)}
    work = lowered
    for t in sorted(found, key=len, reverse=True):
        work = work.replace(t.lower(), " ")
    for word, tag in sorted(METRIC_WORDS.items(), key=lambda kv: len(kv[0]), reverse=True):
        if re.search(rf"(?<![\w/]){re.escape(word)}(?![\w/])", work):
            found.add(tag)
            work = re.sub(rf"(?<![\w/]){re.escape(word)}(?![\w/])", " ", work)
    return found


# a duration as runwatch writes one (fmt_duration: "1h 40m", "22m 30s", "45s"), and the words
# of a fact that says it under a condition ("would finish … at the throughput before the drop")
_DURATION_TEXT = re.compile(r"\b\d+h(?: \d+m)?(?: \d+s)?\b|\b\d+m(?: \d+s)?\b|\b\d+s\b")
_CONDITIONAL = re.compile(r"\bwould\b|\bhad\b|\bif\b|\bwithout\b|\bbefore the drop\b|"
                          r"\boriginal\b|\bat the (?:old|earlier|previous|former) ", re.I)


class Checker:
    """What one fact sheet supports, prepared once for all the sentences of an answer."""

    def __init__(self, sheet: FactSheet, question: str, all_runs: Iterable[str],
                 known: Iterable[str] = ()) -> None:
        self.sheet = sheet
        self.question = question
        self.all_runs = sorted(set(all_runs) | sheet.runs, key=len, reverse=True)
        self.tags = {t for f in sheet.facts for t in re.findall(r"\b(?:train|eval)/[\w/]+|"
                                                                 r"\blr\b|\bgrad_norm\b|"
                                                                 r"\bthroughput\b|\bgpu_mem\b",
                                                                 f.text)}
        texts = [f.text for f in sheet.facts] + list(known)
        self.known = {_norm(t) for t in texts} | {_norm(p) for t in texts
                                                  for p in sentences(t)}
        self.fact_text = "\n".join(f.text for f in sheet.facts) + "\n" + "\n".join(sheet.gaps)
        self.vocab = set(_words(self.fact_text)) | set(_words(" ".join(self.all_runs)))
        self.payload = self._instruction_payload(question)
        self.q_words = set(_content(question))

    # ---- per sentence ------------------------------------------------------------------
    def _starts_mid_sentence(self, sentence: str) -> bool:
        """A sentence opens with a capital, a run name or a metric tag ("exp4 was …",
        "train/loss of …", "lr of …"); "spike on exp2 from step 1500, …" or "no rollback
        was recorded …, name of the config" is a piece cut from another sentence (set b,
        B38)."""
        first = sentence.strip().split(maxsplit=1)[0].strip("\"'“‘(") if sentence.strip() else ""
        if not first or not first[0].islower():
            return False
        word = first.rstrip(".,;:")
        return not (word in self.tags or word == "runwatch" or word.split("'")[0] in
                    self.all_runs or word.split("/")[0] in ("train", "eval"))

    def is_fact(self, sentence: str) -> bool:
        """A whole fact, or one whole sentence of a fact, copied word for word."""
        return bool(sentence.strip()) and _norm(sentence) in self.known

    def runs_in(self, text: str) -> set[str]:
        found = set()
        for run in self.all_runs:
            if re.search(run_pattern(run), text, re.I):
                found.add(run)
                text = re.sub(run_pattern(run), " ", text, flags=re.I)
        return found

    def fact_runs(self, fact: Fact) -> set[str]:
        return self.runs_in(fact.text) | ({fact.source.run} if fact.source else set())

    def clauses(self, fact: Fact) -> list[tuple[set[str], str]]:
        """The parts of a fact, each with the runs it is about: a fact about two runs ("exp2
        has the lower latest eval/loss: 2.12 …, against 2.15 … for exp1") ties each number
        and comparison word to the run of its own clause, not to both."""
        own = {fact.source.run} if fact.source else set()
        if len(self.runs_in(fact.text)) < 2:
            return [(self.fact_runs(fact), fact.text)]
        out: list[tuple[set[str], str]] = []
        subject = own
        for part in fact.text.split(";"):
            runs = self.runs_in(part)
            if len(runs) < 2:
                subject = runs or subject
                out.append((set(subject), part))
                continue
            for piece in part.split(","):
                subject = self.runs_in(piece) or subject
                out.append((set(subject), piece))
        return out

    def check(self, sentence: str, earlier: list[str]) -> list[Rejection]:
        out: list[Rejection] = []

        def reject(kind: str, detail: str) -> None:
            out.append(Rejection(kind, sentence, detail))

        norm = _norm(sentence)
        if norm in {_norm(e) for e in earlier} or any(_near(sentence, e) for e in earlier):
            reject("repetition", "it repeats an earlier sentence")
            return out
        if self.payload and self._follows(sentence):
            reject("instruction", "it follows an instruction written in the question")
            return out
        if not re.search(r"[.!?][\"')\]]*$", sentence.strip()):
            # before the fact match: a fact cut off mid-way ("old1 is finished at step 2000
            # of 2000 (100") is a fragment, not a fact
            reject("fragment", "it does not end as a sentence ends")
            return out
        if self.is_fact(sentence):
            return out
        if self._loops(sentence):
            reject("repetition", "it repeats a phrase over and over")
            return out
        if sentence.rstrip("\"') ").endswith("?") or _SCAFFOLD.search(sentence):
            reject("echo", "an answer asks no question and copies no Q/A scaffolding")
            return out
        if len(_words(sentence)) < 4:
            reject("fragment", "it is too short to be a sentence")
        elif self._starts_mid_sentence(sentence):
            reject("fragment", "it starts in the middle of a sentence")
        elif not _VERB.search(sentence):
            reject("fragment", "it has no verb")
        if out:
            return out
        if self._echoes(sentence):
            reject("echo", "it restates the question")
            return out
        for v in ground(sentence, self.sheet, all_runs=self.all_runs):
            reject(v.kind, v.describe())
        if out:
            return out
        for kind, claims in (("tie", self._ties), ("tie", self._mixed),
                             ("tie", self._hypotheticals),
                             ("signal", self._signals), ("cause", self._causes),
                             ("comparison", self._comparisons), ("comparison", self._extremes),
                             ("comparison", self._ordinals), ("comparison", self._recorded),
                             ("target", self._targets), ("count", self._counts),
                             ("identity", self._identity), ("identity", self._placed),
                             ("state", self._states), ("direction", self._directions)):
            out += [Rejection(kind, sentence, d) for d in claims(sentence)]
        if not out and (d := self._unsupported(sentence)):
            reject("unsupported", d)
        return out

    # ---- the checks ----------------------------------------------------------------------
    @staticmethod
    def _loops(sentence: str) -> bool:
        words = _words(sentence)
        grams = [" ".join(words[i:i + 3]) for i in range(len(words) - 2)]
        return any(grams.count(g) >= 3 for g in set(grams))

    @staticmethod
    def _instruction_payload(question: str) -> list[str]:
        words: list[str] = []
        for match in _INSTRUCTION.finditer(question):
            words += _content(match.group(1))
        if re.search(r"\bignore\b.{0,40}\b(?:facts|rules|instructions|above|previous)\b",
                     question, re.I):
            words += ["ignore"]
        return words

    def _follows(self, sentence: str) -> bool:
        own = set(_content(sentence))
        payload = [w for w in self.payload if w not in self.vocab]
        if not payload:
            return False
        return sum(w in own for w in payload) / len(payload) >= 0.5

    def _echoes(self, sentence: str) -> bool:
        own = _content(sentence)
        if len(own) < 2 or numbers_in(sentence):
            return False
        return sum(w in self.q_words for w in own) / len(own) >= 0.75

    def _ties(self, sentence: str) -> list[str]:
        """Each number must come from a fact about the runs and metrics the sentence names;
        a sentence about two runs is read clause by clause, each number tied to its own
        clause's run ("exp4 has the lower eval/loss of 2.149 …, against 2.18 … for exp1"
        when 2.149 is exp1's); a step said of no run is said of the run asked about."""
        runs = self.runs_in(sentence)
        if len(runs) < 2:
            return self._ties_in(sentence, runs)
        problems: list[str] = []
        subject: set[str] = set()
        for part in re.split(r";|,\s", sentence):
            subject = self.runs_in(part) or subject
            problems += self._ties_in(part, subject or runs)
        return list(dict.fromkeys(problems))

    def _ties_in(self, sentence: str, runs: set[str]) -> list[str]:
        metrics = metrics_named(sentence, self.tags)
        steps = self._steps(sentence)
        problems = []
        for number in numbers_in(_STEP_NUMBER.sub(" ", self._without_runs(sentence))):
            candidates = [f for f in self.sheet.facts if self._holds(f, number.value,
                                                                     number.tolerance)]
            if runs:
                candidates = [f for f in candidates if any(
                    r & runs and self._holds_text(text, number.value, number.tolerance)
                    for r, text in self.clauses(f)) or (
                    len(self.runs_in(f.text)) < 2 and self.fact_runs(f) & runs)]
            if metrics:  # a metric's value, not a step the facts name ("jumped to 1500")
                candidates = [f for f in candidates
                              if (metrics_named(f.text, self.tags) & metrics
                                  or not metrics_named(f.text, self.tags))
                              and self._holds_text(_STEPS_IN_FACT.sub(" ", f.text),
                                                   number.value, number.tolerance)]
            if steps:
                candidates = [f for f in candidates if any(self._holds(f, s, 0.5)
                                                           for s in steps)] or (
                    candidates if len(steps) > 1 else [])
            if not candidates:
                named = ", ".join(sorted(runs | metrics)) or "the sentence"
                at = f" at step {', '.join(str(int(s)) for s in sorted(steps))}" if steps else ""
                problems.append(f"no fact gives {number.text} for {named}{at}")
        about = runs or {self.sheet.run}
        for step in steps:
            if not any(self._has_step(f, step) and (self.fact_runs(f) & about
                                                    or not self.fact_runs(f))
                       for f in self.sheet.facts):
                problems.append(f"no fact about {', '.join(sorted(about))} has step {int(step)}")
        return problems

    def _hypotheticals(self, sentence: str) -> list[str]:
        """A duration only a conditional fact states ("… would finish in about 22m 30s" at the
        throughput before the drop) is not the expected one: a sentence that gives it must say
        the condition too (bench run G, set i I34: "should finish in about 22m 30s")."""
        problems = []
        for match in _DURATION_TEXT.finditer(sentence):
            said = match.group(0)
            holding = [f.text for f in self.sheet.facts if said in f.text]
            if holding and all(_CONDITIONAL.search(t) for t in holding) \
                    and not _CONDITIONAL.search(sentence):
                problems.append(f"{said} is what the facts give only under a condition "
                                f"(\"{holding[0][:60]}…\"), not as expected")
        return problems

    def _mixed(self, sentence: str) -> list[str]:
        """The numbers of one clause must come from one fact: "1 setting(s) went from 51985 to
        23384" joins a count of settings to a throughput's move, each number in the facts."""
        problems = []
        for clause in re.split(r";|,\s|\band\b|\bwhile\b|\bbut\b|\bagainst\b|\bwhereas\b",
                               self._without_runs(sentence), flags=re.I):
            said = numbers_in(clause)
            if len(said) >= 2 and not any(all(self._holds(f, n.value, n.tolerance)
                                               for n in said) for f in self.sheet.facts):
                problems.append(f"no one fact gives {', '.join(n.text for n in said)}")
        return problems

    def _without_runs(self, text: str) -> str:
        for run in self.all_runs:
            text = re.sub(run_pattern(run), " ", text, flags=re.I)
        return text

    @staticmethod
    def _holds_text(text: str, value: float, tolerance: float) -> bool:
        slack = tolerance * (1 + 1e-9) + 1e-12
        return any(abs(abs(value) - abs(n.value)) <= slack for n in numbers_in(text))

    @staticmethod
    def _has_step(fact: Fact, step: float) -> bool:
        """A step is a whole number the fact states as such (2 is not 1.914 rounded)."""
        return any(n == step for n in fact.numbers) or any(
            n.value == step and n.tolerance >= 0.5 for n in numbers_in(fact.text))

    @staticmethod
    def _holds(fact: Fact, value: float, tolerance: float) -> bool:
        slack = tolerance * (1 + 1e-9) + 1e-12
        values = [abs(n) for n in fact.numbers] + [abs(n.value) for n in numbers_in(fact.text)]
        return any(abs(abs(value) - v) <= slack for v in values) or any(
            abs(abs(value) / 100 - v) <= slack / 100 for v in values)

    def _signals(self, sentence: str) -> list[str]:
        lowered = sentence.lower()
        facts = self.fact_text.lower()
        return [f"the facts name no {name} alert" for name in CATALOG
                if len(name) > 4 and re.search(rf"\b{re.escape(name)}\b", lowered)
                and name not in facts]

    def _causes(self, sentence: str) -> list[str]:
        match = _CAUSAL.search(sentence)
        problems = []
        if match:
            claim = _content(sentence[match.end():])
            causes = [f for f in self.sheet.facts if f.kind in ("cause", "finding", "evidence")]
            best = max(((sum(w in set(_words(f.text)) for w in claim) / max(1, len(claim)), f)
                        for f in causes), key=lambda pair: pair[0]) \
                if causes and claim else (0.0, None)
            if best[0] < 0.6:
                problems.append("it states a cause the facts do not")
            elif "Candidate causes" in best[1].text and not _HEDGE.search(sentence):
                problems.append("it states a candidate cause as the established one")
        elif _FIX.search(sentence) and not self.is_fact(sentence):
            claim = [w for w in _content(_FIX.split(sentence, 1)[-1]) if w not in self.q_words]
            fixes = [f for f in self.sheet.facts if f.kind in ("fix", "first_fix", "next",
                                                               "rollback")]
            support = max((sum(w in set(_words(f.text)) for w in claim) / max(1, len(claim))
                           for f in fixes), default=0.0)
            if claim and support < 0.6:
                problems.append("it recommends something the facts do not")
        return problems

    def _comparisons(self, sentence: str) -> list[str]:
        runs = self.runs_in(sentence)
        metrics = metrics_named(sentence, self.tags)
        problems = []
        for match in _COMPARISON.finditer(sentence):
            word = match.group(1).lower()
            ok = any(re.search(rf"\b{word}\b", text, re.I)
                     and (not runs or clause_runs & runs)
                     and (not metrics or metrics_named(f.text, self.tags) & metrics
                          or not metrics_named(f.text, self.tags))
                     for f in self.sheet.facts for clause_runs, text in self.clauses(f)) or (
                word in ("more", "less", "same", "all", "only") and re.search(
                    rf"\b{word}\b", "\n".join(self.sheet.gaps), re.I))
            if not ok:
                problems.append(f"'{word}' does not follow from the facts")
        return list(dict.fromkeys(problems))

    def extreme_values(self, text: str) -> list[tuple[str, Number, float | None]]:
        """The values ``text`` calls the lowest or the highest, each with the step it is
        given at ("lowest 2.147 at step 970"; None when none is): each number after such a
        word, until another word says what the next values are (steps and run names aside)."""
        parts = _BOUND.split(self._without_runs(text))
        out = []
        for word, chunk in zip(parts[1::2], parts[2::2], strict=True):
            if word.lower() not in EXTREMES:
                continue
            at = {m.group(1): float(m.group(2).replace(",", ""))
                  for m in _AT_STEP.finditer(chunk)}
            out += [(EXTREMES[word.lower()], number, at.get(number.text))
                    for number in numbers_in(_STEP_NUMBER.sub(" ", chunk))]
        return out

    def _extremes(self, sentence: str) -> list[str]:
        """A value called the lowest (minimum, peak, …) must be one a fact calls so, and at
        the step the fact gives it: "the lowest train loss … is 3.885" when 3.885 is the
        facts' highest, and "the minimum … is 2.15, at step 1000" when it is 2.149 at step
        960 (2.154 at step 1000 being the last), passed every other check."""
        said = self.extreme_values(sentence)
        if not said:
            return []
        problems = []
        for group, number, step in said:
            same = [s for g, v, s in self._extreme_facts
                    if g == group and grounded(number, [abs(v.value)])]
            if not same:
                problems.append(f"no fact calls {number.text} the {group}")
            elif step is not None and None not in same and step not in same:
                problems.append(f"no fact calls {number.text} at step {int(step)} the {group}")
        return problems

    @cached_property
    def _extreme_facts(self) -> list[tuple[str, Number, float | None]]:
        """The values the facts call the lowest or highest (read once per answer)."""
        return [item for f in self.sheet.facts for item in self.extreme_values(f.text)]

    @cached_property
    def _fact_moves(self) -> list[tuple[str, set[str], set[str]]]:
        """The ways the facts say each run's metrics moved (read once per answer)."""
        return [move for f in self.sheet.facts
                for move in self._moves(f.text, self.fact_runs(f), numbers=True)]

    @staticmethod
    def _steps(text: str) -> set[float]:
        return {float(m.group(1).replace(",", "")) for m in _STEP_NUMBER.finditer(text)}

    @staticmethod
    def _restricted(text: str) -> set[str]:
        return {way for way, pattern in _RESTRICTION.items() if pattern.search(text)}

    def _ordinals(self, sentence: str) -> list[str]:
        """A step called the latest (last, most recent) — or a checkpoint called the first
        (earliest) — must be one a fact calls so, with the same restriction: "the checkpoint
        at step 1000 is the latest checkpoint of exp2" of a fact that has it as "the latest
        checkpoint at least 2 steps before the onset" (the latest is 2000) is wrong. An
        unrestricted latest checkpoint may also be the highest one the facts list."""
        steps = self._steps(sentence)
        words = {ORDINALS[" ".join(m.group(1).lower().split())] for m in
                 _ORDINAL.finditer(sentence)}
        if "first" in words and "checkpoint" not in sentence.lower():
            words.discard("first")
        if not steps or not words:
            return []
        restricted = self._restricted(sentence)
        runs = self.runs_in(sentence) or {self.sheet.run}
        problems = []
        for group in words:
            said = [f for f in self.sheet.facts
                    if any(ORDINALS[" ".join(m.group(1).lower().split())] == group
                           for m in _ORDINAL.finditer(f.text))
                    and self._restricted(f.text) == restricted
                    and all(self._has_step(f, s) for s in steps)]
            listed = [max(self.sheet.checkpoints.get(r) or {-1}) for r in runs]
            latest = (group == "last" and not restricted and len(steps) == 1
                      and "checkpoint" in sentence.lower() and set(steps) <= set(listed))
            if not said and not latest:
                which = "latest" if group == "last" else "first"
                where = f" {' '.join(sorted(restricted))} a step" if restricted else ""
                named = ", ".join(str(int(s)) for s in sorted(steps))
                problems.append(f"no fact calls step {named} the {which}{where}")
        return problems

    def _recorded(self, sentence: str) -> list[str]:
        """What a sentence says two runs record — the same, different or missing config,
        data version or environment — must be what the facts say: "exp4 and exp1 record the
        same config, but they have different data versions" when the facts have the same
        data version is wrong."""
        states = self.sheet.recorded
        problems = []
        for clause in re.split(r"[;,:]|\bbut\b|\bwhile\b|\bwhereas\b|\bhowever\b", sentence,
                               flags=re.I):
            polarity = next((p for p, pattern in _POLARITY if pattern.search(clause)), None)
            if polarity is None:
                continue
            for name, pattern in ATTRIBUTES.items():
                if not re.search(rf"\b(?:{pattern})\b", clause, re.I):
                    continue
                if polarity not in states.get(name, set()):
                    problems.append(f"the facts do not say the {name} is {polarity}")
        return problems

    def _targets(self, sentence: str) -> list[str]:
        """A step to roll back to must be a checkpoint the facts name — and one runwatch
        recommends when the sentence advises it ("… should go back to step 1500" when the
        recommended checkpoint is step 1000 and 1500 is the onset)."""
        said = [float(m.group(1) or m.group(2)) for m in _TARGET.finditer(
            sentence.replace(",", "")) if (m.group(1) or m.group(2))]
        if not said:
            return []
        runs = self.runs_in(sentence) or {self.sheet.run}
        advice = bool(_ADVICE.search(sentence))
        pool = self.sheet.targets if advice else self.sheet.checkpoints
        allowed = {s for r in runs for s in pool.get(r, set())}
        what = "recommends rolling back to" if advice else "names as a checkpoint"
        return [f"no fact {what} step {int(step)}" for step in said if step not in allowed]

    def _states(self, sentence: str) -> list[str]:
        """An alert called open (firing, active) or resolved must be so in the facts, and
        "no open alerts" needs a fact that lists them all: "the spike alert on exp2 is still
        open" of one resolved at step 1560 is wrong. So must the step it is said to begin or
        end at: "spike from step 1560" of one from step 1500, resolved at step 1560."""
        problems = []
        subject: set[str] = set()
        for clause in _CLAUSE.split(sentence):
            subject = self.runs_in(clause) or subject
            runs = subject or {self.sheet.run}
            lowered = clause.lower()
            signals = [name for name in CATALOG if re.search(rf"\b{re.escape(name)}\b", lowered)]
            if _NONE_OPEN.search(clause) and not signals:
                if not any(self.sheet.open_alerts.get(r) == set() for r in runs):
                    problems.append("no fact says no alert is open")
                continue
            state = ("resolved" if _NOT_OPEN.search(clause) else "open"
                     if _NOT_RESOLVED.search(clause) else "resolved"
                     if _RESOLVED.search(clause) else "open" if _OPEN.search(clause) else None)
            for signal in signals:
                if state is not None and not any(self._in_state(r, signal, state)
                                                 for r in runs):
                    problems.append(f"no fact says the {signal} alert is {state}")
                for key, pattern in _ALERT_STEP.items():
                    for m in pattern.finditer(clause):
                        step = int(m.group(1).replace(",", ""))
                        if not any(step in getattr(self._seen(r, signal), key)
                                   for r in runs):
                            what = "began" if key == "onset" else "ended"
                            problems.append(f"no fact says the {signal} alert {what} at "
                                            f"step {step}")
        return problems

    def _seen(self, run: str, signal: str) -> AlertSeen:
        return self.sheet.alerts.get(run, {}).get(signal) or AlertSeen()

    def _in_state(self, run: str, signal: str, state: str) -> bool:
        said = self._seen(run, signal).states
        listed = self.sheet.open_alerts.get(run)
        return state in said or (listed is not None and (
            signal in listed if state == "open" else bool(said) and signal not in listed))

    def _directions(self, sentence: str) -> list[str]:
        """A metric said to rise (fall, stay flat) must do so in a fact about the same run
        and metric, read clause by clause: "eval/loss of exp3 is falling" of a fact where it
        rises is wrong, though every word of it is in the facts."""
        said = self._moves(sentence, self.runs_in(sentence) or {self.sheet.run})
        if not said:
            return []
        problems = []
        for way, runs, metrics in said:
            if not any(way == w and (runs & r or not r) and (not metrics or not m or metrics & m)
                       for w, r, m in self._fact_moves):
                named = ", ".join(sorted(runs | metrics))
                problems.append(f"no fact says {named} went {way}")
        return list(dict.fromkeys(problems))

    def _moves(self, text: str, runs: set[str], numbers: bool = False
               ) -> list[tuple[str, set[str], set[str]]]:
        """(direction, runs, metrics) of each clause of ``text`` that says one; a clause
        without a run or metric of its own is about the last one named."""
        out = []
        subject, metrics = set(runs), set()
        for clause in _CLAUSE.split(text):
            subject = self.runs_in(clause) or subject
            metrics = metrics_named(clause, self.tags) or metrics
            ways = {way for way, pattern in _DIRECTION.items() if pattern.search(clause)}
            if numbers:
                for a, b in _ARROW.findall(clause):
                    x, y = numbers_in(a)[0].value, numbers_in(b)[0].value
                    ways.add("up" if y > x else "down" if y < x else "flat")
                ways |= {"up" if sign == "+" else "down" for sign in _SIGNED.findall(clause)}
            out += [(way, set(subject), set(metrics)) for way in ways]
        return out

    def _counts(self, sentence: str) -> list[str]:
        """A number that counts things must count the same things in a fact."""
        said = {(n, noun) for n, noun in _counted(sentence)}
        known = {(n, noun) for f in self.sheet.facts for n, noun in _counted(f.text)}
        for f in self.sheet.facts:  # a list counts its items: "Checkpoints of exp4: steps …"
            listed = re.match(r"(Checkpoints|Open alerts) (?:of|on) [^:]+: (.+)\.$", f.text)
            if listed:
                noun = "checkpoint" if listed.group(1) == "Checkpoints" else "alert"
                known.add((len(listed.group(2).split(", ")), noun))
        return [f"no fact counts {n} {noun}s" for n, noun in sorted(said - known)]

    def _placed(self, sentence: str) -> list[str]:
        """A run named by its place ("the first run") where no fact names one so."""
        return [f"it names a run as '{m.group(0)}', not by its name"
                for m in _ORDINAL_RUN.finditer(sentence)
                if m.group(0).lower() not in self.fact_text.lower()]

    @staticmethod
    def _identity(sentence: str) -> list[str]:
        """"The checkpoint at step 1500 is the checkpoint at step 1000": a sentence that
        says a thing is itself, or the same kind of thing at another number, says nothing."""
        parts = re.split(r"\b(?:is|are|was|were)\b", sentence, maxsplit=1, flags=re.I)
        if len(parts) < 2:
            return []
        def shape(text: str) -> list[str]:
            return [w for w in _words(re.sub(r"\d[\d,.]*", " ", text))
                    if w not in _STOP and w not in ("same", "as", "also")]
        left, right = shape(parts[0]), shape(parts[1])
        if left and left == right:
            return ["it says a thing is itself"]
        if _RUN_IS_EVENT.search(sentence):
            return ["it says a run is an event"]
        if _ACTION_STATE.search(sentence):
            return ["it gives a rollback or checkpoint an alert's state"]
        return []

    def _unsupported(self, sentence: str) -> str | None:
        own = [w for w in _content(self._without_runs(sentence)) if w not in _PLAIN]
        if len(own) < 2:
            return None
        supported = sum(w in self.vocab or w.rstrip("s") in self.vocab for w in own)
        if supported / len(own) < MIN_SUPPORT:
            missing = [w for w in own if w not in self.vocab][:4]
            return f"the facts never say {', '.join(missing)}"
        return None


@dataclass
class Review:
    kept: list[str]
    rejected: list[Rejection]

    @property
    def text(self) -> str:
        return " ".join(self.kept)


def review(text: str, sheet: FactSheet, question: str, *, all_runs: Iterable[str] = (),
           known: Iterable[str] = ()) -> Review:
    """The sentences of ``text`` that hold, and why each other one was rejected.
    ``known`` are sentences the code itself writes (the gap line), which pass like facts."""
    checker = Checker(sheet, question, all_runs, known)
    kept: list[str] = []
    rejected: list[Rejection] = []
    said: list[str] = []
    for sentence in sentences(text):
        problems = checker.check(sentence, said)
        said.append(sentence)
        if problems:
            rejected.append(problems[0])
        else:
            kept.append(sentence)
    return Review(kept, rejected)
