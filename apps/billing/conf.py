"""Billing knobs, read once from the environment (embedded defaults that work with nothing set)."""

from __future__ import annotations

from portal.env import env_int

# A piece of an allocation is written to the ledger once it ended this long ago, so the telemetry rollup of its
# last minute (flushed every TELEMETRY_FLUSH_EVERY_S) has landed and its mean utilization is complete.
CLOSE_LAG_S = env_int("BILLING_CLOSE_LAG_S", 120)
# How often the ledger closer runs (beat) and how often live month-to-date figures are pushed to team sockets.
CLOSE_EVERY_S = env_int("BILLING_CLOSE_EVERY_S", 60)
LIVE_EVERY_S = env_int("BILLING_LIVE_EVERY_S", 5)
# Month closes are attempted this often; the first attempt after a month (plus CLOSE_LAG_S) is over freezes it.
MONTH_CLOSE_EVERY_S = env_int("BILLING_MONTH_CLOSE_EVERY_S", 3600)
# Budget alerts fire at these percentages of a team's budget, once each per month.
BUDGET_THRESHOLDS = (80, 100)
