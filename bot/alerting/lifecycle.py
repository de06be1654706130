"""The alert lifecycle as small pure stages, after Prometheus and Alertmanager.

Nothing here touches the store, Slack or the clock: every function takes ``now`` (seconds)
and the state it judges, and returns the next state or a decision. ``bot.alerting.pipeline`` loads
state from SQLite, calls these stages in order and writes what they decide, with the
outbox rows, in one transaction.

1. **Rule** (:func:`advance`): a finding the analyzers report becomes an alert that is
   *pending* until it has persisted ``pending_steps`` steps and ``pending_evaluations``
   further evaluations, then *firing*; once the analyzers report it resolved (or no longer
   report it) it stays firing ``keep_firing_steps`` more steps against flapping, then is
   *resolved*.
2. **Mute**: :func:`inhibited_by` (a firing alert that explains another mutes it) and
   :func:`silenced_by` (people's silences).
3. **Route** (:func:`route`): the channel, and the on-call group to mention, by labels.
4. **Dedup** (:func:`needs_update`): whether a group needs a notification now, from the
   last one sent for it, exactly as Alertmanager's dedup stage decides.
5. **Plan** (:func:`plan_group`): what to send for one group: a new message, alerts
   joining the group's message in place (``chat.update``) within ``group_interval``,
   resolved notices, a repeat of an unacknowledged critical, an escalation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

# Named defaults (README, "Alert lifecycle").
DEFAULT_GROUP_WAIT = 0.0
"""Seconds a new group's first message waits for other alerts to join it. Alertmanager
waits 30 s; runwatch updates a group's message in place as alerts join, so waiting would
only delay a NaN alert by a poll."""
DEFAULT_GROUP_INTERVAL = 5 * 60.0
"""Seconds during which alerts joining a group update its message instead of posting."""
DEFAULT_REPEAT_INTERVAL = 4 * 3600.0
"""Seconds after which a still-firing, unacknowledged critical alert is posted again."""
DEFAULT_ESCALATE_AFTER = 30 * 60.0
"""Seconds an unacknowledged critical alert waits before the on-call group is mentioned."""
DEFAULT_SILENCE_SECONDS = 2 * 3600.0
"""How long a silence lasts when no duration is given."""

ALERT_LABELS = ("run", "attempt", "signal", "metric", "severity", "onset", "nonfinite",
                "project", "team")
SILENCE_LABELS = ("run", "signal", "severity", "metric")
MATCH_OPS = ("=~", "!~", "!=", "=")  # longest first: parsing tries them in this order

AlertState = Literal["pending", "firing", "resolved"]
Observed = Literal["firing", "resolved", "absent", "superseded"]


class LifecycleError(ValueError):
    """Input a user can fix (a silence, a matcher, a duration); the message says what."""


# -- durations ------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``1d``, ``1h30m`` → seconds.

    >>> parse_duration("1h30m"), parse_duration("45s")
    (5400.0, 45.0)
    """
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise LifecycleError(f"{text!r} is not a duration; write e.g. 30m, 2h or 1d")
    return float(sum(float(n) * _UNIT[u] for n, u in parts))


def is_duration(text: str) -> bool:
    try:
        parse_duration(text)
    except LifecycleError:
        return False
    return True


# -- stage 1: the rule ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """Per-signal hysteresis. Steps are the run's steps; an evaluation is one poll that
    analysed the run."""

    pending_steps: int = 0
    pending_evaluations: int = 0
    keep_firing_steps: int = 0


@dataclass(frozen=True)
class Observation:
    """What the analyzers said about one finding in this evaluation."""

    state: Observed
    detected_step: int
    resolved_step: int | None = None


@dataclass(frozen=True)
class Lifecycle:
    """The rule stage's state of one alert."""

    state: AlertState
    evaluations: int = 0  # evaluations that reported the finding firing, the first included
    pending_since: float | None = None
    fired_at: float | None = None
    resolved_at: float | None = None


