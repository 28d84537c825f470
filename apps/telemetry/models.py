"""Telemetry history: per-GPU rollups per minute and per hour (raw 1 Hz samples live only in Redis)."""

from __future__ import annotations

from django.db import models

from apps.accounts.scoping import ScopedQuerySet


class RollupQuerySet(ScopedQuerySet[models.Model]):
    # Telemetry is fleet-wide, like the GPUs it describes.
    team_path = None


class RollupFields(models.Model):
    """The figures every rollup carries (abstract)."""

    samples = models.PositiveIntegerField(help_text="1 Hz samples that went into this row")
    util_min = models.PositiveSmallIntegerField(null=True, blank=True)
    util_mean = models.FloatField(null=True, blank=True)
    util_max = models.PositiveSmallIntegerField(null=True, blank=True)
    mem_used_mean = models.FloatField(null=True, blank=True, help_text="MiB")
    mem_used_max = models.PositiveIntegerField(null=True, blank=True, help_text="MiB")
    temp_max = models.SmallIntegerField(null=True, blank=True, help_text="°C")
    power_mean = models.FloatField(null=True, blank=True, help_text="W")

    class Meta:
        abstract = True


class GpuRollup(RollupFields):
    """One GPU's telemetry over one minute (kept TELEMETRY_MINUTE_RETENTION_DAYS)."""

    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.CASCADE, related_name="rollups")
    minute = models.DateTimeField(help_text="start of the minute, UTC")
    # What the processes of no portal job held and computed on the GPU (the agent's `"o"`, read only where its
    # process listing shows everything on the GPU): on a GPU split in shares, the work of reservations' holders.
    others_mem_max = models.PositiveIntegerField(null=True, blank=True, help_text="MiB")
    others_util_mean = models.FloatField(null=True, blank=True, help_text="% of SMs busy")

    objects = RollupQuerySet.as_manager()

    class Meta:
        ordering = ["gpu", "minute"]
        constraints = [models.UniqueConstraint(fields=["gpu", "minute"], name="gpurollup_unique_gpu_minute")]
        indexes = [models.Index(fields=["minute"], name="gpurollup_minute_idx")]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.minute:%Y-%m-%d %H:%M}"


class GpuHourlyRollup(RollupFields):
    """One GPU's telemetry over one hour, recomputed from the minute rollups (kept TELEMETRY_HOURLY_RETENTION_DAYS)."""

    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.CASCADE, related_name="hourly_rollups")
    hour = models.DateTimeField(help_text="start of the hour, UTC")

    objects = RollupQuerySet.as_manager()

    class Meta:
        ordering = ["gpu", "hour"]
        constraints = [models.UniqueConstraint(fields=["gpu", "hour"], name="gpuhourlyrollup_unique_gpu_hour")]
        indexes = [models.Index(fields=["hour"], name="gpuhourlyrollup_hour_idx")]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.hour:%Y-%m-%d %H:00}"


class JobMemoryMinute(models.Model):
    """The most GPU memory one job's own processes held on one GPU in one minute, and their mean SM activity, as
    its node attributed them (workers/jobmem.py). Kept for jobs on a MIG instance or a share, whose GPU's rollup
    is their neighbours' too; a whole-GPU job's memory is its GPU's rollup. Kept as long as the minute rollups."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="memory_minutes")
    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.CASCADE, related_name="+", help_text="the physical GPU")
    minute = models.DateTimeField(help_text="start of the minute, UTC")
    mem_used_max = models.PositiveIntegerField(help_text="MiB")
    util_mean = models.FloatField(
        null=True,
        blank=True,
        help_text="mean % of SMs the job kept busy (its processes' per-process utilization, or its MIG instance's"
        " GPM reading); null where the node could not read it",
    )

    objects = RollupQuerySet.as_manager()

    class Meta:
        ordering = ["job", "minute"]
        constraints = [
            models.UniqueConstraint(fields=["job", "gpu", "minute"], name="jobmemoryminute_unique_job_gpu_minute")
        ]
        indexes = [models.Index(fields=["minute"], name="jobmemoryminute_minute_idx")]

    def __str__(self) -> str:
        return f"job {self.job_id} on {self.gpu_id} @ {self.minute:%Y-%m-%d %H:%M}"


class OwnerMinute(models.Model):
    """What the processes of no portal job that one owner (uid) runs held and computed on one GPU split in shares,
    over one minute, as its node read them (the agent's `"ou"`, read only where its process listing shows
    everything on the GPU). With the portal user each uid is (apps.identity.models.UnixAccount), this tells two
    reservations of shares of one GPU apart. Minutes where the listing was complete are the GPU's rollups with
    `others_util_mean` set: an owner without a row in such a minute ran nothing there. Kept as long as the minute
    rollups."""

    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.CASCADE, related_name="+", help_text="the physical GPU")
    uid = models.PositiveIntegerField(help_text="the processes' real uid on the node")
    minute = models.DateTimeField(help_text="start of the minute, UTC")
    mem_used_max = models.PositiveIntegerField(help_text="MiB")
    util_mean = models.FloatField(
        null=True, blank=True, help_text="mean % of SMs its processes kept busy; null where the node did not read it"
    )

    objects = RollupQuerySet.as_manager()

    class Meta:
        ordering = ["gpu", "minute", "uid"]
        constraints = [
            models.UniqueConstraint(fields=["gpu", "uid", "minute"], name="ownerminute_unique_gpu_uid_minute")
        ]
        indexes = [models.Index(fields=["minute"], name="ownerminute_minute_idx")]

    def __str__(self) -> str:
        return f"uid {self.uid} on {self.gpu_id} @ {self.minute:%Y-%m-%d %H:%M}"
