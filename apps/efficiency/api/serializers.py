"""Efficiency API shapes (documented in the OpenAPI schema)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class IdlePolicyOutput(serializers.Serializer[Any]):
    team = serializers.CharField(source="team.slug")
    enabled = serializers.BooleanField()
    warn_after_min = serializers.IntegerField()
    reclaim_after_min = serializers.IntegerField()
    utilization_below_pct = serializers.IntegerField()
    memory_below_pct = serializers.IntegerField()
    applies_to = serializers.ListField(child=serializers.ChoiceField(choices=["reservations", "jobs"]))
    unused_release_after_min = serializers.IntegerField()


class IdlePolicyInput(serializers.Serializer[Any]):
    """Every field optional (PATCH); the service validates and answers in the error shape."""

    enabled = serializers.BooleanField(required=False)
    warn_after_min = serializers.IntegerField(required=False, min_value=1)
    reclaim_after_min = serializers.IntegerField(required=False, min_value=1)
    utilization_below_pct = serializers.IntegerField(required=False, min_value=0, max_value=100)
    memory_below_pct = serializers.IntegerField(required=False, min_value=0, max_value=100)
    applies_to = serializers.ListField(child=serializers.ChoiceField(choices=["reservations", "jobs"]), required=False)
    unused_release_after_min = serializers.IntegerField(required=False, min_value=0)


class EfficiencyFiguresOutput(serializers.Serializer[Any]):
    allocated_gpu_hours = serializers.CharField()
    used_gpu_hours = serializers.CharField(help_text="GPU-hours weighted by mean utilization")
    idle_gpu_hours = serializers.CharField()
    idle_cost = serializers.CharField()
    unknown_utilization_gpu_hours = serializers.CharField(
        help_text="allocated GPU-hours without telemetry: counted neither as used nor as idle"
    )
    reclaimed_gpu_hours = serializers.CharField()
    reclaimed_cost = serializers.CharField()


class EfficiencyMemoryOutput(EfficiencyFiguresOutput):
    memory_peak_pct = serializers.CharField(
        allow_null=True, help_text="mean of the jobs' GPU memory peak / GPU memory, percent"
    )
    jobs_measured = serializers.IntegerField()


class EfficiencyUserOutput(EfficiencyMemoryOutput):
    user = serializers.CharField()


class EfficiencyWorstOutput(serializers.Serializer[Any]):
    kind = serializers.ChoiceField(choices=["job", "reservation"])
    id = serializers.IntegerField()
    user = serializers.CharField()
    allocated_gpu_hours = serializers.CharField()
    idle_gpu_hours = serializers.CharField()
    idle_cost = serializers.CharField()
    memory_peak_mib = serializers.IntegerField(allow_null=True)
    memory_allocated_mib = serializers.IntegerField(allow_null=True)


class EfficiencyTeamOutput(EfficiencyMemoryOutput):
    team = serializers.CharField()
    name = serializers.CharField()
    by_user = EfficiencyUserOutput(many=True)
    worst = EfficiencyWorstOutput(many=True)


class EfficiencyReportOutput(serializers.Serializer[Any]):
    month = serializers.CharField()
    currency = serializers.CharField()
    teams = EfficiencyTeamOutput(many=True)
    totals = EfficiencyFiguresOutput()


class WaitlistInput(serializers.Serializer[Any]):
    team = serializers.SlugField()
    gpu_model = serializers.CharField(max_length=64)
    gpu_count = serializers.IntegerField(min_value=1, max_value=64, default=1)
    mig_profile = serializers.CharField(
        max_length=32, required=False, allow_null=True, default=None, help_text="wait for instances of this MIG profile"
    )
    gpu_share = serializers.FloatField(
        min_value=0,
        max_value=1,
        required=False,
        allow_null=True,
        default=None,
        help_text="wait for this share of one GPU",
    )
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    auto_book = serializers.BooleanField(default=False, help_text="book at once when GPUs free up (else: notify)")
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class WaitlistOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    team = serializers.CharField(source="team.slug")
    user = serializers.CharField(source="user.username")
    gpu_model = serializers.CharField(source="gpu_model.name")
    gpu_count = serializers.IntegerField()
    mig_profile = serializers.SerializerMethodField()
    gpu_share = serializers.SerializerMethodField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    auto_book = serializers.BooleanField()
    note = serializers.CharField()
    state = serializers.CharField()
    reservation_id = serializers.IntegerField(allow_null=True)
    created_at = serializers.DateTimeField()

    def get_mig_profile(self, entry: Any) -> str | None:
        return entry.mig_profile or None

    def get_gpu_share(self, entry: Any) -> float | None:
        return None if entry.gpu_share is None else float(entry.gpu_share)