def advance(prev: Lifecycle | None, seen: Observation, rule: Rule, *, step: int,
            now: float) -> Lifecycle | None:
    """The next state of one alert; ``None`` when it never fired and is gone.

    The data is evidence for steps: a finding first seen already resolved fired if it
    lasted ``pending_steps`` (an episode that began and ended between two polls is news).
    Evaluations can only be counted as they happen. ``superseded`` (the run went back and
    started a new attempt) resolves at once, whatever the hold.

    >>> rule = Rule(pending_evaluations=1, keep_firing_steps=10)
    >>> s = advance(None, Observation("firing", 100), rule, step=100, now=0.0)
    >>> s.state
    'pending'
    >>> s = advance(s, Observation("firing", 100), rule, step=110, now=30.0)
    >>> s.state, s.fired_at
    ('firing', 30.0)
    >>> advance(s, Observation("resolved", 100, 115), rule, step=120, now=60.0).state
    'firing'
    >>> advance(s, Observation("resolved", 100, 115), rule, step=125, now=90.0).state
    'resolved'
    """
    if prev is not None and prev.state == "resolved":
        return prev
    if seen.state == "firing":
        evaluations = (prev.evaluations if prev else 0) + 1
        since = prev.pending_since if prev and prev.pending_since is not None else now
        if prev is not None and prev.state == "firing":
            return Lifecycle("firing", evaluations, since, prev.fired_at)
        ready = (evaluations > rule.pending_evaluations
                 and step - seen.detected_step >= rule.pending_steps)
        return Lifecycle("firing" if ready else "pending", evaluations, since,
                         now if ready else None)
    if prev is None or prev.state == "pending":
        lasted = (seen.resolved_step if seen.resolved_step is not None else step) \
            - seen.detected_step
        if prev is None and seen.state == "resolved" and rule.pending_evaluations == 0 \
                and lasted >= rule.pending_steps:
            return Lifecycle("resolved", 1, now, now, now)
        return None  # its condition went away before it fired: forgotten, as in Prometheus
    ended = seen.resolved_step if seen.resolved_step is not None else step
    if seen.state == "superseded" or step - ended >= rule.keep_firing_steps:
        return Lifecycle("resolved", prev.evaluations, prev.pending_since, prev.fired_at, now)
    return prev


# -- stage 2: mute ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Matcher:
    """``name op value`` on an alert's labels; ``=~``/``!~`` match the whole value."""

    name: str
    op: Literal["=", "!=", "=~", "!~"]
    value: str

    def __post_init__(self) -> None:
        if self.op not in MATCH_OPS:
            raise LifecycleError(f"matcher operator {self.op!r} unknown; use = != =~ !~")
        if self.op in ("=~", "!~"):
            try:
                re.compile(self.value)
            except re.error as exc:
                raise LifecycleError(f"{self}: not a regular expression: {exc}") from None

    @classmethod
    def parse(cls, text: str, names: Iterable[str] = SILENCE_LABELS) -> Matcher:
        """``signal=plateau``, ``run=~exp.*``, ``severity!=critical``."""
        names = tuple(names)
        for op in MATCH_OPS:
            name, found, value = text.partition(op)
            if found:
                name = name.strip()
                if name not in names:
                    raise LifecycleError(f"cannot match on {name!r}; use one of "
                                         f"{', '.join(names)}")
                return cls(name, op, value.strip())  # type: ignore[arg-type]
        raise LifecycleError(f"{text!r} is not a matcher; write e.g. signal=plateau or "
                             f"run=~exp.*")

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = str(labels.get(self.name, ""))
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        found = re.fullmatch(self.value, value) is not None
        return found if self.op == "=~" else not found

    def matches_everything(self) -> bool:
        """Alertmanager's test: a matcher that matches the empty label matches any alert
        that lacks the label, so it narrows nothing on its own."""
        return self.matches({})

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.value}"


@dataclass(frozen=True)
class Silence:
    id: int | None
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    created_by: str
    reason: str

    def validate(self, now: float) -> None:
        """Raise :class:`LifecycleError` for a silence that must not be created."""
        if not self.matchers or all(m.matches_everything() for m in self.matchers):
            raise LifecycleError("a silence needs at least one matcher that does not match "
                                 "everything, e.g. run=exp1 or signal=plateau")
        if self.ends_at <= self.starts_at:
            raise LifecycleError("a silence must end after it starts")
        if self.ends_at <= now:
            raise LifecycleError("that silence would already be over; give a later end")
        if not self.created_by:
            raise LifecycleError("a silence needs its creator")
        if not self.reason.strip():
            raise LifecycleError("say why you silence it, e.g. `… 2h eval suite is flaky`")

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)


def silenced_by(labels: Mapping[str, str], silences: Iterable[Silence],
                now: float) -> Silence | None:
    """The first active silence matching ``labels``."""
    return next((s for s in silences if s.active(now) and s.matches(labels)), None)


