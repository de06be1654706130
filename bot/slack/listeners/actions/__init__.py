"""Buttons of the action flow: Roll back / Stop on an alert, Confirm / Cancel on a request.

Every handler acknowledges first (Slack's 3 seconds) and hands the rest to the listeners'
pool: record the request and answer in the alert's thread; a confirmed request is carried
out on the action service's worker and its outcome posted when it is known.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from slack_bolt import Ack, App
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.actions import ActionRefused, ActionRequest, Actions, Actor
from bot.alerting.notify import SlackNotifier
from bot.slack.listeners.work import Work
from bot.store import Store
from bot.views.actions import (
    CANCEL_BUTTON,
    CONFIRM_BUTTON,
    ROLLBACK_BUTTON,
    STOP_BUTTON,
    confirmation_message,
    progress_message,
    refusal_message,
    result_message,
)
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


def register(app: App, store: Store, actions: Actions, work: Work) -> None:
    groups = UserGroups(app.client, actions)

    def on_alert_button(ack: Ack, body: dict, action: dict, client: WebClient) -> None:
        ack()
        work.submit(request_action, body, action, client)

    def request_action(body: dict, action: dict, client: WebClient) -> None:
        kind = "rollback" if action["action_id"] == ROLLBACK_BUTTON else "stop"
        actor = actor_from(body, groups)
        thread = thread_of(body)
        finding = store.finding(action.get("value") or "")
        try:
            if finding is None:
                raise ActionRefused("That alert is no longer known to runwatch; use /run "
                                    f"{kind} RUN instead.")
            req = actions.request(kind, finding["run"], actor, fingerprint=finding["fingerprint"],
                                  thread_ts=thread)
            message = confirmation_message(req, actor.mention)
        except ActionRefused as exc:
            message = refusal_message(str(exc))
        post(client, actor.channel, message, thread)

    def on_confirm(ack: Ack, body: dict, action: dict, client: WebClient) -> None:
        ack()
        work.submit(confirm_action, body, action, client)

    def confirm_action(body: dict, action: dict, client: WebClient) -> None:
        actor = actor_from(body, groups)
        thread = thread_of(body)
        try:
            if action["action_id"] == CANCEL_BUTTON:
                req = actions.cancel(action.get("value") or "", actor)
                message = result_message(req) if not req.existing else refusal_message(
                    f"Request `{req.id}` is {req.state}; nothing to cancel.")
                post(client, actor.channel, message, thread)
                return
            req = actions.confirm(action.get("value") or "", actor)
        except ActionRefused as exc:
            post(client, actor.channel, refusal_message(str(exc)), thread)
            return
        if req.existing:
            by = f" by <@{req.confirmed_by}>" if req.confirmed_by else ""
            post(client, actor.channel, refusal_message(
                f"Request `{req.id}` was already {req.state}{by}; it runs only once."), thread)
            return
        message_ts = (body.get("message") or {}).get("ts")
        progress = progress_message(req, actor.mention)
        if message_ts and actor.channel:  # the buttons go: nobody can press them again
            try:
                client.chat_update(channel=actor.channel, ts=message_ts, text=progress.text,
                                   blocks=progress.blocks)
            except SlackApiError as exc:
                log.warning("could not update the confirmation: %s", exc.response.get("error"))
        report_when_done(client, actions, req, actor.channel, req.thread_ts or thread)

    app.action(ROLLBACK_BUTTON)(on_alert_button)
    app.action(STOP_BUTTON)(on_alert_button)
    app.action(CONFIRM_BUTTON)(on_confirm)
    app.action(CANCEL_BUTTON)(on_confirm)
