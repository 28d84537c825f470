from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from rest_framework import serializers

from apps.fleet.models import DeviceKind, Gpu, GpuModel, Node
from apps.fleet.selectors import gpu_parts
from apps.telemetry.keys import PUBLIC_HOLDER_FIELDS, Holder, LatestSample
from apps.telemetry.outside import owner_as_seen
from apps.telemetry.selectors import is_stale


class GpuModelOutput(serializers.ModelSerializer[GpuModel]):
    currency = serializers.SerializerMethodField()

    class Meta:
        model = GpuModel
        fields = ["name", "display_name", "memory_mib", "hourly_price", "currency"]

    def get_currency(self, obj: GpuModel) -> str:
        return str(settings.PORTAL_CURRENCY)


class NodeGpuOutput(serializers.Serializer[Any]):  # given a list of GPUs (many=True)
    uuid = serializers.CharField()
    index = serializers.IntegerField()
    model = serializers.CharField(source="model.name")
    name = serializers.CharField()
    memory_mib = serializers.IntegerField()
    mig_mode = serializers.BooleanField()
    status = serializers.CharField()


class NodeOutput(serializers.Serializer[Node]):
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

    def get_gpus(self, node: Node) -> list[dict[str, Any]]:
        live = [g for g in node.gpus.all() if g.retired_at is None]
        return list(NodeGpuOutput(sorted(live, key=lambda g: g.index), many=True).data)


class GpuOutput(serializers.Serializer[Any]):  # given a list of GPUs (many=True)
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
    in_use_outside_mib = serializers.SerializerMethodField(
        help_text="memory in use on a whole GPU nothing in the portal holds nor released in the last minute (a "
        "process started outside the portal, or left behind), from a fresh sample, when at least 1024 MiB; null "
        "otherwise"
    )
    in_use_outside_by = serializers.SerializerMethodField(
        help_text="with in_use_outside_mib, whose processes use that memory by the node's last process listing, most "
        "first: {user, teams, mib} for a portal user (named to their teammates and admins), {uid, mib} for a uid no "
        "portal user has (to admins), else {mib}; empty when the listing names nobody; null without in_use_outside_mib"
    )
    shares = serializers.IntegerField(help_text="1: exclusive; N: split in N equal shares")
    shares_free = serializers.SerializerMethodField(help_text="shares nobody holds now (a whole GPU: 1 or 0)")
    mig_devices = serializers.SerializerMethodField(
        help_text="MIG instances: uuid, profile, memory_mib, gi_id, memory_used_mib (null: unknown), holder"
    )
    share_devices = serializers.SerializerMethodField(
        help_text="a GPU split in shares: each share's uuid, index, memory_mib, memory_used_mib (what the job on it "
        "uses now, by its processes; null: free or unknown; a job on several shares is read on the first) and holder"
    )
    share_holders = serializers.SerializerMethodField(
        help_text="a GPU split in shares: one row per holder (a job or booking on several shares is one), with its "
        "shares' uuids and indexes, their memory added up (memory_mib) and what its job uses now (memory_used_mib)"
    )

    def _parts(self, gpu: Gpu) -> list[Gpu]:
        parts: Mapping[int, list[Gpu]] | None = self.context.get("parts")
        if parts is None:  # one GPU (the detail view): read its parts here
            parts = gpu_parts(gpu_ids=[gpu.pk])
        return parts.get(gpu.pk, [])

    def get_shares_free(self, gpu: Gpu) -> int:
        holders: Mapping[str, Holder] = self.context.get("holders", {})
        if gpu.shares <= 1:
            return 0 if gpu.uuid in holders or gpu.mig_mode else 1
        shares = [p for p in self._parts(gpu) if p.kind == DeviceKind.SHARE]
        return sum(1 for p in shares if p.uuid not in holders)

    def get_mig_devices(self, gpu: Gpu) -> list[dict[str, Any]]:
        if not gpu.mig_mode:
            return []
        sample = self._sample(gpu)
        used: Mapping[str, int] = {} if sample is None else sample.get("mig_mem", {})
        busy: Mapping[str, int] = {} if sample is None else sample.get("mig_util", {})
        return [
            {"uuid": p.uuid, "profile": p.mig_profile, "memory_mib": p.memory_mib, "gi_id": p.gi_id,
             "memory_used_mib": used.get(p.uuid), "sm_active_pct": busy.get(p.uuid), "holder": self.get_holder(p)}
            for p in self._parts(gpu)
            if p.kind == DeviceKind.MIG
        ]  # fmt: skip

    def get_share_devices(self, gpu: Gpu) -> list[dict[str, Any]]:
        if gpu.shares <= 1:
            return []
        used: Mapping[str, int] = self.context.get("share_used", {})
        busy: Mapping[str, int] = self.context.get("share_busy", {})
        return [
            {"uuid": p.uuid, "index": p.index, "memory_mib": p.memory_mib, "memory_used_mib": used.get(p.uuid),
             "sm_active_pct": busy.get(p.uuid), "holder": self.get_holder(p)}
            for p in self._parts(gpu)
            if p.kind == DeviceKind.SHARE
        ]  # fmt: skip

    def get_share_holders(self, gpu: Gpu) -> list[dict[str, Any]]:
        if gpu.shares <= 1:
            return []
        holders: Mapping[str, Holder] = self.context.get("holders", {})
        used: Mapping[str, int] = self.context.get("share_used", {})
        busy: Mapping[str, int] = self.context.get("share_busy", {})
        rows: dict[tuple[Any, Any], dict[str, Any]] = {}
        for p in self._parts(gpu):
            holder = holders.get(p.uuid)
            if p.kind != DeviceKind.SHARE or holder is None:
                continue
            key = (holder.get("kind"), holder.get("id"))
            row = rows.get(key)
            if row is None:
                row = rows[key] = {
                    "holder": self.get_holder(p), "share_uuids": [], "indexes": [], "memory_mib": 0,
                    "memory_used_mib": None, "sm_active_pct": None,
                }  # fmt: skip
            row["share_uuids"].append(p.uuid)
            row["indexes"].append(p.index)
            row["memory_mib"] += p.memory_mib or 0
            if p.uuid in used:  # share_job_readings puts a job's reading on its first share
                row["memory_used_mib"] = (row["memory_used_mib"] or 0) + used[p.uuid]
            if p.uuid in busy:
                row["sm_active_pct"] = min(100, (row["sm_active_pct"] or 0) + busy[p.uuid])
        return list(rows.values())

    def _sample(self, gpu: Gpu) -> LatestSample | None:
        latest: Mapping[str, LatestSample] = self.context.get("latest", {})
        return latest.get(gpu.uuid)

    def get_probe_verdict(self, gpu: Gpu) -> str | None:
        probe: dict[str, Any] | None = gpu.probe
        if not probe:
            return None
        verdict: str | None = "error" if "error" in probe and "comparison" not in probe else probe.get("comparison")
        return verdict

    def get_utilization(self, gpu: Gpu) -> int | None:
        sample = self._sample(gpu)
        return None if sample is None else sample.get("util")

    def get_memory_used_mib(self, gpu: Gpu) -> int | None:
        sample = self._sample(gpu)
        return None if sample is None else sample.get("mem_used")

    def get_memory_total_mib(self, gpu: Gpu) -> int | None:
        sample = self._sample(gpu)
        return None if sample is None else sample.get("mem_total")

    def get_temperature_c(self, gpu: Gpu) -> int | None:
        sample = self._sample(gpu)
        return None if sample is None else sample.get("temp")

    def get_power_w(self, gpu: Gpu) -> float | None:
        sample = self._sample(gpu)
        return None if sample is None else sample.get("power")

    def get_sm_clock_mhz(self, gpu: Gpu) -> int | None:
        sample = self._sample(gpu)
        return None if sample is None else sample.get("sm_clock")

    def get_tensor_active(self, gpu: Gpu) -> float | None:
        sample = self._sample(gpu)
        return None if sample is None else sample.get("tensor")

    def get_sampled_at(self, gpu: Gpu) -> datetime | None:
        sample = self._sample(gpu)
        ts = None if sample is None else sample.get("ts")
        return None if ts is None else datetime.fromtimestamp(float(ts), tz=UTC)

    def get_stale(self, gpu: Gpu) -> bool:
        return is_stale(self._sample(gpu))

    def _outside(self, gpu: Gpu) -> dict[str, Any] | None:
        outside: Mapping[str, dict[str, Any]] = self.context.get("outside", {})
        return outside.get(gpu.uuid)

    def get_in_use_outside_mib(self, gpu: Gpu) -> int | None:
        outside = self._outside(gpu)
        return None if outside is None else int(outside["mib"])

    def get_in_use_outside_by(self, gpu: Gpu) -> list[dict[str, Any]] | None:
        outside = self._outside(gpu)
        if outside is None:
            return None
        see_all, teams = bool(self.context.get("see_all")), self.context.get("team_slugs", set())
        return [owner_as_seen(o, see_all=see_all, teams=teams) for o in outside["by"]]

    def get_holder(self, gpu: Gpu) -> Holder | dict[str, Any] | None:
        holders: Mapping[str, Holder] = self.context.get("holders", {})
        holder = holders.get(gpu.uuid)
        if holder is None:
            return None
        # Who holds a GPU is the holder's team's business: others see that it is taken and by which team, the
        # same fields as on the fleet websocket (PUBLIC_HOLDER_FIELDS).
        if self.context.get("see_all") or holder.get("team_id") in self.context.get("team_ids", ()):
            return holder
        return {k: holder[k] for k in PUBLIC_HOLDER_FIELDS if k in holder}


