"""Services: plain functions over the store, shared by Slack, the console and the CLI."""
