"""Efficiency settings (environment, typed, with defaults that work with nothing set)."""

from __future__ import annotations

from portal.env import env_int

SCAN_EVERY_S = env_int("EFFICIENCY_SCAN_EVERY_S", 60)
# Rollups lag the present by about a minute and a half (telemetry README); a GPU whose newest minute is older
# than this is treated as unknown, never as idle.
FRESH_WITHIN_MIN = env_int("EFFICIENCY_FRESH_WITHIN_MIN", 5)