class HistoryPointOutput(serializers.Serializer[dict[str, Any]]):
    t = serializers.DateTimeField()
    samples = serializers.IntegerField()
    util_min = serializers.IntegerField(allow_null=True)
    util_mean = serializers.FloatField(allow_null=True)
    util_max = serializers.IntegerField(allow_null=True)
    mem_used_mean = serializers.FloatField(allow_null=True)
    mem_used_max = serializers.IntegerField(allow_null=True)
    temp_max = serializers.IntegerField(allow_null=True)
    power_mean = serializers.FloatField(allow_null=True)


class InstanceHistoryOutput(serializers.Serializer[dict[str, Any]]):
    uuid = serializers.CharField()
    profile = serializers.CharField()
    gi_id = serializers.IntegerField(allow_null=True)
    memory_mib = serializers.IntegerField()
    points = serializers.ListField(child=serializers.DictField(), help_text="t, mem_used_mean, mem_used_max")


class GpuHistoryOutput(serializers.Serializer[dict[str, Any]]):
    uuid = serializers.CharField()
    resolution = serializers.ChoiceField(choices=["raw", "minute", "hour"])
    since = serializers.DateTimeField()
    points = serializers.ListField(child=serializers.DictField())
    instances = InstanceHistoryOutput(
        many=True, help_text="a GPU in MIG mode: each instance's memory (minute and hour resolutions; [] for raw)"
    )


class ProbeRequestedOutput(serializers.Serializer[dict[str, Any]]):
    gpu = serializers.CharField()
    node = serializers.CharField()
    status = serializers.CharField()
