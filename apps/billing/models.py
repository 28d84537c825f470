"""Billing: prices with validity periods, the usage ledger, month closes, budget alerts and notifications.

The ledger (`UsageRecord`) is derived from `booking.Allocation`: one row per allocation, GPU and piece, where a
piece is the part of the allocation inside one local day at one price (apps/billing/costing.py). Rows are only
ever inserted (`INSERT ... ON CONFLICT DO NOTHING` on the unique source/GPU/start key, so a retried or doubled
task cannot bill twice), with one audited exception: a price change dated into the open month re-rates that
month's rows after it (apps.billing.services.price_set). Closed months never change.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from apps.accounts.scoping import ScopedQuerySet, managed_team_ids_of, team_ids_of
from apps.accounts.types import AnyUser


class SourceKind(models.TextChoices):
    JOB = "job", "Job"
    RESERVATION = "reservation", "Reservation"
    # A job submitted to a Slurm pool outside the portal, billed from sacct under its account (apps/pools).
    SLURM = "slurm", "Slurm job"


class MonthStatus(models.TextChoices):
    CLOSED = "closed", "Closed"
    REOPENED = "reopened", "Re-opened"


class NotificationLevel(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    DANGER = "danger", "Danger"


class PriceQuerySet(ScopedQuerySet["Price"]):
    # Prices are public to every signed-in user, like the GPU models' list prices.
    team_path = None


class Price(models.Model):
    """A GPU model's hourly price from `valid_from` until the model's next price (history, never edited)."""

    gpu_model = models.ForeignKey("fleet.GpuModel", on_delete=models.PROTECT, related_name="prices")
    valid_from = models.DateTimeField(help_text="applies from this instant (a date means local midnight)")
    hourly_price = models.DecimalField(max_digits=12, decimal_places=4)
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = PriceQuerySet.as_manager()

    class Meta:
        ordering = ["gpu_model_id", "valid_from"]
        constraints = [
            models.UniqueConstraint(fields=["gpu_model", "valid_from"], name="billing_price_unique_model_from"),
            models.CheckConstraint(condition=Q(hourly_price__gte=0), name="billing_price_not_negative"),
        ]

    def __str__(self) -> str:
        since = timezone.localtime(self.valid_from)
        price = self.hourly_price.quantize(Decimal("0.01")) if self.hourly_price is not None else "?"
        return f"{self.gpu_model} at {price} {settings.PORTAL_CURRENCY}/h from {since:%Y-%m-%d %H:%M}"


class MigProfilePriceQuerySet(ScopedQuerySet["MigProfilePrice"]):
    team_path = None


class MigProfilePrice(models.Model):
    """An admin's hourly price for one MIG instance of a profile on a GPU model. Without one, an instance bills at
    the GPU's price x its compute fraction (1g = 1/7)."""

    gpu_model = models.ForeignKey("fleet.GpuModel", on_delete=models.CASCADE, related_name="+")
    profile = models.CharField(max_length=32, help_text="e.g. 1g.10gb")
    hourly_price = models.DecimalField(max_digits=12, decimal_places=4)

    objects = MigProfilePriceQuerySet.as_manager()

    class Meta:
        ordering = ["gpu_model__name", "profile"]
        constraints = [models.UniqueConstraint(fields=["gpu_model", "profile"], name="billing_mig_price_unique")]

    def __str__(self) -> str:
        return f"{self.gpu_model} MIG {self.profile} at {self.hourly_price}/h"


class UsageRecordQuerySet(ScopedQuerySet["UsageRecord"]):
    team_path = "team"

    def visible_to(self, user: AnyUser) -> UsageRecordQuerySet:
        """Admins: every row. Managers: their teams' rows. Members: their own rows in their teams (a member sees
        the team's totals on the team page, not who spent what)."""
        if not user.is_authenticated or not user.is_active:
            return self.none()
        if user.is_staff:
            return self
        managed = managed_team_ids_of(user)
        return self.filter(Q(team_id__in=managed) | Q(team_id__in=team_ids_of(user), user_id=user.pk))


