"""Demo jobs (embedded default only): the image allow-list, a few finished jobs with their timelines and logs, and
one queued job that the scheduler starts on the local agent as soon as it registers (the process runtime when no
Docker engine answers). Idempotent: marked by the "demo: " name prefix."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Team
from apps.accounts.types import User
from apps.efficiency.demo import oom_memory_curve
from apps.fleet.models import Gpu, GpuModel, Node
from apps.jobs import services
from apps.jobs.models import ContainerImage, Job, JobEvent, JobLogLine, JobReason, JobState

DEMO = "demo: "
BUSYBOX = "portal-test/busybox:latest"
PROCESS = "local/process"
HELLO = "echo 'hello from GPU Portal'; for i in $(seq 1 20); do echo step $i/20; sleep 1; done"

FINISHED: list[dict[str, Any]] = [
    {
        "name": "resnet50 baseline", "team": "vision", "user": "alice", "gpus": 2, "ago_h": 30, "minutes": 42,
        "state": JobState.SUCCEEDED, "reason": JobReason.EXIT_CODE, "exit_code": 0,
        "command": ["python", "train.py", "--arch", "resnet50", "--epochs", "3"],
        "logs": ["epoch 1/3 loss=2.113 acc=0.412", "epoch 2/3 loss=1.402 acc=0.598", "epoch 3/3 loss=1.087 acc=0.671",
                 "saved checkpoint to /out/resnet50.pt"],
    },
    {
        "name": "tokenizer sweep", "team": "nlp", "user": "carol", "gpus": 1, "ago_h": 20, "minutes": 6,
        "state": JobState.FAILED, "reason": JobReason.EXIT_CODE, "exit_code": 3,
        "command": ["python", "sweep.py", "--vocab", "32000,64000"],
        "logs": ["vocab 32000: ok", "vocab 64000: corpus shard 17 missing", "ERROR: giving up"],
    },
    {
        "name": "detector v3 (batch 512)", "team": "vision", "user": "bob", "gpus": 1, "ago_h": 8, "minutes": 3,
        "state": JobState.FAILED, "reason": JobReason.OOM, "exit_code": 137,
        "command": ["python", "train_detector.py", "--batch-size", "512"],
        "logs": ["loading dataset (1.2M images)", "building model", "step 1 ..."],
        "message": "killed by the kernel OOM killer (memory limit 16384 MiB)",
    },
    {
        "name": "llm finetune (batch 64)", "team": "vision", "user": "alice", "gpus": 1, "ago_h": 6, "minutes": 14,
        "state": JobState.FAILED, "reason": JobReason.EXIT_CODE, "exit_code": 1, "curve": "cuda_oom",
        "command": ["python", "finetune.py", "--batch-size", "64", "--seq-len", "4096"],
        "logs": ["loading checkpoint (7B)", "step 1/500 loss=2.41", "step 2/500 loss=2.37",
                 "ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                 "capacity of 79.15 GiB of which 1.06 GiB is free."],
    },
    {
        "name": "long eval", "team": "nlp", "user": "carol", "gpus": 1, "ago_h": 3, "minutes": 12,
        "state": JobState.CANCELLED, "reason": JobReason.CANCELLED, "exit_code": None,
        "command": ["python", "eval.py", "--suite", "full"],
        "logs": ["suite full: 48 tasks", "task 1/48 ...", "task 2/48 ..."], "message": "cancelled by carol",
    },
]  # fmt: skip


def _images() -> None:
    ContainerImage.objects.get_or_create(
        name=BUSYBOX, defaults={"description": "busybox: sh and the usual tools (the test image; docker runtime)"}
    )
    ContainerImage.objects.get_or_create(
        name=PROCESS, defaults={"description": "no container: the command runs as a process on the node"}
    )


def _docker_has_busybox() -> bool:
    """Whether the local Docker engine (if any) has the busybox image; decides the queued demo job's image."""
    try:
        import docker

        client = docker.from_env(timeout=2)
        try:
            client.images.get(BUSYBOX)
            return True
        finally:
            client.close()
    except Exception:
        return False


