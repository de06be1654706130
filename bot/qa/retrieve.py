"""Fact retrieval: for each kind of question, the statements the store supports.

Everything here reads the store and nothing else; it never writes and never imports action
code. Runs outside ``visible`` are never read, named or counted.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

from analyzers.catalog import CATALOG
from analyzers.finding import TROUBLE_KINDS
from analyzers.fmt import fmt_duration
from analyzers.stats.metric import has_direction, higher_is_better
from bot.qa.entities import Entities
from bot.qa.facts import FactSheet, Source, num, pct
from bot.qa.grounding import numbers_in
from bot.services.changes import SUITES, run_changes
from bot.services.status import run_status
from bot.store import Store
from connectors.training.versions import flatten

# Likely causes per signal, from SIGNALS.md (the catalog holds the fixes).
CAUSES: dict[str, str] = {
    "plateau": "learning rate too high (oscillates) or too low (crawls); data problems (label "
               "noise, truncated text, mixed formats, duplicates); task/model mismatch",
    "spike": "learning rate too high; precision too aggressive (fp16 overflow); an abnormal or "
             "over-long sample in the batch",
    "overfit": "small data or too many epochs; data leakage (train holds near-duplicates of "
               "eval); train and eval processed differently",
    "forgetting": "capacity given to the new data; too many epochs; learning rate too high",
    "business_flat": "the optimisation target is not the business goal",
    "diminishing_returns": "the run has converged",
    "grad_norm": "a bad batch; learning rate too high",
    "throughput_drop": "a data-loading bottleneck (disk IO, too few preprocessing workers) or "
                       "a slow node",
    "lr_schedule": "the scheduler is misconfigured",
    "oscillation": "learning rate too high for this phase",
    "memory": "sequence too long or batch too big",
    "stalled": "a crash, pre-emption or hang",
    "checkpoint_gap": "checkpointing is misconfigured",
    "repetition": "SFT overfitting; templated data",
    "role_confusion": "too few multi-turn samples; wrong special tokens",
    "over_refusal": "preference data imbalance; KL coefficient wrong",
    "reward_hacking": "KL coefficient too small",
    "divergence": "learning rate too high; precision too aggressive (fp16 overflow); a run of "
                  "bad or over-long batches",
    "reward_collapse": "the policy drifted too far from the reference (KL coefficient too "
                       "small, learning rate too high); a collapsing actor or critic loss",
}
DEFAULT_TAGS = ("train/loss", "eval/loss")
MAX_CONFIG_ITEMS = 8
MAX_TEXT = 160  # characters of any value copied from a log or config into a fact
TREND_FLAT_PERCENT = 1.0
SPEED_SIGNALS = ("throughput_drop",)  # what a setting would show from the first step
PACE_WINDOW = 500  # steps: "is it flattening?" compares the last window with the one before
# What a run records about how it was set up, compared field by field (metadata key, words).
RECORDED = (("config", "config"), ("data_version", "data version"),
            ("environment", "environment"), ("datasets", "datasets"))


def quote(value: Any) -> str:
    """A value from a log, config or run name as inert, bounded text."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = " ".join(text.split())
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "…"
    return f'"{text}"' if isinstance(value, str) else text


@dataclass
class Context:
    store: Store
    run: str
    entities: Entities
    now: float
    visible: Callable[[str], bool]
    alert: str | None = None  # the fingerprint of the alert whose thread asks
    similar: Callable[[Context, FactSheet], None] | None = None


# ---- reading the store ---------------------------------------------------------------------
def attempts(store: Store, run: str) -> list[dict[str, Any]]:
    return store.attempt_spans(run)


def series(store: Store, run: str, attempt: int, tag: str) -> list[tuple[int, float]]:
    return store.series(run, attempt, tag)


def tags(store: Store, run: str) -> list[str]:
    return store.tag_names(run)


def current_attempt(store: Store, run: str) -> int:
    info = store.run(run)
    return info["attempt"] if info else 1


def attempt_for_step(store: Store, run: str, step: int) -> int:
    """The current attempt when it holds ``step``, else the latest attempt that does."""
    rows = attempts(store, run)
    current = current_attempt(store, run)
    for row in sorted(rows, key=lambda r: (r["attempt"] != current, -r["attempt"])):
        if row["first"] <= step <= row["last"]:
            return row["attempt"]
    return current


def step_at_time(store: Store, run: str, attempt: int, wall: float) -> int | None:
    return store.step_at_time(run, attempt, wall)


def run_meta(store: Store, run: str) -> dict[str, Any]:
    info = store.run(run) or {}
    meta = json.loads(info.get("meta") or "{}")
    if info.get("config"):
        meta["config"] = json.loads(info["config"])
    return meta


def findings(store: Store, run: str) -> list[dict[str, Any]]:
    rows = store.findings(run=run)
    for row in rows:
        row["payload"] = json.loads(row["data"] or "{}")
    return rows


def actions(store: Store, run: str) -> list[dict[str, Any]]:
    return store.run_actions(run)


# ---- windows -------------------------------------------------------------------------------
def window(ctx: Context, run: str, attempt: int) -> tuple[int | None, int | None, str]:
    """The step window the question names, as (first, last, words for it)."""
    ents = ctx.entities
    if ents.step_range is not None:
        lo, hi = ents.step_range
        words = (f"between steps {lo} and {hi}" if lo is not None and hi is not None
                 else f"after step {lo}" if lo is not None else f"up to step {hi}")
        return lo, hi, words
    if ents.since is not None:
        lo = step_at_time(ctx.store, run, attempt, ents.since)
        hi = step_at_time(ctx.store, run, attempt, ents.until) if ents.until else None
        if lo is None:
            return None, None, "in the time asked about"
        return lo, hi, f"in the time asked about (from step {lo})"
    if ents.after_rollback and attempt > 1:
        first = next((a["first"] for a in attempts(ctx.store, run) if a["attempt"] == attempt),
                     None)
        return first, None, f"since the rollback (attempt {attempt}, from step {first})"
    return None, None, ""


def _within(points: list[tuple[int, float]], lo: int | None,
            hi: int | None) -> list[tuple[int, float]]:
    return [(s, v) for s, v in points if (lo is None or s >= lo) and (hi is None or s <= hi)]


def _finite(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(s, v) for s, v in points if math.isfinite(v)]


# ---- status --------------------------------------------------------------------------------
def status_facts(ctx: Context, sheet: FactSheet, run: str) -> None:
    st = run_status(ctx.store, run, now=ctx.now)
    src = Source(run, st.step, attempt=st.attempt)
    if st.step is None:
        sheet.add("status", f"{run} has no metric points yet.", source=Source(run))
        return
    total = f" of {st.total_steps}" if st.total_steps else ""
    progress = f" ({st.progress * 100:.0f}% done)" if st.progress is not None else ""
    sheet.add("status", f"{run} is {st.state} at step {st.step}{total}{progress}.",
              st.step, st.total_steps or math.nan,
              st.progress * 100 if st.progress is not None else math.nan, source=src)
    if not st.total_steps and st.state != "finished":
        sheet.add("status", f"{run} records no total step count, so how far along it is "
                            f"cannot be given as a share.", source=src)
    if st.attempt > 1:
        first = next((a["first"] for a in attempts(ctx.store, run)
                      if a["attempt"] == st.attempt), None)
        since = (f"; it started at step {first}, {st.step - first} steps ago" if first is not None
                 else "")
        sheet.add("status", f"{run} is on attempt {st.attempt} (it was rolled back or "
                            f"restarted {st.attempt - 1} time(s)){since}.", st.attempt,
                  st.attempt - 1, *([first, st.step - first] if first is not None else []),
                  source=src)
    if st.eta_seconds is not None:
        sheet.add("status", f"{run} should finish in about {fmt_duration(st.eta_seconds)}.",
                  source=src)
    if st.seconds_since_last_point is not None:
        since = fmt_duration(st.seconds_since_last_point)
        sheet.add("status", f"{run}'s last point arrived {since} ago.", source=src)
    for tag, (step, value) in st.latest.items():
        sheet.add("status", f"Latest {tag} of {run}: {num(value)} at step {step}.", value, step,
                  source=Source(run, step, attempt=st.attempt))
    if st.last_checkpoint:
        cp = st.last_checkpoint
        sheet.add("status", f"Latest checkpoint of {run}: step {cp['step']} ({cp['path']}).",
                  cp["step"], source=Source(run, cp["step"]))
        sheet.checkpoint(run, cp["step"])
    else:
        sheet.add("status", f"{run} has no recorded checkpoint.", source=Source(run))
    if st.open_alerts:
        names = ", ".join(f"{a['signal']} (from step {a['onset_step']})" for a in st.open_alerts)
        sheet.add("status", f"Open alerts on {run}: {names}.",
                  *[a["onset_step"] for a in st.open_alerts], source=Source(run))
    else:
        sheet.add("status", f"No open alerts on {run}.", source=Source(run))
    sheet.all_open(run, [a["signal"] for a in st.open_alerts])
    for a in st.open_alerts:
        sheet.alert(run, a["signal"], "open", a["onset_step"])


