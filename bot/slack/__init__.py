"""Slack: the Bolt app behind the request gate, the listeners (one module per surface) and the
text safety that every Slack post goes through."""
