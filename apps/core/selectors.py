"""Reads for the home page: a summary each app contributes to (fleet, bookings, jobs, cost)."""

from __future__ import annotations

from typing import Any

from apps.accounts.selectors import teams_of
from apps.accounts.types import AnyUser


def home_summary(*, user: AnyUser) -> dict[str, Any]:
    from apps.fleet.selectors import fleet_summary

    return {"teams": list(teams_of(user=user)), "fleet": fleet_summary(user=user)}