# ---- metric values -------------------------------------------------------------------------
def metric_facts(ctx: Context, sheet: FactSheet, run: str, tag: str) -> None:
    ents = ctx.entities
    kinds = set(sheet.kinds)
    anchor = ents.steps[0] if ents.steps else next(
        (s for s in (ents.step_range or ()) if s is not None), None)
    attempt = (attempt_for_step(ctx.store, run, anchor) if anchor is not None
               else current_attempt(ctx.store, run))
    points = series(ctx.store, run, attempt, tag)
    if not points:
        sheet.gap(f"{run} has no {tag} points" + (f" in attempt {attempt}" if attempt > 1
                                                  else ""))
        return
    lo, hi, words = window(ctx, run, attempt)
    if ents.last_steps and lo is None and hi is None:  # "over the last 500 steps"
        lo = max(points[0][0], points[-1][0] - ents.last_steps)
        words = f"over the last {ents.last_steps} steps (from step {lo})"
    if ents.after_rollback and current_attempt(ctx.store, run) <= 1:
        sheet.gap(f"{run} has not been rolled back (it is on its first attempt)")
    if ents.at_checkpoint and ents.at_checkpoint[1] in ents.steps and not any(
            f.text.startswith(f"The {ents.at_checkpoint[0]} checkpoint of") for f in sheet.facts):
        which, step, path = ents.at_checkpoint
        by = f" (by {tag})" if which == "best" else ""
        sheet.add("value", f"The {which} checkpoint of {run}{by} is at step {step} ({path}).",
                  step, source=Source(run, step))
    for step in ents.steps:
        value_at(sheet, run, attempt, tag, points, step)
        earlier(ctx, sheet, run, attempt, tag, step)
    cur = current_attempt(ctx.store, run)
    now = _finite(points if attempt == cur else series(ctx.store, run, cur, tag))
    if ents.latest and lo is None and hi is None and now:  # "final eval loss?", "lr now?"
        step, value = now[-1]
        sheet.add("value", f"Latest {tag} of {run}: {num(value)} at step {step}.", value, step,
                  source=Source(run, step, attempt=cur))
        if ents.previous and len(now) > 1:  # "… vs the one before it"
            (was_step, was), change = now[-2], pct(now[-2][1], value)
            moved = f" ({change:+.1f}% since)" if change is not None else ""
            sheet.add("value", f"The {tag} of {run} before that: {num(was)} at step "
                               f"{was_step}{moved}.", was, was_step,
                      *([change] if change is not None else []),
                      source=Source(run, was_step, attempt=cur))
    scoped = _finite(_within(points, lo, hi))
    if (lo is not None or hi is not None) and not scoped:
        sheet.gap(f"{run} has no {tag} points {words}")
        return
    if "min" in kinds:
        extreme(sheet, run, attempt, tag, scoped or _finite(points), "lowest", words,
                ents.since_extreme)
    if "max" in kinds:
        extreme(sheet, run, attempt, tag, scoped or _finite(points), "highest", words,
                ents.since_extreme)
    if lo is not None or hi is not None:
        range_stats(sheet, run, attempt, tag, scoped, words)
        for a, b in ents.more_ranges:  # "avg throughput over 500-1000 vs 1500-2000"
            other = _finite(_within(points, a, b))
            if not other:
                sheet.gap(f"{run} has no {tag} points between steps {a} and {b}")
                continue
            range_stats(sheet, run, attempt, tag, other, f"between steps {a} and {b}")
            means(sheet, run, attempt, tag, (words, scoped), (f"between steps {a} and {b}", other))
    if ents.moved and ents.steps:  # "why did the lr jump at 2k?": what moved there (for "right
        # before the spike", the step of the spike, not the point before it)
        shifts(ctx, sheet, run, attempt, ents.event_step or ents.steps[0])
    elif ents.moved and not any(f.kind == "move" for f in sheet.facts):
        # "exp1's lr right after it tripled?": the biggest move of the metric, or none
        if not unalerted_moves(ctx, sheet, run, only=[tag], covered_too=True):
            sheet.add("move", f"{tag} of {run} moved by less than {UNALERTED_MOVE:.0f}% at every "
                              f"step after its first tenth (mean of 5 points before against "
                              f"5 after).", UNALERTED_MOVE, source=Source(run))
    for f in findings(ctx.store, run):  # "is throughput fine now?": its open alert says
        if f["state"] == "firing" and f.get("metric") == tag:
            finding_fact(sheet, f, "finding")
    if attempt != cur and (ents.after_rollback or ents.latest) and now:
        # a step before the rollback, and how it goes now: the trend is the current attempt's
        lo, hi, words = window(ctx, run, cur)
        trend(sheet, run, cur, tag, _finite(_within(now, lo, hi)) or now, words)
    elif "trend" in kinds or (lo is None and hi is None and not ents.steps
                              and not {"min", "max"} & kinds):
        trend(sheet, run, attempt, tag, scoped or _finite(points), words)


def value_at(sheet: FactSheet, run: str, attempt: int, tag: str,
             points: list[tuple[int, float]], step: int) -> None:
    index = min(range(len(points)), key=lambda i: (abs(points[i][0] - step), points[i][0]))
    at, value = points[index]
    src = Source(run, at, attempt=attempt)
    if at == step:
        sheet.add("value", f"{tag} of {run} at step {step}: {num(value)}.", value, step,
                  source=src)
    else:
        sheet.add("value", f"{run} logged no {tag} at step {step}; the nearest point is step "
                           f"{at}: {num(value)}.", step, at, value, source=src)
    neighbours = []
    if index > 0:
        neighbours.append(points[index - 1])
    if index + 1 < len(points):
        neighbours.append(points[index + 1])
    if neighbours:
        text = "; ".join(f"step {s}: {num(v)}" for s, v in neighbours)
        sheet.add("value", f"Neighbouring {tag} points of {run}: {text}.",
                  *[x for s, v in neighbours for x in (s, v)], source=src)


def earlier(ctx: Context, sheet: FactSheet, run: str, attempt: int, tag: str,
            step: int) -> None:
    """The same step in the attempts before a rollback, which logged it too."""
    for row in attempts(ctx.store, run):
        if row["attempt"] != attempt and row["first"] <= step <= row["last"]:
            value = ctx.store.value_at(run, row["attempt"], tag, step)
            if value is not None:
                sheet.add("value", f"In attempt {row['attempt']} of {run} (before it was rolled "
                                   f"back), {tag} at step {step} was {num(value)}.",
                          row["attempt"], step, value,
                          source=Source(run, step, attempt=row["attempt"]))


def extreme(sheet: FactSheet, run: str, attempt: int, tag: str,
            points: list[tuple[int, float]], which: str, words: str, since: bool = False) -> None:
    if not points:
        sheet.gap(f"{run} has no finite {tag} values")
        return
    pick = min if which == "lowest" else max
    step, value = pick(points, key=lambda p: (p[1], p[0]))
    scope = f" {words}" if words else ""
    kind = "min" if which == "lowest" else "max"
    sheet.add(kind, f"The {which} {tag} of {run}{scope} is {num(value)}, at step {step}.",
              value, step, source=Source(run, step, attempt=attempt))
    if since:  # "how much has it gone up since the min?": the latest against it
        last_step, last = points[-1]
        if last_step > step and last != value:
            change = pct(value, last)
            rel = f" ({change:+.1f}%)" if change is not None else ""
            sheet.add(kind, f"Since its {which} value at step {step}, {tag} of {run} has moved "
                            f"{last - value:+.4g}{rel}, to {num(last)} at step {last_step}.",
                      step, last - value, *([change] if change is not None else []), last,
                      last_step, source=Source(run, last_step, attempt=attempt))


