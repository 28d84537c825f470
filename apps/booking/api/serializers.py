"""Input and output shapes of the booking API."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import serializers

from apps.booking.models import Reservation
from apps.fleet.models import Gpu
from portal.internals.drf_output import FastOutputMixin


class ReservationInput(serializers.Serializer[Any]):
    team = serializers.SlugField(help_text="team slug")
    gpu_count = serializers.IntegerField(min_value=1, max_value=1024, required=False, allow_null=True)
    gpu_model = serializers.CharField(max_length=64, required=False, allow_null=True, allow_blank=True)
    gpus = serializers.ListField(
        child=serializers.CharField(max_length=96),
        required=False,
        allow_empty=True,
        max_length=256,
        help_text="GPU uuids, instead of gpu_count + gpu_model",
    )
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    mig_profile = serializers.CharField(
        max_length=32, required=False, allow_null=True, help_text="book MIG instances of this profile, e.g. 1g.10gb"
    )
    gpu_share = serializers.FloatField(
        min_value=0, max_value=1, required=False, allow_null=True, help_text="book this fraction of one shared GPU"
    )
    mig_memory_mib = serializers.IntegerField(
        min_value=1,
        max_value=1 << 24,
        required=False,
        allow_null=True,
        help_text="book MIG instances with at least this much memory (the smallest profile that has them free)",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("mig_profile") or attrs.get("gpu_share") is not None or attrs.get("mig_memory_mib") is not None:
            return attrs  # parts of GPUs: of any model unless one is given (services.devices)
        if not attrs.get("gpus") and not attrs.get("gpu_model"):
            raise serializers.ValidationError({"gpu_model": ["Give gpu_model (with gpu_count) or gpus."]})
        if not attrs.get("gpus") and attrs.get("gpu_count") is None:
            raise serializers.ValidationError({"gpu_count": ["Required with gpu_model."]})
        return attrs


class ReservationOutput(FastOutputMixin, serializers.ModelSerializer[Reservation]):
    team = serializers.CharField(source="team.slug")
    user = serializers.SerializerMethodField()
    gpu_model = serializers.SerializerMethodField()
    gpus = serializers.SerializerMethodField()

    class Meta:
        model = Reservation
        fields = [
            "id",
            "team",
            "user",
            "gpu_model",
            "gpu_count",
            "gpus",
            "start",
            "end",
            "booked_end",
            "status",
            "note",
            "created_at",
            "activated_at",
            "ended_at",
            "released_reason",
        ]

    def get_user(self, obj: Reservation) -> str | None:
        return obj.user.username if obj.user else None

    def get_gpu_model(self, obj: Reservation) -> str | None:
        return obj.gpu_model.name if obj.gpu_model else None

    def get_gpus(self, obj: Reservation) -> list[dict[str, Any]]:
        # What it holds for the rest of its window; once nothing is left, what it held (cancelled rows included).
        # A booking moved off a device (a GPU layout change) then shows only where it went.
        rows = list(obj.allocations.all())
        now = timezone.now()
        held = [a for a in rows if a.active and a.end > now] or [a for a in rows if a.active] or rows
        return allocated_devices([device_row(a.gpu) for a in held])


def device_row(g: Gpu) -> tuple[Any, ...]:
    """One device held, as `allocated_devices` reads it (its node, model and parent loaded with it)."""
    parent = g.parent
    return (g.uuid, g.node.name, g.index, g.model.name, g.kind, g.mig_profile, g.capacity,
            parent.uuid if parent else None, parent.index if parent else None)  # fmt: skip


def allocated_devices(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """The `gpus` of a booking: (uuid, node, index, model, kind, profile, share, parent uuid, parent index) per
    device held, as the API shows them: a whole GPU with share 1.0; a MIG instance by its own uuid with its
    profile and parent; the shares of one GPU as one entry of that GPU's uuid with their sum (what a container is
    given: a share is not a device of its own to the driver)."""
    out: dict[str, dict[str, Any]] = {}
    for uuid, node, index, model, kind, profile, share, parent, parent_index in rows:
        if kind == "share" and parent:
            entry = out.setdefault(
                parent,
                {"uuid": parent, "node": node, "index": parent_index, "model": model, "profile": None, "share": 0.0},
            )
            entry["share"] = round(entry["share"] + float(share), 6)
            continue
        entry = {"uuid": uuid, "node": node, "index": index, "model": model, "profile": profile or None}
        entry["share"] = round(float(share), 6) if kind == "mig" else 1.0
        if kind == "mig" and parent:
            entry.update({"parent": parent, "index": parent_index})
        out[uuid] = entry
    return sorted(out.values(), key=lambda e: (e["node"], e["index"], e["uuid"]))


class ReservationCreatedOutput(ReservationOutput):
    warnings = serializers.SerializerMethodField(help_text="soft limits this booking went over")

    class Meta(ReservationOutput.Meta):
        fields = [*ReservationOutput.Meta.fields, "warnings"]

    def get_warnings(self, obj: Reservation) -> list[dict[str, Any]]:
        return list(self.context.get("warnings", []))


class ReservationChangeInput(serializers.Serializer[Any]):
    end = serializers.DateTimeField(help_text="the new end: later to extend, earlier to end it before its booked end")


class WindowInput(serializers.Serializer[Any]):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    model = serializers.CharField(required=False, max_length=64)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": ["Must be after start."]})
        if (attrs["end"] - attrs["start"]).days > 92:
            raise serializers.ValidationError({"end": ["At most 92 days after start."]})
        return attrs


class QuotaPreviewInput(serializers.Serializer[Any]):
    team = serializers.SlugField()
    start = serializers.DateTimeField(required=False)
    end = serializers.DateTimeField(required=False)
    gpu_count = serializers.IntegerField(min_value=1, max_value=1024, required=False)
    gpu_model = serializers.CharField(required=False, max_length=64)
    mig_profile = serializers.CharField(
        required=False, max_length=32, help_text="count gpu_count MIG instances of this profile (1g = 1/7 of a GPU)"
    )
    gpu_share = serializers.CharField(required=False, max_length=32, help_text="count this fraction of one GPU")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("mig_profile") and attrs.get("gpu_share") is not None:
            raise serializers.ValidationError({"gpu_share": ["Give mig_profile or gpu_share, not both."]})
        return attrs


def booking_created_payload(result: Any) -> dict[str, Any]:
    """The 201 body of a new booking, from the service's result (no second read of what was just written);
    the same fields as ReservationCreatedOutput."""
    r = result.reservation
    when = serializers.DateTimeField()

    def dt(value: Any) -> Any:
        return when.to_representation(value) if value is not None else None

    gpus = result.gpus
    models = {g.model for g in gpus}
    return {
        "id": r.pk,
        "team": r.team.slug,
        "user": r.user.username if r.user else None,
        "gpu_model": models.pop() if len(models) == 1 else None,
        "gpu_count": r.gpu_count,
        "gpus": allocated_devices(
            [
                (g.uuid, g.node, g.index, g.model, g.kind, g.profile, g.share, g.parent_uuid, g.parent_index)
                for g in gpus
            ]
        ),
        "start": dt(r.start),
        "end": dt(r.end),
        "booked_end": dt(r.booked_end),
        "status": r.status,
        "note": r.note,
        "created_at": dt(r.created_at),
        "activated_at": dt(r.activated_at),
        "ended_at": dt(r.ended_at),
        "released_reason": r.released_reason,
        "warnings": list(result.warnings),
    }


# --- Output shapes of the read endpoints (for the OpenAPI schema; the views return selector dicts) -------------


class AvailabilityModelOutput(serializers.Serializer[Any]):
    model = serializers.CharField()
    total = serializers.IntegerField()
    free = serializers.IntegerField()
    max_free_on_one_node = serializers.IntegerField()


class CountsOutput(serializers.Serializer[Any]):
    total = serializers.IntegerField()
    free = serializers.IntegerField()


class AvailabilityNodeOutput(serializers.Serializer[Any]):
    node = serializers.CharField()
    total = serializers.IntegerField()
    free = serializers.IntegerField()
    models = serializers.DictField(child=CountsOutput(), help_text="per GPU model on this node")


class AvailabilityOutput(serializers.Serializer[Any]):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    models = AvailabilityModelOutput(many=True)
    nodes = AvailabilityNodeOutput(many=True)


class TimelineGpuOutput(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    uuid = serializers.CharField()
    node = serializers.CharField()
    node_status = serializers.CharField()
    index = serializers.IntegerField()
    model = serializers.CharField()
    status = serializers.CharField()
    bookable = serializers.BooleanField()
    mig_mode = serializers.BooleanField()
    shares = serializers.IntegerField()


class TimelineSlotOutput(serializers.Serializer[Any]):
    gpu_id = serializers.IntegerField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    team = serializers.CharField()
    mine = serializers.BooleanField(help_text="held by one of your teams")
    # Only for your teams' slots (and for admins):
    kind = serializers.CharField(required=False)
    reservation_id = serializers.IntegerField(required=False, allow_null=True)
    job_id = serializers.IntegerField(required=False, allow_null=True)
    user = serializers.CharField(required=False, allow_null=True)
    note = serializers.CharField(required=False, allow_blank=True)
    status = serializers.CharField(required=False, allow_null=True)
    # A MIG instance or share: its fraction of the GPU, profile, and its lane among the GPU's parts.
    share = serializers.FloatField(required=False)
    profile = serializers.CharField(required=False, allow_null=True)
    lane = serializers.IntegerField(required=False)
    lanes = serializers.IntegerField(required=False)


class TimelineMaintenanceOutput(serializers.Serializer[Any]):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    gpu_id = serializers.IntegerField(allow_null=True)
    node = serializers.CharField(allow_null=True)
    reason = serializers.CharField(allow_blank=True)


class TimelineOutput(serializers.Serializer[Any]):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    gpus = TimelineGpuOutput(many=True)
    slots = TimelineSlotOutput(many=True)
    maintenance = TimelineMaintenanceOutput(many=True)


class QuotaLimitsOutput(serializers.Serializer[Any]):
    gpu_hours = serializers.CharField(allow_null=True)
    max_concurrent_gpus = serializers.IntegerField(allow_null=True)
    allowed_models = serializers.ListField(child=serializers.CharField())
    budget_soft = serializers.CharField(allow_null=True)
    budget_hard = serializers.CharField(allow_null=True)


class QuotaAmountOutput(serializers.Serializer[Any]):
    gpu_hours = serializers.CharField(allow_null=True)
    cost = serializers.CharField(allow_null=True)


class QuotaRemainingOutput(serializers.Serializer[Any]):
    gpu_hours = serializers.CharField(allow_null=True)
    budget = serializers.CharField(allow_null=True)
    budget_soft = serializers.CharField(allow_null=True)
    concurrent_gpus = serializers.FloatField(
        allow_null=True, help_text="GPUs more that may be held at once; a part of a GPU counts its fraction (0.25)"
    )


class QuotaMonthOutput(serializers.Serializer[Any]):
    month = serializers.CharField(help_text="YYYY-MM in the installation's time zone")
    limits = QuotaLimitsOutput()
    booked = QuotaAmountOutput()
    remaining = QuotaRemainingOutput()
    requested = QuotaAmountOutput()
    exceeded = serializers.ListField(child=serializers.CharField())
    warnings = serializers.ListField(child=serializers.CharField())


class QuotaPreviewOutput(serializers.Serializer[Any]):
    team = serializers.CharField()
    currency = serializers.CharField()
    fits = serializers.BooleanField()
    months = QuotaMonthOutput(many=True)


class GpuSharesInput(serializers.Serializer[Any]):
    shares = serializers.IntegerField(help_text="1: exclusive; N (2-16): split in N equal shares")


class GpuShareDeviceOutput(serializers.Serializer[Any]):
    uuid = serializers.CharField()
    index = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    share = serializers.DecimalField(max_digits=7, decimal_places=6, source="capacity")


class GpuSharesOutput(serializers.Serializer[Any]):
    gpu = serializers.CharField()
    node = serializers.CharField()
    shares = serializers.IntegerField()
    share_devices = GpuShareDeviceOutput(many=True)
