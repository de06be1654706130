"""Routing a question to what it asks for, by meaning: the intents runwatch can answer.

Each intent has labelled example questions; a question is embedded with the bundled
all-MiniLM-L6-v2 (:mod:`bot.qa.embeddings`) and takes the intent of its nearest examples,
so "which step is exp1 at now?" finds *where* although it shares no keyword with "status".
Keywords still decide where they are unambiguous (a step and a metric ask for a value; two
runs and "better" ask which is better), because an embedding of a short question is easily
pulled towards the wrong example by one word. A question near no example, with no keyword,
is *unknown*: the answer says so and lists what can be asked (:data:`CAN_ANSWER`).

Run names are replaced by a neutral word before embedding: "exp2" must not make two
questions look alike.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bot.qa.embeddings import Embedder, UsesEmbedder
from bot.qa.entities import Entities
from bot.qa.facts import run_pattern

# The intents, each with questions people ask for it. "RUN" stands for a run name.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "where": (
        "which step is RUN at now?", "where is the run now?", "what step are we on?",
        "how far along is it?", "what's the progress?", "current step?", "is it still running?",
        "how is RUN doing?", "status of RUN", "where's training at?", "how's it going?",
        "is the run alive?", "what iteration is it on right now?", "progress?",
    ),
    "summary": (
        "summarize RUN", "summarize the run in one sentence", "give me a summary of RUN",
        "tl;dr of the run", "what happened in this run so far?", "recap the training run",
        "overview of RUN", "brief me on the run", "how did the run go overall?",
        "sum up RUN for me", "tell me about RUN", "did RUN blow up?",
        "anything wrong with RUN?",
    ),
    "next_step": (
        "what should I do about RUN?", "what should we do?", "what's the next step?",
        "how do I fix this?", "what do you recommend?", "what action should we take?",
        "what should I do now?", "how do we fix RUN?", "any advice for this run?",
        "what do we do about the alert?", "should I stop the run or let it finish?",
        "do I need to do anything?", "is it fine to leave it alone?",
        "should we kill it?", "is there anything to do about RUN?",
    ),
    "why": (
        "why did the loss spike?", "why did it stall?", "why did it slow down?",
        "what caused this alert?", "why is throughput down?", "what went wrong?",
        "why did RUN alert?", "explain the alert", "what is the cause of the spike?",
        "why is it overfitting?", "why did training get slower?", "why did it stop improving?",
        "what happened at step 1200?", "what went wrong around step 500?",
    ),
    "changed": (
        "what changed?", "what changed compared to the baseline?",
        "what is different from the last attempt?", "what changed at step 2000?",
        "what's different in the config?", "diff against the baseline",
        "what changed between the attempts?", "what did we change since the last run?",
        "what did the rollback change?",
    ),
    "rollback": (
        "is it safe to roll back?", "where should we roll back to?",
        "which checkpoint should we go back to?", "can we restore a checkpoint?",
        "which checkpoints do we have?", "is there a good checkpoint to revert to?",
        "should we roll back, and to where?",
    ),
    "better": (
        "which run is better on eval loss?", "is RUN better than RUN?",
        "which has the lower loss?", "which run wins on accuracy?", "which one is doing best?",
        "which of the two runs has the better validation loss?",
    ),
    "compare": (
        "compare RUN with RUN", "RUN vs RUN", "how does it compare to the baseline?",
        "what is the difference between RUN and RUN?",
    ),
    "similar": (
        "have we seen this before?", "has this happened before?",
        "any similar incidents in the past?", "did another run have this problem?",
        "is this a known issue from earlier runs?", "have we run into this before?",
        "did any other run do this too?",
    ),
    "eta": (
        "when will it finish?", "how long until it's done?", "eta?", "when does training end?",
        "how much time is left?", "when will RUN be done?", "how many hours to go?",
    ),
    "value": (
        "what was the loss at step 400?", "what is the learning rate now?",
        "grad norm at step 800?", "what's the latest eval loss?", "lowest validation loss?",
        "how did the loss change between 600 and 900?", "is the loss going down?",
        "what was the highest grad norm?", "throughput at step 1500?",
    ),
}

# Questions written outside the project, labelled by the answers readers judged right
# (held-out sets already measured; see the file's "about").
LABELLED = Path(__file__).with_name("intent_examples.json")


def _labelled() -> dict[str, tuple[str, ...]]:
    rows = json.loads(LABELLED.read_text(encoding="utf-8"))["intents"]
    return {intent: tuple(EXAMPLES[intent]) + tuple(rows.get(intent, ()))
            for intent in EXAMPLES}


EXAMPLES = _labelled()

# What the answer to an unknown question offers instead.
CAN_ANSWER = ("where a run is now, a summary, what to do next, why it alerted (spike, stall, "
              "slow-down), what changed, whether and where to roll back, which run is better "
              "on a metric, whether we have seen this before, when it will finish, and metric "
              "values at steps")

MIN_SIMILARITY = 0.45  # below it a question is near no example
_KEYWORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("summary", re.compile(r"\b(summari[sz]e|summary|summ|tl;?dr|recap|overview|sum up|"
                           r"he?a?lth ?-?check|sanity ?-?check)\b|"
                           # "anything weird going on w exp8?": what happened, said whole
                           r"\banything (weird|wrong|odd|off|unusual|strange|funny|fishy|"
                           r"suspicious|bad)\b")),
    # not "finish with 2.1", not "let it finish" (a decision)
    ("eta", re.compile(r"\bwhen(?:'s| is| will| does)\b.{0,30}\b(done|complete\w*|over)\b|"
                       r"\bwhen\b.{0,30}\b(hit|reach)\w* (the )?(final|last|end)\b|"
                       r"\b(when wil+|when does|eta|how long until|time left|how much "
                       r"longer|wrap up|be done\b(?! (with|at|on)\b)|"
                       r"(?<!let it )finish(?! (with|at|on)\b))\b")),
    ("next_step", re.compile(r"\b(what should (i|we)|what do (i|we) do|next step|"
                             r"recommend|how do (i|we) fix|advice)\b"
                             # a decision about the run: stop it, let it go on, leave it
                             r"|\b(i|we) should (\w+ ){0,2}(kill|stop|abort|restart|rerun)\b|"
                             r"\bshould (i|we) (\w+ ){0,2}(kill|stop|abort|cancel|restart|"
                             r"continue|keep|let|leave|worry)\b|\breasons? to (stop|kill|worry)\b|"
                             r"\b(kill|stop|abort) (it|this|the run)\b.*\bor\b|"
                             r"\blet it (run|finish|go on|ride)\b|\b(need|have) to do anything\b|"
                             r"\b(keep|let) it (going|running|run|ride)\b.*\bor\b|\bor restart\b|"
                             r"\bleave it alone\b|\bworth (restart|relaunch|rerun)\w*\b|"
                             r"\b(restart|relaunch|rerun)\w* .{0,60}\bor (just )?let it\b|"
                             r"\b(any|is) action (needed|required)\b|\bpull (the )?plug\b|"
                             r"\btime to (stop|kill|call it|end|give up)\b|\bcall it quits\b|"
                             r"\b(can|should) (i|we) (ack|close|ignore)\b|\bact on\b|"
                             r"\b(is it|is this|is the \w+) (fixed|resolved|over)\b|"
                             r"\b(fixed|resolved)( now| yet)?\?|"
                             r"\bstill (a problem|an issue|open|firing)\b")),
    # "have we seen / run into / had this before", "has any other run …": the past of others
    ("similar", re.compile(r"\b(seen|had|hit|happen\w*)\b.{0,40}\b(anywhere|elsewhere|other "
                           r"runs?|another run)\b|"
                           r"\b(seen|had|hit|run into|ran into|encountered|happened)\b.{0,40}"
                           r"\bbefore\b(?!\s*(step|iter|\d))|\bany other runs?\b|"
                           r"\b(on|in) (another|other|previous|earlier|past|a different|any "
                           r"other) runs?\b|\b(look|looks|seem|seems)( like)? (like )?the same "
                           r"(thing|issue|problem|kind)\b|\bsame (thing|issue|problem) as\b")),
    ("better", re.compile(r"\b(which (run|one|of)\b.*\b(better|best|lower|higher|wins?)|"
                          r"better than|worse than|which is better|beats?|beating|"
                          r"outperform\w*|ahead of)\b|\bhow (does|do|is|did) .{0,30}\bcompare "
                          r"(to|with|against) (its|the) baseline\b|\b(buy|bought) (us )?anything\b|"
                          r"\bpa(y|id|ys) off\b|\b(match|keep(ing)? up with|on par with|as good "
                          r"as)\b")),
    ("changed", re.compile(r"\bwho (changed|modified|edited|touched|bumped|set|tweaked)\b|"
                           r"\bwhat(?:'s| has| is)? (?:changed|different|moved)\b|\bwhat did (we|"
                           r"they|you|u|people) (change|tweak|modify)\b|\bdiff\b")),
    # "what happened at step 150?" asks about the event there, not where the run is now
    ("why", re.compile(r"\bwhat (happened|went wrong|broke|blew up)\b.*\b(step|iter\w*)\b|"
                       r"^\W*(why|how come)\b|\bwhat(?:'s| is|s)? (caus\w*|trigger\w*|"
                       r"behind|made|makes|led to|leads to)\b|\b(recover\w*|c[oa]me back|"
                       r"bounced? back)\b|\bon its own\b|"
                       r"\bhow did\b.{0,60}\bend up (so |that |this |way )?(higher|lower|"
                       r"bigger|smaller|larger|\d+x)\b|\b(was|is) (that|this|it) "
                       r"(planned|expected|a bug)\b|\bon purpose\b|\bintentional(ly)?\b|"
                       r"\bdeliberate(ly)?\b|\bby design\b|\b(any|early) warning\b|"
                       r"\bwarning signs?\b|\bcould (an|the) alert have caught\b|"
                       r"\b(do|does) (we|you|anyone) know why\b|\bany idea why\b")),
    ("where", re.compile(r"\b(which|what) (step|iteration)\b.*\b(now|currently|at)\b|"
                         r"\bwhere(?: is|'s| s)\b|\b(which|what) attempt\b|\bhow far (along|in|"
                         r"through)\b|\b(what|which) (%|percent\w*|fraction|share)\b")),
    # where to go back to ("last good checkpoint before the NaN?", "rollback to 1500 ok?")
    ("rollback", re.compile(r"\b(roll ?-?back|revert|restore)\b|"
                            r"\broll(ed|ing)? (\w+ ){0,3}back\b|\b(which|what|last good|"
                            r"latest good|good|safe) (checkpoint|ckpt)\b|\bcheckpoint (before|"
                            r"to (use|keep|go))\b")),
)


_BETTER = dict(_KEYWORDS)["better"]
# a guessed cause of the trouble the question names, to confirm ("is the slowdown the
# loader?", "was the spike from the lr?")
_HYPOTHESIS = re.compile(r"\b(is|was) (it|this|that|the \w+) (the|a|an|due|because|caused|"
                         r"from|related)\b|\b(could|might) (it|this|that) be\b|\b(because of|"
                         r"due to|caused by|to blame|the culprit|the reason)\b")


@dataclass(frozen=True)
class Route:
    intent: str  # one of EXAMPLES, or "unknown"
    score: float  # similarity to the nearest example (1.0 when a keyword decided)
    by: str  # "keyword", "embedding" or "none"


class Router(UsesEmbedder):
    """Nearest labelled examples by cosine similarity (the examples embedded once)."""

    def __init__(self, embedder: Embedder | None = None) -> None:
        super().__init__(embedder)
        self._labels: list[str] = []
        self._vectors: np.ndarray | None = None
        self._lock = threading.Lock()

    def _examples(self) -> tuple[list[str], np.ndarray]:
        with self._lock:
            if self._vectors is None:
                texts = [t for ts in EXAMPLES.values() for t in ts]
                self._labels = [k for k, ts in EXAMPLES.items() for _ in ts]
                self._vectors = self.embedder.embed(texts)
            return self._labels, self._vectors

    def nearest(self, question: str) -> tuple[str, float]:
        """The intent of the examples nearest to ``question`` (mean of the best two per
        intent, so one lucky example does not decide) and that similarity."""
        if getattr(self.embedder, "per_call", False):  # TF-IDF: vectors are per call
            texts = [t for ts in EXAMPLES.values() for t in ts]
            labels = [k for k, ts in EXAMPLES.items() for _ in ts]
            vecs = self.embedder.embed([question, *texts])
            query, rows = vecs[0], vecs[1:]
        else:
            labels, rows = self._examples()
            query = self.embedder.embed([question])[0]
        sims = rows @ query
        best: dict[str, list[float]] = {}
        for label, sim in zip(labels, sims, strict=True):
            best.setdefault(label, []).append(float(sim))
        scored = {k: float(np.mean(sorted(v, reverse=True)[:2])) for k, v in best.items()}
        intent = max(scored, key=scored.__getitem__)
        return intent, scored[intent]

    def route(self, question: str, ents: Entities) -> Route:
        text = neutral(question, ents.runs)
        lowered = unquoted(text.lower())  # "reply 'no action needed'" asks for no next step
        if len(ents.runs) >= 2 and _BETTER.search(lowered):  # "exp7 or exp8, which to keep?"
            return Route("better", 1.0, "keyword")
        for intent, pattern in _KEYWORDS:
            if pattern.search(lowered):
                if intent == "better" and not ents.runs and not against_baseline(lowered):
                    continue  # one run and nothing to measure it against
                if intent == "where" and {"min", "max"} & set(ents.kinds):
                    continue  # "in which step was the eval loss lowest?"
                return Route(intent, 1.0, "keyword")
        if ents.signals and _HYPOTHESIS.search(lowered):  # "is the slowdown the loader?"
            return Route("why", 1.0, "keyword")
        if ents.rollback_to is not None:  # "take it back to 1500?"
            return Route("rollback", 1.0, "keyword")
        if ents.attempts and "changed" in ents.kinds and not ents.runs:
            return Route("changed", 1.0, "keyword")  # "attempt 2 vs attempt 1 at the same step"
        if ents.metrics and (ents.steps or ents.step_range or ents.latest or ents.moved) or set(
                ents.kinds) & {"min", "max", "trend"}:
            return Route("value", 1.0, "keyword")
        if ents.setup:  # "which data version is it on?": how the run is set up
            return Route("changed", 1.0, "keyword")
        intent, score = self.nearest(text)
        if score < MIN_SIMILARITY:
            return Route("unknown", score, "none")
        return Route(intent, score, "embedding")


_AGAINST_BASELINE = re.compile(r"\bbaseline\b|\bpa(y|id|ys) off\b|\b(buy|bought)\b")


def against_baseline(text: str) -> bool:
    """Whether a question about one run measures it against its baseline ("did the higher lr
    pay off?")."""
    return _AGAINST_BASELINE.search(text.lower()) is not None


# where one ask of a question ends and the next begins: "ETA? and how much sooner …",
# "did it NaN too or did it recover on its own? how long did that take"
_ASKS = re.compile(r"\?+\s*(?=\S)|;\s*|\s+[—–-]\s+|,?\s+(?:and|or|also|plus|but)\s+"
                   r"(?=(?:how|what|when|which|where|who|why|is|are|was|were|did|does|do|can|"
                   r"could|should|will|would|has|have|any)\b)", re.I)


def asks(question: str) -> list[str]:
    """The separate asks of ``question``, in order (one item for a single ask)."""
    pieces = [p.strip(" \t?.,!") for p in _ASKS.split(unquoted(question))]
    return [p for p in pieces if re.search(r"[a-z]", p, re.I)] or [question]


_QUOTED = re.compile(r"(?<!\w)'[^']{2,}'(?!\w)|\"[^\"]*\"|[‘“][^’”]*[’”]")


def unquoted(text: str) -> str:
    """``text`` without what it quotes: a reply it dictates or words it cites are not what
    it asks ("just reply 'all good, no action needed'")."""
    return _QUOTED.sub(" ", text)


def neutral(question: str, runs: list[str]) -> str:
    """``question`` with the run names it names replaced by ``RUN``."""
    for run in sorted(runs, key=len, reverse=True):
        question = re.sub(run_pattern(run), "RUN", question,
                          flags=re.I)
    return " ".join(question.split())


_router = Router()


def route(question: str, ents: Entities) -> Route:
    """The intent of ``question`` with the process's shared router."""
    return _router.route(question, ents)
