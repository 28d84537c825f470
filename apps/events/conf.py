"""The events app's settings, read once from the environment (with defaults that work with nothing set)."""

from __future__ import annotations

from portal.env import env_int, env_list

# Comma-separated CIDRs a webhook may resolve into although private, loopback or link-local (empty: none).
ALLOWED_NETWORKS: list[str] = env_list("WEBHOOK_ALLOWED_NETWORKS", [])
SWEEP_EVERY_S = env_int("EVENTS_SWEEP_EVERY_S", 30)
# Delivery attempts back off exponentially from BASE up to MAX seconds between tries.
BACKOFF_BASE_S = env_int("WEBHOOK_BACKOFF_BASE_S", 5)
BACKOFF_MAX_S = env_int("WEBHOOK_BACKOFF_MAX_S", 3600)
TIMEOUT_S = env_int("WEBHOOK_TIMEOUT_S", 10)
# An endpoint whose deliveries have failed without a success for this long is disabled and its owner told.
DISABLE_AFTER_S = env_int("WEBHOOK_DISABLE_AFTER_S", 86400)
# A claimed delivery not finished within this long (the worker died mid-attempt) is owed again.
CLAIM_LEASE_S = env_int("EVENTS_CLAIM_LEASE_S", 60)
# "Starting soon" is published this long before a reservation's start (checked every REMINDER_EVERY_S).
RESERVATION_REMINDER_S = env_int("RESERVATION_REMINDER_S", 900)
REMINDER_EVERY_S = env_int("RESERVATION_REMINDER_EVERY_S", 60)
# Delivered events (and their delivery log) are kept this long.
RETENTION_DAYS = env_int("EVENTS_RETENTION_DAYS", 30)
