"""GPU models, nodes and their GPUs."""

from __future__ import annotations

from decimal import Decimal

from django.db import models

from apps.accounts.scoping import ScopedQuerySet


class NodeStatus(models.TextChoices):
    ONLINE = "online", "Online"
    DRAINING = "draining", "Draining"
    OFFLINE = "offline", "Offline"


class GpuStatus(models.TextChoices):
    OK = "ok", "OK"
    DEGRADED = "degraded", "Degraded"
    LOST = "lost", "Lost"
    OFFLINE = "offline", "Offline"


class GpuModelQuerySet(ScopedQuerySet["GpuModel"]):
    team_path = None


class GpuModel(models.Model):
    """A kind of GPU (e.g. A100-80GB) with its memory and hourly price; capacity is counted in slices."""

    name = models.CharField(max_length=64, unique=True, help_text="portal key, e.g. A100-80GB")
    display_name = models.CharField(max_length=120, blank=True)
    memory_mib = models.PositiveIntegerField()
    hourly_price = models.DecimalField(max_digits=10, decimal_places=4, default=Decimal("0"))

    objects = GpuModelQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class PoolBackend(models.TextChoices):
    # The seam for who schedules a pool's GPUs: the portal's own scheduler and node agents, or an existing scheduler
    # the portal fronts (its bridge process submits and follows the jobs). A new backend is a new choice plus its
    # bridge; the other backends do not change.
    AGENTS = "agents", "Portal agents"
    SLURM = "slurm", "Slurm"
    KUBERNETES = "kubernetes", "Kubernetes"


class PoolQuerySet(ScopedQuerySet["Pool"]):
    team_path = None


class Pool(models.Model):
    """A set of nodes scheduled by one backend. Nodes without a pool belong to the portal's own agents."""

    name = models.SlugField(max_length=64, unique=True)
    backend = models.CharField(max_length=16, choices=PoolBackend.choices, default=PoolBackend.AGENTS)
    description = models.CharField(max_length=300, blank=True)
    # Backend settings (for Slurm: partition, accounts prefix, container flag); read by the pool's bridge.
    options = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = PoolQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class NodeQuerySet(ScopedQuerySet["Node"]):
    # Nodes are shared infrastructure: every signed-in user sees the fleet (who holds a GPU is scoped
    # separately, by the holder's team).
    team_path = None


class Node(models.Model):
    """A GPU host running one node agent."""

    name = models.CharField(max_length=100, unique=True)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.OFFLINE)
    # What an admin asked for; `status` says what is true now. A draining node that goes offline and comes back
    # is draining again, not online.
    draining = models.BooleanField(default=False)
    last_heartbeat = models.DateTimeField(null=True, blank=True, help_text="portal time of the last heartbeat")
    last_seen = models.DateTimeField(null=True, blank=True, help_text="portal time of the last accepted message")
    registered_at = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    driver_version = models.CharField(max_length=64, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    backend = models.CharField(max_length=16, blank=True, help_text="nvml or simulated")
    pool = models.ForeignKey(
        Pool, on_delete=models.PROTECT, null=True, blank=True, related_name="nodes", help_text="empty: portal agents"
    )
    # The node's token: `gpn_<prefix>_<secret>`, stored as the SHA-256 of the whole token (apps.accounts.tokens).
    # The digest also keys the HMAC of portal -> agent commands, so only this node's agent accepts them.
    token_prefix = models.CharField(max_length=16, blank=True, db_index=True)
    token_digest = models.CharField(max_length=64, blank=True)
    token_created_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class GpuQuerySet(ScopedQuerySet["Gpu"]):
    team_path = None


class DeviceKind(models.TextChoices):
    GPU = "gpu", "Whole GPU"
    MIG = "mig", "MIG instance"
    SHARE = "share", "GPU share"


_GpuManagerBase = models.Manager.from_queryset(GpuQuerySet)


class PhysicalGpuManager(_GpuManagerBase["Gpu"]):
    """`Gpu.objects`: physical GPUs only. MIG instances and shares are rows of the same table (so allocations,
    the exclusion constraint and the ledger hold them like any GPU), but every list of GPUs (fleet, telemetry,
    metrics, placement of whole GPUs) means the physical ones; `Gpu.devices` sees every row."""

    def get_queryset(self) -> GpuQuerySet:
        return GpuQuerySet(self.model, using=self._db).filter(parent__isnull=True)


class Gpu(models.Model):
    """One physical GPU on a node (a whole GPU is one slice of capacity 1.0), or one allocatable part of one: a
    MIG instance (`kind` mig: its own `MIG-...` uuid, profile and memory) or one of the N equal shares an admin
    split it into (`kind` share). A part's `capacity` is its fraction of the physical GPU (a 1g instance 1/7, a
    share 1/N): what billing multiplies the GPU's price by."""

    uuid = models.CharField(max_length=96, unique=True)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="gpus")
    memory_mib = models.PositiveIntegerField()
    capacity = models.DecimalField(max_digits=7, decimal_places=6, default=Decimal("1.000000"))
    mig_mode = models.BooleanField(default=False)
    kind = models.CharField(max_length=8, choices=DeviceKind.choices, default=DeviceKind.GPU)
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="for a MIG instance or share",
    )
    shares = models.PositiveSmallIntegerField(default=1, help_text="1: exclusive; N: split in N equal shares")
    mig_profile = models.CharField(max_length=32, blank=True, help_text="a MIG instance's profile, e.g. 1g.10gb")
    gi_id = models.PositiveSmallIntegerField(null=True, blank=True, help_text="a MIG instance's GPU instance id")
    status = models.CharField(max_length=16, choices=GpuStatus.choices, default=GpuStatus.OFFLINE)
    name = models.CharField(max_length=120, blank=True, help_text="device name as the driver reports it")
    # Last health probe (workers.probes.torch_probe result, or {"error": ...}); a degraded verdict makes the GPU
    # `degraded` until a later probe says it is fine again.
    probe = models.JSONField(null=True, blank=True)
    probed_at = models.DateTimeField(null=True, blank=True)
    # Set when the node's agent stopped reporting this GPU (removed, or moved to another host). Retired rows stay
    # for history and the ledger; they leave the (node, index) uniqueness so a new GPU can take the slot.
    retired_at = models.DateTimeField(null=True, blank=True)

    objects = PhysicalGpuManager()
    devices = GpuQuerySet.as_manager()

    class Meta:
        ordering = ["node__name", "index"]
        base_manager_name = "devices"
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                condition=models.Q(retired_at__isnull=True, parent__isnull=True),
                name="gpu_unique_node_index",
            ),
            models.UniqueConstraint(
                fields=["parent", "kind", "index"],
                condition=models.Q(retired_at__isnull=True, parent__isnull=False),
                name="gpu_unique_part_index",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.index} ({self.model.name})"

    def part_label(self, shares: int | None = None) -> str:
        """How pages name a part: its MIG profile ("1g.10gb"), or "share 2/4" for the second of four shares; "" for
        a whole GPU. `shares`: the parent's share count when the caller has it (otherwise read from the parent)."""
        if self.kind == DeviceKind.MIG:
            return self.mig_profile
        if self.kind == DeviceKind.SHARE:
            count = shares if shares is not None else (self.parent.shares if self.parent is not None else 0)
            return f"share {self.index + 1}/{count}"
        return ""