@dataclass(frozen=True)
class InhibitRule:
    """A firing *source* alert mutes *target* alerts that share the ``equal`` labels (and,
    with ``within_steps``, whose onset lies that close to the source's)."""

    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...] = ("run",)
    within_steps: int | None = None

    @classmethod
    def from_dict(cls, source: Mapping[str, str | list[str]],
                  target: Mapping[str, str | list[str]], equal: Iterable[str] = ("run",),
                  within_steps: int | None = None) -> InhibitRule:
        """``{"signal": ["stalled", "crashed"]}`` → ``signal=~stalled|crashed``."""
        return cls(_matchers(source), _matchers(target), tuple(equal), within_steps)

    def inhibits(self, source: Mapping[str, str], target: Mapping[str, str]) -> bool:
        if not (all(m.matches(source) for m in self.source)
                and all(m.matches(target) for m in self.target)):
            return False
        if any(source.get(name) != target.get(name) for name in self.equal):
            return False
        if self.within_steps is not None:
            try:
                gap = abs(int(source["onset"]) - int(target["onset"]))
            except (KeyError, ValueError):
                return False
            return gap <= self.within_steps
        return True


def _matchers(spec: Mapping[str, str | list[str]]) -> tuple[Matcher, ...]:
    out = []
    for name, value in spec.items():
        if name not in ALERT_LABELS:
            raise LifecycleError(f"label {name!r} unknown; known: {', '.join(ALERT_LABELS)}")
        values = [value] if isinstance(value, str) else list(value)
        if not values:
            raise LifecycleError(f"label {name!r} needs at least one value")
        out.append(Matcher(name, "=", values[0]) if len(values) == 1 else
                   Matcher(name, "=~", "|".join(re.escape(v) for v in values)))
    if not out:
        raise LifecycleError("an inhibition side needs at least one label")
    return tuple(out)


DEFAULT_INHIBIT_RULES: tuple[InhibitRule, ...] = (
    # A run that stopped advancing explains its low throughput, its flat loss and its
    # missing checkpoints: one alert, not four.
    InhibitRule.from_dict({"signal": ["stalled", "crashed"]},
                          {"signal": ["throughput_drop", "plateau", "checkpoint_gap"]},
                          equal=("run",)),
    # A NaN/Inf explains the spike alerts on other metrics (eval loss, grad norm) at the
    # same steps.
    InhibitRule.from_dict({"signal": "spike", "nonfinite": "true"},
                          {"signal": ["spike", "grad_norm"], "nonfinite": "false"},
                          equal=("run", "attempt"), within_steps=5),
    # An instability episode explains the single-point spikes of its metric while it lasts
    # (divergence defers to a spike that came first; this covers one that comes after).
    InhibitRule.from_dict({"signal": "divergence"}, {"signal": "spike", "nonfinite": "false"},
                          equal=("run", "attempt", "metric")),
)


def inhibited_by(fingerprint: str, labels: Mapping[str, str],
                 firing: Mapping[str, Mapping[str, str]],
                 rules: Iterable[InhibitRule]) -> str | None:
    """The fingerprint of a firing alert that inhibits this one (never itself)."""
    rules = tuple(rules)
    for source_fp, source in firing.items():
        if source_fp != fingerprint and any(r.inhibits(source, labels) for r in rules):
            return source_fp
    return None


# -- stage 3: routing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """Alerts whose labels match go to ``channel``; the first matching route wins."""

    channel: str
    matchers: tuple[Matcher, ...] = ()
    oncall: str | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)


def route(labels: Mapping[str, str], routes: Iterable[Route], default: Route) -> Route:
    return next((r for r in routes if r.matches(labels)), default)


