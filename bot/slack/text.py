"""Text from logs and people is shown in Slack as text, never as markup that acts.

Run names come from folder names, metric names from JSON keys and column headers, notices
and errors quote what a log holds, and answers repeat questions: anyone who can write a log
file or type in a channel decides part of what runwatch posts. Slack turns ``<!channel>``,
``<!here>``, ``<!everyone>`` and ``<!subteam^ID>`` into notifications for a whole channel or
group, and ``<https://…|label>`` into a link whose label hides where it goes. runwatch itself
posts no links and mentions only people by id and the on-call groups of its configuration, so
every other such token is escaped (``&lt;!channel&gt;`` shows as ``<!channel>`` and notifies
nobody) on the way out, in every text and block of every message.

>>> neutralize("loss of <!channel> at <https://evil.example|docs>")
'loss of &lt;!channel&gt; at &lt;https://evil.example|docs&gt;'
>>> neutralize("<!subteam^S0ONCALL> please look", allowed={"<!subteam^S0ONCALL>"})
'<!subteam^S0ONCALL> please look'
>>> neutralize("<@U123ABC> confirmed")
'<@U123ABC> confirmed'
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from typing import Any

from slack_sdk import WebClient
from slack_sdk.web.slack_response import SlackResponse

# A special mention (<!channel>, <!here|here>, <!subteam^S1>, …) or a link (<scheme:…>).
_ACTIVE = re.compile(r"<(?:![^<>]*|[a-z][a-z0-9+.-]{0,31}:[^<>]*)>", re.IGNORECASE)


def neutralize(text: str, allowed: Collection[str] = ()) -> str:
    """``text`` with every special mention and link escaped, but those in ``allowed``."""
    return _ACTIVE.sub(lambda m: m.group() if m.group() in allowed
                       else "&lt;" + m.group()[1:-1] + "&gt;", text)


def neutralize_blocks(value: Any, allowed: Collection[str] = ()) -> Any:
    """Block Kit (dicts and lists, as sent) with every ``text`` string neutralized."""
    if isinstance(value, dict):
        return {k: (neutralize(v, allowed) if k == "text" and isinstance(v, str)
                    else neutralize_blocks(v, allowed)) for k, v in value.items()}
    if isinstance(value, list):
        return [neutralize_blocks(v, allowed) for v in value]
    return value


def oncall_mentions(groups: Collection[str | None]) -> frozenset[str]:
    """The group mentions runwatch may post: its configured on-call groups."""
    return frozenset(f"<!subteam^{g}>" for g in groups if g)


# Fields of a Web API call that Slack renders as mrkdwn, and those that hold blocks.
_TEXT_FIELDS = ("text", "initial_comment")
_BLOCK_FIELDS = ("blocks", "attachments", "view")


def neutralize_payload(payload: dict[str, Any], allowed: Collection[str] = ()) -> dict[str, Any]:
    """A Web API call's arguments with their texts and blocks neutralized (blocks may come
    as Python objects or, in form-encoded calls, as JSON text)."""
    safe = dict(payload)
    for key, value in payload.items():
        if key in _TEXT_FIELDS and isinstance(value, str):
            safe[key] = neutralize(value, allowed)
        elif key in _BLOCK_FIELDS and isinstance(value, str):
            try:
                safe[key] = json.dumps(neutralize_blocks(json.loads(value), allowed))
            except ValueError:
                safe[key] = neutralize(value, allowed)
        elif key in _BLOCK_FIELDS:
            safe[key] = neutralize_blocks(value, allowed)
    return safe


class SafeWebClient(WebClient):
    """The Web API client every post, edit, upload comment and view goes through: each is
    neutralized on its way out, whichever part of runwatch built it."""

    def __init__(self, *args: Any, allowed: Collection[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.allowed = frozenset(allowed)

    def api_call(self, api_method: str, **kwargs: Any) -> SlackResponse:
        for part in ("json", "params", "data"):
            if isinstance(kwargs.get(part), dict):
                kwargs[part] = neutralize_payload(kwargs[part], self.allowed)
        return super().api_call(api_method, **kwargs)


def safe_respond(respond: Callable[..., Any], allowed: Collection[str] = ()) -> Callable[..., Any]:
    """Bolt's ``respond`` (a POST to the request's response URL, outside the Web API
    client) with the same neutralizing."""
    def send(text: str = "", blocks: Any = None, **kwargs: Any) -> Any:
        return respond(text=neutralize(text, allowed) if text else text,
                       blocks=neutralize_blocks(blocks, allowed) if blocks else blocks,
                       **kwargs)

    return send
