"""Buttons of the action flow: Roll back / Stop on an alert, Confirm / Cancel on a request.

Every handler acknowledges first (Slack's 3 seconds) and hands the rest to the listeners'
pool: record the request and answer in the alert's thread; a confirmed request is carried
out on the action service's worker and its outcome posted when it is known.
"""

from __future__ import annotations

import logging

from slack_bolt import Ack, App
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.actions import ActionRefused, Actions
from bot.slack.listeners.shared import UserGroups, actor_from, post, report_when_done, thread_of
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

log = logging.getLogger("runwatch.slack")

def register(app: App, store: Store, actions: Actions, groups: UserGroups, work: Work) -> None:

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
