"""Plain data the scheduling core reads and writes: a snapshot in, decisions out.

Why frozen dataclasses of strings and floats: the same core runs under the ORM shell (wall-clock time,
database ids) and under the trace replay in ``bench/`` (simulated time, thousands of passes), so it
cannot touch Django, and its input must be cheap to build and impossible to mutate behind its back.
Times are epoch seconds as floats; the shell converts its timezone-aware datetimes at the edge.
Ids are strings (the shell passes ``str(pk)``) so that ties sort the same way on every run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

INF = math.inf


@dataclass(frozen=True, slots=True)
class Gpu:
    """One schedulable GPU. Capacity and free capacity are in slices: a whole GPU is 1.0.

    A job takes whole GPUs, so a GPU is free for it only when ``free`` is a whole slice (1.0).
    The shell leaves out GPUs of offline or draining nodes. ``split``: admins split it in shares for fractional
    jobs; a whole-GPU job may take it (all its shares free), but only where no node gives it exclusive GPUs.
    ``in_use_outside``: free in the portal, but something started outside it uses its memory (telemetry); a job
    takes such a GPU of a node only after the node's others.
    """

    id: str
    node: str
    model: str
    capacity: float = 1.0
    free: float = 1.0
    split: bool = False
    in_use_outside: bool = False


@dataclass(frozen=True, slots=True)
class Reservation:
    """A portal booking: these GPUs belong to ``team`` over [start, end)."""

    id: str
    team: str
    gpu_ids: frozenset[str]
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds GPUs now; it is expected to end by ``start + max_duration_s`` (its hard limit)."""

    id: str
    team: str
    gpu_ids: tuple[str, ...]
    start: float
    max_duration_s: float
    reservation_id: str | None = None

    @property
    def expected_end(self) -> float:
        """The latest time the job can still hold its GPUs: backfill plans against it."""
        return self.start + self.max_duration_s


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A queued job. ``models`` is the set of acceptable GPU models, None = any model."""

    id: str
    team: str
    user: str
    gpu_count: int
    max_duration_s: float
    submitted_at: float
    models: frozenset[str] | None = None
    priority: int = 0
    reservation_id: str | None = None
    # A fraction of one GPU in thousandths (with gpu_count 1): 250 = a quarter; 1000 = whole GPUs.
    gpu_milli: int = 1000


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling pass needs, read in one transaction by the shell.

    ``team_usage`` is each team's exponentially decayed GPU-seconds (see ``fairshare``); ``team_shares`` the
    teams' relative shares (any positive scale; a team missing from it gets ``Policy.default_share``).
    Reservations that ended before ``now`` may be left out.
    """

    gpus: tuple[Gpu, ...]
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    team_usage: Mapping[str, float] = field(default_factory=dict)
    team_shares: Mapping[str, float] = field(default_factory=dict)


class ReasonCode(StrEnum):
    """Why a pending job did not start in this pass (shown to users, stored by the shell)."""

    WAITING_FOR_GPUS = "waiting_for_gpus"
    NEXT_IN_LINE = "next_in_line"
    WOULD_DELAY_NEXT = "would_delay_next"
    HELD_BY_RESERVATION = "held_by_reservation"
    BEHIND_HEAD = "behind_head"
    GANG_DOES_NOT_FIT = "gang_does_not_fit"
    RESERVATION_NOT_STARTED = "reservation_not_started"
    RESERVATION_UNKNOWN = "reservation_unknown"
    RESERVATION_OTHER_TEAM = "reservation_other_team"
    OUTSIDE_RESERVATION_WINDOW = "outside_reservation_window"
    WAITING_FOR_RESERVED_GPUS = "waiting_for_reserved_gpus"
    PART_NOT_IN_LAYOUT = "part_not_in_layout"
    """A job on a part (MIG profile, share) that the GPUs, as admins laid them out now, do not give."""
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Reason:
    """A machine-readable code plus a sentence for the user."""

    code: ReasonCode
    message: str


@dataclass(frozen=True, slots=True)
class Start:
    """Start ``job_id`` now on ``gpu_ids`` (all on ``node``).

    ``backfilled`` is True when the job jumped ahead of the job holding the planned (shadow) start.
    """

    job_id: str
    node: str
    gpu_ids: tuple[str, ...]
    expected_end: float
    backfilled: bool = False
    milli: int = 1000  # thousandths of its GPU a fractional job takes (placement.ShareState); 1000 = whole GPUs


class StopReason(StrEnum):
    """Why a running job must be stopped."""

    TIMEOUT = "timeout"
    RESERVATION_ENDED = "reservation_ended"


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the running job ``job_id``."""

    job_id: str
    reason: StopReason


@dataclass(frozen=True, slots=True)
class PlannedStart:
    """The backfill (shadow) reservation of the first job that could not start: nobody may delay it."""

    job_id: str
    node: str
    gpu_ids: tuple[str, ...]
    start: float


@dataclass(frozen=True, slots=True)
class Decisions:
    """What one pass decided. ``pending_reasons`` has an entry for every pending job that did not start
    (with ``explain=False`` only for the head, invalid, infeasible and reservation-bound ones).

    ``considered`` counts the jobs the pass evaluated (placed, or found unable to start), for benchmarks;
    jobs that strict FIFO leaves behind a blocked head are not evaluated and not counted.
    """

    starts: tuple[Start, ...]
    stops: tuple[Stop, ...] = ()
    pending_reasons: Mapping[str, Reason] = field(default_factory=dict)
    planned: PlannedStart | None = None
    considered: int = 0
