"""runwatch: chat-ops bot that watches LLM training runs and alerts in Slack."""