def _finished(teams: dict[str, Team], users: dict[str, User]) -> None:
    node = Node.objects.filter(name="local").first() or Node.objects.order_by("name").first()
    gpus = (
        list(Gpu.objects.filter(node=node, retired_at__isnull=True).select_related("model").order_by("index"))
        if node
        else []
    )
    price = GpuModel.objects.filter(name="A100-80GB").values_list("hourly_price", flat=True).first() or Decimal("2.2")
    now = timezone.now()
    for spec in FINISHED:
        team, user = teams.get(spec["team"]), users.get(spec["user"])
        if team is None or user is None:
            continue
        submitted = now - timedelta(hours=spec["ago_h"])
        started = submitted + timedelta(seconds=20)
        ended = started + timedelta(minutes=spec["minutes"])
        held = gpus[: spec["gpus"]]
        job = Job.objects.create(
            team=team, user=user, name=DEMO + spec["name"], image=PROCESS, command=spec["command"],
            gpu_count=spec["gpus"], gpu_models=sorted({g.model.name for g in held}) or ["A100-80GB"],
            cpus=Decimal("4"), memory_mib=16384,
            max_duration_s=4 * 3600, state=spec["state"], reason=spec["reason"], exit_code=spec["exit_code"],
            message=spec.get("message", f"exited with code {spec['exit_code']}"), node=node if held else None,
            hourly_price=(sum((g.model.hourly_price for g in held), Decimal("0")) if held else price * spec["gpus"]),
            scheduled_at=started - timedelta(seconds=2), started_at=started, ended_at=ended,
            log_seq=len(spec["logs"]), log_agent_seq=len(spec["logs"]), log_expected=len(spec["logs"]),
            log_epoch="demo",
        )  # fmt: skip
        Job.objects.filter(pk=job.pk).update(submitted_at=submitted)
        if held:
            job.gpus.set(held)
            if spec.get("curve"):
                oom_memory_curve(gpu=held[0], start=started, minutes=spec["minutes"])
        timeline = [
            ("", JobState.QUEUED, submitted, ""),
            (JobState.QUEUED, JobState.STARTING, started - timedelta(seconds=2), ""),
            (JobState.STARTING, JobState.RUNNING, started, ""),
            (JobState.RUNNING, spec["state"], ended, spec["reason"]),
        ]
        JobEvent.objects.bulk_create(
            [JobEvent(job=job, at=at, from_state=a, to_state=b, reason=r) for a, b, at, r in timeline]
        )
        step = (ended - started) / max(len(spec["logs"]), 1)
        JobLogLine.objects.bulk_create(
            [
                JobLogLine(
                    job=job,
                    seq=i + 1,
                    stream="stderr" if "ERROR" in text else "stdout",
                    at=started + step * i,
                    line=text,
                )
                for i, text in enumerate(spec["logs"])
            ]
        )


def load() -> None:
    _images()
    if Job.objects.filter(name__startswith=DEMO).exists():
        return
    teams = {t.slug: t for t in Team.objects.filter(slug__in=["vision", "nlp"])}
    users = {u.username: u for u in get_user_model().objects.filter(username__in=["alice", "bob", "carol"])}
    if "vision" not in teams or "alice" not in users:
        return
    with transaction.atomic():
        _finished(teams, users)
        # The queued one runs for real: the local agent registers after the demo loads, so the fleet check waits.
        services.job_submit(
            user=users["alice"],
            team=teams["vision"],
            name=DEMO + "hello from the portal",
            image=BUSYBOX if _docker_has_busybox() else PROCESS,
            command=["sh", "-c", HELLO],
            gpu_count=1,
            max_duration_s=600,
            memory_mib=512,
            check_fleet=False,
        )
