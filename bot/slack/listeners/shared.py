"""What the listeners share: who is asking (with their Slack user groups, one cache for every
surface), posting an answer through the alerts' notifier, and reporting a confirmed action."""

from __future__ import annotations

import logging
import time
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.actions import ActionRequest, Actions, Actor
from bot.alerting.notify import SlackNotifier
from bot.views.actions import result_message
from bot.views.message import Message

log = logging.getLogger("runwatch.slack")

GROUP_CACHE_S = 60.0


class UserGroups:
    """Which of the configured Slack user groups a user is in (``usergroups.users.list``),
    cached for a minute so a burst of clicks costs one call per group."""

    def __init__(self, client: WebClient, actions: Actions) -> None:
        self.client = client
        self.actions = actions
        self._cache: dict[str, tuple[float, set[str]]] = {}

    def members(self, group: str) -> set[str]:
        cached = self._cache.get(group)
        if cached and time.monotonic() - cached[0] < GROUP_CACHE_S:
            return cached[1]
        try:
            users = set(self.client.usergroups_users_list(usergroup=group).get("users") or [])
        except SlackApiError as exc:
            log.warning("could not list user group %s: %s", group, exc.response.get("error"))
            users = set()
        self._cache[group] = (time.monotonic(), users)
        return users

    def of(self, user: str) -> set[str]:
        wanted = {g for rule in self.actions.config.permissions.values() for g in rule.usergroups}
        return {g for g in wanted if user in self.members(g)}


def actor_from(body: dict[str, Any], groups: UserGroups) -> Actor:
    user = (body.get("user") or {}).get("id") or body.get("user_id") or "unknown"
    channel = (body.get("channel") or {}).get("id") or body.get("channel_id")
    return Actor(user=user, channel=channel, groups=lambda: groups.of(user))


def post(client: WebClient, channel: str | None, message: Message,
         thread_ts: str | None = None) -> None:
    """Answer in Slack through the notifier the alerts use; a failure is logged, not raised
    (the request was already acknowledged and audited)."""
    if channel is None:
        log.warning("no channel to post %r to", message.text)
        return
    result = SlackNotifier(client).post(channel, message, thread_ts)
    if not result.ok:
        log.warning("could not answer in %s: %s", channel, result.reason)


def report_when_done(client: WebClient, actions: Actions, req: ActionRequest,
                     channel: str | None, thread_ts: str | None) -> None:
    """Run a confirmed request on the worker; post its outcome in the thread."""
    actions.submit(req.id, on_done=lambda done: post(client, channel, result_message(done),
                                                     thread_ts))


def thread_of(body: dict[str, Any]) -> str | None:
    message = body.get("message") or {}
    return message.get("thread_ts") or message.get("ts") or \
        (body.get("container") or {}).get("message_ts")