def range_stats(sheet: FactSheet, run: str, attempt: int, tag: str,
                points: list[tuple[int, float]], words: str) -> None:
    (s0, v0), (s1, v1) = points[0], points[-1]
    lo_step, lo_val = min(points, key=lambda p: (p[1], p[0]))
    hi_step, hi_val = max(points, key=lambda p: (p[1], p[0]))
    mean = sum(v for _, v in points) / len(points)
    sheet.add("range", f"{tag} of {run} {words}: {num(v0)} at step {s0} → {num(v1)} at step "
                       f"{s1}; lowest {num(lo_val)} at step {lo_step}, highest {num(hi_val)} at "
                       f"step {hi_step}, mean {num(mean)} over {len(points)} points.",
              v0, s0, v1, s1, lo_val, lo_step, hi_val, hi_step, mean, len(points),
              source=Source(run, s1, attempt=attempt))


def means(sheet: FactSheet, run: str, attempt: int, tag: str,
          first: tuple[str, list[tuple[int, float]]],
          second: tuple[str, list[tuple[int, float]]]) -> None:
    """The means of two windows, which is lower and by how much."""
    (w1, p1), (w2, p2) = first, second
    m1, m2 = (sum(v for _, v in p) / len(p) for p in (p1, p2))
    change = pct(m1, m2)
    if change is None:
        return
    how = ("the same" if abs(change) < 0.05 else
           f"{'lower' if m2 < m1 else 'higher'} ({change:+.1f}%)")
    sheet.add("range", f"The mean {tag} of {run} {w2} ({num(m2)}) is {how} than {w1} "
                       f"({num(m1)}).", m2, m1, change, *_window_steps(w1, w2),
              source=Source(run, p2[-1][0], attempt=attempt))


def _window_steps(*words: str) -> list[float]:
    return [float(n) for w in words for n in re.findall(r"\d+", w)]