# -- stage 4: dedup --------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """The notification log's last entry for one group: when, and which alerts it showed
    firing and resolved."""

    at: float
    firing: frozenset[str] = frozenset()
    resolved: frozenset[str] = frozenset()


def needs_update(entry: Entry | None, firing: frozenset[str], resolved: frozenset[str],
                 repeat_interval: float, now: float) -> bool:
    """Alertmanager's dedup: notify for new firing alerts, for resolutions, and when the
    repeat interval has passed since the last notification.

    >>> e = Entry(at=0.0, firing=frozenset({"a"}))
    >>> needs_update(None, frozenset({"a"}), frozenset(), 60, 10)
    True
    >>> needs_update(e, frozenset({"a"}), frozenset(), 60, 10)
    False
    >>> needs_update(e, frozenset({"a", "b"}), frozenset(), 60, 10)
    True
    >>> needs_update(e, frozenset({"a"}), frozenset(), 60, 60)
    True
    >>> needs_update(e, frozenset(), frozenset({"a"}), 60, 10)
    True
    """
    if entry is None:
        return bool(firing)
    if not firing <= entry.firing:
        return True
    if not firing:
        # Alerts that fired and resolved within one interval were never shown: say nothing.
        return bool(entry.firing)
    if not resolved <= entry.resolved:
        return True
    return entry.at <= now - repeat_interval


# -- stage 5: what to send for one group -----------------------------------------------------


@dataclass(frozen=True)
class Timing:
    group_wait: float = DEFAULT_GROUP_WAIT
    group_interval: float = DEFAULT_GROUP_INTERVAL
    repeat_interval: float = DEFAULT_REPEAT_INTERVAL
    escalate_after: float | None = DEFAULT_ESCALATE_AFTER


@dataclass(frozen=True)
class AlertView:
    """One alert of a group as the planner sees it."""

    fingerprint: str
    severity: str
    state: AlertState
    fired_at: float | None = None
    message_id: int | None = None  # the group message that announced it
    notified: str | None = None  # what people were last told: "firing", "resolved"
    muted: str | None = None  # why it is muted ("silenced by …", "inhibited by …")
    acked_by: str | None = None
    escalated: bool = False
    shown: str | None = None  # the status its message shows
    flash: bool = False  # fired and resolved between two evaluations, never shown yet

    @property
    def status(self) -> str:
        """What its message should show about it."""
        if self.state == "resolved":
            return "resolved"
        return "; ".join(x for x in ("firing", self.muted,
                                     self.acked_by and f"acknowledged by {self.acked_by}")
                         if x)


@dataclass(frozen=True)
class MessageView:
    id: int
    created_at: float


@dataclass
class Plan:
    """What one group needs now. ``post``: alerts announced in a new message; ``join``:
    alerts added to ``message`` in place; ``update``: messages to redraw; ``resolved``,
    ``repeat``, ``escalate``: thread replies."""

    entry: Entry | None
    post: list[str] = field(default_factory=list)
    post_at: float | None = None
    join: list[str] = field(default_factory=list)
    message: int | None = None
    update: list[int] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)
    repeat: list[str] = field(default_factory=list)
    escalate: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.post or self.join or self.update or self.resolved or self.repeat
                    or self.escalate)


def nags(alert: AlertView) -> bool:
    """Only an unacknowledged critical repeats; a warning does not nag."""
    return alert.severity == "critical" and alert.acked_by is None


def plan_group(alerts: list[AlertView], entry: Entry | None, message: MessageView | None,
               timing: Timing, now: float) -> Plan:
    """Decide what one group needs, from its alerts and its last notification.

    A new alert joins the group's message when that message is younger than
    ``group_interval``; otherwise it opens a new message (the first one after
    ``group_wait``). An alert shows once; its resolution is a notice in its thread. An
    episode that began and ended between two evaluations (``flash``) is news: it counts as
    firing and resolved at once.
    """
    live = frozenset(a.fingerprint for a in alerts if a.state == "firing" and not a.muted)
    flash = frozenset(a.fingerprint for a in alerts if a.flash and not a.muted)
    firing = live | flash
    resolved = flash | frozenset(a.fingerprint for a in alerts
                                 if a.state == "resolved" and a.notified == "firing")
    repeat = timing.repeat_interval if any(nags(a) for a in alerts
                                           if a.fingerprint in live) else math.inf
    plan = Plan(entry=entry)
    by_fp = {a.fingerprint: a for a in alerts}
    if needs_update(entry, firing, resolved, repeat, now):
        new = sorted(fp for fp in firing if by_fp[fp].message_id is None)
        if new and message is not None and now - message.created_at < timing.group_interval:
            plan.join, plan.message = new, message.id
        elif new:
            plan.post = new
            plan.post_at = now + (timing.group_wait if entry is None or not entry.firing
                                  else 0.0)
        plan.resolved = sorted(resolved)
        if not new and not resolved and entry is not None and firing <= entry.firing:
            plan.repeat = sorted(fp for fp in live if nags(by_fp[fp]))
        plan.entry = Entry(now, firing, resolved)
    if timing.escalate_after is not None:
        plan.escalate = sorted(
            a.fingerprint for a in alerts
            if a.fingerprint in live and nags(a) and not a.escalated
            and a.message_id is not None and a.fired_at is not None
            and now - a.fired_at >= timing.escalate_after)
    joined = set(plan.join)
    plan.update = sorted({a.message_id for a in alerts
                          if a.message_id is not None and a.fingerprint not in joined
                          and a.shown is not None and a.shown != a.status}
                         | ({plan.message} if plan.join else set()))
    return plan
