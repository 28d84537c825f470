"""Job policy knobs, read once from the environment (embedded defaults that work with nothing set)."""

from __future__ import annotations

from portal.env import env_int, env_str

# Submission policy (per-team overrides in TeamJobPolicy).
MAX_DURATION_S = env_int("JOBS_MAX_DURATION_S", 7 * 24 * 3600)
DEFAULT_MAX_DURATION_S = env_int("JOBS_DEFAULT_MAX_DURATION_S", 3600)
MAX_CPUS = env_int("JOBS_MAX_CPUS", 128)
DEFAULT_CPUS = 2.0
MAX_MEMORY_MIB = env_int("JOBS_MAX_MEMORY_MIB", 1024 * 1024)
DEFAULT_MEMORY_MIB = env_int("JOBS_DEFAULT_MEMORY_MIB", 8192)
DEFAULT_MAX_PRIORITY = env_int("JOBS_DEFAULT_MAX_PRIORITY", 10)
STAFF_MAX_PRIORITY = 100
MIN_PRIORITY = -100
DEFAULT_MAX_QUEUED_PER_TEAM = env_int("JOBS_MAX_QUEUED_PER_TEAM", 10000)

# Command and environment bounds (the node's container policy checks again; these are the portal's).
MAX_COMMAND_ARGS = 1024
MAX_COMMAND_BYTES = 64 * 1024
MAX_ENV_VARS = 128
MAX_ENV_NAME_CHARS = 128
MAX_ENV_VALUE_BYTES = 16 * 1024
MAX_ENV_TOTAL_BYTES = 64 * 1024
MAX_NAME_CHARS = 200

# Logs kept per job: the newest MAX_LOG_LINES lines, each cut at MAX_LOG_LINE_CHARS characters.
MAX_LOG_LINES = env_int("JOBS_LOG_MAX_LINES", 5000)
MAX_LOG_LINE_CHARS = env_int("JOBS_LOG_MAX_LINE_CHARS", 4096)
# A log reader is not given the lines after a missing one until the line after the gap is this old: batches can
# arrive out of order (two portal workers; an agent's replay after a broker outage), and a follower that moved
# past the gap would never see the late line. A gap that stays (lines the agent had to drop) delays it once.
LOG_GAP_WAIT_S = env_int("JOBS_LOG_GAP_WAIT_S", 10)

# Lifecycle timing.
NODE_LOST_TIMEOUT_S = env_int("JOBS_NODE_LOST_TIMEOUT_S", 60)
LAUNCH_RESEND_S = env_int("JOBS_LAUNCH_RESEND_S", 15)
LAUNCH_TIMEOUT_S = env_int("JOBS_LAUNCH_TIMEOUT_S", 180)
CANCEL_GRACE_S = env_int("JOBS_CANCEL_GRACE_S", 10)
# A stop whose job still runs this long after it was asked is asked again (a command lost with the broker).
STOP_RESEND_S = env_int("JOBS_STOP_RESEND_S", 30)
RESERVATION_GRACE_S = env_int("JOBS_RESERVATION_GRACE_S", 60)
# A job's allocation is booked until start + max_duration + this slack (the agent's own timeout kill and
# its grace period must fit inside it); it is cut to the real end when the job ends.
ALLOCATION_SLACK_S = env_int("JOBS_ALLOCATION_SLACK_S", 120)

# Scheduler.
SCHEDULER_POLICY = env_str("SCHEDULER_POLICY", "fair")
# Keeping nodes clear of long work for gangs (apps/jobs/scheduling/longwork.py); 0 = off. A trade-off, not a
# free win: docs/benchmarks.md ("Keeping nodes clear of long work") shows where it helps and where it hurts.
SCHEDULER_GANG_NODES_KEPT = float(env_str("SCHEDULER_GANG_NODES_KEPT", "0"))
SCHEDULER_LONG_JOB_S = float(env_str("SCHEDULER_LONG_JOB_S", str(24 * 3600)))
SCHEDULER_LONG_JOB_PATIENCE_S = float(env_str("SCHEDULER_LONG_JOB_PATIENCE_S", "3600"))
SCHEDULER_INTERVAL_S = float(env_str("SCHEDULER_INTERVAL_S", "1.0"))
# Passes woken by events start at most this often: each reads a snapshot of the fleet and queue, so under a
# steady stream of submissions and exits fewer, larger passes cost less CPU per job, for that much more latency.
SCHEDULER_MIN_PASS_GAP_S = float(env_str("SCHEDULER_MIN_PASS_GAP_S", "0.1"))
FAIRSHARE_HALF_LIFE_S = float(env_str("SCHEDULER_FAIRSHARE_HALF_LIFE_S", str(7 * 24 * 3600)))
