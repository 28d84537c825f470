"""Booking: reservations, the GPU occupancy table (Allocation), quotas, policy, maintenance, calendar feeds.

`Allocation` is the shared truth of who holds which GPU when. Reservations write it (kind "reservation"), the job
scheduler writes it for jobs that run outside a reservation (kind "job"), billing reads it. Two *active* rows
never overlap on one GPU: an exclusion constraint (btree_gist, migration 0002) makes it impossible. Write rows only
through `apps.booking.services` (`allocations_create`, `allocation_end`, `reservation_create`).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import DateTimeRangeField, RangeOperators
from django.db import models
from django.db.models import Q
from django.utils import timezone

from apps.accounts.scoping import ScopedQuerySet


class TsTzRange(models.Func):
    """`tstzrange(start, end)`: the half-open interval [start, end) of two timestamps."""

    function = "TSTZRANGE"
    output_field = DateTimeRangeField()


def _span(start: datetime, end: datetime) -> str:
    """[start, end) in the installation's time zone, as admins' messages and lists show it."""
    lo, hi = timezone.localtime(start), timezone.localtime(end)
    if lo.date() == hi.date():
        return f"{lo:%Y-%m-%d %H:%M} to {hi:%H:%M}"
    return f"{lo:%Y-%m-%d %H:%M} to {hi:%Y-%m-%d %H:%M}"


class ReservationStatus(models.TextChoices):
    BOOKED = "booked", "Booked"
    ACTIVE = "active", "Active"
    RELEASED = "released", "Released"
    CANCELLED = "cancelled", "Cancelled"


class AllocationKind(models.TextChoices):
    RESERVATION = "reservation", "Reservation"
    JOB = "job", "Job"


class ReservationQuerySet(ScopedQuerySet["Reservation"]):
    team_path = "team"


class Reservation(models.Model):
    """GPUs booked by a team member for [start, end); its GPUs are the rows of `allocations`."""

    # No index of its own: booking_res_team_start (team, start) serves lookups by team (one index less per write).
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="reservations", db_index=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="reservations"
    )
    gpu_model = models.ForeignKey(
        "fleet.GpuModel",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="the model asked for (or of the GPUs named), null when the GPUs named are of several models",
    )
    gpu_count = models.PositiveSmallIntegerField()
    start = models.DateTimeField()
    end = models.DateTimeField(help_text="cut to the release time when released early")
    booked_end = models.DateTimeField(help_text="the end as booked")
    status = models.CharField(max_length=16, choices=ReservationStatus.choices, default=ReservationStatus.BOOKED)
    note = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True, help_text="when it was released or cancelled")
    changed_at = models.DateTimeField(
        null=True, blank=True, help_text="when its end was last moved, or the portal last moved it to other devices"
    )
    released_reason = models.CharField(
        max_length=16,
        blank=True,
        help_text=(
            "why the portal ended it early: idle, unused, empty, scheduler (a pool refused it), layout (a MIG layout"
            " change took its devices) or gpu_gone (its GPU left its node or fell off the bus)"
        ),
    )

    objects = ReservationQuerySet.as_manager()

    class Meta:
        ordering = ["start", "id"]
        indexes = [
            models.Index(fields=["status", "start"], name="booking_res_status_start"),
            models.Index(fields=["status", "end"], name="booking_res_status_end"),
            models.Index(fields=["team", "start"], name="booking_res_team_start"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="booking_res_end_after_start")
        ]

    def __str__(self) -> str:
        model = self.gpu_model.name if self.gpu_model else "GPU"
        return f"#{self.pk} {self.team}: {self.gpu_count} x {model}, {_span(self.start, self.end)}"

    @property
    def size_text(self) -> str:
        """What it holds, short, for lists: "2 x A100-80GB", "1g.10gb instance of A100-80GB", "0.5 of A100-80GB".
        Parts are read from `part_allocations` where a selector preloaded them (`reservations_current_and_upcoming`);
        without it the booking reads as whole GPUs."""
        model = self.gpu_model.name if self.gpu_model else "GPU"
        parts: list[Allocation] = getattr(self, "part_allocations", [])
        if not parts:
            return f"{self.gpu_count} x {model}"
        profiles = sorted({a.gpu.mig_profile for a in parts if a.gpu.mig_profile})
        if profiles:
            n = len(parts)
            return f"{n} {'/'.join(profiles)} instance{'' if n == 1 else 's'} of {model}"
        share = sum((a.gpu.capacity for a in parts), Decimal(0))
        return f"{share.normalize():f} of {model}"


class AllocationQuerySet(ScopedQuerySet["Allocation"]):
    team_path = "team"

    def active(self) -> AllocationQuerySet:
        return self.filter(active=True)

    def overlapping(self, start: object, end: object) -> AllocationQuerySet:
        """Rows whose [start, end) intersects [start, end) (touching ends do not overlap)."""
        return self.filter(start__lt=end, end__gt=start)


class Allocation(models.Model):
    """One GPU held by a team for [start, end), by a reservation or a job; active rows never overlap per GPU."""

    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.PROTECT, related_name="allocations")
    # No index of its own: booking_alloc_team_start (team, start) serves lookups by team.
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="allocations", db_index=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    kind = models.CharField(max_length=16, choices=AllocationKind.choices)
    reservation = models.ForeignKey(
        Reservation, null=True, blank=True, on_delete=models.PROTECT, related_name="allocations"
    )
    # Becomes a ForeignKey to jobs.Job once the jobs app exists (the jobs engineer's migration).
    job_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    start = models.DateTimeField()
    end = models.DateTimeField(help_text="cut short on early release or when the job ends")
    # Cancelled rows leave the exclusion constraint (it applies WHERE active) but stay for the record.
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True, help_text="when it was cut short or cancelled")

    objects = AllocationQuerySet.as_manager()

    class Meta:
        ordering = ["start", "gpu_id"]
        indexes = [
            models.Index(fields=["gpu", "end"], condition=Q(active=True), name="booking_alloc_gpu_end_active"),
            models.Index(fields=["team", "start"], name="booking_alloc_team_start"),
            models.Index(fields=["start", "end"], name="booking_alloc_window"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="booking_alloc_end_after_start"),
            models.CheckConstraint(
                condition=Q(kind="reservation", reservation__isnull=False) | Q(kind="job", reservation__isnull=True),
                name="booking_alloc_kind_source",
            ),
            # Created by migration 0002 (with the btree_gist extension it needs); declared here so that the
            # model states every rule the database enforces.
            ExclusionConstraint(
                name="booking_allocation_no_overlap",
                expressions=[("gpu", RangeOperators.EQUAL), (TsTzRange("start", "end"), RangeOperators.OVERLAPS)],
                condition=Q(active=True),
            ),
        ]

    def __str__(self) -> str:
        source = f"reservation #{self.reservation_id}" if self.reservation_id else f"job {self.job_id}"
        return f"{self.gpu} for {self.team} ({source}), {_span(self.start, self.end)}"


class QuotaQuerySet(ScopedQuerySet["Quota"]):
    team_path = "team"


class Quota(models.Model):
    """A team's limits for one calendar month (`month` = its first day) or, with no month, for every month."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="quotas")
    month = models.DateField(null=True, blank=True, help_text="first day of the month; empty = every month")
    gpu_hours = models.DecimalField(
        max_digits=12, decimal_places=2, null=True, blank=True, help_text="GPU-hours per month; empty = unlimited"
    )
    max_concurrent_gpus = models.PositiveIntegerField(null=True, blank=True, help_text="empty = unlimited")
    allowed_models = models.ManyToManyField(
        "fleet.GpuModel", blank=True, related_name="+", help_text="none selected = every model"
    )
    budget_soft = models.DecimalField(
        max_digits=14, decimal_places=2, null=True, blank=True, help_text="warn above this (PORTAL_CURRENCY)"
    )
    budget_hard = models.DecimalField(
        max_digits=14, decimal_places=2, null=True, blank=True, help_text="refuse above this (PORTAL_CURRENCY)"
    )
    updated_at = models.DateTimeField(auto_now=True)

    objects = QuotaQuerySet.as_manager()

    class Meta:
        ordering = ["team__slug", "month"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "month"], condition=Q(month__isnull=False), name="booking_quota_unique_team_month"
            ),
            models.UniqueConstraint(
                fields=["team"], condition=Q(month__isnull=True), name="booking_quota_unique_team_default"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.team}, {self.month:%Y-%m}" if self.month else f"{self.team}, every month"


