from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from rest_framework import serializers

from apps.fleet.models import GpuModel
from apps.telemetry.keys import PUBLIC_HOLDER_FIELDS
from apps.telemetry.selectors import is_stale


class GpuModelOutput(serializers.ModelSerializer):
    currency = serializers.SerializerMethodField()

    class Meta:
        model = GpuModel
        fields = ["name", "display_name", "memory_mib", "hourly_price", "currency"]

    def get_currency(self, obj: GpuModel) -> str:
        return str(settings.PORTAL_CURRENCY)


class NodeGpuOutput(serializers.Serializer):
    uuid = serializers.CharField()
    index = serializers.IntegerField()
    model = serializers.CharField(source="model.name")
    name = serializers.CharField()
    memory_mib = serializers.IntegerField()
    mig_mode = serializers.BooleanField()
    status = serializers.CharField()


class NodeOutput(serializers.Serializer):
    name = serializers.CharField()
    status = serializers.CharField()
    draining = serializers.BooleanField()
    last_heartbeat = serializers.DateTimeField(allow_null=True)
    last_seen = serializers.DateTimeField(allow_null=True)
    registered_at = serializers.DateTimeField(allow_null=True)
    agent_version = serializers.CharField()
    driver_version = serializers.CharField()
    backend = serializers.CharField()
    gpus = serializers.SerializerMethodField()

    def get_gpus(self, node: Any) -> list[dict[str, Any]]:
        live = [g for g in node.gpus.all() if g.retired_at is None]
        return NodeGpuOutput(sorted(live, key=lambda g: g.index), many=True).data  # type: ignore[return-value]


class GpuOutput(serializers.Serializer):
    """A GPU with its state and its latest sample (null figures when none in the last seconds or ever)."""

    uuid = serializers.CharField()
    node = serializers.CharField(source="node.name")
    node_status = serializers.CharField(source="node.status")
    index = serializers.IntegerField()
    model = serializers.CharField(source="model.name")
    name = serializers.CharField()
    memory_mib = serializers.IntegerField()
    mig_mode = serializers.BooleanField()
    status = serializers.CharField()
    probed_at = serializers.DateTimeField(allow_null=True)
    probe_verdict = serializers.SerializerMethodField()
    utilization = serializers.SerializerMethodField(help_text="%")
    memory_used_mib = serializers.SerializerMethodField()
    memory_total_mib = serializers.SerializerMethodField()
    temperature_c = serializers.SerializerMethodField()
    power_w = serializers.SerializerMethodField()
    sm_clock_mhz = serializers.SerializerMethodField()
    tensor_active = serializers.SerializerMethodField(help_text="tensor-pipe activity, 0..1")
    sampled_at = serializers.SerializerMethodField()
    stale = serializers.SerializerMethodField(help_text="no sample in the last 10 s")
    holder = serializers.SerializerMethodField()

    def _sample(self, gpu: Any) -> dict[str, Any] | None:
        return self.context.get("latest", {}).get(gpu.uuid)

    def _field(self, gpu: Any, key: str) -> Any:
        sample = self._sample(gpu)
        return None if sample is None else sample.get(key)

    def get_probe_verdict(self, gpu: Any) -> str | None:
        if not gpu.probe:
            return None
        return "error" if "error" in gpu.probe and "comparison" not in gpu.probe else gpu.probe.get("comparison")

    def get_utilization(self, gpu: Any) -> int | None:
        return self._field(gpu, "util")

    def get_memory_used_mib(self, gpu: Any) -> int | None:
        return self._field(gpu, "mem_used")

    def get_memory_total_mib(self, gpu: Any) -> int | None:
        return self._field(gpu, "mem_total")

    def get_temperature_c(self, gpu: Any) -> int | None:
        return self._field(gpu, "temp")

    def get_power_w(self, gpu: Any) -> float | None:
        return self._field(gpu, "power")

    def get_sm_clock_mhz(self, gpu: Any) -> int | None:
        return self._field(gpu, "sm_clock")

    def get_tensor_active(self, gpu: Any) -> float | None:
        return self._field(gpu, "tensor")

    def get_sampled_at(self, gpu: Any) -> datetime | None:
        ts = self._field(gpu, "ts")
        return None if ts is None else datetime.fromtimestamp(float(ts), tz=UTC)

    def get_stale(self, gpu: Any) -> bool:
        return bool(is_stale(self._sample(gpu)))  # type: ignore[arg-type]

    def get_holder(self, gpu: Any) -> dict[str, Any] | None:
        holder = self.context.get("holders", {}).get(gpu.uuid)
        if holder is None:
            return None
        # Who holds a GPU is the holder's team's business: others see that it is taken and by which team, the
        # same fields as on the fleet websocket (PUBLIC_HOLDER_FIELDS).
        if self.context.get("see_all") or holder.get("team_id") in self.context.get("team_ids", ()):
            return holder
        return {k: holder[k] for k in PUBLIC_HOLDER_FIELDS if k in holder}


class HistoryPointOutput(serializers.Serializer):
    t = serializers.DateTimeField()
    samples = serializers.IntegerField()
    util_min = serializers.IntegerField(allow_null=True)
    util_mean = serializers.FloatField(allow_null=True)
    util_max = serializers.IntegerField(allow_null=True)
    mem_used_mean = serializers.FloatField(allow_null=True)
    mem_used_max = serializers.IntegerField(allow_null=True)
    temp_max = serializers.IntegerField(allow_null=True)
    power_mean = serializers.FloatField(allow_null=True)


class GpuHistoryOutput(serializers.Serializer):
    uuid = serializers.CharField()
    resolution = serializers.ChoiceField(choices=["raw", "minute", "hour"])
    since = serializers.DateTimeField()
    points = serializers.ListField(child=serializers.DictField())


class ProbeRequestedOutput(serializers.Serializer):
    gpu = serializers.CharField()
    node = serializers.CharField()
    status = serializers.CharField()
