"""Pure Block Kit builders (slack_sdk models, so lengths and counts are validated)."""