class QuotaUsageQuerySet(ScopedQuerySet["QuotaUsage"]):
    team_path = "team"


# How many rows a team's usage of one month may be spread over (see QuotaUsage.slot).
USAGE_SLOTS = 8


class QuotaUsage(models.Model):
    """What a team has booked (held) against its quota in one month: the sum of its rows (`slot`s) for the month.

    Slot 0 is the row every quota check locks (all slots of the month, in fact) and writes. Amounts counted without
    a check (teams without amount limits, refunds at a job's end) go to any slot not locked at that moment: with one
    row, every submission and every job end of a team queued on its lock (under load, backends waited for that
    row most of the time), see services.quotas.add_usage."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="quota_usage")
    month = models.DateField(help_text="first day of the month in settings.TIME_ZONE")
    slot = models.PositiveSmallIntegerField(default=0)
    gpu_hours = models.DecimalField(max_digits=16, decimal_places=4, default=Decimal("0"))
    cost = models.DecimalField(max_digits=16, decimal_places=4, default=Decimal("0"))
    updated_at = models.DateTimeField(auto_now=True)

    objects = QuotaUsageQuerySet.as_manager()

    class Meta:
        ordering = ["team_id", "month", "slot"]
        constraints = [
            models.UniqueConstraint(fields=["team", "month", "slot"], name="booking_usage_unique_team_month_slot")
        ]

    def __str__(self) -> str:
        return f"{self.team}, {self.month:%Y-%m} (slot {self.slot})"


class QuotaHoldQuerySet(ScopedQuerySet["QuotaHold"]):
    team_path = "team"


class QuotaHold(models.Model):
    """What one reservation or job counts against its team's quota: `gpus` x [start, end) at hourly_rate."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=AllocationKind.choices)
    reservation = models.OneToOneField(
        Reservation, null=True, blank=True, on_delete=models.CASCADE, related_name="quota_hold"
    )
    job_id = models.BigIntegerField(null=True, blank=True, unique=True)
    gpu_count = models.PositiveSmallIntegerField()
    gpus = models.DecimalField(
        max_digits=10,
        decimal_places=6,
        help_text="GPUs counted against the quota: a whole GPU 1, a part its fraction (1g MIG = 1/7)",
    )
    hourly_rate = models.DecimalField(max_digits=12, decimal_places=4, help_text="price of all its GPUs per hour")
    start = models.DateTimeField()
    end = models.DateTimeField()
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = QuotaHoldQuerySet.as_manager()

    class Meta:
        ordering = ["start"]

    def __str__(self) -> str:
        source = f"reservation #{self.reservation_id}" if self.reservation_id else f"job {self.job_id}"
        return f"{self.team}: {self.gpu_count} GPU for {source}, {_span(self.start, self.end)}"


