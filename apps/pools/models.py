"""What the portal keeps for pools scheduled elsewhere: the bridge's token and each job's external id."""

from __future__ import annotations

from django.db import models

from apps.accounts.scoping import ScopedQuerySet


class BridgeToken(models.Model):
    """The credential of a pool's bridge process: `gpb_<prefix>_<secret>`, stored as the SHA-256 of the whole
    token (apps.accounts.tokens). A bridge holds this, never database credentials."""

    pool = models.OneToOneField("fleet.Pool", on_delete=models.CASCADE, related_name="bridge_token")
    prefix = models.CharField(max_length=16, db_index=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"bridge token of {self.pool_id}"


class ExternalJobQuerySet(ScopedQuerySet["ExternalJob"]):
    team_path = "job__team"


class ExternalJob(models.Model):
    """A portal job handed to a pool's scheduler, and its id there (a Slurm job id).

    The row exists from the moment the bridge claims the job, before it submits: a bridge that restarts between
    its submit and its report of the id finds the job in the scheduler by its comment (the portal job id) instead
    of submitting it twice."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="external")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.PROTECT, related_name="external_jobs")
    external_id = models.CharField(max_length=64, blank=True, db_index=True, help_text="e.g. the Slurm job id")
    external_state = models.CharField(max_length=32, blank=True, help_text="the scheduler's word, e.g. PENDING")
    claimed_at = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The scheduler has finished with it (final state reported, or cancelled there): the bridge stops following.
    done = models.BooleanField(default=False)

    objects = ExternalJobQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["pool", "external_id"], condition=~models.Q(external_id=""), name="externaljob_unique_id"
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} = {self.external_id or '?'}"
