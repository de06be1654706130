"""Every stage of the alert lifecycle on its own, with time injected (bot.alerting.lifecycle)."""

import math

import pytest

from benchmarks.lifecycle_series import expand_series
from bot.alerting.lifecycle import (
    DEFAULT_INHIBIT_RULES,
    AlertView,
    Entry,
    InhibitRule,
    LifecycleError,
    Matcher,
    MessageView,
    Observation,
    Route,
    Rule,
    Silence,
    Timing,
    advance,
    inhibited_by,
    needs_update,
    parse_duration,
    plan_group,
    route,
    silenced_by,
)

F = frozenset


# -- rule stage ----------------------------------------------------------------------------

def walk(rule, events):
    """Feed (step, observed state, resolved_step) per evaluation; return the states."""
    state, out = None, []
    for i, (step, seen, resolved) in enumerate(events):
        state = advance(state, Observation(seen, 100, resolved), rule, step=step, now=i * 10.0)
        out.append(state.state if state else None)
    return out


def test_without_hysteresis_a_finding_fires_and_resolves_at_once():
    assert walk(Rule(), [(100, "firing", None), (110, "resolved", 105)]) == ["firing",
                                                                              "resolved"]


def test_pending_counts_evaluations_and_steps():
    assert walk(Rule(pending_evaluations=2), [(100, "firing", None)] * 3) == \
        ["pending", "pending", "firing"]
    assert walk(Rule(pending_steps=20), [(100, "firing", None), (110, "firing", None),
                                         (120, "firing", None)]) == ["pending", "pending",
                                                                     "firing"]


def test_a_pending_alert_whose_condition_goes_away_is_forgotten():
    assert walk(Rule(pending_evaluations=1), [(100, "firing", None), (105, "resolved", 104)]) \
        == ["pending", None]


def test_keep_firing_holds_the_resolution_for_steps():
    events = [(100, "firing", None), (106, "resolved", 105), (114, "resolved", 105),
              (115, "resolved", 105)]
    assert walk(Rule(keep_firing_steps=10), events) == ["firing", "firing", "firing",
                                                        "resolved"]


def test_keep_firing_absorbs_a_flap():
    events = [(100, "firing", None), (106, "resolved", 105), (108, "firing", None),
              (130, "resolved", 125)]
    assert walk(Rule(keep_firing_steps=10), events) == ["firing"] * 4


def test_a_rewound_run_resolves_at_once_whatever_the_hold():
    assert walk(Rule(keep_firing_steps=1000), [(100, "firing", None),
                                               (90, "superseded", None)]) == ["firing",
                                                                               "resolved"]


def test_an_episode_over_between_two_polls_fired_if_it_lasted_the_pending_steps():
    short = advance(None, Observation("resolved", 100, 104), Rule(pending_steps=10),
                    step=120, now=0.0)
    long = advance(None, Observation("resolved", 100, 130), Rule(pending_steps=10),
                   step=140, now=0.0)
    assert short is None and long.state == "resolved" and long.fired_at == 0.0


# -- dedup ------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry, firing, resolved, now, expected", [
    (None, F(), F(), 0, False),  # nothing to say
    (None, F("a"), F(), 0, True),  # first notification
    (Entry(0, F("a")), F("a"), F(), 100, False),  # nothing changed
    (Entry(0, F("a")), F("ab"), F(), 100, True),  # a new alert
    (Entry(0, F("ab")), F("a"), F("b"), 100, True),  # a resolution
    (Entry(0, F("ab"), F("b")), F("a"), F("b"), 100, False),  # already told
    (Entry(0, F("a")), F(), F("a"), 100, True),  # all resolved
    (Entry(0, F()), F(), F("a"), 100, False),  # fired and resolved unseen
    (Entry(0, F("a")), F("a"), F(), 3600, True),  # repeat interval passed
])
def test_dedup_is_alertmanagers(entry, firing, resolved, now, expected):
    assert needs_update(entry, firing, resolved, 3600, now) is expected


def test_an_infinite_repeat_interval_never_repeats():
    assert not needs_update(Entry(0, F("a")), F("a"), F(), math.inf, 1e12)


# -- silences ---------------------------------------------------------------------------------

LABELS = {"run": "exp1", "signal": "plateau", "severity": "warning", "metric": "train/loss"}


def silence(*matchers, start=0.0, end=3600.0, by="U1", reason="flaky eval"):
    return Silence(1, tuple(Matcher.parse(m) for m in matchers), start, end, by, reason)


@pytest.mark.parametrize("matchers, match", [
    (["run=exp1"], True), (["run=exp2"], False), (["run=~exp.*", "signal=plateau"], True),
    (["severity!=critical"], True), (["signal!~plat.*"], False), (["run=~exp"], False),
])
def test_matchers(matchers, match):
    assert silence(*matchers).matches(LABELS) is match


