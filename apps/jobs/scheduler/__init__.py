"""The ORM shell around the pure scheduling core (`apps.jobs.scheduling`): leadership, snapshot, apply, loop.

`python manage.py scheduler` runs `SchedulerLoop` (loop.py). One process at a time is the leader (leadership.py: a
PostgreSQL advisory lock and a fencing token). A pass loads a snapshot (snapshot.py: GPUs of online nodes, running
jobs, reservations and maintenance windows, queued jobs, decayed team usage), calls
`apps.jobs.scheduling.schedule`, and applies the starts and stops in one fenced transaction (apply.py). Jobs on
parts of GPUs (MIG instances, shares) start after it, in the policy's order (parts.py); one that does not fit gets a
planned start (part_plans.py).
"""

from apps.jobs.scheduler.apply import PassResult, apply_decisions, claim_fence, run_pass
from apps.jobs.scheduler.leadership import ADVISORY_KEY, Leadership, NotLeader, PostgresLeadership
from apps.jobs.scheduler.loop import SchedulerLoop
from apps.jobs.scheduler.snapshot import PassContext, UsageCache, epoch, load_snapshot, team_usage

__all__ = [
    "ADVISORY_KEY",
    "Leadership",
    "NotLeader",
    "PassContext",
    "PassResult",
    "PostgresLeadership",
    "SchedulerLoop",
    "UsageCache",
    "apply_decisions",
    "claim_fence",
    "epoch",
    "load_snapshot",
    "run_pass",
    "team_usage",
]
