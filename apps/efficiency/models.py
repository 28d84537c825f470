"""Efficiency: each team's idle policy, exemptions, what the detector saw and did per allocation, and the
waitlist for GPUs refused for lack of capacity."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.accounts.scoping import ScopedQuerySet


def default_applies_to() -> list[str]:
    return ["reservations", "jobs"]


class IdlePolicyQuerySet(ScopedQuerySet["IdlePolicy"]):
    team_path = "team"


class IdlePolicy(models.Model):
    """A team's idle limits; a team without a row gets the defaults below (see docs/efficiency.md)."""

    team = models.OneToOneField("accounts.Team", on_delete=models.CASCADE, related_name="idle_policy")
    enabled = models.BooleanField(default=True)
    warn_after_min = models.PositiveIntegerField(
        default=60, help_text="mean utilization below the threshold over this many minutes: the holder is warned"
    )
    reclaim_after_min = models.PositiveIntegerField(
        default=15, help_text="then this many minutes without a busy minute: reclaimed"
    )
    utilization_below_pct = models.PositiveSmallIntegerField(default=5, help_text="a minute below this is idle")
    memory_below_pct = models.PositiveSmallIntegerField(
        default=10,
        help_text="memory below this share of the GPU's is empty; above it the GPU is loaded (longer window)",
    )
    applies_to = models.JSONField(default=default_applies_to, help_text='any of "reservations", "jobs"')
    unused_release_after_min = models.PositiveIntegerField(
        default=30, help_text="a reservation whose GPUs are not used this long after its start is released"
    )
    updated_at = models.DateTimeField(auto_now=True)

    objects = IdlePolicyQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "idle policies"

    def __str__(self) -> str:
        return f"idle policy of {self.team}"


class SourceKind(models.TextChoices):
    RESERVATION = "reservation", "Reservation"
    JOB = "job", "Job"


class IdleExemptionQuerySet(ScopedQuerySet["IdleExemption"]):
    team_path = "team"


class IdleExemption(models.Model):
    """A reservation or job marked interactive (more minutes before reclaim) or exempt (never reclaimed)."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=SourceKind.choices)
    source_id = models.BigIntegerField()
    extra_min = models.PositiveIntegerField(
        null=True, blank=True, help_text="more minutes before warning and reclaim; empty = never reclaimed"
    )
    reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = IdleExemptionQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "source_id"], name="efficiency_exemption_unique")]

    def __str__(self) -> str:
        return f"{self.kind} {self.source_id} exempt from idle reclaim"


class MarkState(models.TextChoices):
    WARNED = "warned", "Warned"
    RECLAIMED = "reclaimed", "Reclaimed"
    CLEARED = "cleared", "Busy again"
    UNUSED = "unused", "Released unused"


class IdleMarkQuerySet(ScopedQuerySet["IdleMark"]):
    team_path = "team"


class IdleMark(models.Model):
    """What the idle detector did to one reservation or job: warned it, reclaimed it, or released it unused."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    kind = models.CharField(max_length=16, choices=SourceKind.choices)
    source_id = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=MarkState.choices)
    gpu_count = models.PositiveSmallIntegerField(default=1)
    idle_since = models.DateTimeField(null=True, blank=True)
    loaded = models.BooleanField(default=False, help_text="memory was held while idle (the longer limit applied)")
    warned_at = models.DateTimeField(null=True, blank=True)
    reclaim_at = models.DateTimeField(null=True, blank=True, help_text="when it will be reclaimed if still idle")
    reclaimed_at = models.DateTimeField(null=True, blank=True)
    reclaimed_gpu_hours = models.DecimalField(max_digits=12, decimal_places=4, default=0)
    reclaimed_cost = models.DecimalField(max_digits=14, decimal_places=4, default=0)
    updated_at = models.DateTimeField(auto_now=True)

    objects = IdleMarkQuerySet.as_manager()

    class Meta:
        ordering = ["-updated_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["kind", "source_id"], name="efficiency_mark_unique_source")]
        indexes = [models.Index(fields=["state", "user"], name="efficiency_mark_state_user")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.source_id} {self.state}"


class WaitState(models.TextChoices):
    WAITING = "waiting", "Waiting"
    NOTIFIED = "notified", "Notified"
    BOOKED = "booked", "Booked"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


class WaitlistQuerySet(ScopedQuerySet["WaitlistEntry"]):
    team_path = "team"


class WaitlistEntry(models.Model):
    """A booking refused for lack of GPUs, waiting for GPUs of that model (or slices of them: MIG instances of a
    profile, a share of one GPU) in that window (first come first served)."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    gpu_model = models.ForeignKey("fleet.GpuModel", on_delete=models.PROTECT, related_name="+")
    gpu_count = models.PositiveSmallIntegerField()
    # A slice of a GPU instead of whole GPUs: `gpu_count` instances of a MIG profile, or a share of one GPU.
    mig_profile = models.CharField(max_length=32, blank=True, default="")
    gpu_share = models.DecimalField(max_digits=7, decimal_places=6, null=True, blank=True)
    start = models.DateTimeField()
    end = models.DateTimeField()
    auto_book = models.BooleanField(default=False, help_text="book at once when GPUs free up (else: notify)")
    note = models.CharField(max_length=500, blank=True)
    state = models.CharField(max_length=16, choices=WaitState.choices, default=WaitState.WAITING)
    reservation_id = models.BigIntegerField(null=True, blank=True, help_text="the reservation booked for it")
    created_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    objects = WaitlistQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="efficiency_wait_end_after_start"),
            models.CheckConstraint(condition=Q(gpu_count__gte=1), name="efficiency_wait_count_positive"),
            models.CheckConstraint(
                condition=Q(mig_profile="") | Q(gpu_share__isnull=True), name="efficiency_wait_one_kind_of_slice"
            ),
            models.CheckConstraint(
                condition=Q(gpu_share__isnull=True) | (Q(gpu_share__gt=0) & Q(gpu_share__lte=1) & Q(gpu_count=1)),
                name="efficiency_wait_share_of_one_gpu",
            ),
        ]
        indexes = [models.Index(fields=["state", "gpu_model", "start"], name="efficiency_wait_state_model")]

    def __str__(self) -> str:
        return f"wait {self.gpu_count} x {self.gpu_model_id} {self.start:%Y-%m-%d %H:%M}"
