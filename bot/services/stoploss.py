"""Stop-loss rules agreed before the run (seed §5.4): ``/run stoploss RUN "3 evals < 0.5% on
eval/loss"`` parses a rule written the way a team says it, checks it with the
``diminishing_returns`` analyzer's own validation, and stores it in the run's metadata under
``runwatch_stop_loss``, where that analyzer reads it (a declared rule's finding is a warning
that is posted; runwatch's default one stays information in status).

Grammar: ``N eval[s|uations] < X% [on METRIC] [max]`` (``max`` for a metric where higher
is better), or ``off`` to opt the run out.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from analyzers.diminishing_returns import CONFIG_KEY, DiminishingReturns
from bot.store import Store, UnknownRun

_RULE = re.compile(
    r"^\s*(?P<n>\d+)\s*(?:evals?|evaluations?)\s*(?:<|under|below)\s*"
    r"(?P<x>\d+(?:\.\d+)?)\s*%\s*(?:on\s+(?P<metric>\S+))?\s*(?P<mode>max|min)?\s*$", re.I)
EXAMPLE = '"3 evals < 0.5% on eval/loss"'


class RuleError(ValueError):
    """A rule that cannot be used; the message shows the grammar."""


def parse_rule(text: str) -> dict[str, Any]:
    """The rule as the analyzer's parameters.

    >>> parse_rule("3 evals < 0.5% on eval/loss")
    {'evaluations': 3, 'min_improvement': 0.005, 'metric': 'eval/loss'}
    >>> parse_rule("off")
    {'enabled': False}
    """
    if text.strip().lower() in ("off", "none", "no"):
        return {"enabled": False}
    match = _RULE.match(text)
    if not match:
        raise RuleError(f"cannot read the rule {text!r}; write it as {EXAMPLE} "
                        f"(N evaluations improving less than X%, optionally on a metric, "
                        f"'max' when higher is better) or 'off'")
    rule: dict[str, Any] = {"evaluations": int(match["n"]),
                            "min_improvement": round(float(match["x"]) / 100, 10)}
    if match["metric"]:
        rule["metric"] = match["metric"]
    if match["mode"]:
        rule["mode"] = match["mode"].lower()
    try:
        DiminishingReturns(**rule)  # the analyzer's own checks, so a stored rule always applies
    except ValueError as exc:
        raise RuleError(f"{exc}; e.g. {EXAMPLE}") from exc
    return rule


def describe(rule: dict[str, Any] | None) -> str:
    """A rule in words, as status shows it."""
    if not rule:
        return "none declared (runwatch's default, 3 evaluations < 0.5% on eval/loss, is " \
               "only information)"
    if rule.get("enabled") is False:
        return "off for this run"
    text = f"{rule.get('evaluations', 3)} evaluations < {rule.get('min_improvement', 0.005):.2%}"
    text += f" on {rule.get('metric', 'eval/loss')}"
    return text + (" (higher is better)" if rule.get("mode") == "max" else "")


def declared_rule(store: Store, run: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The run's declared rule (from ``/run stoploss`` or its config) and who declared it."""
    info = store.run(run)
    if info is None:
        raise UnknownRun(run, store.run_names())
    meta = json.loads(info.get("meta") or "{}")
    config = json.loads(info["config"]) if info.get("config") else {}
    rule = meta.get(CONFIG_KEY) or (config.get(CONFIG_KEY) if isinstance(config, dict)
                                    else None)
    if isinstance(rule, str):
        try:
            rule = json.loads(rule)
        except ValueError:
            rule = None
    by = meta.get("stop_loss_declared") or ({"by": "run config"} if rule else {})
    return (rule if isinstance(rule, dict) else None), by


def declare(store: Store, run: str, text: str, user: str,
            now: float | None = None) -> dict[str, Any]:
    """Store the rule in the run's metadata; the analyzer applies it from the next poll."""
    rule = parse_rule(text)
    declared = {"by": user, "at": time.time() if now is None else now, "text": text}
    if not store.update_run_meta(run, {CONFIG_KEY: rule, "stop_loss_declared": declared}):
        raise UnknownRun(run, store.run_names())
    return rule
