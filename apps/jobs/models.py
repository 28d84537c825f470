"""Jobs, their state timeline and logs, the container image allow-list and per-team job policy."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.accounts.scoping import ScopedQuerySet


class JobState(models.TextChoices):
    QUEUED = "queued", "Queued"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    LOST = "lost", "Lost"


class JobReason(models.TextChoices):
    EXIT_CODE = "exit_code", "Exit code"
    OOM = "oom", "Out of memory"
    TIMEOUT = "timeout", "Timed out"
    NODE_LOST = "node_lost", "Node lost"
    PREEMPTED = "preempted", "Preempted"
    LAUNCH_ERROR = "launch_error", "Launch error"
    CANCELLED = "cancelled", "Cancelled"
    IDLE = "idle", "Reclaimed while idle"


ACTIVE_STATES = frozenset({JobState.QUEUED, JobState.STARTING, JobState.RUNNING})
ON_NODE_STATES = frozenset({JobState.STARTING, JobState.RUNNING})
TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST})

# The state machine. Terminal states are final: a job marked lost whose container turns up again is stopped on
# its node (reconciliation), never revived, because its GPUs may already run someone else's job.
# starting → succeeded/failed is legal: a job that ends within milliseconds may report its exit before the
# "started" report is applied (the control queue has more than one consumer).
TRANSITIONS: dict[str, frozenset[str]] = {
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.CANCELLED, JobState.FAILED}),
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST}
    ),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.LOST: frozenset(),
}


class ContainerImageQuerySet(ScopedQuerySet["ContainerImage"]):
    team_path = None


class ContainerImage(models.Model):
    """A container image admins allow jobs to run, with the host mounts a job of that image may ask for."""

    name = models.CharField(max_length=255, unique=True, help_text="image reference, e.g. pytorch/pytorch:2.4")
    description = models.CharField(max_length=500, blank=True)
    allowed_mounts = models.JSONField(
        default=list,
        blank=True,
        help_text='list of {"host_path": "/data", "container_path": "/data", "read_only": true}',
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ContainerImageQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TeamJobPolicyQuerySet(ScopedQuerySet["TeamJobPolicy"]):
    team_path = "team"


class TeamJobPolicy(models.Model):
    """A team's job limits (admins set them); teams without a row get the installation defaults."""

    team = models.OneToOneField("accounts.Team", on_delete=models.CASCADE, related_name="job_policy")
    max_priority = models.IntegerField(default=10, help_text="highest priority members may ask for")
    max_duration_s = models.PositiveIntegerField(null=True, blank=True, help_text="empty: installation default")
    max_gpus_per_job = models.PositiveIntegerField(null=True, blank=True)
    max_queued_jobs = models.PositiveIntegerField(null=True, blank=True)

    objects = TeamJobPolicyQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "team job policies"

    def __str__(self) -> str:
        return f"job policy of {self.team}"


class JobQuerySet(ScopedQuerySet["Job"]):
    team_path = "team"

    def active(self) -> JobQuerySet:
        return self.filter(state__in=ACTIVE_STATES)

    def on_nodes(self) -> JobQuerySet:
        return self.filter(state__in=ON_NODE_STATES)