@pytest.mark.parametrize("matchers, start, end, by, reason, error", [
    ([], 0, 10, "U1", "x", "at least one matcher"),
    (["run=~.*"], 0, 10, "U1", "x", "at least one matcher"),
    (["run!=exp1"], 0, 10, "U1", "x", "at least one matcher"),
    (["run=exp1"], 10, 10, "U1", "x", "end after it starts"),
    (["run=exp1"], -20, -10, "U1", "x", "already be over"),
    (["run=exp1"], 0, 10, "", "x", "creator"),
    (["run=exp1"], 0, 10, "U1", " ", "say why"),
])
def test_silences_are_validated(matchers, start, end, by, reason, error):
    with pytest.raises(LifecycleError, match=error):
        silence(*matchers, start=start, end=end, by=by, reason=reason).validate(now=0.0)


def test_bad_matchers_say_what_to_write():
    with pytest.raises(LifecycleError, match="cannot match on 'host'"):
        Matcher.parse("host=a")
    with pytest.raises(LifecycleError, match="not a matcher"):
        Matcher.parse("plateau")
    with pytest.raises(LifecycleError, match="not a regular expression"):
        Matcher.parse("run=~(")


def test_a_silence_mutes_only_between_start_and_end():
    s = silence("signal=plateau", start=100, end=200)
    assert [silenced_by(LABELS, [s], now) is s for now in (99, 100, 199, 200)] == \
        [False, True, True, False]


def test_durations():
    assert parse_duration("2h") == 7200 and parse_duration("1d12h") == 129600
    with pytest.raises(LifecycleError, match="not a duration"):
        parse_duration("2 hours")


# -- inhibition and routing --------------------------------------------------------------------

def labels(signal, run="exp1", onset=100, nonfinite="false", attempt="1"):
    return {"run": run, "attempt": attempt, "signal": signal, "metric": "train/loss",
            "severity": "warning", "onset": str(onset), "nonfinite": nonfinite}


def test_a_stalled_run_mutes_its_throughput_plateau_and_checkpoint_alerts():
    firing = {"s": labels("stalled")}
    for target in ("throughput_drop", "plateau", "checkpoint_gap"):
        assert inhibited_by("t", labels(target), firing, DEFAULT_INHIBIT_RULES) == "s"
    assert inhibited_by("t", labels("spike"), firing, DEFAULT_INHIBIT_RULES) is None
    assert inhibited_by("t", labels("plateau", run="exp2"), firing,
                        DEFAULT_INHIBIT_RULES) is None
    assert inhibited_by("s", labels("stalled"), firing, DEFAULT_INHIBIT_RULES) is None


def test_a_nan_mutes_the_spike_alerts_it_explains_and_no_others():
    firing = {"nan": labels("spike", onset=100, nonfinite="true")}
    near = labels("grad_norm", onset=98)
    far = labels("grad_norm", onset=300)
    other_attempt = labels("spike", onset=100, attempt="2")
    assert inhibited_by("g", near, firing, DEFAULT_INHIBIT_RULES) == "nan"
    assert inhibited_by("g", far, firing, DEFAULT_INHIBIT_RULES) is None
    assert inhibited_by("g", other_attempt, firing, DEFAULT_INHIBIT_RULES) is None
    other_nan = labels("spike", onset=101, nonfinite="true")
    assert inhibited_by("n2", other_nan, firing, DEFAULT_INHIBIT_RULES) is None


def test_a_divergence_mutes_the_finite_spikes_of_its_metric_while_it_fires():
    firing = {"div": labels("divergence", onset=100)}
    assert inhibited_by("s", labels("spike", onset=160), firing, DEFAULT_INHIBIT_RULES) == "div"
    assert inhibited_by("n", labels("spike", onset=160, nonfinite="true"), firing,
                        DEFAULT_INHIBIT_RULES) is None
    eval_spike = {**labels("spike", onset=160), "metric": "eval/loss"}
    assert inhibited_by("e", eval_spike, firing, DEFAULT_INHIBIT_RULES) is None


def test_inhibit_rules_from_config_data():
    rule = InhibitRule.from_dict({"signal": "memory"}, {"severity": ["warning", "info"]})
    assert rule.inhibits(labels("memory"), labels("plateau"))
    with pytest.raises(LifecycleError, match="label 'host' unknown"):
        InhibitRule.from_dict({"host": "a"}, {"signal": "x"})


def test_routing_first_match_wins_and_falls_back_to_the_default():
    oncall = Route("#oncall", (Matcher("severity", "=", "critical"),), oncall="S1")
    team = Route("#nlp", (Matcher("run", "=~", "nlp-.*"),))
    default = Route("#alerts")
    crit = {**labels("spike", run="nlp-7"), "severity": "critical"}
    assert route(crit, [oncall, team], default) is oncall
    assert route(labels("plateau", run="nlp-7"), [oncall, team], default) is team
    assert route(labels("plateau"), [oncall, team], default) is default


# -- the plan for one group ----------------------------------------------------------------------

T = Timing(group_wait=0, group_interval=300, repeat_interval=3600, escalate_after=1800)


