"""`gpuportal submit` and `gpuportal reserve` on part of a GPU (--share FRACTION, --mig-profile PROFILE) against a
live portal with a GPU in MIG mode and a GPU split in four; `gpuportal gpus` lists the parts; the command-line
mistakes are the client's usage errors; cli/gpuportal.py is what the modules give and runs as one file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from apps.booking.models import Allocation, Reservation
from apps.fleet.devices import MigInstance, gpu_set_shares, mig_layout_apply
from apps.fleet.models import Gpu, GpuStatus, NodeStatus
from apps.jobs import scheduler
from apps.jobs.models import ContainerImage
from apps.jobs.scheduling import FAIR
from cli import bundle, gpuportal
from tests.booking.conftest import slot
from tests.conftest import REPO, start_live_server
from tests.factories import GpuFactory, GpuModelFactory, NodeFactory
from tests.fleet.procs import clean_fleet_redis, start_portal_worker, wait_for
from tests.jobs.stack import start_job_agent, start_scheduler
from workers.gpu.mig import profiles_for

BUSYBOX = "portal-test/busybox:latest"


def _cli(url: str, token: str, *args: str, script: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The client as CI runs it: `python -m cli.gpuportal`, or the downloaded file alone (`script`, no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "DJANGO"))}
    env.pop("PYTHONPATH", None)
    env.update({"GPUPORTAL_URL": url, "GPUPORTAL_TOKEN": token})
    if script is None:
        env["PYTHONPATH"] = str(REPO)
    argv = [sys.executable, str(script)] if script else [sys.executable, "-m", "cli.gpuportal"]
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=60, env=env, cwd=script.parent if script else REPO
    )


@pytest.fixture
def parts_fleet(transactional_db: Any) -> dict[str, Gpu]:
    """Node "mig": an A100 in MIG mode (seven 1g.10gb) and a whole one; node "shared": an A100 in four shares and a
    whole one. Both online, so the scheduler places jobs on them."""
    a100 = GpuModelFactory(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.8000"))
    now = timezone.now()
    gpus: dict[str, Gpu] = {}
    for name in ("mig", "shared"):
        node = NodeFactory(name=name, status=NodeStatus.ONLINE, last_heartbeat=now, token_digest="d" * 64)
        mig_mode = name == "mig"
        gpus[name] = GpuFactory(
            node=node, index=0, model=a100, uuid=f"GPU-{name}-0", status=GpuStatus.OK, mig_mode=mig_mode
        )
        GpuFactory(node=node, index=1, model=a100, uuid=f"GPU-{name}-1", status=GpuStatus.OK)
    one_g = profiles_for("A100-80GB")["1g.10gb"]
    instances = [
        MigInstance(uuid=f"MIG-mig-0-{gi}", profile=one_g.name, memory_mib=one_g.memory_mib, gi_id=gi)
        for gi in range(7, 14)
    ]
    mig_layout_apply(gpu=gpus["mig"], mig_mode=True, instances=instances)
    gpu_set_shares(actor=None, gpu_uuid=gpus["shared"].uuid, shares=4)
    ContainerImage.objects.create(name=BUSYBOX, description="busybox")
    return gpus


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_jobs_on_a_share_and_a_mig_instance(
    alice: Any, vision: Any, parts_fleet: dict[str, Gpu], make_token: Any, live_portal: Any, tmp_path: Path
) -> None:
    token = make_token(alice, ["read", "jobs:write"])
    common = ["submit", "--team", "vision", "--image", BUSYBOX, "--max-duration", "600"]
    quarter = _cli(live_portal.url, token, "--json", *common, "--share", "0.25", "--", "true")
    assert quarter.returncode == 0, quarter.stderr
    quarter_job = json.loads(quarter.stdout)
    assert float(quarter_job["gpu_share"]) == 0.25 and not quarter_job["mig_profile"]
    mig = _cli(live_portal.url, token, "--json", *common, "--mig-profile", "1g.10gb", "--", "true")
    assert mig.returncode == 0, mig.stderr
    mig_job = json.loads(mig.stdout)
    assert mig_job["mig_profile"] == "1g.10gb" and mig_job["gpu_share"] is None

    # The scheduler's pass places each on exactly its part.
    result = scheduler.run_pass(token=1, leader="test", policy=FAIR)
    assert {quarter_job["id"], mig_job["id"]} <= set(result.started)
    held = {a.job_id: a.gpu for a in Allocation.objects.filter(active=True).select_related("gpu")}
    assert held[quarter_job["id"]].kind == "share" and held[quarter_job["id"]].parent_id == parts_fleet["shared"].pk
    assert held[mig_job["id"]].kind == "mig" and held[mig_job["id"]].mig_profile == "1g.10gb"
    assert held[mig_job["id"]].parent_id == parts_fleet["mig"].pk

    status = _cli(live_portal.url, token, "status", str(quarter_job["id"]))
    assert status.returncode == 0 and "0.25 of a GPU" in status.stdout, status.stdout
    status = _cli(live_portal.url, token, "status", str(mig_job["id"]))
    assert status.returncode == 0 and "a 1g.10gb MIG instance" in status.stdout, status.stdout

    # The file the portal serves, downloaded and run on its own: `gpus` shows each GPU's parts.
    script = tmp_path / "gpuportal.py"
    with urllib.request.urlopen(f"{live_portal.url}/jobs/cli/gpuportal.py", timeout=30) as download:
        script.write_bytes(download.read())
    gpus = _cli(live_portal.url, token, "gpus", script=script)
    assert gpus.returncode == 0, gpus.stderr
    rows = {line.split()[0] + line.split()[1]: line for line in gpus.stdout.splitlines()[1:] if "└" not in line}
    assert "MIG: 6/7 instances free" in rows["mig0"]
    assert "shared: 3/4 shares free" in rows["shared0"]
    parts = [line for line in gpus.stdout.splitlines() if "└" in line]
    instances = [line for line in parts if "MIG-mig-0-" in line]
    assert len(instances) == 7 and all("1g.10gb" in line for line in instances)
    # The share held, under its GPU (no memory reading yet: its node has not reported).
    (share,) = [line for line in parts if "MIG-" not in line]
    assert share.split("└ ")[1].split() == ["share", "1/4", "job", "vision", str(quarter_job["id"])], gpus.stdout
    taken = [line for line in instances if line.rstrip().endswith(f"job vision {mig_job['id']}")]
    assert len(taken) == 1, gpus.stdout
    assert rows["mig1"].split()[-1] == "-"  # a whole GPU's row is as before: nobody holds it

    # The portal's own refusal, printed as every refusal is.
    unknown = _cli(live_portal.url, token, *common, "--mig-profile", "9g.99gb", "--", "true")
    assert unknown.returncode == gpuportal.EXIT_REFUSED == 201
    assert "Unknown MIG profile '9g.99gb'. (invalid)" in unknown.stderr
    assert "  mig_profile: One of: " in unknown.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_reserve_a_share_and_mig_instances(
    alice: Any, vision: Any, parts_fleet: dict[str, Gpu], make_token: Any, live_portal: Any
) -> None:
    token = make_token(alice, ["read", "reservations:write"])
    start, end = (moment.isoformat() for moment in slot(hours=2))
    window = ["reserve", "--team", "vision", "--start", start, "--end", end]
    quarter = _cli(live_portal.url, token, *window, "--share", "0.25")
    assert quarter.returncode == 0, quarter.stderr
    assert "0.25 of a GPU" in quarter.stdout and "[0.25 of GPU-shared-0]" in quarter.stdout
    resv_id = int(quarter.stdout.split()[1].rstrip(":"))
    (held,) = Allocation.objects.filter(reservation_id=resv_id).select_related("gpu")
    assert held.gpu.kind == "share" and held.gpu.parent_id == parts_fleet["shared"].pk

    # A booking may hold several instances: --gpus counts them.
    two = _cli(live_portal.url, token, "--json", *window, "--mig-profile", "1g.10gb", "--gpus", "2")
    assert two.returncode == 0, two.stderr
    devices = json.loads(two.stdout)["gpus"]
    assert len(devices) == 2
    assert all(d["profile"] == "1g.10gb" and d["parent"] == "GPU-mig-0" for d in devices)

    # By memory: the smallest instance with that much (the 1g.10gb instances have 9,728 MiB).
    by_memory = _cli(live_portal.url, token, "--json", *window, "--mig-memory", "9000")
    assert by_memory.returncode == 0, by_memory.stderr
    assert [d["profile"] for d in json.loads(by_memory.stdout)["gpus"]] == ["1g.10gb"]

    # Three quarters are left: 0.5 fits, another 0.5 does not (409, printed as the portal says it).
    assert _cli(live_portal.url, token, *window, "--share", "0.5").returncode == 0
    full = _cli(live_portal.url, token, *window, "--share", "0.5")
    assert full.returncode == gpuportal.EXIT_REFUSED and "(conflict)" in full.stderr

    # Listed, soonest first; released (cancelled: it has not started), it leaves the list and frees its quarter.
    listed = _cli(live_portal.url, token, "reservations")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 4 and lines[0].startswith(f"#{resv_id} vision booked ")
    assert lines[0].endswith(" [0.25 of GPU-shared-0]") and " → " in lines[0]
    released = _cli(live_portal.url, token, "release", str(resv_id))
    assert released.returncode == 0, released.stderr
    assert released.stdout.startswith(f"#{resv_id} vision cancelled ")
    assert f"#{resv_id} " not in _cli(live_portal.url, token, "reservations").stdout
    assert f"#{resv_id} vision cancelled" in _cli(live_portal.url, token, "reservations", "--all").stdout
    assert _cli(live_portal.url, token, *window, "--share", "0.25").returncode == 0
    again = _cli(live_portal.url, token, "release", str(resv_id))
    assert again.returncode == gpuportal.EXIT_REFUSED and "already ended" in again.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_extend_a_reservation_by_a_time_or_to_an_end(
    alice: Any, charlie: Any, vision: Any, nlp: Any, parts_fleet: dict[str, Gpu], make_token: Any, live_portal: Any
) -> None:
    from apps.booking import services

    token = make_token(alice, ["read", "reservations:write"])
    start, end = slot(hours=2)
    booked = _cli(live_portal.url, token, "--json", "reserve", "--team", "vision", "--gpus", "1", "--model",
                  "A100-80GB", "--start", start.isoformat(), "--end", end.isoformat())  # fmt: skip
    assert booked.returncode == 0, booked.stderr
    resv = json.loads(booked.stdout)
    longer = _cli(live_portal.url, token, "extend", str(resv["id"]), "--by", "1h30m")
    assert longer.returncode == 0, longer.stderr
    assert longer.stdout.startswith(f"#{resv['id']} vision booked ")
    assert Reservation.objects.get(pk=resv["id"]).end == end + timedelta(minutes=90)
    shorter = _cli(live_portal.url, token, "--json", "extend", str(resv["id"]), "--end", end.isoformat())
    assert shorter.returncode == 0, shorter.stderr
    assert datetime.fromisoformat(json.loads(shorter.stdout)["end"]) == end
    # Someone else holds the GPU right after: refused as the portal says, exit 201.
    gpu = resv["gpus"][0]["uuid"]
    services.reservation_create(user=charlie, team=nlp, start=end, end=end + timedelta(hours=1), gpus=[gpu])
    refused = _cli(live_portal.url, token, "extend", str(resv["id"]), "--by", "30m")
    assert refused.returncode == gpuportal.EXIT_REFUSED and "(conflict)" in refused.stderr
    assert Reservation.objects.get(pk=resv["id"]).end == end


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.django_db(transaction=True)
def test_submit_wait_runs_on_the_part_asked_for(tmp_path: Path, alice: Any, vision: Any, make_token: Any) -> None:
    """The whole path: CLI, REST, scheduler, broker, a node agent with simulated GPUs (one in MIG mode, one split in
    four) running each job as a process that prints what it was given."""
    from apps.fleet import services as fleet

    clean_fleet_redis()
    ContainerImage.objects.create(name="local/process", description="process runtime")
    node_token = fleet.node_token_issue(node_name="parts")[1]
    server = start_live_server()
    procs = [start_portal_worker(tmp_path, FLEET_HEARTBEAT_TIMEOUT_S="4", FLEET_OFFLINE_CHECK_S="1")]
    procs.append(start_scheduler(tmp_path))
    models = "A100-80GB:mig=1g.10gb*7,A100-80GB"
    procs.append(start_job_agent(tmp_path, "parts", node_token, runtime="process", gpus=2, models=models))
    try:
        online = wait_for(
            lambda: (
                Gpu.objects.filter(node__name="parts", status="ok").count() == 2
                and Gpu.devices.filter(node__name="parts", kind="mig").count() == 7
            ),
            90,
            "the node online with its GPUs and MIG instances",
            procs,
        )
        assert online
        split = Gpu.objects.get(node__name="parts", mig_mode=False)
        gpu_set_shares(actor=None, gpu_uuid=split.uuid, shares=4)
        token = make_token(alice, ["read", "jobs:write"])
        submit = ["submit", "--team", "vision", "--image", "local/process", "--max-duration", "120", "--wait"]
        shown = "share=$GPUPORTAL_GPU_SHARE memory=$GPUPORTAL_GPU_MEMORY_MIB gpu=$CUDA_VISIBLE_DEVICES"
        quarter = _cli(server.url, token, *submit, "--share", "0.25", "--", "sh", "-c", f"echo {shown}")
        assert quarter.returncode == 0, quarter.stderr
        assert f"share=0.25 memory={81920 // 4} gpu={split.uuid}" in quarter.stdout.splitlines()
        mig = _cli(server.url, token, *submit, "--mig-profile", "1g.10gb", "--", "sh", "-c", f"echo {shown}")
        assert mig.returncode == 0, mig.stderr
        (line,) = mig.stdout.splitlines()
        instances = set(Gpu.devices.filter(node__name="parts", kind="mig").values_list("uuid", flat=True))
        assert line.startswith("share= memory= gpu=MIG-") and line.split("gpu=")[1] in instances
    finally:
        for proc in reversed(procs):
            proc.stop()
        server.stop()


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["submit", "--share", "0.25", "--mig-profile", "1g.10gb"], "not allowed with argument"),
        (["submit", "--gpus", "2", "--share", "0.25"], "--share is a part of one GPU"),
        (["submit", "--gpus", "2", "--mig-profile", "1g.10gb"], "a job runs on one MIG instance"),
        (["submit", "--share", "1.5"], "'1.5' is not a fraction of one GPU above 0 and at most 1"),
        (["submit", "--share", "0"], "'0' is not a fraction of one GPU"),
        (["submit", "--share", "nan"], "'nan' is not a fraction of one GPU"),
        (["reserve", "--gpus", "2", "--share", "0.5"], "--share is a part of one GPU"),
        (["reserve", "--share", "0.5", "--mig-profile", "1g.10gb"], "not allowed with argument"),
        (["reserve"], "required: --gpus (or --mig-profile / --mig-memory / --share)"),
        (["submit", "--mig-memory", "0"], "--mig-memory is the least memory"),
        (["submit", "--mig-memory", "9000", "--share", "0.5"], "not allowed with argument"),
        (["extend", "7", "--by", "soon"], "'soon' is not a length of time such as 2h, 30m or 1h30m"),
        (["extend", "7", "--by", "0m"], "'0m' is not a length of time"),
        (["extend", "7"], "one of the arguments --by --end is required"),
        (["extend", "7", "--by", "1h", "--end", "2030-01-01T00:00Z"], "not allowed with argument"),
    ],
)
def test_part_mistakes_are_usage_errors(args: list[str], why: str) -> None:
    extra = {"submit": ["--image", BUSYBOX, "--", "true"], "reserve": ["--start", "a", "--end", "b"]}.get(args[0], [])
    done = _cli("http://127.0.0.1:9", "gpp_x", *args, *extra)  # nothing listens there: nothing is sent
    assert done.returncode == gpuportal.EXIT_USAGE == 200
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuportal: error: ") and why in last, done.stderr
    assert done.stderr.startswith(f"usage: gpuportal {args[0]}")


def test_the_one_file_is_what_the_modules_give() -> None:
    assert (REPO / "cli" / "gpuportal.py").read_text() == bundle.build(), "run: python -m cli.bundle"
    for module in bundle.MODULES:
        lines = (REPO / "cli" / f"{module}.py").read_text().count("\n")
        assert lines < 500, f"cli/{module}.py has {lines} lines"


def test_gpus_prints_the_memory_each_instance_uses(capsys: pytest.CaptureFixture[str]) -> None:
    instance = {"profile": "1g.10gb", "uuid": "MIG-a", "memory_mib": 9728, "holder": None}
    gpu = {
        "node": "mig", "index": 0, "model": "A100-80GB", "status": "ok", "utilization": None,
        "memory_used_mib": 5200, "memory_total_mib": 81920, "holder": None, "shares": 1,
        "mig_devices": [{**instance, "memory_used_mib": 5120}, {**instance, "uuid": "MIG-b", "memory_used_mib": None}],
    }  # fmt: skip

    class Portal:
        def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
            return {"results": [gpu]}

    args = gpuportal.build_parser().parse_args(["gpus"])
    assert gpuportal.cmd_gpus(Portal(), args) == 0  # type: ignore[arg-type]
    lines = [line for line in capsys.readouterr().out.splitlines() if "└" in line]
    assert lines[0].endswith("MIG-a  5120/9728 MiB") and lines[1].endswith("MIG-b")  # free: no holder
