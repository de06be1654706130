"""Short answers: the facts behind the questions people ask, and the two-to-four sentences
that answer each one.

The full fact sheet goes behind a "Details" button (Slack) or ``--verbose`` (CLI); what is
posted is :func:`short_answer`, a few of the sheet's own sentences chosen for the question's
intent (:mod:`bot.qa.router`), so a short answer says nothing the facts do not. The facts
built here are the ones :mod:`bot.qa.retrieve` did not have: a summary's non-finite values
and alert history, the one next step from the worst open alert, the finish time, and which
of two runs is better on a metric.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

from analyzers.fmt import fmt_duration
from bot.qa.facts import Fact, FactSheet, Source, num
from bot.qa.retrieve import (
    Context,
    _actions_near,
    _finite,
    current_attempt,
    findings,
    nonfinite_facts,
    series,
    tags,
    unalerted_moves,
)
from bot.qa.router import CAN_ANSWER
from bot.services.status import run_status

MAX_SENTENCES = 4
SEVERITY_RANK = {"critical": 0, "error": 0, "warning": 1, "info": 2}
# Metrics where a higher value is better; every other metric (losses, memory) is better lower.
HIGHER_IS_BETTER = ("accuracy", "pass_rate", "reward", "throughput", "score", "f1", "bleu",
                    "rouge", "win_rate", "exact_match")
CANT_ANSWER = "I can't answer that from the run history."


def higher_is_better(tag: str) -> bool:
    return any(word in tag for word in HIGHER_IS_BETTER)


# ---- facts for the new questions -----------------------------------------------------------
def alert_history(ctx: Context, sheet: FactSheet, run: str) -> None:
    rows = findings(ctx.store, run)
    if not rows:
        sheet.add("history", f"runwatch has raised no alert on {run}.", source=Source(run))
        return
    said = []
    for f in rows[-3:]:
        state = (f"resolved at step {f['resolved_step']}" if f["state"] == "resolved"
                 and f["resolved_step"] is not None else f["state"])
        said.append(f"{f['signal']} from step {f['onset_step']} ({f['severity']}, {state})")
        sheet.alert(run, f["signal"], f["state"], f["onset_step"], f["resolved_step"])
    count = f"{len(rows)} alerts, the latest" if len(rows) > 3 else \
        f"{len(rows)} alert{'s' if len(rows) > 1 else ''}"
    sheet.add("history", f"runwatch raised {count} on {run}: {'; '.join(said)}.",
              len(rows), *[f["onset_step"] for f in rows[-3:]],
              *[f["resolved_step"] for f in rows[-3:] if f["resolved_step"] is not None],
              source=Source(run))


def worst_open(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    firing = [r for r in rows if r["state"] == "firing"]
    if not firing:
        return None
    return min(firing, key=lambda r: (SEVERITY_RANK.get(r["severity"], 3), -r["onset_step"]))


def next_step_facts(ctx: Context, sheet: FactSheet, run: str) -> None:
    """The one next step: the first fix of the worst open alert (severity, then the latest)."""
    rows = findings(ctx.store, run)
    if ctx.alert:
        rows = [r for r in rows if r["fingerprint"] == ctx.alert] or rows
    worst = worst_open(rows)
    for signal in [s for s in ctx.entities.signals if s not in {r["signal"] for r in rows}][:1]:
        # "the overfit alert that fired last night — still open?": there was none
        sheet.add("next", f"runwatch has raised no {signal} alert on {run}.", source=Source(run))
    if worst is None:
        last = rows[-1] if rows else None
        tail = (f" The latest alert, {last['signal']} from step {last['onset_step']}, is "
                f"{last['state']}." if last else "")
        sheet.add("next", f"No alert is open on {run}, so nothing needs doing now.{tail}",
                  *([last["onset_step"]] if last else []), source=Source(run))
        unalerted_moves(ctx, sheet, run)  # unless something moved that no alert covers
        if last:
            sheet.alert(run, last["signal"], last["state"], last["onset_step"])
        if not ctx.alert:  # every alert of the run was read: none is open
            sheet.all_open(run, [])
        return
    payload = worst["payload"]
    src = Source(run, worst["onset_step"], alert=worst["fingerprint"], attempt=worst["attempt"])
    fixes = payload.get("fixes") or []
    others = len([r for r in rows if r["state"] == "firing"]) - 1
    besides = f" ({others} other open alert{'s' if others > 1 else ''})" if others else ""
    sheet.alert(run, worst["signal"], "open", worst["onset_step"])
    sheet.add("next", f"The worst open alert on {run} is {worst['signal']} "
                      f"({worst['severity']}) from step {worst['onset_step']}{besides}.",
              worst["onset_step"], others, source=src)
    if fixes:
        sheet.add("next", f"Next step: {fixes[0]['text'].rstrip('.')}.", source=src)
    for other in [r for r in rows if r["state"] == "firing" and r is not worst][:2]:
        first = (other["payload"].get("fixes") or [{}])[0].get("text")
        if first:  # "should we kill it?": the other alert may be the one that says stop
            sheet.alert(run, other["signal"], "open", other["onset_step"])
            sheet.add("next", f"The other open alert, {other['signal']} ({other['severity']}) "
                              f"from step {other['onset_step']}, says first: "
                              f"{first.rstrip('.')}.", other["onset_step"],
                      source=Source(run, other["onset_step"], alert=other["fingerprint"],
                                    attempt=other["attempt"]))
    target = payload.get("rollback_to")
    if target:
        sheet.add("next", f"If you roll back, runwatch recommends the checkpoint at step "
                          f"{target['step']}; /run rollback {run} {target['step']} asks for "
                          f"it and a person confirms.", target["step"],
                  source=Source(run, target["step"], alert=worst["fingerprint"]))
        sheet.checkpoint(run, target["step"], recommended=True)


def eta_facts(ctx: Context, sheet: FactSheet, run: str) -> None:
    if not any(f.kind == "status" and "should finish" in f.text for f in sheet.facts):
        if any(f.kind == "status" and " finished " in f" {f.text} " for f in sheet.facts):
            return
        sheet.gap(f"{run} records no total step count or no recent step rate, so its finish "
                  f"time cannot be estimated")
        return
    drops = [r for r in findings(ctx.store, run) if r["state"] == "firing"
             and r["signal"] == "throughput_drop"]
    eta = run_status(ctx.store, run, now=ctx.now).eta_seconds
    pts = _finite(series(ctx.store, run, current_attempt(ctx.store, run), "throughput"))
    if not drops or not eta or not pts:  # how much sooner without the slowdown
        return
    onset = drops[-1]["onset_step"]
    before = [v for s, v in pts if s < onset][-50:]
    now = [v for _, v in pts[-10:]]
    if not before or not now or statistics.median(now) >= statistics.median(before):
        return
    was, is_ = statistics.median(before), statistics.median(now)
    sheet.add("status", f"At the throughput before the drop at step {onset} ({num(was)} "
                        f"against {num(is_)} now) and the same tokens per step, {run} would "
                        f"finish in about {fmt_duration(eta * is_ / was)}.", onset, was, is_,
              source=Source(run, onset, alert=drops[-1]["fingerprint"]))


def better_facts(ctx: Context, sheet: FactSheet, a: str, b: str, tag: str) -> None:
    """Which of two runs is better on ``tag``, on the latest and on the best value."""
    points = {}
    for run in (a, b):
        attempt = current_attempt(ctx.store, run)
        pts = _finite(series(ctx.store, run, attempt, tag))
        if not pts:
            sheet.gap(f"{run} has no {tag} points")
            return
        points[run] = (attempt, pts)
    higher = higher_is_better(tag)
    word = "higher" if higher else "lower"

    def versus(at: dict[str, tuple[int, float]], what: str, lead: str = "") -> None:
        """"{winner} has the lower {what}: …, against … for {loser}" for one point each."""
        (sa, va), (sb, vb) = at[a], at[b]
        if va == vb:
            steps = f"step {sa}" if sa == sb else f"steps {sa} and {sb}"
            sheet.add("better", f"{lead}{a} and {b} have the same {what}: {num(va)} ({steps}).",
                      va, sa, sb, source=Source(a, sa, attempt=points[a][0]))
            return
        win, lose = (a, b) if (va > vb) == higher else (b, a)
        (sw, vw), (sl, vl) = at[win], at[lose]
        where = (f": {num(vw)}, against {num(vl)} for {lose} (both at step {sw})" if sw == sl
                 and not what.endswith(f"step {sw}") and not lead
                 else f": {num(vw)}, against {num(vl)} for {lose}" if sw == sl
                 else f": {num(vw)} at step {sw}, against {num(vl)} at step {sl} for {lose}")
        sheet.add("better", f"{lead}{win} has the {word} {what}{where}.", vw, sw, vl, sl,
                  source=Source(win, sw, attempt=points[win][0]))

    if ctx.entities.throughout:  # "better at any point, or worse the whole way?"
        along(sheet, {run: pts for run, (_, pts) in points.items()}, tag, higher)
    asked = ctx.entities.steps[0] if ctx.entities.steps else None
    short = [run for run, (_, pts) in points.items() if asked is not None
             and pts[-1][0] < asked]
    for run in short:  # "exp1 vs exp6 at step 2500" when exp1 is at step 2000
        last = points[run][1][-1][0]
        sheet.add("better", f"{run} has not reached step {asked}: its latest {tag} is at step "
                            f"{last}.", asked, last, source=Source(run, last,
                                                                   attempt=points[run][0]))
    if asked is not None and not short:  # "which has the lower eval loss at step 2000?"
        near = {run: min(pts, key=lambda p: (abs(p[0] - asked), p[0]))
                for run, (_, pts) in points.items()}
        exact = all(step == asked for step, _ in near.values())
        versus(near, f"{tag} at step {asked}" if exact else f"{tag} near step {asked}")
    latest = {run: pts[-1] for run, (_, pts) in points.items()}
    sa, sb = latest[a][0], latest[b][0]
    src = Source(a, sa, attempt=points[a][0])
    versus(latest, f"latest {tag}")
    if sa != sb:  # the latest values are at unequal progress: the last step both logged too
        common = ctx.store.last_common_point((a, points[a][0]), (b, points[b][0]), tag)
        if common is not None and math.isfinite(common[1]) and math.isfinite(common[2]) \
                and common[0] != asked:
            step = common[0]
            versus({a: (step, common[1]), b: (step, common[2])}, tag,
                   f"At step {step}, the latest step both logged, ")
    pick = max if higher else min
    best = {run: pick(pts, key=lambda p: (p[1], -p[0])) for run, (_, pts) in points.items()}
    (ba_s, ba_v), (bb_s, bb_v) = best[a], best[b]
    label = "highest" if higher else "lowest"
    sheet.add("better", f"The {label} {tag} of {a} is {num(ba_v)} at step {ba_s}; of {b}, "
                        f"{num(bb_v)} at step {bb_s}.", ba_v, ba_s, bb_v, bb_s, source=src)
    if max(sa, sb) > 1.5 * max(1, min(sa, sb)):
        sheet.add("better", f"{a} and {b} are at different steps ({sa} and {sb}), so their "
                            f"latest values are not at equal training progress.", sa, sb,
                  source=src)


def along(sheet: FactSheet, points: dict[str, list[tuple[int, float]]], tag: str,
          higher: bool) -> None:
    """At how many of the steps both runs logged ``tag`` each one was better."""
    (a, pa), (b, pb) = points.items()
    other = dict(pb)
    common = [(s, v, other[s]) for s, v in pa if s in other]
    if not common:
        sheet.add("better", f"{a} and {b} logged {tag} at no common step.", source=Source(a))
        return
    word = "higher" if higher else "lower"
    wins = {a: [s for s, x, y in common if (x > y) == higher and x != y],
            b: [s for s, x, y in common if (y > x) == higher and x != y]}
    first, last, n = common[0][0], common[-1][0], len(common)
    said = []
    for run in (a, b):
        steps = wins[run]
        if len(steps) == n:
            said.append(f"{run} is {word} at all {n}")
        elif steps:
            said.append(f"{run} is {word} at {len(steps)} (the first at step {steps[0]}, the "
                        f"last at step {steps[-1]})")
        else:
            said.append(f"{run} is {word} at none")
    sheet.add("better", f"Of the {n} steps both {a} and {b} logged {tag} (steps {first} to "
                        f"{last}), {'; '.join(said)}.", n, first, last,
              *[x for r in (a, b) for x in (len(wins[r]), *wins[r][:1], *wins[r][-1:])],
              source=Source(a, last))


def rank_facts(ctx: Context, sheet: FactSheet, tag: str, top: int = 3) -> None:
    """Every visible run on ``tag``, best first: on its best value and on its latest ("which
    run has the best eval loss?")."""
    higher = higher_is_better(tag)
    best, latest = [], []
    for run in ctx.store.run_names():
        if not ctx.visible(run):
            continue
        pts = _finite(series(ctx.store, run, current_attempt(ctx.store, run), tag))
        if pts:
            pick = max if higher else min
            best.append((run, *pick(pts, key=lambda p: (p[1], -p[0]))))
            latest.append((run, *pts[-1]))
    if not best:
        sheet.gap(f"no visible run logs {tag}")
        return
    word = "Highest" if higher else "Lowest"
    for rows, what in ((best, f"{word.lower()} {tag} each reached"), (latest, f"latest {tag}")):
        rows.sort(key=lambda r: r[2], reverse=higher)
        listed = "; ".join(f"{r} {num(v)} at step {s}" for r, s, v in rows[:top])
        sheet.add("rank", f"Ranked by the {what}, of {len(rows)} visible runs: {listed}.",
                  *[x for _, s, v in rows[:top] for x in (s, v)], len(rows),
                  source=Source(rows[0][0], rows[0][1]))
        for run, _, _ in rows[:top]:
            sheet.runs.add(run)


# ---- the short answer ----------------------------------------------------------------------
def _of(sheet: FactSheet, kind: str, contains: str = "", *, without: str = "") -> list[Fact]:
    return [f for f in sheet.facts if f.kind == kind and contains in f.text
            and not (without and without in f.text)]


def _metric_facts(sheet: FactSheet) -> list[Fact]:
    out = []
    for f in sheet.facts:
        if f.kind == "value" and not f.text.startswith("Neighbouring"):
            out.append(f)
        elif f.kind in ("min", "max", "range", "trend", "shift", "move"):
            out.append(f)
    return out


def _alert_block(sheet: FactSheet) -> list[Fact]:
    """The one alert the question is about (the worst firing, else the latest), its candidate
    causes and its first fix."""
    # the NaN asked about, or that there was none ("did it NaN too, or recover?")
    nonfinite = _of(sheet, "nonfinite")[:1] or _of(sheet, "finding", "logged no NaN")
    # an alert fact another retrieval added first keeps that one's kind ("alert")
    alerts = [f for f in sheet.facts if f.kind in ("finding", "alert")
              and f.text.startswith("Alert ")]
    if not alerts:  # no alert: the NaN itself, what the catalogue says of one, what was done
        if sheet.asked.again:
            nonfinite = _of(sheet, "nonfinite")[:2]  # "did the second attempt NaN too?"
        unalerted = [f for f in sheet.facts if f.kind in ("cause", "first_fix")
                     and f.source is not None and f.source.alert is None]
        # a move no alert covers ("why did the lr jump?"): the move, what was done there
        if sheet.asked.window_before:  # "the metrics in the 200 steps before the NaN"
            unalerted = _of(sheet, "trend", " points before step ")[:3]
        elif _of(sheet, "trend", " points before step "):  # "was grad norm climbing before?"
            unalerted = unalerted[:1] + _of(sheet, "trend", " points before step ")[:1]
        return (nonfinite + unalerted + (_of(sheet, "shift")[:1] or _of(sheet, "move")[:1])
                + _of(sheet, "setting")[:1] + _of(sheet, "action")[:1] + _of(sheet, "finding")
                + _of(sheet, "setup")[:1])
    firing = [f for f in alerts if ", firing)" in f.text]
    if sheet.asked.every_alert and len(firing) > 1:  # "what alerts are open and why each?"
        return nonfinite + firing[:MAX_SENTENCES]
    pool = firing or alerts
    alert = min(pool, key=lambda f: (min((SEVERITY_RANK[w] for w in SEVERITY_RANK
                                          if f"({w}," in f.text), default=3),
                                     -pool.index(f)))
    sig = alert.source.alert if alert.source else None
    # what the question guessed at ("was it the lr?"): the named metric before it, its setting
    guessed = _of(sheet, "trend", " points before step ")[:1] + _of(sheet, "setting")[:1]
    causes = [f for f in sheet.facts if f.kind in ("cause", "first_fix") and f.source is not None
              and f.source.alert == sig and ("Candidate causes" in f.text or f.kind == "first_fix")]
    return nonfinite + [alert] + (causes[:1] + guessed + causes[1:] if guessed else causes)


def _status_block(sheet: FactSheet, metrics: list[str]) -> list[Fact]:
    status = _of(sheet, "status")
    picked = (status[:1] + _of(sheet, "status", "records no total step count")
              + _of(sheet, "status", " is on attempt "))
    if sheet.intent == "eta":
        picked += _of(sheet, "status", "should finish") + _of(sheet, "status", "At the throughput")
    named = [f for f in status if f.text.startswith("Latest ")
             and any(f"Latest {m} of" in f.text for m in metrics)]
    if sheet.asked.health:  # "is it on track?": whether anything is open comes second
        picked[1:1] = _of(sheet, "status", "No open alerts on") + _of(sheet, "history")[:1]
    picked += named or [f for f in status if f.text.startswith("Latest train/loss of")]
    return picked + _of(sheet, "status", "Open alerts on")


def _metric_block(sheet: FactSheet) -> list[Fact]:
    facts = _metric_facts(sheet)
    if sheet.asked.event and sheet.asked.event[0] == "around":  # "did loss react to the jump?":
        facts = ([f for f in facts if f.kind == "shift"]  # how each metric moved there first
                 + [f for f in facts if f.kind != "shift"])
    if sheet.asked.latest:  # "final train and eval loss": the status may already say them
        facts = [f for m in sheet.asked.metrics for f in _of(sheet, "status", f"Latest {m} of ")
                 if f not in facts] + facts
    facts += [f for f in _of(sheet, "finding", "Alert ") if ", firing)" in f.text][:1]
    if any(f.kind == "range" for f in facts) and "trend" not in sheet.kinds:
        facts = [f for f in facts if f.kind != "trend"]  # the range says the same, and more
    return facts




def _rollback_block(sheet: FactSheet) -> list[Fact]:
    done = _of(sheet, "action", "Action ")[-1:] + _of(sheet, "action", "No rollback")
    ahead = _of(sheet, "rollback") + _of(sheet, "move")[:1]
    # "did the rollback fix it?", "who rolled it back?": what was done comes first
    if sheet.asked.past_rollback:  # what was done, and when, before where one would go now
        started = [f for f in ahead if " started at step " in f.text]
        done, ahead = done + started, [f for f in ahead if f not in started]
    first = done + ahead if sheet.asked.past_rollback else ahead + done
    return first + _of(sheet, "checkpoint")


def _changed_block(sheet: FactSheet) -> list[Fact]:
    config = _of(sheet, "config")
    missing = [f for f in config if f.text.startswith("Missing")]
    said = [f for f in config if f not in missing]
    # the run's own change events (a resume with another config) come first: they are
    # what changed, as recorded; config differences against another run follow
    asked = sheet.asked
    moved = _of(sheet, "shift")[:2] + _of(sheet, "move")[:1]
    if asked.who:  # "who changed the lr?": what the record says people did
        return (_of(sheet, "action")[-2:] + _of(sheet, "change")[:2] + moved[:1]
                + _of(sheet, "attempt")[-1:])
    if asked.attempts:  # "what changed between the attempts?", "is the retry healthier?"
        return (_of(sheet, "attempt", " started at step ")[-1:]
                + _of(sheet, "attempt", "the latest step both attempts")[:1]
                + _of(sheet, "attempt", "has not reached yet") + _of(sheet, "change")[:2]
                + _of(sheet, "action", "Action ")[-2:] + said[:1])
    if asked.steps or asked.step_range is not None:  # "what changed at step 2000?"
        return (moved + _of(sheet, "change")[:2] + _of(sheet, "alert")[:1]
                + _of(sheet, "action")[:1])
    return (_of(sheet, "setting")[:2] + _of(sheet, "setup") + _of(sheet, "change")[:2]
            + said[:3] + missing
            + _of(sheet, "attempt")[-1:] + moved)


def _compare_block(sheet: FactSheet) -> list[Fact]:
    """Each metric compared once, on its latest values; where the runs are at unequal steps and
    the last step both logged says the other run is ahead, that first (the fair comparison);
    then what differs in their setup and the alerts open on either — not only the train loss
    (a run that overfits has the lower train loss and the worse eval loss)."""
    better = _of(sheet, "better", without="at different steps")
    picked: list[Fact] = []
    picked += [f for f in better if " has not reached step " in f.text]
    for tag in dict.fromkeys(m.group(1) for f in better if (m := re.search(
            r"(?:lower|higher|same) (?:latest )?(\S+?)(?: (?:at|near) step \d+)?:", f.text))):
        picked += [f for f in better if f" {tag} at step " in f.text  # the step asked about
                   or f" {tag} near step " in f.text][:1]
        latest = [f for f in better if f" latest {tag}" in f.text][:1]
        common = [f for f in better if "the latest step both logged" in f.text
                  and f" {tag}" in f.text][:1]
        # the last step both logged comes first where the latest values point the other way,
        # where the question asks for the same step, or one run has not reached the step asked
        fair = common and latest and common[0].source and latest[0].source and (
            common[0].source.run != latest[0].source.run or sheet.asked.same_step
            or any(" has not reached step " in f.text for f in picked))
        if fair:
            picked += common if picked and not sheet.asked.same_step else common + latest
        else:
            picked += latest
    config = _of(sheet, "config")
    differ = [f for f in config if " differ between " in f.text or " have the same " in f.text]
    missing = [f for f in config if f.text.startswith("Missing")]
    alerts = [f for f in _of(sheet, "compare", "Open alerts on ") if not f.text.endswith(": none.")]
    return picked + differ[:1] + alerts[:1] + missing + alerts[1:] + [
        f for f in better if f not in picked]


def _blocks(sheet: FactSheet, metrics: list[str]) -> dict[str, list[Fact]]:
    return {
        "where": _status_block(sheet, metrics),
        "eta": _status_block(sheet, metrics),
        "summary": (_of(sheet, "status")[:1] + _of(sheet, "status", " is on attempt ")
                    # "is it NaN'ing again?": that the new attempt logged none is the answer
                    + _of(sheet, "nonfinite", without="" if sheet.asked.again else "logged no")[:2]
                    + _of(sheet, "action", "Action ")[-1:]
                    + _of(sheet, "history") + _of(sheet, "move")[:1]
                    + [f for f in _of(sheet, "status") if f.text.startswith("Latest train/loss")]
                    + _of(sheet, "status", "should finish in about")),
        # the one next step; a decision ("kill it?") weighs every open alert's first fix
        # and how much is left
        "next_step": ([f for f in _of(sheet, "next", without="If you roll back")
                       if sheet.asked.decision or not f.text.startswith("The other open")]
                      + _of(sheet, "move") + _of(sheet, "status", "should finish in about")
                      + _of(sheet, "next", "If you roll back")),
        # "at the same step": the last step both runs logged leads
        "better": sorted(_of(sheet, "better"), key=lambda f: not (
            sheet.asked.same_step and "the latest step both logged" in f.text)),
        "rank": _of(sheet, "rank"),
        "compare": _compare_block(sheet),
        "why": _alert_block(sheet),
        "changed": _changed_block(sheet),
        "rollback": _rollback_block(sheet),
        "similar": _of(sheet, "nonfinite")[:1] + [
            f for f in _of(sheet, "similar") if not f.text.startswith("Compared with")][:3]
        + _of(sheet, "move")[:1],
        "value": _metric_block(sheet),
    }


def key_facts(sheet: FactSheet, metrics: list[str] | None = None) -> list[Fact]:
    """The facts the short answer says, in order: the intent's own first, then those of the
    other things the question asked for ("is it overfitting, and where do we roll back?")."""
    blocks = _blocks(sheet, metrics or [])
    order = [sheet.intent, *sheet.also] + [{"status": "where", "min": "value", "max": "value",
                               "trend": "value"}.get(k, k) for k in sheet.kinds]
    # "roll it back now": that it acts on none first; then what the question wrongly assumes
    picked: list[Fact] = _of(sheet, "act") + _of(sheet, "premise")
    if sheet.asked.risk:  # "about to blow up?": its NaNs, grad norm and loss lately first
        picked += _of(sheet, "risk")[:3]
    if sheet.asked.pace and sheet.intent != "why":  # "still improving, or flattening?": the
        picked += _of(sheet, "pace")[:2]  # pace of each loss first (a why leads with its alert)
    for name in dict.fromkeys(order):
        extra = [f for f in blocks.get(name, []) if f not in picked]
        if (picked and name != sheet.intent) or (sheet.also and name == sheet.intent):
            extra = extra[:2]  # a question of two asks: room for the second's answer
        picked += extra
    if not picked:
        picked = sheet.facts[:2]
    said: set[str] = set()
    unique = []
    for fact in picked:  # "2 setting(s) differ … (its baseline)" and "… (compared)"
        gist = re.sub(r"\s*\([^)]*\)", "", fact.text)
        if gist not in said:
            said.add(gist)
            unique.append(fact)
    return unique[:MAX_SENTENCES]


def gap_line(sheet: FactSheet, said: str = "") -> str:
    """What the record lacks, less what ``said`` already states word for word ("" if nothing)."""
    gaps = [g for g in sheet.gaps if g.lower().rstrip(".") not in said.lower()]
    return "The run history does not show this: " + "; ".join(gaps) + "." if gaps else ""


def cant_answer_line() -> str:
    return f"{CANT_ANSWER} I can answer: {CAN_ANSWER}."


def short_answer(sheet: FactSheet, metrics: list[str] | None = None) -> str:
    """Two to four sentences from the facts, then what the record lacks."""
    if sheet.intent == "unknown":
        return " ".join([gap_line(sheet)] * bool(sheet.gaps) + [cant_answer_line()])
    lines = [f.text for f in key_facts(sheet, metrics)]
    if sheet.gaps:
        lines.append(gap_line(sheet))
    return " ".join(lines)


def short_sources(sheet: FactSheet, metrics: list[str] | None = None) -> list[str]:
    """The sources of the facts the short answer says (all of them when it says none)."""
    seen: dict[str, None] = {}
    for fact in key_facts(sheet, metrics) if sheet.intent != "unknown" else []:
        if fact.source is not None:
            seen.setdefault(fact.source.label(), None)
    return list(seen) or sheet.sources()[:1]


def gather_more(ctx: Context, sheet: FactSheet) -> None:
    """The facts of the questions :func:`bot.qa.retrieve.gather` does not cover."""
    from bot.qa.retrieve import DEFAULT_TAGS, baseline_of

    run, kinds = ctx.run, sheet.kinds
    if "summary" in kinds:
        nonfinite_facts(ctx, sheet, run)
        _actions_near(ctx, sheet, run, None)  # a rollback is part of what happened
        alert_history(ctx, sheet, run)
        unalerted_moves(ctx, sheet, run)
    if "next" in kinds:
        next_step_facts(ctx, sheet, run)
    if "eta" in kinds:
        eta_facts(ctx, sheet, run)
    if "rank" in kinds:
        for tag in (ctx.entities.metrics or ["eval/loss"])[:2]:
            rank_facts(ctx, sheet, tag)
    if "compare" in kinds or "better" in kinds:
        others = [r for r in ctx.entities.runs if r != run]
        other = others[0] if others else baseline_of(ctx, run)
        if other is None:
            if "better" in kinds:
                sheet.gap(f"the question names no second run to compare {run} with")
            return
        sheet.runs.add(other)
        both = [t for t in DEFAULT_TAGS if t in tags(ctx.store, run) and t in tags(ctx.store,
                                                                                other)]
        # "did doubling the lr buy us anything?": the lr is what was changed, the loss the gain
        asked = [m for m in ctx.entities.metrics if not (m == "lr" and ctx.entities.outcome)]
        # "compare X with Y": the train loss and the eval loss (an overfit run wins on one only)
        wanted = asked or (both[::-1] if ctx.entities.outcome else both[:2] if sheet.intent
                           == "compare" else both[:1]) or ["train/loss"]
        for tag in wanted[:2]:
            better_facts(ctx, sheet, run, other, tag)