class UsageRecord(models.Model):
    """One ledger row: one GPU held by one job or reservation over [start, end), inside one local day, one price."""

    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="+")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.PROTECT, related_name="+")
    gpu_model = models.ForeignKey("fleet.GpuModel", on_delete=models.PROTECT, related_name="+")
    source = models.CharField(max_length=16, choices=SourceKind.choices)
    source_id = models.BigIntegerField(help_text="the job's or reservation's id")
    allocation = models.ForeignKey(
        "booking.Allocation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    day = models.DateField(help_text="local date (settings.TIME_ZONE) the row lies in")
    month = models.DateField(help_text="first day of the local month")
    gpu_seconds = models.PositiveIntegerField(help_text="seconds held x share (a quarter of a GPU for an hour: 900)")
    share = models.DecimalField(
        max_digits=7, decimal_places=6, default=1, help_text="of the physical GPU: 1 whole, 1/7 a 1g MIG instance"
    )
    hourly_price = models.DecimalField(max_digits=12, decimal_places=4, help_text="of the whole GPU")
    cost = models.DecimalField(max_digits=20, decimal_places=8)
    mean_utilization = models.DecimalField(
        max_digits=7, decimal_places=6, null=True, blank=True, help_text="0..1; empty: no telemetry for the period"
    )
    # On the last row of a reservation the portal released early (idle, unused, scheduler refusal) or of a job it
    # reclaimed while idle: why billing stopped there. Empty on every other row.
    end_reason = models.CharField(max_length=16, blank=True, help_text="why billing stopped early: idle, unused, …")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = UsageRecordQuerySet.as_manager()

    class Meta:
        ordering = ["start", "id"]
        constraints = [
            # The idempotency guarantee: a piece of a source's use of a GPU is billed once, whoever retries.
            models.UniqueConstraint(fields=["source", "source_id", "gpu", "start"], name="billing_usage_unique_piece"),
            models.CheckConstraint(condition=Q(end__gt=models.F("start")), name="billing_usage_end_after_start"),
        ]
        indexes = [
            models.Index(fields=["month", "team"], name="billing_usage_month_team"),
            models.Index(fields=["team", "month", "day"], name="billing_usage_team_month_day"),
            models.Index(fields=["allocation", "end"], name="billing_usage_alloc_end"),
            models.Index(fields=["gpu_model", "end"], name="billing_usage_model_end"),
        ]

    def __str__(self) -> str:
        start = timezone.localtime(self.start)
        return f"{self.source} {self.source_id} on {self.gpu}, {start:%Y-%m-%d %H:%M:%S} ({self.gpu_seconds} s)"


class MonthCloseQuerySet(ScopedQuerySet["MonthClose"]):
    team_path = None


class MonthClose(models.Model):
    """A month's frozen report: while `closed`, its ledger rows, prices and figures never change."""

    month = models.DateField(unique=True, help_text="first day of the local month")
    status = models.CharField(max_length=16, choices=MonthStatus.choices, default=MonthStatus.CLOSED)
    figures = models.JSONField(default=dict, help_text="the frozen per-team aggregates (full precision)")
    cost = models.DecimalField(max_digits=20, decimal_places=8, default=0)
    gpu_seconds = models.BigIntegerField(default=0)
    closed_at = models.DateTimeField()
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reopened_at = models.DateTimeField(null=True, blank=True)
    reopened_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = MonthCloseQuerySet.as_manager()

    class Meta:
        ordering = ["-month"]

    def __str__(self) -> str:
        return f"{self.month:%Y-%m} ({self.status})"


class BudgetAlertQuerySet(ScopedQuerySet["BudgetAlert"]):
    team_path = "team"


class BudgetAlert(models.Model):
    """That a team's month-to-date cost reached a share of its budget; one row per team, month and threshold."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    month = models.DateField()
    threshold = models.PositiveSmallIntegerField(help_text="percent of the budget: 80 or 100")
    budget = models.DecimalField(max_digits=14, decimal_places=2)
    cost = models.DecimalField(max_digits=20, decimal_places=8, help_text="month-to-date cost when it fired")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = BudgetAlertQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["team", "month", "threshold"], name="billing_alert_once_per_month")
        ]

    def __str__(self) -> str:
        return f"{self.team}, {self.month:%Y-%m}: {self.threshold}% of the budget"


class NotificationQuerySet(ScopedQuerySet["Notification"]):
    team_path = "team"


class Notification(models.Model):
    """A message the portal shows a team's members (and admins): budget alerts and the like."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="+")
    level = models.CharField(max_length=16, choices=NotificationLevel.choices, default=NotificationLevel.INFO)
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    link = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = NotificationQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.title