class Job(models.Model):
    """A containerized command run on whole GPUs of one node, from submission to its final state."""

    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="jobs")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200, blank=True)
    image = models.CharField(max_length=255)
    command = models.JSONField(help_text="argv list, never a shell string")
    env = models.JSONField(default=dict, blank=True)
    mounts = models.JSONField(default=list, blank=True)
    gpu_count = models.PositiveSmallIntegerField()
    gpu_models = models.JSONField(default=list, blank=True, help_text="acceptable GPU model names; empty: any")
    # A part of a GPU instead of whole GPUs (gpu_count 1): a MIG instance of this profile, or this fraction of a
    # shared GPU (apps.jobs.scheduler.parts places them).
    mig_profile = models.CharField(max_length=32, blank=True, help_text="a MIG instance of this profile")
    gpu_share = models.DecimalField(
        max_digits=7, decimal_places=6, null=True, blank=True, help_text="this fraction of one shared GPU"
    )
    # Or any MIG instance with at least this much memory: the smallest profile free when it starts (which then
    # becomes its `mig_profile`).
    mig_memory_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="any MIG instance with at least this much memory (MiB)"
    )
    cpus = models.DecimalField(max_digits=6, decimal_places=2)
    memory_mib = models.PositiveIntegerField()
    max_duration_s = models.PositiveIntegerField()
    priority = models.IntegerField(default=0)
    reservation = models.ForeignKey(
        "booking.Reservation", null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    reason = models.CharField(max_length=16, choices=JobReason.choices, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    message = models.TextField(blank=True, help_text="why it ended, or the engine's words for a launch error")
    pending_reason = models.CharField(max_length=40, blank=True, help_text="scheduler's code while queued")
    pending_message = models.CharField(max_length=300, blank=True)
    stop_reason = models.CharField(
        max_length=16, choices=JobReason.choices, blank=True, help_text="why the portal asked the node to stop it"
    )
    stop_requested_at = models.DateTimeField(null=True, blank=True)

    node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs")
    gpus = models.ManyToManyField("fleet.Gpu", blank=True, related_name="jobs")
    handle = models.CharField(max_length=128, blank=True, help_text="container id or pid on the node")
    gpu_memory_own_peak_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="peak GPU memory of the job's own processes, as its node attributes it"
    )
    launch_sent_at = models.DateTimeField(null=True, blank=True)
    launch_attempts = models.PositiveSmallIntegerField(default=0)
    # Price of the job's GPUs per hour, fixed when it starts (cost so far = GPU-hours x this).
    hourly_price = models.DecimalField(max_digits=12, decimal_places=4, default=Decimal("0"))

    submitted_at = models.DateTimeField(auto_now_add=True, db_index=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    idempotency_key = models.CharField(max_length=255, blank=True)

    # Logs. The agent numbers a job's lines from 1 per attachment (`epoch`: a launch or an adoption); the portal
    # stores line n of the current epoch at seq log_base + n, so a batch that arrives late (a worker took the next
    # one first, or the agent sent it again after a broker outage) falls into its place, and a copy is skipped.
    # log_seq: the highest stored seq; log_agent_seq: the highest agent number seen in the current epoch.
    log_seq = models.BigIntegerField(default=0)
    log_epoch = models.CharField(max_length=40, blank=True)
    log_base = models.BigIntegerField(default=0)
    log_agent_seq = models.BigIntegerField(default=0)
    log_expected = models.BigIntegerField(null=True, blank=True, help_text="agent's line count at exit")

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["state", "submitted_at"], name="job_state_submitted"),
            models.Index(fields=["team", "state"], name="job_team_state"),
            models.Index(fields=["node", "state"], name="job_node_state"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="job_unique_user_idempotency_key",
            ),
            models.CheckConstraint(condition=Q(gpu_count__gte=1), name="job_gpu_count_positive"),
            models.CheckConstraint(condition=Q(max_duration_s__gte=1), name="job_max_duration_positive"),
            models.CheckConstraint(condition=Q(state__in=JobState.values), name="job_state_valid"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.name or self.image})"

    def on_part(self) -> bool:
        """Does the job ask for a MIG instance (by profile or by memory) or a share of a GPU, not whole GPUs?"""
        return bool(self.mig_profile) or self.gpu_share is not None or self.mig_memory_mib is not None

    @property
    def size_text(self) -> str:
        """What the job asks for, short, for lists: "2 GPUs", "1g.10gb instance", "0.25 of a GPU"."""
        if self.mig_profile:
            return f"{self.mig_profile} instance"
        if self.gpu_share is not None:
            return f"{self.gpu_share.normalize():f} of a GPU"
        if self.mig_memory_mib is not None:
            return f"MIG instance of {self.mig_memory_mib} MiB+"
        return f"{self.gpu_count} GPU{'' if self.gpu_count == 1 else 's'}"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def logs_complete(self) -> bool:
        """All the lines the node reported have been stored (a follower may stop reading)."""
        if not self.is_terminal:
            return False
        if self.log_expected is None:
            return self.state in {JobState.LOST, JobState.CANCELLED} or self.reason == JobReason.LAUNCH_ERROR
        return self.log_agent_seq >= self.log_expected

    def runtime_seconds(self, now: datetime) -> float:
        if self.started_at is None:
            return 0.0
        end = self.ended_at or now
        return max(0.0, (end - self.started_at).total_seconds())

    def gpu_seconds(self, now: datetime) -> float:
        return self.runtime_seconds(now) * self.gpu_count

    def cost(self, now: datetime) -> Decimal:
        """GPU-hours so far x the job's GPUs' hourly price (until billing owns the ledger)."""
        seconds = Decimal(str(round(self.runtime_seconds(now), 3)))
        return (seconds / Decimal(3600) * self.hourly_price).quantize(Decimal("0.0001"))


class JobEventQuerySet(ScopedQuerySet["JobEvent"]):
    team_path = "job__team"


class JobEvent(models.Model):
    """One state change of a job: the timeline on the job page."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_index=True)
    from_state = models.CharField(max_length=16, choices=JobState.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=JobState.choices)
    reason = models.CharField(max_length=16, choices=JobReason.choices, blank=True)
    message = models.TextField(blank=True)

    objects = JobEventQuerySet.as_manager()

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_state or '-'} → {self.to_state}"


class LogStream(models.TextChoices):
    STDOUT = "stdout", "stdout"
    STDERR = "stderr", "stderr"


class JobLogLineQuerySet(ScopedQuerySet["JobLogLine"]):
    team_path = "job__team"


class JobLogLine(models.Model):
    """One line a job printed, numbered per job; only the newest lines are kept (see conf.MAX_LOG_LINES)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_lines")
    seq = models.BigIntegerField()
    stream = models.CharField(max_length=6, choices=LogStream.choices, default=LogStream.STDOUT)
    at = models.DateTimeField()
    line = models.TextField()

    objects = JobLogLineQuerySet.as_manager()

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="joblogline_unique_job_seq")]

    def __str__(self) -> str:
        return f"job {self.job_id}, line {self.seq}"


class SchedulerState(models.Model):
    """The scheduler's singleton row: the fencing token of the current leader and the last pass's numbers."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    fence = models.BigIntegerField(default=0, help_text="highest leader token that applied decisions")
    leader = models.CharField(max_length=200, blank=True)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    last_pass_ms = models.FloatField(default=0)
    last_started = models.PositiveIntegerField(default=0)
    pending = models.PositiveIntegerField(default=0)
    passes = models.BigIntegerField(default=0)
    # Bumped by a change of how GPUs are split (apps.booking.services.layout) in the change's transaction: a pass
    # whose snapshot read another number starts nothing (its placements were made on the old layout).
    layout_version = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"scheduler (leader {self.leader or '-'})"
