"""Alerting: findings → alert lifecycle (pure stages) → durable outbox → transport; silences and
acknowledgements."""
