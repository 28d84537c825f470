"""Writes for jobs: submission, the state machine, starts, node reports and the leader's sweep.

Callers use the package (`from apps.jobs import services; services.job_submit(...)`); the modules inside import
each other directly.
"""

from apps.jobs.services.reports import (
    OUTCOME_STATES,
    InventoryItem,
    LogLineIn,
    final_state_of,
    job_logs_append,
    job_on_node,
    job_report_exit,
    job_report_started,
    node_reconcile,
)
from apps.jobs.services.starting import StartItem, job_resend_launch, job_start, jobs_start_many, launch_request
from apps.jobs.services.submission import TeamLimits, job_submit, limits_of
from apps.jobs.services.sweep import jobs_stop_for_reservation, jobs_sweep
from apps.jobs.services.transitions import (
    TransitionRefused,
    job_cancel,
    job_fail_launch,
    job_mark_lost,
    job_request_stop,
    job_transition,
)

__all__ = [
    "OUTCOME_STATES",
    "InventoryItem",
    "LogLineIn",
    "StartItem",
    "TeamLimits",
    "TransitionRefused",
    "final_state_of",
    "job_cancel",
    "job_fail_launch",
    "job_logs_append",
    "job_mark_lost",
    "job_on_node",
    "job_report_exit",
    "job_report_started",
    "job_request_stop",
    "job_resend_launch",
    "job_start",
    "job_submit",
    "job_transition",
    "jobs_start_many",
    "jobs_stop_for_reservation",
    "jobs_sweep",
    "launch_request",
    "limits_of",
    "node_reconcile",
]