def view(fp, severity="critical", state="firing", message=None, notified=None, **kw):
    return AlertView(fp, severity, state, fired_at=kw.pop("fired_at", 0.0), message_id=message,
                     notified=notified, shown=kw.pop("shown", "firing" if message else None),
                     **kw)


def test_first_alerts_of_a_group_are_posted_together():
    plan = plan_group([view("a"), view("b", "warning")], None, None, T, now=0)
    assert plan.post == ["a", "b"] and plan.post_at == 0 and plan.entry.firing == F("ab")


def test_group_wait_holds_only_a_new_groups_first_post():
    wait = Timing(group_wait=30)
    assert plan_group([view("a")], None, None, wait, now=0).post_at == 30
    later = plan_group([view("a", message=1, notified="firing"), view("b")],
                       Entry(0, F("a")), MessageView(1, 0), wait, now=400)
    assert later.post == ["b"] and later.post_at == 400


def test_within_the_group_interval_a_new_alert_joins_the_message():
    alerts = [view("a", message=1, notified="firing"), view("b", "warning")]
    plan = plan_group(alerts, Entry(0, F("a")), MessageView(1, 0), T, now=299)
    assert (plan.join, plan.message, plan.post, plan.update) == (["b"], 1, [], [1])


def test_after_the_group_interval_a_new_alert_opens_a_new_message():
    alerts = [view("a", message=1, notified="firing"), view("b", "warning")]
    plan = plan_group(alerts, Entry(0, F("a")), MessageView(1, 0), T, now=300)
    assert (plan.join, plan.post) == ([], ["b"])


def test_nothing_new_nothing_sent():
    alerts = [view("a", message=1, notified="firing")]
    assert plan_group(alerts, Entry(0, F("a")), MessageView(1, 0), T, now=100).empty


def test_a_resolution_is_a_thread_notice_and_a_redraw():
    alerts = [view("a", state="resolved", message=1, notified="firing"),
              view("b", message=1, notified="firing")]
    plan = plan_group(alerts, Entry(0, F("ab")), MessageView(1, 0), T, now=100)
    assert (plan.resolved, plan.update, plan.repeat) == (["a"], [1], [])


def test_a_long_firing_critical_repeats_a_warning_does_not_nag():
    crit = [view("a", message=1, notified="firing")]
    warn = [view("a", "warning", message=1, notified="firing")]
    assert plan_group(crit, Entry(0, F("a")), MessageView(1, 0), T, now=3600).repeat == ["a"]
    assert plan_group(warn, Entry(0, F("a")), MessageView(1, 0), T, now=36000).empty


def test_an_acknowledged_critical_stops_repeating_and_escalating_and_shows_who():
    acked = [view("a", message=1, notified="firing", acked_by="U7")]
    plan = plan_group(acked, Entry(0, F("a")), MessageView(1, 0), T, now=36000)
    assert (plan.repeat, plan.escalate, plan.update) == ([], [], [1])
    assert acked[0].status == "firing; acknowledged by U7"


def test_an_unacknowledged_critical_escalates_once_after_the_configured_time():
    alerts = [view("a", message=1, notified="firing")]
    entry = Entry(0, F("a"))
    assert plan_group(alerts, entry, MessageView(1, 0), T, now=1799).escalate == []
    assert plan_group(alerts, entry, MessageView(1, 0), T, now=1800).escalate == ["a"]
    done = [view("a", message=1, notified="firing", escalated=True)]
    assert plan_group(done, entry, MessageView(1, 0), T, now=1900).escalate == []
    no_oncall = Timing(escalate_after=None)
    assert plan_group(alerts, entry, MessageView(1, 0), no_oncall, now=1e6).escalate == []


def test_a_muted_alert_is_not_announced_and_a_posted_one_is_redrawn():
    assert plan_group([view("a", muted="silenced by U1")], None, None, T, now=0).empty
    posted = [view("a", message=1, notified="firing", muted="silenced by U1")]
    plan = plan_group(posted, Entry(0, F("a")), MessageView(1, 0), T, now=10)
    assert (plan.update, plan.repeat, plan.resolved) == ([1], [], [])


def test_an_alert_whose_silence_ended_is_announced_then():
    plan = plan_group([view("a")], Entry(0, F()), None, T, now=7200)
    assert plan.post == ["a"]


def test_a_flash_episode_is_posted_and_resolved_at_once():
    plan = plan_group([view("a", state="resolved", flash=True)], None, None, T, now=0)
    assert (plan.post, plan.resolved) == (["a"], ["a"])


# -- compact series ---------------------------------------------------------------------------

def test_series_notation():
    assert expand_series("1+1x2 _x2 Inf 3x1") == [1, 2, 3, None, None, math.inf, 3, 3]
    assert expand_series("2.1-0.01x200 9.5 2.0x50")[199:203] == [0.11, 0.1, 9.5, 2.0]
    with pytest.raises(ValueError, match="bad term"):
        expand_series("1+x3")