class BookingPolicy(models.Model):
    """The installation's booking rules (one row, pk 1, edited by admins)."""

    min_duration_minutes = models.PositiveIntegerField(default=15)
    max_duration_hours = models.PositiveIntegerField(default=24 * 14)
    max_advance_days = models.PositiveIntegerField(default=90, help_text="how far ahead a booking may start")
    granularity_minutes = models.PositiveIntegerField(default=15, help_text="start and end align to this")
    end_grace_minutes = models.PositiveIntegerField(
        default=5, help_text="a team's jobs on a reservation's GPUs are stopped this long after it ends"
    )
    allow_multi_node = models.BooleanField(
        default=True, help_text="a booking may span nodes when no single node has enough free GPUs"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "booking policy"

    def __str__(self) -> str:
        return "Booking policy"


class MaintenanceWindowQuerySet(ScopedQuerySet["MaintenanceWindow"]):
    team_path = None


class MaintenanceWindow(models.Model):
    """A time when GPUs cannot be booked: one GPU, a whole node, or (neither set) the whole fleet."""

    start = models.DateTimeField()
    end = models.DateTimeField()
    node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    gpu = models.ForeignKey("fleet.Gpu", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = MaintenanceWindowQuerySet.as_manager()

    class Meta:
        ordering = ["start"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="booking_maint_end_after_start")
        ]

    def __str__(self) -> str:
        what = self.gpu or self.node or "whole fleet"
        return f"maintenance of {what}, {_span(self.start, self.end)}"


class CalendarFeed(models.Model):
    """A user's secret iCal feed: the URL carries a random key; only its SHA-256 is stored."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="calendar_feed")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"calendar feed of {self.user}"

    @staticmethod
    def key_digest(key: str) -> str:
        """What is stored of a feed's key, and what a feed URL's key is looked up by."""
        return hashlib.sha256(key.encode()).hexdigest()
