"""Which runs a Slack channel may hear about.

Alerts are routed per project, team or run (``[[alerting.routes]]``); an answer in a channel
must not reveal runs whose alerts go elsewhere. A run is visible in a channel when one of
the routes that can take its alerts (matching its run, project and team; severity and
signal aside) sends them there, or when the channel is the default alerts channel. Without
routes every run is visible everywhere. A direct message sees what the default channel sees.
"""

from __future__ import annotations

from bot.alerting.lifecycle import Matcher
from bot.alerting.pipeline import run_labels
from bot.config import AlertingConfig
from bot.store import Store

RUN_LABELS = ("run", "project", "team")


def _could_route(matchers: tuple[Matcher, ...], labels: dict[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers if m.name in RUN_LABELS)


def visible_runs(store: Store, alerting: AlertingConfig, default_channel: str,
                 channel: str | None) -> set[str] | None:
    """The runs ``channel`` may hear about; None: all of them (no routes configured)."""
    if not alerting.routes:
        return None
    if channel is None or channel.startswith("D") or channel == default_channel:
        channel = default_channel
    routes = [r.route() for r in alerting.routes]
    visible = set()
    for run in store.run_names():
        labels = {"run": run, **run_labels(store, run)}
        channels = {r.channel for r in routes if _could_route(r.matchers, labels)}
        catches_all = any(_could_route(r.matchers, labels) and not any(
            m.name not in RUN_LABELS for m in r.matchers) for r in routes)
        if not catches_all:
            channels.add(default_channel)  # what no route takes goes to the default channel
        if channel in channels:
            visible.add(run)
    return visible
