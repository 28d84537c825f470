"""Input and output shapes of the jobs API (the names are the contract: docs/api.md, the CLI, tests)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.booking.api.serializers import allocated_devices, device_row
from apps.efficiency.jobinfo import JobEfficiency, job_efficiency
from apps.jobs.models import ContainerImage, Job, JobEvent, JobLogLine
from portal.internals.drf_output import FastOutputMixin


class ImageOutput(serializers.ModelSerializer[ContainerImage]):
    class Meta:
        model = ContainerImage
        fields = ["name", "description"]


class AnyValueField(serializers.Field[Any, Any, Any, Any]):
    """Passes the JSON value through: the service validates it and says precisely what is wrong."""

    context_free_output = True  # its output is the value itself (FastOutputMixin)

    def to_internal_value(self, data: Any) -> Any:
        return data

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field({"type": "array", "items": {"type": "string"}, "minItems": 1})
class ArgvField(AnyValueField):
    pass


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class EnvField(AnyValueField):
    pass


@extend_schema_field(
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "host_path": {"type": "string"},
                "container_path": {"type": "string"},
                "read_only": {"type": "boolean", "default": True},
            },
            "required": ["host_path"],
        },
    }
)
class MountsField(AnyValueField):
    pass


@extend_schema_field(OpenApiTypes.INT)
class IntValueField(AnyValueField):
    pass


@extend_schema_field(OpenApiTypes.NUMBER)
class NumberValueField(AnyValueField):
    pass


@extend_schema_field({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]})
class ModelsField(AnyValueField):
    pass


@extend_schema_field(OpenApiTypes.STR)
class StrValueField(AnyValueField):
    pass


@extend_schema_field({"type": "string", "enum": ["none"]})
class NetworkField(AnyValueField):
    pass


class JobInput(serializers.Serializer[Any]):
    """A job to submit. Types are checked by the service (one place for the messages)."""

    team = serializers.CharField(required=False, help_text="team slug; optional if you are in one team")
    name = serializers.CharField(required=False, allow_blank=True, max_length=200)
    image = serializers.CharField(help_text="a name from GET /api/v1/images/")
    command = ArgvField(help_text='argv list, e.g. ["python", "train.py"]; never a shell string')
    env = EnvField(required=False, help_text="environment variables (POSIX names)")
    mounts = MountsField(required=False, help_text="only mounts the image's allow-list names")
    gpu_count = IntValueField(required=False, help_text="whole GPUs on one node (default 1)")
    gpu_model = ModelsField(required=False, help_text="a model name, or a list of acceptable models")
    gpu_models = ModelsField(required=False, help_text="acceptable models (alternative spelling)")
    mig_profile = StrValueField(required=False, help_text="a MIG instance of this profile (e.g. 1g.10gb)")
    gpu_share = NumberValueField(required=False, help_text="this fraction of one shared GPU (e.g. 0.25)")
    mig_memory_mib = IntValueField(
        required=False, help_text="any MIG instance with at least this much memory (the smallest profile free)"
    )
    pool = serializers.CharField(
        required=False, help_text="a pool's name (GET /api/v1/pools/): that pool's scheduler chooses its GPUs"
    )
    cpus = NumberValueField(required=False)
    memory_mib = IntValueField(required=False)
    max_duration_s = IntValueField(required=False, help_text="the job is stopped after this many seconds")
    priority = IntValueField(required=False, help_text="within your team's allowance")
    reservation = IntValueField(required=False, help_text="id of a reservation of the same team")
    network = NetworkField(required=False, help_text="jobs run without a network")


# What a job holds, in the shape a booking's `gpus` has (apps.booking.api.serializers.allocated_devices): a whole GPU
# with share 1.0; a MIG instance by its own uuid with its profile and parent GPU; the shares of one GPU as that GPU's
# uuid with their sum (what the job's container is given).
_JOB_GPUS_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "uuid": {"type": "string"},
            "node": {"type": "string"},
            "index": {"type": "integer"},
            "model": {"type": "string"},
            "profile": {"type": "string", "nullable": True, "description": "a MIG instance's profile"},
            "share": {"type": "number", "description": "of the physical GPU; 1.0 for a whole one"},
            "parent": {"type": "string", "description": "a MIG instance's GPU"},
        },
        "required": ["uuid", "node", "index", "model", "profile", "share"],
    },
}


class JobOutput(FastOutputMixin, serializers.ModelSerializer[Job]):
    team = serializers.CharField(source="team.slug")
    user = serializers.CharField(source="user.username")
    node = serializers.SerializerMethodField()
    gpu_model = serializers.SerializerMethodField()
    reservation = serializers.IntegerField(source="reservation_id", allow_null=True)
    reason = serializers.SerializerMethodField()
    pending_reason = serializers.SerializerMethodField()
    # The same shapes as asked for: a profile or null, the fraction as a number (as each GPU's `share`).
    mig_profile = serializers.SerializerMethodField()
    gpu_share = serializers.SerializerMethodField()
    env = serializers.SerializerMethodField()
    runtime_s = serializers.SerializerMethodField()
    gpu_seconds = serializers.SerializerMethodField()
    cost = serializers.SerializerMethodField()
    currency = serializers.SerializerMethodField()
    logs_complete = serializers.BooleanField(read_only=True)
    cpus = serializers.FloatField()

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "team",
            "user",
            "image",
            "command",
            "env",
            "mounts",
            "gpu_count",
            "gpu_model",
            "gpu_models",
            "mig_profile",
            "gpu_share",
            "mig_memory_mib",
            "cpus",
            "memory_mib",
            "max_duration_s",
            "priority",
            "reservation",
            "state",
            "reason",
            "exit_code",
            "message",
            "pending_reason",
            "pending_message",
            "node",
            "submitted_at",
            "scheduled_at",
            "started_at",
            "ended_at",
            "runtime_s",
            "gpu_seconds",
            "cost",
            "currency",
            "log_seq",
            "logs_complete",
        ]

    def get_node(self, job: Job) -> str | None:
        return job.node.name if job.node_id and job.node else None

    def get_gpu_model(self, job: Job) -> str | None:
        return job.gpu_models[0] if len(job.gpu_models) == 1 else None

    def get_reason(self, job: Job) -> str | None:
        return job.reason or None

    def get_pending_reason(self, job: Job) -> str | None:
        return job.pending_reason or None

    def get_mig_profile(self, job: Job) -> str | None:
        return job.mig_profile or None

    def get_gpu_share(self, job: Job) -> float | None:
        return None if job.gpu_share is None else float(job.gpu_share)

    def get_env(self, job: Job) -> dict[str, str]:
        # Values may be secrets a CI pipeline passed in: only the submitter and admins see them.
        user = self.context.get("user")
        if user is not None and (user.is_staff or user.pk == job.user_id):
            return dict(job.env)
        return dict.fromkeys(job.env, "***")

    def get_runtime_s(self, job: Job) -> float:
        return round(job.runtime_seconds(timezone.now()), 3)

    def get_gpu_seconds(self, job: Job) -> float:
        return round(job.gpu_seconds(timezone.now()), 3)

    def get_cost(self, job: Job) -> str:
        return str(job.cost(timezone.now()))

    def get_currency(self, job: Job) -> str:
        return str(settings.PORTAL_CURRENCY)


class JobEventOutput(FastOutputMixin, serializers.ModelSerializer[JobEvent]):
    class Meta:
        model = JobEvent
        fields = ["at", "from_state", "to_state", "reason", "message"]


class AdviceOutput(serializers.Serializer[Any]):
    code = serializers.CharField()
    detail = serializers.CharField()


class JobDetailOutput(JobOutput):
    gpus = serializers.SerializerMethodField()
    events = serializers.SerializerMethodField()
    gpu_memory_peak_mib = serializers.SerializerMethodField()
    gpu_utilization_mean = serializers.SerializerMethodField()
    advice = serializers.SerializerMethodField()

    class Meta(JobOutput.Meta):
        fields = [
            *JobOutput.Meta.fields,
            "gpus",
            "hourly_price",
            "events",
            "gpu_memory_peak_mib",
            "gpu_utilization_mean",
            "advice",
        ]

    def _efficiency(self, job: Job) -> JobEfficiency:
        # Computed once per job for the three fields (docs/efficiency.md: peak, mean, advice).
        cache: dict[int, JobEfficiency] = self.__dict__.setdefault("_efficiency_cache", {})
        if job.pk not in cache:
            cache[job.pk] = job_efficiency(job)
        return cache[job.pk]

    def get_gpu_memory_peak_mib(self, job: Job) -> int | None:
        return self._efficiency(job).gpu_memory_peak_mib

    def get_gpu_utilization_mean(self, job: Job) -> float | None:
        return self._efficiency(job).gpu_utilization_mean

    @extend_schema_field(AdviceOutput(many=True))
    def get_advice(self, job: Job) -> list[dict[str, str]]:
        return self._efficiency(job).advice

    @extend_schema_field(_JOB_GPUS_SCHEMA)
    def get_gpus(self, job: Job) -> list[dict[str, Any]]:
        # .all(): the prefetched devices, parts with their GPU (apps.jobs.selectors.job_detail_queryset).
        return allocated_devices([device_row(g) for g in job.gpus.all()])

    def get_events(self, job: Job) -> list[dict[str, Any]]:
        # .all() and a sort here rather than order_by: a prefetched timeline (a job just submitted) is used as is.
        events = sorted(job.events.all(), key=lambda e: (e.at, e.pk))
        return list(JobEventOutput(events, many=True).data)


class LogLineOutput(FastOutputMixin, serializers.ModelSerializer[JobLogLine]):
    class Meta:
        model = JobLogLine
        fields = ["seq", "stream", "at", "line"]


class LogsOutput(serializers.Serializer[Any]):
    job = serializers.IntegerField()
    state = serializers.CharField()
    lines = LogLineOutput(many=True)
    last_seq = serializers.IntegerField(help_text="pass it as ?after= to get the next lines")
    more = serializers.BooleanField(help_text="more lines are stored after these")
    waiting = serializers.BooleanField(
        help_text="lines after a missing one are held back while it may still arrive (a few seconds): read again"
    )
    logs_complete = serializers.BooleanField(help_text="the job has ended and every line it printed is here")
