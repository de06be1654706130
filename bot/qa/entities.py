"""What a question is about: runs, metrics, steps, times, and which kinds of answer it wants.

Only runs the asker may see are recognised; a name of any other run is ordinary text.
Numbers that belong to a run name (``exp1``) or a time phrase (``last 2 hours``) are not
steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from connectors.aliases import AliasTable

# Question kinds, each with the words that ask for it. Order matters only for display.
KIND_WORDS: dict[str, tuple[str, ...]] = {
    "status": ("status", "how is", "how's", "progress", "eta", "how far", "doing", "state of",
               "still running", "finished", "alive", "stalled", "how long"),
    "value": ("what was", "what is", "what's", "value", "at step", "how high", "how low",
              "show me"),
    "min": ("min", "minimum", "lowest", "best", "smallest", "most low", "bottom", "bottomed",
            "low point"),
    "max": ("max", "maximum", "highest", "peak", "worst", "largest", "most high"),
    "trend": ("trend", "going down", "going up", "improving", "decreasing", "increasing",
              "converg", "plateau", "flatten", "flattening", "levelled off", "leveled off",
              "rising", "falling", "dropping", "trending", "over the last", "since",
              "getting better", "getting worse"),
    "changed": ("changed", "change", "different", "differs", "differ", "diff", "config",
                "setting", "hyperparameter", "data version", "environment"),
    "why": ("why", "cause", "caused", "what happened", "wrong", "explain", "overfit",
            "spike", "nan", "diverg", "plateau", "problem", "issue", "alert", "fix",
            "what should", "what do we do", "forgetting", "oscillat", "recover"),
    "rollback": ("roll back", "rollback", "roll-back", "checkpoint", "restore", "resume",
                 "revert", "go back to"),
    "compare": ("compare", " vs ", " vs.", "versus", "better than", "worse than",
                "difference between", "against"),
    "similar": ("seen this before", "seen it before", "similar", "happened before",
                "past incident", "previous incident", "like this before", "before?",
                "again?", "other runs"),
}

# Plain words for metrics, beyond the alias table's logged names. Longest first wins.
METRIC_WORDS: dict[str, str] = {
    "validation loss": "eval/loss", "val loss": "eval/loss", "eval loss": "eval/loss",
    "evaluation loss": "eval/loss", "valid loss": "eval/loss", "test loss": "eval/loss",
    "training loss": "train/loss", "train loss": "train/loss", "loss": "train/loss",
    "learning rate": "lr", "lr": "lr", "grad norm": "grad_norm",
    "gradient norm": "grad_norm", "gradient": "grad_norm", "grad-norm": "grad_norm",
    "throughput": "throughput", "tokens/s": "throughput", "tokens per second": "throughput",
    "speed": "throughput", "tok/s": "throughput", "samples/s": "throughput",
    "thruput": "throughput", "tput": "throughput", "tokens/sec": "throughput",
    "tok/sec": "throughput", "tps": "throughput", "val/loss": "eval/loss",
    "valid/loss": "eval/loss", "eval_loss": "eval/loss", "train_loss": "train/loss",
    "learning_rate": "lr", "gradnorm": "grad_norm", "grad_norm": "grad_norm",
    "memory": "gpu_mem", "gpu memory": "gpu_mem", "vram": "gpu_mem", "oom": "gpu_mem",
    "reward": "reward", "kl": "kl",
}

SIGNAL_WORDS: dict[str, str] = {
    "overfit": "overfit", "spike": "spike", "nan": "spike", "diverg": "divergence",
    "instabil": "divergence", "reward collapse": "reward_collapse",
    "plateau": "plateau", "stuck": "plateau", "forgetting": "forgetting",
    "grad norm": "grad_norm", "gradient": "grad_norm", "throughput": "throughput_drop",
    "slow": "throughput_drop", "learning rate schedule": "lr_schedule",
    "schedule": "lr_schedule", "oscillat": "oscillation", "memory": "memory", "oom": "memory",
    "stalled": "stalled", "checkpoint gap": "checkpoint_gap", "diminishing": "diminishing_returns",
    "converged": "diminishing_returns", "repetition": "repetition", "refus": "over_refusal",
    "reward hacking": "reward_hacking", "business": "business_flat",
}

_BOTH_LOSSES = re.compile(r"\b(?:train(?:ing)?|eval|val(?:idation)?)\s*(?:and|&|/|,|\+)\s*"
                          r"(?:train(?:ing)?|eval|val(?:idation)?)\s+loss(?:es)?\b")
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?\s*[kK]?"  # "1,500", not "1200, 1500"
_TIME_UNITS = {"minute": 60, "min": 60, "mins": 60, "minutes": 60, "hour": 3600,
               "hours": 3600, "h": 3600, "hr": 3600, "hrs": 3600, "day": 86400, "days": 86400,
               "week": 604800, "weeks": 604800, "second": 1, "seconds": 1}
_RELATIVE = re.compile(
    r"\b(?:in\s+the\s+|over\s+the\s+|during\s+the\s+|for\s+the\s+)?(?:last|past)\s+"
    r"(?:(\d+(?:\.\d+)?)\s*)?(seconds?|minutes?|mins?|hours?|hrs?|h|days?|weeks?)\b", re.I)
_DURATION = re.compile(r"\b\d+(?:\.\d+)?\s*(?:min|mins|minutes?|secs?|seconds?|hrs?|hours?)\b",
                       re.I)
_AGO = re.compile(r"\bsince\s+(\d+(?:\.\d+)?)\s*(minutes?|mins?|hours?|hrs?|h|days?|weeks?)\s+"
                  r"ago\b", re.I)
_RANGE = re.compile(
    rf"\b(?:between\s+(?:steps?\s+)?({_NUMBER})\s+and\s+(?:steps?\s+)?({_NUMBER})"
    rf"|from\s+(?:steps?\s+)?({_NUMBER})\s+(?:to|until|till)\s+(?:steps?\s+)?({_NUMBER})"
    rf"|steps?\s+({_NUMBER})\s*(?:-|–|to|\.\.)\s*({_NUMBER})"
    rf"|(?:between\s+)?({_NUMBER})\s*(?:-|–|\.\.)\s*({_NUMBER}))\b", re.I)
_AFTER = re.compile(rf"\b(?:after|since|past|from)\s+(?:steps?\s+)?({_NUMBER})\b", re.I)
_JUST_BEFORE = re.compile(rf"\b(?:right|just|immediately|directly)\s+(?:before|prior\s+to)\s+"
                          rf"(?:steps?\s+)?({_NUMBER})", re.I)
_BEFORE = re.compile(rf"\b(?:before|until|up\s+to)\s+(?:steps?\s+)?({_NUMBER})\b", re.I)
_STEP = re.compile(rf"(?:\b(?:steps?|at|around|near|iteration|iter)\s+#?|@\s*)({_NUMBER})"
                   # "at 1000 and 2000", "@1990 vs @2010", "steps 500, 1000 or 1500"
                   rf"((?:\s*(?:,|and|&|vs\.?|versus|or|/)\s*(?:steps?\s+|@\s*)?{_NUMBER}"
                   rf"(?![\w.]))*)", re.I)
_LAST_STEPS = re.compile(rf"\b(?:last|past|final|latest)\s+({_NUMBER})\s*(?:steps?|iters?|"
                         rf"iterations?)\b", re.I)
# what no training log here records, asked for by name
_UNRECORDED = re.compile(r"\b(cost|costs|price|dollars?|spend|spent|budget|billing|temperature|"
                         r"temps?|thermal\w*|power draw|watts|gpu type|gpu model|hardware|host ?"
                         r"names?|which node|what node|mmlu|hellaswag|carbon|emissions|"
                         r"prod|production|deploy\w*|shipped|in use|serving|gpu-?hours?|"
                         r"compute hours|usd|money|who (launched|"
                         r"started|kicked off|owns|created|submitted|ran|set up|trained))\b")


# a question over every run: "which run has the best eval loss?", "best run overall?"
_ACROSS = re.compile(r"\b(which|what) (run|one|experiment|exp)s?\b.{0,40}\b(best|better|lowest|"
                     r"highest|fastest|slowest|worst|most|least|leading|winning|ahead)\b|"
                     r"\b(best|worst|fastest|leading|top) (run|experiment|model)s?\b|"
                     r"\b(across|among|of) (all )?(our |the |my )?(runs|experiments)\b|\brank\w*\b")


# "the grad norm at the spike", "the loss right before the NaN": a step named by its event
_EVENT = re.compile(r"\b((?:right |just )?before (?:and|&|/|vs\.?) (?:right |just )?after|"
                    r"at|during|around|right before|just before|before|after|right after|"
                    r"react(?:ed|ing)? to|since)\s+(?:the|that|this)\s+(?:[\w/]+\s+)?"
                    r"(spike|nan|jump|drop|slow-?down|crash|alert|blow-?up)\b")

_BEFORE_AFTER = re.compile(rf"\b(?:before|pre)\s*(?:and|vs\.?|versus|/|&|or)\s*(?:after|post)\s+"
                           rf"(?:steps?\s+)?({_NUMBER})", re.I)
_LISTED = re.compile(rf"{_NUMBER}(?![\w.])")
_SETUP = re.compile(r"\b(config\w*|settings?|setup|hyper-?param\w*|data ?versions?|datasets?|"
                    r"environment|env)\b|\b(which|what|new|old|same) data\b")
_MOVED = re.compile(r"\b(jump\w*|spik\w*|drop\w*|bigger|smaller|higher|lower|increas\w*|"
                    r"decreas\w*|(went|gone|go|shot|blew|moved) (\w+ )?(up|down)|"
                    r"explod\w*|"
                    r"sudden\w*|tripled|doubled|halved|\d+(\.\d+)?x)\b")
# words for a config setting a question names ("we only gave it 2 workers"), matched against
# the flattened keys of the run's config
SETTING_WORDS = ("worker", "batch", "warmup", "epoch", "schedul", "precision", "fp16", "bf16",
                 "seed", "optimi", "weight decay", "weight_decay", "dropout", "grad accum",
                 "accumulation", "clip", "seq len", "context length", "max_len")
# a decision about the run ("kill it?", "restart with more workers or let it limp on?")
_DECISION = re.compile(r"\b(kill|stop|abort|cancel|restart|relaunch|rerun|pull the plug|"
                       r"keep (it )?(going|running)|let it (run|finish|go|ride|limp|continue)|"
                       r"leave it|worth (it|continuing|finishing))\w*\b")
# a question about a rollback that was done ("who rolled it back?", "did the rollback help?")
PAST_ROLLBACK = re.compile(r"\b(rolled|was rolling|were rolling)\b.{0,25}\bback\b|"
                           r"\b(restart|resum|relaunch)\w* from\b|"
                           r"\brolled ?back\b|\brollback (?:\w+ )?(was|happened|help\w*|fix\w*|"
                           r"work\w*|did)\b|\b(who|when)\b.{0,30}\broll ?-?back\b|"
                           r"\b(did|was) (we|it|someone|anyone)\b.{0,20}\broll ?-?back\b")
# the move since a run's best or worst point ("how much up since the min", "risen since")
_SINCE_EXTREME = re.compile(r"\b(since|from) (?:the |its )?(min\w*|lowest|low|bottom|best|peak|"
                            r"max\w*|highest|high)\b|\bhow much (?:\w+ ){0,3}(up|down|higher|lower|"
                            r"worse|better|risen|rose|dropped|fallen|climbed)\b|\b(risen|rose|climbed|"
                            r"gone up|dropped|fallen) since\b")
# an attempt by its number ("did the third attempt use the lower lr?", "attempt #3")
_ORDINALS = {"first": 1, "1st": 1, "second": 2, "2nd": 2, "third": 3, "3rd": 3, "fourth": 4,
             "4th": 4, "fifth": 5, "5th": 5}
_ATTEMPT_NO = re.compile(r"\b(first|1st|second|2nd|third|3rd|fourth|4th|fifth|5th) (?:\w+ )?"
                         r"(attempt|try|retry|restart|relaunch)\b|\battempt #?(\d)\b")
# a checkpoint by its step ("the step 3000 checkpoint", "ckpt 2500", "checkpoint-1500")
_CHECKPOINT_AT = re.compile(r"\b(?:step[ -]?(\d[\d,]*k?) (?:checkpoint|ckpt)|(?:checkpoint|ckpt)s?"
                            r"(?: at| from)?(?: step)?[ -]?(\d[\d,]*k?))\b")
# whether it still improves ("flattening out yet?", "at diminishing returns?", "still learning?")
_PACE = re.compile(r"\b(flatten\w*|flat ?lin\w*|plateau\w*|level\w* off|diminishing returns?|"
                   r"still (?:improv|going down|go down|falling|dropping|decreas|learning|"
                   r"getting better|worth)\w*|converg\w*|"
                   r"worth (?:continu|keep|running)\w*|stop (?:it )?early)\b")
# the run's attempts ("what changed between the attempts?", "what's different in the retry?")
_ATTEMPTS = re.compile(r"\b(attempts?|retr(y|ies)|relaunch\w*|resum\w*|restart\w*)\b")
# another time than the first ("did the second attempt NaN too?")
_AGAIN = re.compile(r"\b(attempts?|again|too|also|still|retr(y|ies))\b")
# how a run differs from another, not only how it is set up ("same config as exp1?")
_DIFFER = re.compile(r"\b(diff\w*|chang\w*|vs|versus|compar\w*|baseline|than|same)\b")
# the whole list of checkpoints ("list the checkpoints")
_LIST_CHECKPOINTS = re.compile(r"\bcheckpoints\b|\blist\b")
# a request that the bot act, not a question ("roll it back to 1000 now", "kick it off")
_ACT = re.compile(r"^\W*(please |pls |just |can you |could you |go ahead and )?(roll|revert|stop|"
                  r"kill|abort|cancel|resume|restart|relaunch|rerun|launch|start|kick|pause|"
                  r"ship|deploy|bump|lower|raise|set|change)\b(?!.*\?\s*$)|\b(kick it off|"
                  r"do it now|go ahead and (roll|stop|kill|resume|restart))\b|"
                  r"\b(roll|stop|kill|resume|restart)\b.{0,40}\b(now|asap|right away)\b(?!\?)")
# a comparison over the whole run, not at one step ("better at any point, or worse the whole
# way?")
_THROUGHOUT = re.compile(r"\b(at any (point|step|time)|any point|ever|(the )?whole (way|time|run)|"
                         r"always|throughout|every (step|point|eval)|all along|the entire run)\b")
_BARE_K = re.compile(r"\b(\d+(?:\.\d+)?)\s*[kK]\b")
# where a rollback would go ("rollback to 1500", "go back to checkpoint-1000"), as against the
# step of the trouble ("roll back to before step 1500")
_ROLLBACK_TO = re.compile(rf"\b(?:back|rollback|roll-back|revert|restore|resume)\s+(?:\w+\s+)?"
                          rf"(?:to|from)\s+(?:the\s+)?(?:step\s+|checkpoint[- ]?|ckpt[- ]?)?"
                          rf"({_NUMBER})", re.I)


@dataclass
class Entities:
    """What :func:`extract` found in a question."""

    runs: list[str] = field(default_factory=list)  # visible runs named in the question
    metrics: list[str] = field(default_factory=list)  # canonical tags
    steps: list[int] = field(default_factory=list)
    step_range: tuple[int | None, int | None] | None = None  # inclusive; None = open end
    more_ranges: list[tuple[int, int]] = field(default_factory=list)  # "… vs 1500-2000"
    since: float | None = None  # wall-clock window start (Unix seconds)
    until: float | None = None
    after_rollback: bool = False
    signals: list[str] = field(default_factory=list)
    nonfinite: bool = False  # asks about NaN or infinite values ("what caused the NaN")
    latest: bool = False  # asks for a metric's latest value ("final eval loss", "lr now")
    rollback_to: int | None = None  # the step a rollback would go to ("rollback to 1500 ok?")
    last_steps: int | None = None  # "over the last 500 steps"
    just_before: int | None = None  # "the lr right before step 2000"
    event: tuple[str, str] | None = None  # ("before", "nan") of "the loss just before the NaN"
    unrecorded: str | None = None  # what no training log records, asked for ("cost")
    across: bool = False  # a question over every run ("which run has the best eval loss?")
    setup: bool = False  # asks how a run is set up (config, data version, environment)
    moved: bool = False  # asks about a move at a step ("why did lr jump at 2k?")
    decision: bool = False  # asks whether to stop, restart or let it run
    settings: list[str] = field(default_factory=list)  # config settings named ("workers")
    past_rollback: bool = False  # asks about a rollback that was done ("who rolled it back?")
    attempts: bool = False  # asks about the run's attempts ("what changed in the retry?")
    again: bool = False  # asks about another time than the first ("did it NaN again?")
    differ: bool = False  # asks how a run differs ("same config as exp1?")
    all_checkpoints: bool = False  # asks for the list of checkpoints
    baseline: bool = False  # names the run's baseline ("how's it doing against its baseline?")
    previous: bool = False  # the point before the latest ("latest eval loss vs the one before")
    outcome: bool = False  # asks what a change gained ("did doubling the lr buy us anything?")
    who: bool = False  # asks who did something ("who changed the lr?")
    act: bool = False  # asks the bot to act ("roll it back now", "just kick it off")
    every_alert: bool = False  # asks about every alert ("what alerts are open, why each?")
    health: bool = False  # asks whether the run is fine ("is it on track?", "looking ok?")
    throughout: bool = False  # asks about every step, not one ("better at any point?")
    pace: bool = False  # asks whether it still improves ("flattening out?", "still improving?")
    at_checkpoint: tuple[str, int, str] | None = None  # ("latest", step, path): "its eval loss"
    risk: bool = False  # asks whether it is about to blow up ("going to NaN like exp4?")
    event_step: int | None = None  # the step of the event named ("the spike"), once read
    window_before: int | None = None  # "what did the metrics look like in the 200 steps before"
    same_step: bool = False  # asks for runs compared at equal progress ("at the same step")
    since_extreme: bool = False  # how far it moved since its best or worst ("up since the min?")
    attempt_no: int | None = None  # an attempt named by number ("the third attempt", "attempt 3")
    checkpoint_steps: list[int] = field(default_factory=list)  # "the step 3000 checkpoint"
    kinds: list[str] = field(default_factory=list)
    matched: bool = True  # False: nothing in the question was recognised (status by default)


def _to_step(text: str) -> int:
    text = text.replace(",", "").strip()
    if text[-1:] in "kK":
        return int(round(float(text[:-1].strip()) * 1000))
    return int(round(float(text)))


def _seconds(amount: str | None, unit: str) -> float:
    unit = unit.lower()
    per = _TIME_UNITS.get(unit) or _TIME_UNITS.get(unit.rstrip("s"), 3600)
    return (float(amount) if amount else 1.0) * per


def _mask(text: str, start: int, end: int) -> str:
    return text[:start] + " " * (end - start) + text[end:]


def _has_word(text: str, word: str) -> bool:
    """``word`` in ``text`` starting at a word boundary; words of up to four letters must end
    at one too (``overfit`` finds "overfitting", ``min`` does not find "mini")."""
    pattern = (r"(?<![\w/])" if word[:1].isalnum() else "") + re.escape(word) + \
        (r"(?![\w/])" if word[-1:].isalnum() and len(word) <= 4 else "")
    return re.search(pattern, text) is not None


def extract(question: str, *, known_runs: list[str], tags: list[str] | None = None,
            now: float, aliases: AliasTable | None = None) -> Entities:
    """Read ``question``. ``known_runs`` must already be limited to what the asker may see;
    ``tags`` are the metric tags the run has (matched by their own names too)."""
    aliases = aliases or AliasTable()
    found = Entities()
    text = question.strip()
    lowered = text.lower()
    work = lowered

    named: dict[str, int] = {}
    for run in sorted(known_runs, key=len, reverse=True):  # longest first: exp10 before exp1
        for match in re.finditer(rf"(?<![\w.-]){re.escape(run.lower())}(?![\w.-])", work):
            named.setdefault(run, match.start())
            work = _mask(work, match.start(), match.end())
    found.runs = sorted(named, key=named.__getitem__)

    at: dict[str, int] = {}  # where the question first names each metric: its order there
    for tag in sorted(tags or [], key=len, reverse=True):
        if "/" in tag or "_" in tag:
            for match in re.finditer(re.escape(tag.lower()), work):
                found.metrics.append(tag)
                at.setdefault(tag, match.start())
                work = _mask(work, match.start(), match.end())
    for match in _BOTH_LOSSES.finditer(work):  # "final train and eval loss"
        found.metrics += ["train/loss", "eval/loss"]
        at.setdefault("train/loss", match.start())
        at.setdefault("eval/loss", match.start())
        work = _mask(work, match.start(), match.end())
    for word, tag in sorted(METRIC_WORDS.items(), key=lambda kv: len(kv[0]), reverse=True):
        for match in re.finditer(rf"(?<![\w/]){re.escape(word)}(?![\w/])", work):
            found.metrics.append(tag)
            at[tag] = min(at.get(tag, match.start()), match.start())
            work = _mask(work, match.start(), match.end())
    for token in re.findall(r"[a-z][\w/.-]*", work):
        tag = aliases.canonical(token)
        if tag != token and "/" not in token and tag not in ("step", "time"):
            found.metrics.append(tag)
    for tag in tags or []:  # eval/<suite>/<metric>: "accuracy", "pass rate"
        leaf = tag.rsplit("/", 1)[-1].replace("_", " ")
        if tag.startswith("eval/") and tag.count("/") >= 2 and _has_word(lowered, leaf):
            found.metrics.append(tag)
    if not any(m.startswith("eval/") for m in found.metrics) and re.search(
            r"(?<![\w/])(eval|val|validation)(?![\w/])", work):
        found.metrics.append("eval/loss")  # "eval min + step"
    found.metrics = list(dict.fromkeys(found.metrics))
    # "is the loss affected by the slowdown?": the loss first, as the question names it first
    found.metrics.sort(key=lambda t: at.get(t, len(lowered)))
    event = _EVENT.search(lowered)
    when = event.group(1) if event else ""
    if "before" in when and "after" in when:  # "right before and after the jump": both sides
        when = "either side"
    if when.startswith("react"):  # "did loss react to the lr jump?": what moved there
        when = "around"
    found.event = (when if when.startswith(("at", "during", "around", "before", "right", "just",
                                            "after", "either")) else "after",
                   event.group(2)) if event else None
    found.unrecorded = " or ".join(dict.fromkeys(m.group(0) for m in _UNRECORDED.finditer(
        lowered))) or None  # "who ran this and what hardware": both
    found.across = _ACROSS.search(lowered) is not None
    found.setup = _SETUP.search(work) is not None
    found.moved = found.moved or _MOVED.search(work) is not None
    found.decision = _DECISION.search(lowered) is not None
    found.settings = [w for w in SETTING_WORDS if w in lowered]
    found.setup = found.setup or bool(found.settings) or re.search(
        r"\bwhat(?:'s|\s+is)?\s+(?:\w+\s+){0,3}training\b(?! loss)", work) is not None
    found.past_rollback = PAST_ROLLBACK.search(lowered) is not None
    found.attempts = _ATTEMPTS.search(lowered) is not None
    found.again = _AGAIN.search(lowered) is not None
    found.differ = _DIFFER.search(lowered) is not None
    found.all_checkpoints = _LIST_CHECKPOINTS.search(lowered) is not None
    found.baseline = re.search(r"\bbase ?line\b", lowered) is not None
    found.outcome = re.search(r"\b(buy|bought|help\w*|worth|pay(s|ing)? off|paid off|improv\w*|"
                              r"gain\w*|better|worse|benefit\w*|win\w*|costing|hurt\w*|"
                              r"match\w*|on track)\b", lowered) is not None
    # "who changed the lr?" asks what people did; "who launched it?" what no record holds
    found.who = re.search(r"\bwho\b(?! (launched|started|kicked off|owns|created|submitted|"
                          r"ran|set up|trained)\b)", lowered) is not None
    found.act = _ACT.search(lowered) is not None
    found.every_alert = re.search(r"\balerts\b|\beach\b|\bevery alert\b", lowered) is not None
    found.health = re.search(r"\b(on track|ok|okay|fine|healthy|health|alright|all right|all good|"
                             r"no issues|"
                             r"looking good|look good|any (problems?|issues?|trouble))\b",
                             lowered) is not None
    found.previous = re.search(r"\b(the )?(one|value|point|eval|reading)s? before( it| that)?\b|"
                               r"\bprevious (one|value|point|eval|reading)\b|\blast two\b",
                               lowered) is not None
    found.throughout = _THROUGHOUT.search(lowered) is not None
    found.pace = _PACE.search(lowered) is not None
    found.since_extreme = _SINCE_EXTREME.search(lowered) is not None
    # "about to blow up like exp4?", "looks like the lead-up to the NaN?" — now, not then
    found.risk = re.search(r"\b(about to|going to|gonna|will it|risk of|at risk|close to|"
                           r"heading for|like exp\d+ did)\b.{0,40}\b(blow\w*|explod\w*|diverg\w*|"
                           r"nan\w*|crash\w*)\b|\blike the lead-? ?up\b", lowered) is not None
    window = re.search(rf"(?:~|about |roughly |around )?({_NUMBER})\s*(?:steps?|iters?)\s+"
                       rf"(?:before|leading up|prior)\b", lowered)
    found.window_before = _to_step(window.group(1)) if window else None
    found.same_step = re.search(r"\bsame (step|point|progress|number of steps|step count)s?\b|"
                                r"\bstep for step\b|\bstep both\b|\bequal (steps|progress)\b",
                                lowered) is not None
    ordinal = _ATTEMPT_NO.search(lowered)
    if ordinal:
        word = ordinal.group(1) or ordinal.group(3)
        found.attempt_no = int(word) if word.isdigit() else _ORDINALS[word]

    for match in _AGO.finditer(work):
        found.since = now - _seconds(match.group(1), match.group(2))
        work = _mask(work, match.start(), match.end())
    for match in _RELATIVE.finditer(work):
        found.since = now - _seconds(match.group(1), match.group(2))
        work = _mask(work, match.start(), match.end())
    for match in _DURATION.finditer(work):  # "deciding in 10 min" asks for no minimum
        work = _mask(work, match.start(), match.end())
    midnight = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    if re.search(r"\bsince yesterday\b|\byesterday\b", work):
        found.since = (midnight - timedelta(days=1)).timestamp()
        if "since yesterday" not in work:
            found.until = midnight.timestamp()
        work = work.replace("yesterday", " " * len("yesterday"))
    elif re.search(r"\btoday\b|\bthis morning\b", work):
        found.since = midnight.timestamp()
    rollback = re.search(r"(?:after|since) (?:the |our |a )?(?:last )?roll ?-?back|after (?:we |"
                         r"it )?rolled back|new attempt", work)
    if rollback:
        found.after_rollback = True
        work = _mask(work, rollback.start(), rollback.end())

    just = _JUST_BEFORE.search(work)
    if just:  # "right before step 2000": the last point logged before it, read with the run
        found.just_before = _to_step(just.group(1))
        work = _mask(work, just.start(), just.end())
    last = _LAST_STEPS.search(work)
    if last:  # a window back from the run's latest step, read when the run is known
        found.last_steps = _to_step(last.group(1))
        work = _mask(work, last.start(), last.end())
    target = _ROLLBACK_TO.search(work)
    if target:  # "restore from step 2k" names no window after step 2000
        found.rollback_to = _to_step(target.group(1))
        work = _mask(work, target.start(1), target.end(1))
    around = _BEFORE_AFTER.search(work)
    if around:  # "tok/s before vs after 1000": what moved at step 1000
        found.steps.append(_to_step(around.group(1)))
        found.moved = True
        work = _mask(work, around.start(), around.end())
    ranges = list(_RANGE.finditer(work))
    for match in ranges:
        lo, hi = [g for g in match.groups() if g is not None]
        a, b = sorted((_to_step(lo), _to_step(hi)))
        if found.step_range is None:
            found.step_range = (a, b)
        else:
            found.more_ranges.append((a, b))
        work = _mask(work, match.start(), match.end())
    if not ranges:
        after = _AFTER.search(work)
        before = _BEFORE.search(work)
        if after or before:
            found.step_range = (_to_step(after.group(1)) if after else None,
                                _to_step(before.group(1)) if before else None)
            for m in (after, before):
                if m:
                    work = _mask(work, m.start(), m.end())
    for match in _STEP.finditer(work):
        found.steps.append(_to_step(match.group(1)))
        found.steps += [_to_step(m.group(0)) for m in _LISTED.finditer(match.group(2) or "")]
        work = _mask(work, match.start(), match.end())
    for match in _BARE_K.finditer(work):
        found.steps.append(_to_step(match.group(0)))
    found.steps = list(dict.fromkeys(found.steps))
    found.checkpoint_steps = [_to_step(m.group(1) or m.group(2))
                              for m in _CHECKPOINT_AT.finditer(lowered)]
    if len(found.steps) == 2 and found.step_range is None and re.search(
            r"\bwhat(?:'s| has| else)? (moved|changed|differs?|happened)\b", lowered):
        found.step_range = (min(found.steps), max(found.steps))  # "1900 vs 2100, what moved?"
        found.steps = []

    for word, signal in SIGNAL_WORDS.items():
        if word in lowered and signal not in found.signals:
            found.signals.append(signal)
    found.nonfinite = re.search(r"\b(nan\w*|infs?|infinit[ey]|non-?finite)\b", lowered) \
        is not None
    found.latest = re.search(r"\b(final|latest|last value|current(ly)?|right now|now|at the "
                             r"end)\b", work) is not None
    found.kinds = classify(lowered, work, found)
    return found


def classify(lowered: str, work: str, found: Entities) -> list[str]:
    """The kinds of answer a question wants, from its words (``work``: the question with run
    names and time phrases blanked, so ``last 30 min`` asks for no minimum) and entities."""
    kinds = [kind for kind, words in KIND_WORDS.items()
             if any(_has_word(work, w.strip()) if w.strip() == w else w in work
                    for w in words)]
    if "since" in lowered and found.since is None and found.step_range is None \
            and not found.after_rollback and "trend" in kinds and "before" not in lowered:
        kinds.remove("trend")
    if "compare" in kinds and len(found.runs) < 1:
        kinds.remove("compare")
        if found.attempts and "changed" not in kinds:  # "attempt 2 vs attempt 1 at the same step"
            kinds.insert(0, "changed")
    if len(found.runs) >= 2 and not {"compare", "similar"} & set(kinds):
        kinds.append("compare")
    if "similar" in kinds and "before?" in lowered and not re.search(
            r"(seen|happened|had|see).{0,30}before\?", lowered):
        kinds.remove("similar")
    if "changed" in kinds and "compare" in kinds and "what changed" not in lowered and not \
            re.search(r"\b(config\w*|settings?|setup|hyperparam\w*|data ?versions?|datasets?|"
                      r"environment|env|different|differ|differs|diff)\b", lowered):
        kinds.remove("changed")  # "how does it compare to the baseline?", not its settings
    if kinds == ["value"] and not (found.metrics or found.steps or found.step_range):
        kinds = []  # "what is …" alone asks for nothing this bot records
    if {"min", "max", "trend", "changed", "why", "rollback", "compare", "similar",
            "status"} & set(kinds) and not found.steps and "value" in kinds:
        kinds.remove("value")  # "what is" in a question that asks for something specific
    if ("min" in kinds or "max" in kinds) and not found.metrics and not found.unrecorded:
        found.metrics.append("eval/loss" if "best" in lowered else "train/loss")
    if found.metrics and (found.steps or found.step_range) and not {
            "min", "max", "trend", "why", "compare"} & set(kinds):
        kinds.append("value")
    if (found.since is not None or found.after_rollback) and found.metrics and not {
            "min", "max", "trend"} & set(kinds) and not found.steps:
        kinds = [k for k in kinds if k != "value"] + ["trend"]
    if not kinds:
        found.matched = bool(found.metrics or found.signals or found.steps)
        kinds = ["value"] if found.metrics else ["status"]
    return list(dict.fromkeys(kinds))