def trend(sheet: FactSheet, run: str, attempt: int, tag: str,
          points: list[tuple[int, float]], words: str) -> None:
    if len(points) < 2:
        if points:
            step, value = points[0]
            sheet.add("trend", f"{run} has a single {tag} point: {num(value)} at step {step}.",
                      value, step, source=Source(run, step, attempt=attempt))
        return
    if not words:  # the recent part of the run: last fifth, at least 10 points
        points = points[-max(10, len(points) // 5):]
    (s0, v0), (s1, v1) = points[0], points[-1]
    half = len(points) // 2
    early = sum(v for _, v in points[:half]) / half
    late = sum(v for _, v in points[half:]) / (len(points) - half)
    change = pct(early, late)
    if change is None or abs(change) < TREND_FLAT_PERCENT / 4:
        direction = "flat"
    else:  # a late loss that still falls 0.9% is falling slowly, not flat (set c, C55)
        direction = ("falling" if change < 0 else "rising") + (
            " slowly" if abs(change) < TREND_FLAT_PERCENT else "")
    change_text = f" ({change:+.1f}% between the halves' means)" if change is not None else ""
    scope = words or f"from step {s0} to step {s1}"
    sheet.add("trend", f"{tag} of {run} is {direction} {scope}: {num(v0)} at step {s0} → "
                       f"{num(v1)} at step {s1}{change_text}.",
              v0, s0, v1, s1, change if change is not None else math.nan,
              source=Source(run, s1, attempt=attempt))


def pace(sheet: FactSheet, run: str, attempt: int, tag: str,
         points: list[tuple[int, float]]) -> None:
    """How far ``tag`` moved over the last window against the window before it ("is it still
    improving or flattening out?", "diminishing returns yet?"): each end is the median of the
    points in the tenth of a window up to it, so one noisy point does not decide."""
    pts = _finite(points)
    if len(pts) < 6 or not has_direction(tag):  # grad norm, lr: no better way to move
        return
    last = pts[-1][0]
    width = min(PACE_WINDOW, (last - pts[0][0]) // 2)
    if width <= 0:
        return
    reach = max(width // 10, 1)

    def level(step: int) -> float | None:
        near = [v for s, v in pts if step - reach <= s <= step]
        return statistics.median(near) if near else None

    b0, b1 = last - 2 * width, last - width
    ends = level(b0), level(b1), level(last)
    if None in ends:
        return
    v0, v1, v2 = ends
    before, lately = v1 - v0, v2 - v1
    better = (lambda d: d > 0) if higher_is_better(tag) else (lambda d: d < 0)
    noise = 0.001 * max(abs(v1), 1e-12)  # a move under 0.1% of the level is no move
    if abs(lately) <= noise:
        verdict = "it has flattened out (no move beyond 0.1% of its level)"
    elif not better(lately):
        verdict = "it is getting worse, not better"
    elif not better(before) or abs(before) <= noise:
        verdict = "it is improving faster than in the window before"
    else:
        ratio = lately / before
        verdict = (f"the improvement has slowed to {ratio:.0%} of the pace before: it is "
                   f"flattening" if ratio < 0.5 else
                   f"it is still improving at {ratio:.0%} of the pace before")
    sheet.add("pace", f"{tag} of {run} moved {lately:+.3g} over the last {width} steps (about "
                      f"{num(v1)} around step {b1} → {num(v2)} at step {last}), against "
                      f"{before:+.3g} over the {width} before (from about {num(v0)} around step "
                      f"{b0}): {verdict}.", lately, width, v1, b1, v2, last, before, v0, b0,
              source=Source(run, last, attempt=attempt))


# ---- what changed --------------------------------------------------------------------------
def config_diff(ctx: Context, sheet: FactSheet, run: str, other: str, why: str) -> int:
    """Config, data version and environment of ``run`` against ``other``; returns the count
    of differing settings. What either run does not record is said to be missing: two runs
    with nothing recorded are not "the same"."""
    mine, theirs = run_meta(ctx.store, run), run_meta(ctx.store, other)
    src = Source(run)
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    present, missing = [], []
    for part, words in RECORDED:
        has_a, has_b = bool(mine.get(part)), bool(theirs.get(part))
        if part == "datasets" and not (has_a or has_b):
            continue  # an optional detail few runs record: its absence says nothing
        if not (has_a and has_b):
            lacking = [r for r, has in ((run, has_a), (other, has_b)) if not has]
            missing.append(f"{' and '.join(lacking)} record{'s' if len(lacking) == 1 else ''}"
                           f" no {words}")
            sheet.recorded.setdefault(words, set()).add("missing")
            continue
        present.append(words)
        if part == "config":
            a.update({f"config.{k}": v for k, v in flatten(mine[part]).items()})
            b.update({f"config.{k}": v for k, v in flatten(theirs[part]).items()})
        else:
            a[part], b[part] = mine[part], theirs[part]
    if missing:
        sheet.add("config", f"Missing, so not compared: {'; '.join(missing)}.", source=src)
    differing = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    for part, words in RECORDED:  # what the claim check holds a sentence about them to
        if words in present:
            sheet.recorded.setdefault(words, set()).add("different" if any(
                k == part or k.startswith(f"{part}.") for k in differing) else "same")
    if not present:
        return 0
    if not differing:
        both = ", ".join(present[:-1]) + (" and " if len(present) > 1 else "") + present[-1]
        sheet.add("config", f"{run} and {other} ({why}) have the same {both}.", source=src)
        return 0
    count = len(differing)
    advice = (" More than one setting differs, so the comparison does not isolate one change."
              if count > 1 else "")
    names = differing[:MAX_CONFIG_ITEMS]
    listed = ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1]
    sheet.add("config", f"{count} setting(s) differ between {run} and {other} ({why}): {listed}"
                        f"{' and more' if count > len(names) else ''}.{advice}",
              count, source=src)
    for key in differing[:MAX_CONFIG_ITEMS]:
        sheet.add("config", f"{key}: {quote(a.get(key))} in {run}, {quote(b.get(key))} in "
                            f"{other}.", *_numbers(a.get(key), b.get(key)), source=src)
    if count > MAX_CONFIG_ITEMS:
        sheet.add("config", f"{count - MAX_CONFIG_ITEMS} more differing setting(s) not listed.",
                  count - MAX_CONFIG_ITEMS, source=src)
    return count


def _numbers(*values: Any) -> list[float]:
    return [float(v) for v in values
            if isinstance(v, (int, float)) and not isinstance(v, bool)]


def baseline_of(ctx: Context, run: str) -> str | None:
    return baseline(ctx.store, run, ctx.visible)


def baseline(store: Store, run: str, visible: Callable[[str], bool]) -> str | None:
    """The visible baseline run ``run`` records, if any."""
    base = run_meta(store, run).get("baseline")
    if isinstance(base, str) and base != run and visible(base) and store.run(base):
        return base
    return None


def baseline_for(store: Store, run: str, visible: Callable[[str], bool]) -> list[str]:
    """The visible runs that record ``run`` as their baseline (``run`` is "the baseline")."""
    return [r for r in store.run_names() if r != run and visible(r)
            and run_meta(store, r).get("baseline") == run]


def act_fact(ctx: Context, sheet: FactSheet, run: str) -> None:
    """What a request to act gets: runwatch acts on no question; the commands that ask."""
    sheet.add("act", f"runwatch takes no action from a question: /run rollback {run} STEP asks "
                     f"for a rollback and /run stop {run} for a stop, and a person confirms "
                     f"each.", source=Source(run))


def setting_facts(ctx: Context, sheet: FactSheet, run: str,
                  named: list[str] | None = None) -> None:
    """The config settings a question names ("is it the 2 workers?"), as the run records them,
    against its baseline's where that records them too."""
    named = ctx.entities.settings if named is None else named
    words = [w.replace(" ", "_") for w in named]
    mine = flatten(run_meta(ctx.store, run).get("config") or {})
    others = [r for r in ctx.entities.runs if r != run]
    base = others[0] if others else baseline_of(ctx, run)
    what = base if others else f"{base} (its baseline)"
    theirs = flatten(run_meta(ctx.store, base).get("config") or {}) if base else {}
    for key in [k for k in mine if any(w in k.lower().replace(" ", "_") for w in words)][:2]:
        other = (f"; {what} records {quote(theirs[key])}" if key in theirs
                 else f"; {what} does not record it" if base else "")
        sheet.add("setting", f"{run} is set up with {key} {quote(mine[key])}{other}.",
                  *_numbers(mine[key], *([theirs[key]] if key in theirs else [])),
                  source=Source(run))
        setting_before_onset(ctx, sheet, run, key, mine[key])
    if words and not any(f.kind == "setting" for f in sheet.facts):
        what = " or ".join(named)
        sheet.add("setting", f"{run}'s config records no setting for {what}." if mine else
                  f"{run} records no config, so no {what} setting either.", source=Source(run))


def setting_before_onset(ctx: Context, sheet: FactSheet, run: str, key: str, value: Any) -> None:
    """"Is it because of the 2 workers?": a setting no change event touched was the same
    before a slow-down began as after it, so it alone does not explain a drop at that step. Only
    for speed, which a setting sets from the first step; not for a loss (more epochs overfit
    late, a high lr can spike late)."""
    if any(key in c.changed or f"config.{key}" in c.changed for c in run_changes(ctx.store, run)):
        return
    rows = [f for f in findings(ctx.store, run) if f["signal"] in SPEED_SIGNALS]
    firing = [f for f in rows if f["state"] == "firing"]
    alert = (firing or rows)[-1:]
    if not alert:
        return
    f = alert[0]
    spans = attempts(ctx.store, run)
    first = next((a["first"] for a in spans if a["attempt"] == f["attempt"]), None)
    if first is None or f["onset_step"] - first < 100:
        return
    sheet.add("setting", f"{key} was {quote(value)} for all of {run} (no change to it recorded), "
                         f"before the {f['signal']} alert's onset at step {f['onset_step']} as "
                         f"after it: the setting alone does not explain a change at step "
                         f"{f['onset_step']}.", *_numbers(value), f["onset_step"],
              source=Source(run, f["onset_step"], alert=f["fingerprint"]))


def setup_facts(ctx: Context, sheet: FactSheet, run: str) -> None:
    """What ``run`` records of how it was set up ("which data version is exp7 on?")."""
    meta = run_meta(ctx.store, run)
    lacking = []
    for part, words in RECORDED:
        value = meta.get(part)
        if not value:
            if part != "datasets":
                lacking.append(words)
            continue
        if isinstance(value, dict):
            items = sorted(flatten(value).items())
            listed = ", ".join(f"{k} {quote(v)}" for k, v in items[:MAX_CONFIG_ITEMS])
            more = f" and {len(items) - MAX_CONFIG_ITEMS} more" if len(items) > \
                MAX_CONFIG_ITEMS else ""
            sheet.add("setup", f"The {words} of {run}: {listed}{more}.",
                      *_numbers(*[v for _, v in items[:MAX_CONFIG_ITEMS]]), source=Source(run))
        else:
            sheet.add("setup", f"The {words} of {run}: {quote(value)}.", *_numbers(value),
                      source=Source(run))
    if lacking:
        sheet.add("setup", f"{run} records no {', no '.join(lacking)}.", source=Source(run))
        for words in lacking:
            sheet.recorded.setdefault(words, set()).add("missing")


def changed_facts(ctx: Context, sheet: FactSheet, run: str) -> None:
    ents = ctx.entities
    others = [r for r in ents.runs if r != run]
    differ = ents.differ  # "how does it differ?", not "which config?"
    base = others[0] if others else baseline_of(ctx, run)
    if ents.setup and not others and (not differ or base is None):
        setup_facts(ctx, sheet, run)  # with no baseline: at least what the run records
    if base is not None:
        config_diff(ctx, sheet, run, base, "named in the question" if others else "its baseline")
    elif not (ents.steps or ents.step_range is not None or ents.since is not None) and (
            differ or not ents.setup):
        sheet.gap(f"{run} names no baseline run to compare its config with")
    history = attempts(ctx.store, run)
    if len(history) > 1:  # what people did between the attempts (a rollback, its options)
        for row in actions(ctx.store, run)[-2:]:
            action_fact(sheet, run, row)
    for prev, cur in zip(history, history[1:], strict=False):
        sheet.add("attempt", f"Attempt {cur['attempt']} of {run} started at step {cur['first']} "
                             f"after attempt {prev['attempt']} had reached step {prev['last']}.",
                  cur["attempt"], cur["first"], prev["attempt"], prev["last"],
                  source=Source(run, cur["first"], attempt=cur["attempt"]))
    if ents.attempts and len(history) > 1:  # "is the retry healthier than the first try?"
        attempts_compared(ctx, sheet, run, history[-2], history[-1])
    change_event_facts(ctx, sheet, run)
    if ents.who and not any(f.kind == "change" for f in sheet.facts):
        sheet.add("change", f"{run} recorded no change to its config during the run.",
                  source=Source(run))
    if not ents.steps and (ents.step_range is not None or ents.since is not None):
        attempt = current_attempt(ctx.store, run)
        lo, hi, words = window(ctx, run, attempt)
        if lo is None and hi is None:
            sheet.gap(f"{run} logged nothing {words}")
            return
        step = window_shifts(ctx, sheet, run, attempt, lo, hi, words)
        _alerts_near(ctx, sheet, run, step)
        _actions_near(ctx, sheet, run, step)
        return
    step = ents.steps[0] if ents.steps else None
    if step is None:
        step = _latest_onset(ctx, run)
    if step is None:  # no alert to anchor on: what moved with none, and what was done
        unalerted_moves(ctx, sheet, run)
        _actions_near(ctx, sheet, run, None)
        return
    attempt = attempt_for_step(ctx.store, run, step)
    shifts(ctx, sheet, run, attempt, step)
    _alerts_near(ctx, sheet, run, step)
    _actions_near(ctx, sheet, run, step)


def attempts_compared(ctx: Context, sheet: FactSheet, run: str, prev: dict[str, Any],
                      cur: dict[str, Any]) -> None:
    """Two attempts of a run at the latest step both logged, on the metrics asked ("what lr is
    attempt 2 on vs attempt 1?") or else the losses."""
    for tag in ctx.entities.metrics or DEFAULT_TAGS:
        mine = dict(_finite(series(ctx.store, run, cur["attempt"], tag)))
        theirs = dict(_finite(series(ctx.store, run, prev["attempt"], tag)))
        common = sorted(set(mine) & set(theirs))
        if not common:
            continue
        step = common[-1]
        a, b = mine[step], theirs[step]
        word = "lower" if a < b else "higher" if a > b else "the same"
        sheet.add("attempt", f"At step {step}, the latest step both attempts of {run} logged, "
                             f"{tag} was {num(a)} in attempt {cur['attempt']} against {num(b)} "
                             f"in attempt {prev['attempt']} ({word} in attempt {cur['attempt']}).",
                  step, a, b, cur["attempt"], prev["attempt"],
                  source=Source(run, step, attempt=cur["attempt"]))
    bad = [r for r in ctx.store.nonfinite_points(run) if r["attempt"] == prev["attempt"]]
    if bad and bad[0]["step"] > cur["last"]:
        sheet.add("attempt", f"Attempt {prev['attempt']} of {run} logged a non-finite "
                             f"{bad[0]['tag']} at step {bad[0]['step']}, which attempt "
                             f"{cur['attempt']} has not reached yet (it is at step {cur['last']}).",
                  prev["attempt"], bad[0]["step"], cur["attempt"], cur["last"],
                  source=Source(run, bad[0]["step"], attempt=prev["attempt"]))


def change_event_facts(ctx: Context, sheet: FactSheet, run: str) -> None:
    """What changed during the run (issue 26), as ``/run changes`` and the alert say it
    (:func:`bot.services.changes.run_changes`): each change event the training side recorded
    when an attempt started, and each new version of an eval suite, with its step and values
    (quoted: they come from the run's config)."""
    for change in run_changes(ctx.store, run):
        if not change.changed or not isinstance(change.step, int):
            continue
        items = list(change.changed.items())[:MAX_CONFIG_ITEMS]
        values = [v for _, pair in items for v in pair]
        listed = "; ".join(f"{quote(key)}: {quote(old)} → {quote(new)}"
                           for key, (old, new) in items)
        how = (f"was resumed at step {change.step} with" if change.attempt is not None
               and any(not key.startswith(f"{SUITES}.") for key in change.changed)
               else f"changed at step {change.step}:")
        sheet.add("change", f"{run} {how} {len(change.changed)} recorded change(s): {listed}.",
                  change.step, len(change.changed), *_numbers(*values),
                  source=Source(run, change.step,
                                attempt=attempt_for_step(ctx.store, run, change.step)))


def _latest_onset(ctx: Context, run: str) -> int | None:
    rows = findings(ctx.store, run)
    if ctx.alert:
        rows = [r for r in rows if r["fingerprint"] == ctx.alert] or rows
    return rows[-1]["onset_step"] if rows else None


def shifts(ctx: Context, sheet: FactSheet, run: str, attempt: int, step: int,
           width: int = 5) -> None:
    """Which metrics moved at ``step``: the mean of the points before against those from it;
    a metric the question names is said however little it moved ("did loss react to it?")."""
    named = set(ctx.entities.metrics)
    moved = []
    for tag in tags(ctx.store, run):
        points = _finite(series(ctx.store, run, attempt, tag))
        before = [v for s, v in points if s < step][-width:]
        after = [v for s, v in points if s >= step][:width]
        if len(before) < 2 or not after:
            continue
        b, a = sum(before) / len(before), sum(after) / len(after)
        change = pct(b, a)
        if change is not None and (abs(change) >= 10 or tag in named):
            moved.append((tag in named, abs(change), tag, b, a, change))  # the named first
    src = Source(run, step, attempt=attempt)
    if not any(abs(change) >= 10 for *_, change in moved):
        sheet.add("shift", f"No metric of {run} moved by 10% or more around step {step} "
                           f"(mean of {width} points before against {width} from it).",
                  step, width, source=src)
    for *_, tag, b, a, change in sorted(moved, reverse=True)[:4]:
        sheet.add("shift", f"Around step {step}, {tag} of {run} went from {num(b)} to {num(a)} "
                           f"({change:+.1f}%, mean of the points before against those after).",
                  step, b, a, change, source=src)


UNALERTED_MOVE = 50.0  # percent: a level shift no alert covers that is worth saying


def level_moves(store: Store, run: str, width: int = 5, only: list[str] | None = None,
                covered_too: bool = False) -> list[tuple[str, int, float, float, float]]:
    """The biggest level shift of each metric of the run's current attempt, by at least
    ``UNALERTED_MOVE``, that no alert of the run covers (``covered_too``: alerted ones count
    too), as (tag, step, mean before, mean after, change %), the biggest two first. The first
    tenth of the run (warm-up) is left out."""
    attempt = current_attempt(store, run)
    covered = [] if covered_too else [
        (f["onset_step"] - 50, (f["resolved_step"] or f["detected_step"]) + 50)
        for f in findings(store, run)]
    best: dict[str, tuple[float, int, float, float, float]] = {}
    for tag in only if only is not None else tags(store, run):
        points = _finite(series(store, run, attempt, tag))
        if len(points) < 2 * width:
            continue
        start = points[0][0] + (points[-1][0] - points[0][0]) // 10
        values = [v for _, v in points]
        for i in range(width, len(points) - 1):
            step = points[i][0]
            if step < start or any(a <= step <= b for a, b in covered):
                continue
            before = sum(values[i - width:i]) / width
            after = sum(values[i:i + width]) / len(values[i:i + width])
            change = pct(before, after)
            if change is not None and abs(change) >= UNALERTED_MOVE and abs(change) > best.get(
                    tag, (0.0,))[0]:
                best[tag] = (abs(change), step, before, after, change)
    ranked = sorted(best.items(), key=lambda kv: kv[1][0], reverse=True)[:2]
    return [(tag, step, before, after, change) for tag, (_, step, before, after, change)
            in ranked]


def unalerted_moves(ctx: Context, sheet: FactSheet, run: str, width: int = 5,
                    only: list[str] | None = None, covered_too: bool = False) -> list[int]:
    """:func:`level_moves` as facts (the lr of exp6 tripled at step 2000 and nothing alerted:
    "no alert is open" alone would read as all clear). Returns their steps."""
    attempt = current_attempt(ctx.store, run)
    moves = level_moves(ctx.store, run, width, only, covered_too)
    lead = "" if covered_too else "No alert covers it, but a"
    for tag, step, before, after, change in moves:
        sheet.add("move", f"{lead or 'A'}round step {step} {tag} of {run} went from "
                          f"{num(before)} to {num(after)} ({change:+.1f}%, mean of the points "
                          f"before against those after).", step, before, after, change,
                  source=Source(run, step, attempt=attempt))
    return [step for _, step, *_ in moves]


def moves_elsewhere(ctx: Context, sheet: FactSheet, run: str, tag: str) -> None:
    """Whether another visible run's ``tag`` moved as much ("has exp6's lr jump happened on
    any other run?")."""
    others = [r for r in ctx.store.run_names() if r != run and ctx.visible(r)]
    seen = [(other, *move) for other in others for move in level_moves(ctx.store, other, only=[tag],
                                                                        covered_too=True)]
    for other, _, step, before, after, change in seen[:3]:
        sheet.add("similar", f"{tag} of {other} also moved around step {step}: from "
                             f"{num(before)} to {num(after)} ({change:+.1f}%).", step, before,
                  after, change, source=Source(other, step))
    if not seen:
        sheet.add("similar", f"None of the {len(others)} other visible runs has a {tag} move of "
                             f"{UNALERTED_MOVE:.0f}% or more (after its first tenth).",
                  len(others), UNALERTED_MOVE, source=Source(run))


def window_shifts(ctx: Context, sheet: FactSheet, run: str, attempt: int, lo: int | None,
                  hi: int | None, words: str, width: int = 5) -> int:
    """The biggest level shifts inside a window; returns the step of the largest (or the
    window's first step when nothing moved)."""
    best: dict[str, tuple[float, int, float, float, float]] = {}
    for tag in tags(ctx.store, run):
        points = _finite(series(ctx.store, run, attempt, tag))
        values = [v for _, v in points]
        for i, (step, _) in enumerate(points):
            if (lo is not None and step < lo) or (hi is not None and step > hi) or i < 2:
                continue
            before, after = values[max(0, i - width):i], values[i:i + width]
            b, a = sum(before) / len(before), sum(after) / len(after)
            change = pct(b, a)
            if change is not None and abs(change) >= 10 and abs(change) > best.get(
                    tag, (0.0,))[0]:
                best[tag] = (abs(change), step, b, a, change)
    first = lo if lo is not None else (hi or 0)
    if not best:
        sheet.add("shift", f"No metric of {run} moved by 10% or more {words}.",
                  source=Source(run, first, attempt=attempt))
        return first
    ranked = sorted(best.items(), key=lambda kv: kv[1][0], reverse=True)[:4]
    for tag, (_, step, b, a, change) in ranked:
        sheet.add("shift", f"{words[:1].upper() + words[1:]}, the biggest move of {tag} of {run} "
                           f"was at step {step}: from {num(b)} to {num(a)} ({change:+.1f}%, "
                           f"mean of the points before against those after).",
                  step, b, a, change, source=Source(run, step, attempt=attempt))
    return ranked[0][1][1]


def _alerts_near(ctx: Context, sheet: FactSheet, run: str, step: int) -> None:
    margin = max(50, step // 20)
    near = [f for f in findings(ctx.store, run) if abs(f["onset_step"] - step) <= margin
            or (f["onset_step"] <= step <= (f["resolved_step"] or f["detected_step"]))]
    for f in near:
        finding_fact(sheet, f, "alert")
    if not near:
        sheet.add("alert", f"No alert of {run} began within {margin} steps of step {step}.",
                  margin, step, source=Source(run, step))


def action_fact(sheet: FactSheet, run: str, row: dict[str, Any], lead: str = "Action") -> None:
    """One audit row as a fact: who did what to ``run``, with its options (quoted)."""
    detail = f", {quote(row['detail'])}" if row.get("detail") else ""
    # its numbers are what it did ("to checkpoint-1000, skip 10 batches, lr x0.67"), not its
    # id: "action id 1" must not make "attempt 1" look like the action said
    sheet.add("action", f"{lead} {row['action']} on {run} by {quote(row['actor'] or '?')}: "
                        f"{row['status']}{detail} (action id {row['id']}).",
              *(abs(n.value) for n in numbers_in(detail)), source=Source(run))
    # the checkpoint a rollback went to is one the facts name ("to checkpoint-1000")
    sheet.checkpoint(run, *(int(m) for m in re.findall(r"checkpoint-(\d+)", detail)))


def _actions_near(ctx: Context, sheet: FactSheet, run: str, step: int | None) -> None:
    rows = actions(ctx.store, run)
    if step is not None and rows:
        attempt = attempt_for_step(ctx.store, run, step)
        lo, hi = ctx.store.wall_span(run, attempt)
        at = ctx.store.wall_time_from(run, attempt, step)
        if at is not None and hi is not None:
            span = max(60.0, (hi - lo) / 10)
            rows = [r for r in rows if abs(r["at"] - at) <= span]
    for row in rows[-5:]:
        action_fact(sheet, run, row)
    if not rows:
        where = f" near step {step}" if step is not None else ""
        sheet.add("action", f"No rollback or stop was recorded for {run}{where}.",
                  source=Source(run, step))


# ---- NaN and infinite values ---------------------------------------------------------------
def nonfinite_facts(ctx: Context, sheet: FactSheet, run: str) -> list[tuple[int, int]]:
    """Every NaN or infinite value the run logged, per attempt and metric (a summary that
    leaves out a NaN is wrong); returns the (attempt, step) of each metric's first."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in ctx.store.nonfinite_points(run):
        groups.setdefault((row["attempt"], row["tag"]), []).append(row)
    several = len(attempts(ctx.store, run)) > 1
    firsts = []
    for (attempt, tag), rows in groups.items():
        step, value = rows[0]["step"], rows[0]["value"]
        where = f" in attempt {attempt}" if several else ""
        more = f" ({len(rows)} non-finite points in all)" if len(rows) > 1 else ""
        sheet.add("nonfinite", f"{tag} of {run} was {num(value)} at step {step}{where}{more}.",
                  step, len(rows), source=Source(run, step, attempt=attempt))
        firsts.append((attempt, step))
    if firsts and several:  # "did the second attempt NaN too?"
        for row in attempts(ctx.store, run):
            if row["attempt"] not in {a for a, _ in firsts}:
                sheet.add("nonfinite", f"Attempt {row['attempt']} of {run} (steps {row['first']}"
                                       f" to {row['last']}) logged no NaN or infinite value.",
                          row["attempt"], row["first"], row["last"],
                          source=Source(run, row["last"], attempt=row["attempt"]))
    return firsts


RISK_POINTS = 20  # the recent points "is it about to blow up?" reads


def risk_facts(ctx: Context, sheet: FactSheet, run: str) -> None:
    """"Is it about to blow up like exp4?", "anything like the lead-up to the NaN?": whether the
    current attempt logged a NaN, how its grad norm sits lately (its highest against its
    median) and how its loss moves — what a blow-up shows first — as the record says them."""
    cur = current_attempt(ctx.store, run)
    bad = [r for r in ctx.store.nonfinite_points(run) if r["attempt"] == cur]
    if bad:
        sheet.add("risk", f"{bad[0]['tag']} of {run} was {num(bad[0]['value'])} at step "
                          f"{bad[0]['step']} in its current attempt ({cur}).", bad[0]["step"], cur,
                  source=Source(run, bad[0]["step"], attempt=cur))
    else:
        sheet.add("risk", f"{run} has logged no NaN or infinite value in its current attempt "
                          f"({cur}).", cur, source=Source(run, attempt=cur))
    for tag in ("grad_norm", "train/loss"):
        pts = _finite(series(ctx.store, run, cur, tag))[-RISK_POINTS:]
        if len(pts) < 4:  # a tag the run does not log has none
            continue
        median = statistics.median(v for _, v in pts)
        top_step, top = max(pts, key=lambda p: (p[1], p[0]))
        times = top / median if median else math.nan
        sheet.add("risk", f"{tag} of {run} over its last {len(pts)} points (steps {pts[0][0]} "
                          f"to {pts[-1][0]}): median {num(median)}, highest {num(top)} at step "
                          f"{top_step} ({times:.2g}x the median), latest {num(pts[-1][1])}.",
                  len(pts), pts[0][0], pts[-1][0],
                  median, top, top_step, times, pts[-1][1],
                  source=Source(run, pts[-1][0], attempt=cur))


def nonfinite_cause_facts(ctx: Context, sheet: FactSheet, run: str, attempt: int,
                          step: int) -> None:
    """What the catalogue says of a non-finite loss no alert covers (the ``spike`` signal's
    causes and first fix, as candidates), and what people did about it."""
    src = Source(run, step, attempt=attempt)
    sheet.add("cause", f"Candidate causes of a NaN or infinite loss (the spike signal in the "
                       f"catalogue, not established for this run): {CAUSES['spike']}.",
              source=src)
    spec = CATALOG.get("spike")
    if spec and spec.fixes:
        sheet.add("first_fix", f"The first fix for a NaN loss: {spec.fixes[0].text.rstrip('.')}.",
                  source=src)
    at = ctx.store.wall_time_from(run, attempt, step)
    done = [a for a in actions(ctx.store, run) if at is None or a["at"] >= at][:2]
    for row in done:
        action_fact(sheet, run, row, lead="After it, action")
    if not done:
        sheet.add("action", f"No rollback or stop was recorded for {run} after step {step}.",
                  step, source=Source(run, step))
    later = [r for r in attempts(ctx.store, run) if r["attempt"] > attempt][:1]
    for row in later:
        sheet.add("attempt", f"Attempt {row['attempt']} of {run} started at step {row['first']} "
                             f"and is at step {row['last']}.", row["attempt"], row["first"],
                  row["last"], source=Source(run, row["first"], attempt=row["attempt"]))


def nonfinite_elsewhere(ctx: Context, sheet: FactSheet, run: str) -> None:
    """Which other visible runs logged a NaN or infinite value ("has any other run NaN'd?")."""
    others = [r for r in ctx.store.run_names() if r != run and ctx.visible(r)]
    hits = []
    for other in others:
        rows = ctx.store.nonfinite_points(other)
        if rows:
            first = rows[0]
            hits.append(other)
            sheet.add("similar", f"{other} logged a non-finite value: {first['tag']} was "
                                 f"{num(first['value'])} at step {first['step']}.",
                      first["step"], source=Source(other, first["step"],
                                                   attempt=first["attempt"]))
    if not hits:
        sheet.add("similar", f"None of the {len(others)} other visible runs logged a NaN or "
                             f"infinite value.", len(others), source=Source(run))
    if not ctx.store.nonfinite_points(run):
        sheet.add("similar", f"{run} itself logged no NaN or infinite value.",
                  source=Source(run))


# ---- why -----------------------------------------------------------------------------------
def finding_fact(sheet: FactSheet, f: dict[str, Any], kind: str = "finding",
                 detail: bool = False) -> None:
    payload = f["payload"]
    src = Source(f["run"], f["onset_step"], alert=f["fingerprint"], attempt=f["attempt"])
    state = (f"resolved at step {f['resolved_step']}" if f["state"] == "resolved"
             and f["resolved_step"] is not None else f["state"])
    sheet.add(kind, f"Alert {f['signal']} on {f['run']} ({f['severity']}, {state}) began at "
                    f"step {f['onset_step']}, seen at step {f['detected_step']}: "
                    f"{f['summary'].rstrip('.')}.", f["onset_step"], f["detected_step"],
              f["resolved_step"] if f["resolved_step"] is not None else math.nan, source=src)
    sheet.alert(f["run"], f["signal"], f["state"], f["onset_step"], f["resolved_step"])
    if not detail:
        return
    spec = CATALOG.get(f["signal"])
    trouble = TROUBLE_KINDS.get(payload.get("kind") or (spec.kind if spec else ""), "")
    if trouble:
        sheet.add("cause", f"{f['signal']} is a '{trouble}' problem.", source=src)
    if f["signal"] in CAUSES:
        sheet.add("cause", f"Candidate causes of {f['signal']} (from the signal catalogue, not "
                           f"established for this run): {CAUSES[f['signal']]}.", source=src)
    evidence = [(k, v) for k, v in (payload.get("evidence") or {}).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)][:5]
    if evidence:
        sheet.add("evidence", "Evidence: " + ", ".join(f"{k} = {num(v)}" for k, v in evidence)
                  + ".", *[v for _, v in evidence], source=src)
    fixes = payload.get("fixes") or [{"text": fx.text} for fx in (spec.fixes if spec else ())]
    if fixes:
        sheet.add("first_fix", f"The first fix for {f['signal']}: "
                               f"{fixes[0]['text'].rstrip('.')}.", source=src)
        ordered = " then ".join(f"({chr(ord('a') + i)}) {fx['text']}"
                                for i, fx in enumerate(fixes))
        sheet.add("fix", f"Fixes for {f['signal']}, in order: {ordered}.", source=src)


def why_facts(ctx: Context, sheet: FactSheet, run: str) -> None:
    ents = ctx.entities
    bad = nonfinite_facts(ctx, sheet, run) if ents.nonfinite else []
    if ents.nonfinite and not bad:
        sheet.add("finding", f"{run} logged no NaN or infinite value.", source=Source(run))
    rows = findings(ctx.store, run)
    chosen = rows
    if ctx.alert:
        chosen = [r for r in rows if r["fingerprint"] == ctx.alert] or rows
    if ents.signals:
        chosen = [r for r in chosen if r["signal"] in ents.signals]
    if ents.steps:
        margin = max(50, ents.steps[0] // 20)
        near = [r for r in chosen if r["onset_step"] - margin <= ents.steps[0]
                <= (r["resolved_step"] or max(r["detected_step"], ents.steps[0])) + margin]
        chosen = near or chosen
    firing = [r for r in chosen if r["state"] == "firing"]
    chosen = (firing or chosen)[-3:]
    for f in chosen:
        finding_fact(sheet, f, detail=True)
    if chosen:
        leading_up(ctx, sheet, run, f["attempt"], f["onset_step"], f["metric"])
        return
    if bad:  # a NaN no alert covers: what the catalogue says of one, and what was done
        nonfinite_cause_facts(ctx, sheet, run, *bad[0])
        leading_up(ctx, sheet, run, *bad[0])
        return
    step = ents.steps[0] if ents.steps else (ents.step_range or (None,))[0]
    if step is not None:  # no alert there: what moved at the step is the evidence there is
        shifts(ctx, sheet, run, attempt_for_step(ctx.store, run, step), step)
    elif ents.moved:  # "how did the lr end up 3x higher?": the move no alert covers
        moved = unalerted_moves(ctx, sheet, run, only=ents.metrics or None, covered_too=True)
        step = moved[0] if moved else None
    if step is not None and ents.moved:  # was it done on purpose? what the record says
        _actions_near(ctx, sheet, run, step)
    if "lr" in ents.metrics:  # "why did the lr jump? I thought this was cosine": the config
        setup_facts(ctx, sheet, run)
    if ents.signals:
        names = ", ".join(ents.signals)
        sheet.add("finding", f"runwatch has raised no {names} alert on {run}.", source=Source(run))
        if "overfit" in ents.signals:
            for tag in DEFAULT_TAGS:
                pts = _finite(series(ctx.store, run, current_attempt(ctx.store, run), tag))
                if pts:
                    trend(sheet, run, current_attempt(ctx.store, run), tag, pts, "")
    else:
        sheet.add("finding", f"runwatch has raised no alert on {run}.", source=Source(run))


def leading_up(ctx: Context, sheet: FactSheet, run: str, attempt: int, step: int,
               own: str = "train/loss") -> None:
    """The other metrics a why-question names, over the points before the trouble ("was grad
    norm climbing beforehand?", "was it the lr?"), and a named lr as the config sets it; the
    trouble's own metric (``own``) is what the alert already describes. "The metrics in the 200
    steps before" asks for that window, of every metric when it names none."""
    window = ctx.entities.window_before
    named = [m for m in ctx.entities.metrics if m not in (own, "train/loss")][:2]
    if window and not ctx.entities.metrics:
        have = tags(ctx.store, run)
        named = [t for t in ("train/loss", "grad_norm", "lr", "throughput") if t in have][:3]
    for tag in named:
        before = [p for p in _finite(series(ctx.store, run, attempt, tag)) if p[0] < step]
        before = [p for p in before if p[0] >= step - window] if window else before[-10:]
        if before:
            trend(sheet, run, attempt, tag, before, f"over the {len(before)} points before step "
                                                    f"{step}")
    if "lr" in ctx.entities.metrics:
        setting_facts(ctx, sheet, run, ["lr"])


# ---- rollback ------------------------------------------------------------------------------
def rollback_facts(ctx: Context, sheet: FactSheet, run: str) -> None:
    ents = ctx.entities
    cps = ctx.store.checkpoints(run)
    alerts = findings(ctx.store, run)
    open_alerts = [r for r in alerts if r["state"] == "firing"]
    rows = [r for r in alerts if r["payload"].get("rollback_to")]
    if ctx.alert:
        rows = [r for r in rows if r["fingerprint"] == ctx.alert] or rows
    if ents.signals:
        rows = [r for r in rows if r["signal"] in ents.signals] or rows
    if not ctx.alert and not open_alerts:
        sheet.add("rollback", f"No alert is open on {run}, so nothing calls for a rollback now.",
                  source=Source(run))
        sheet.all_open(run, [])
    firing = [r for r in rows if r["state"] == "firing"]
    for f in (firing or rows)[-2:]:
        target = f["payload"]["rollback_to"]
        resolved = (f", resolved at step {f['resolved_step']}" if f["state"] == "resolved"
                    and f["resolved_step"] is not None else "")
        sheet.add("rollback", f"Recommended rollback for the {f['signal']} alert on {run} "
                              f"(onset step {f['onset_step']}{resolved}): the checkpoint at step "
                              f"{target['step']} ({target['path']}), the {target['reason']}.",
                  target["step"], f["onset_step"], *([f["resolved_step"]] if resolved else []),
                  source=Source(run, target["step"], alert=f["fingerprint"]))
        sheet.checkpoint(run, target["step"], recommended=True)
        sheet.alert(run, f["signal"], f["state"], f["onset_step"], f["resolved_step"])
    for r in [r for r in open_alerts if not r["payload"].get("rollback_to") and not rows][-1:]:
        # a slowdown is in the data pipeline or the node, not in the weights a checkpoint has
        fixes = r["payload"].get("fixes") or []
        first = f"; its first fix: {fixes[0]['text'].rstrip('.')}" if fixes else ""
        sheet.add("rollback", f"runwatch recommends no rollback for the open {r['signal']} "
                              f"alert on {run} (from step {r['onset_step']}){first}.",
                  r["onset_step"], source=Source(run, r["onset_step"], alert=r["fingerprint"]))
        sheet.alert(run, r["signal"], "open", r["onset_step"])
    moved = [] if open_alerts else unalerted_moves(ctx, sheet, run)
    if ents.past_rollback:  # "was rolling back to 1000 right?", "who rolled it back, when?"
        _actions_near(ctx, sheet, run, None)
        history = attempts(ctx.store, run)
        for prev, cur in zip(history, history[1:], strict=False):
            sheet.add("rollback", f"Attempt {cur['attempt']} of {run} started at step "
                                  f"{cur['first']} after attempt {prev['attempt']} had reached "
                                  f"step {prev['last']}.", cur["attempt"], cur["first"],
                      prev["attempt"], prev["last"],
                      source=Source(run, cur["first"], attempt=cur["attempt"]))
    if not cps:
        sheet.gap(f"{run} has no recorded checkpoints, so there is nothing to roll back to")
        return
    target = ents.rollback_to
    if target is not None:
        at = [c for c in cps if c.step == target]
        if at:
            sheet.add("rollback", f"{run} has a checkpoint at step {target} ({at[0].path}); "
                                  f"/run rollback {run} {target} asks for it and a person "
                                  f"confirms.", target, target, source=Source(run, target))
            sheet.checkpoint(run, target)
        else:
            before = [c.step for c in cps if c.step < target]
            nearest = f"; the latest before it is step {before[-1]}" if before else ""
            sheet.add("rollback", f"{run} has no checkpoint at step {target}{nearest}.",
                      target, *before[-1:], source=Source(run))
        onsets = [r for r in open_alerts if r["onset_step"] <= target]
        for step in [m for m in moved if m <= target][:1]:
            sheet.add("rollback", f"Step {target} is not before the move at step {step} that "
                                  f"no alert covers: a checkpoint there may already hold it.",
                      target, step, source=Source(run, step))
        for r in onsets[-1:]:
            sheet.add("rollback", f"Step {target} is not before the onset of the open "
                                  f"{r['signal']} alert on {run} (step {r['onset_step']}): a "
                                  f"checkpoint there may already hold the trouble.", target,
                      r["onset_step"], source=Source(run, r["onset_step"],
                                                     alert=r["fingerprint"]))
            sheet.alert(run, r["signal"], "open", r["onset_step"])
    else:
        bad = ctx.store.nonfinite_points(run)  # the NaN a rollback would go back before
        anchor = ents.steps[0] if ents.steps else bad[0]["step"] if bad else None
        what = " (the first NaN or infinite value)" if anchor is not None and not ents.steps \
            else ""
        if anchor is None and moved:  # "the latest clean checkpoint": before what moved
            anchor, what = moved[0], " (the move no alert covers)"
        before = [c for c in cps if anchor is not None and c.step < anchor]
        if before:
            c = before[-1]
            sheet.add("rollback", f"The latest checkpoint of {run} before step {anchor}{what} is "
                                  f"step {c.step} ({c.path}).", c.step, anchor,
                      source=Source(run, c.step))
            sheet.checkpoint(run, c.step, recommended=True)
        elif anchor is not None:
            sheet.add("rollback", f"{run} has no checkpoint before step {anchor}{what}.",
                      anchor, source=Source(run))
    shown = cps[-6:]
    steps = ", ".join(str(c.step) for c in shown)
    more = f" (the latest {len(shown)} of {len(cps)})" if len(cps) > len(shown) else ""
    sheet.add("checkpoint", f"Checkpoints of {run}{more}: steps {steps}.",
              *[c.step for c in shown], len(shown), len(cps), source=Source(run, cps[-1].step))
    sheet.checkpoint(run, *(c.step for c in shown))


# ---- what the question takes for granted ---------------------------------------------------
def premise_facts(ctx: Context, sheet: FactSheet, run: str) -> None:
    """What the question assumes and the record contradicts ("the third attempt", "the step
    3000 checkpoint"), said before anything else is answered (a rollback that never happened
    is said by the rollback answer: "No rollback or stop was recorded")."""
    ents = ctx.entities
    spans = attempts(ctx.store, run)
    count = len(spans) or 1
    if ents.attempt_no is not None and ents.attempt_no > count:
        started = (f"; attempt {count} started at step {spans[-1]['first']}" if count > 1
                   and spans else "")
        sheet.add("premise", f"{run} has {count} attempt{'s' if count > 1 else ''} on record"
                             f"{started}: there is no attempt {ents.attempt_no}.",
                  count, ents.attempt_no, source=Source(run))
    cps = ctx.store.checkpoints(run)
    have = {c.step for c in cps}
    for step in ents.checkpoint_steps:
        if step in have:
            continue
        last = spans[-1]["last"] if spans else None
        ended = (f", and its latest step is {last}" if last is not None and step > last else "")
        listed = (f"its checkpoints are at steps {', '.join(str(c.step) for c in cps[-6:])}"
                  if cps else "it has no checkpoint on record")
        sheet.add("premise", f"{run} has no checkpoint at step {step}: {listed}{ended}.", step,
                  *[c.step for c in cps[-6:]], *([last] if ended else []), source=Source(run))


# ---- comparisons ---------------------------------------------------------------------------
def compare_facts(ctx: Context, sheet: FactSheet, runs: list[str]) -> None:
    a, b = runs[0], runs[1]
    wanted = ctx.entities.metrics or list(DEFAULT_TAGS)
    for run in (a, b):
        st = run_status(ctx.store, run, now=ctx.now)
        if st.step is not None:
            total = f" of {st.total_steps}" if st.total_steps else ""
            sheet.add("compare", f"{run} is at step {st.step}{total} ({st.state}).", st.step,
                      st.total_steps or math.nan, source=Source(run, st.step))
    for tag in wanted:
        for run in (a, b):
            attempt = current_attempt(ctx.store, run)
            pts = _finite(series(ctx.store, run, attempt, tag))
            if not pts:
                sheet.gap(f"{run} has no {tag} points")
                continue
            step, value = pts[-1]
            lo_step, lo = min(pts, key=lambda p: (p[1], p[0]))
            sheet.add("compare", f"{run}: latest {tag} {num(value)} at step {step}; lowest "
                                 f"{num(lo)} at step {lo_step}.", value, step, lo, lo_step,
                      source=Source(run, step, attempt=attempt))
    config_diff(ctx, sheet, a, b, "compared")
    for run in (a, b):
        open_alerts = [f["signal"] for f in findings(ctx.store, run) if f["state"] == "firing"]
        sheet.add("compare", f"Open alerts on {run}: {', '.join(open_alerts) or 'none'}.",
                  source=Source(run))
        sheet.all_open(run, open_alerts)


# ---- the plan ------------------------------------------------------------------------------
def gather(ctx: Context, sheet: FactSheet) -> None:
    """Fill ``sheet`` with the facts its kinds ask for."""
    ents = ctx.entities
    run = ctx.run
    kinds = sheet.kinds
    sheet.runs.add(run)
    if ents.act:  # "roll it back now": said first, whatever else is answered
        act_fact(ctx, sheet, run)
    premise_facts(ctx, sheet, run)
    if ents.risk:  # "is it about to blow up?": its NaNs, grad norm and loss lately
        risk_facts(ctx, sheet, run)
    if "status" in kinds:
        status_facts(ctx, sheet, run)
    metric_kinds = {"value", "min", "max", "trend"}
    against = [r for r in ents.runs if r != run] or ([baseline_of(ctx, run)] if "compare" in
                                                       kinds else [])
    if ents.pace:  # "still improving, or flattening?": each loss asked, last window vs before
        attempt = current_attempt(ctx.store, run)
        for tag in ents.metrics or DEFAULT_TAGS:  # a tag the run lacks has no points: no fact
            pace(sheet, run, attempt, tag, series(ctx.store, run, attempt, tag))
    if metric_kinds & set(kinds) and not ("compare" in kinds and any(against)):
        start, each = len(sheet.facts), []
        for tag in ents.metrics or ["train/loss"]:
            metric_facts(ctx, sheet, run, tag)
            each.append(sheet.facts[start + sum(map(len, each)):])
        # "peak grad norm? and how high did the loss go?": each metric's first fact, then
        # each one's second, so a short answer says something of every metric asked
        sheet.facts[start:] = [f for row in zip_longest(*each) for f in row if f is not None]
    if "changed" in kinds:
        changed_facts(ctx, sheet, run)
    if "why" in kinds:
        why_facts(ctx, sheet, run)
    if "rollback" in kinds:
        rollback_facts(ctx, sheet, run)
    if "compare" in kinds:
        others = [r for r in ents.runs if r != run]
        if others:
            compare_facts(ctx, sheet, [run, others[0]])
        else:
            base = baseline_of(ctx, run)
            if base:
                compare_facts(ctx, sheet, [run, base])
            elif sheet.intent in ("compare", "better") or ents.baseline:
                # "latest eval loss vs the one before it" compares no runs: no gap for it
                sheet.gap(f"the question names no second run to compare {run} with")
    if "similar" in kinds and ctx.similar is not None:
        ctx.similar(ctx, sheet)
    if ents.settings and {"why", "changed", "next", "summary"} & set(kinds):
        setting_facts(ctx, sheet, run)  # "is it the dataloader? we gave it 2 workers"
