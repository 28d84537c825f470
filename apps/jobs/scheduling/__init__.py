"""The pure-Python scheduling core: a snapshot of the fleet in, decisions out; no Django import.

Why a package of its own: the ORM shell (apps.jobs) and the trace replay (bench/) must run exactly the
same code, and the core must be testable without a database. Import the public API from here.
"""

from apps.jobs.scheduling.core import schedule, span
from apps.jobs.scheduling.fairshare import DEFAULT_HALF_LIFE_S, UsageLedger, decayed_gpu_seconds, usage_ratios
from apps.jobs.scheduling.model import (
    Decisions,
    Gpu,
    PendingJob,
    PlannedStart,
    Reason,
    ReasonCode,
    Reservation,
    RunningJob,
    Snapshot,
    Start,
    Stop,
    StopReason,
)
from apps.jobs.scheduling.policies import BACKFILL, FAIR, FIFO, POLICIES, Policy, offer_order, policy_by_name

__all__ = [
    "BACKFILL",
    "DEFAULT_HALF_LIFE_S",
    "FAIR",
    "FIFO",
    "POLICIES",
    "Decisions",
    "Gpu",
    "PendingJob",
    "PlannedStart",
    "Policy",
    "Reason",
    "ReasonCode",
    "Reservation",
    "RunningJob",
    "Snapshot",
    "Start",
    "Stop",
    "StopReason",
    "UsageLedger",
    "decayed_gpu_seconds",
    "offer_order",
    "policy_by_name",
    "schedule",
    "span",
    "usage_ratios",
]
