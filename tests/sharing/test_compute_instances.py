"""A GPU instance split into compute instances ("1c.3g.40gb" and "2c.3g.40gb" in one 3g.40gb): each is a MIG
device of its own, booked by its profile at its own slices' share of the price; "any instance with N MiB" leaves
them out, since they share their GPU instance's memory; a compute-instance profile that cannot exist is a 400."""

from __future__ import annotations

from typing import Any

import pytest

from apps.fleet.devices import MigInstance, mig_layout_apply
from apps.fleet.models import Gpu, GpuStatus
from tests.booking.conftest import slot
from tests.factories import GpuFactory
from workers.gpu.mig import profiles_for

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


@pytest.fixture
def split(sharing_fleet: dict[str, Any]) -> Gpu:
    """A third A100-80GB on node "mig": a 4g.40gb GPU instance and a 3g.40gb split into 1 + 2 compute slices."""
    mig = sharing_fleet["mig"]
    memory = profiles_for("A100-80GB")["3g.40gb"].memory_mib
    gpu = GpuFactory(node=mig.node, index=2, model=mig.model, uuid="GPU-mig-2", mig_mode=True, status=GpuStatus.OK)
    layout = [
        MigInstance(uuid="MIG-ci-4g", profile="4g.40gb", memory_mib=memory, gi_id=1),
        MigInstance(uuid="MIG-ci-1c", profile="1c.3g.40gb", memory_mib=memory, gi_id=2),
        MigInstance(uuid="MIG-ci-2c", profile="2c.3g.40gb", memory_mib=memory, gi_id=2),
    ]
    mig_layout_apply(gpu=gpu, mig_mode=True, instances=layout)
    return gpu


def body(**extra: Any) -> dict[str, Any]:
    start, end = slot(hours=2)
    return {"team": "vision", "start": start.isoformat(), "end": end.isoformat(), **extra}


def test_compute_instances_are_booked_by_their_profile_at_their_own_slices(api_as, alice, split):
    parts = {p.uuid: p.capacity for p in Gpu.devices.filter(parent=split, retired_at__isnull=True)}
    # 4 + 1 + 2 slices: the GPU's 7, not 4 + 3 + 3.
    assert [float(parts[u]) for u in ("MIG-ci-4g", "MIG-ci-1c", "MIG-ci-2c")] == pytest.approx([4 / 7, 1 / 7, 2 / 7])
    client = api_as(alice)
    one = client.post(URL, body(mig_profile="1c.3g.40gb"), format="json")
    assert one.status_code == 201, one.json()
    assert [(g["uuid"], g["profile"]) for g in one.json()["gpus"]] == [("MIG-ci-1c", "1c.3g.40gb")]
    assert one.json()["gpus"][0]["share"] == pytest.approx(1 / 7, abs=1e-6)
    again = client.post(URL, body(mig_profile="1c.3g.40gb"), format="json")
    assert again.status_code == 409 and again.json()["code"] == "conflict"
    two = client.post(URL, body(mig_profile="2c.3g.40gb"), format="json")
    assert two.status_code == 201 and two.json()["gpus"][0]["share"] == pytest.approx(2 / 7, abs=1e-6)


def test_asking_by_memory_leaves_compute_instances_out(api_as, alice, split):
    client = api_as(alice)
    first = client.post(URL, body(mig_memory_mib=30_000), format="json")
    assert first.status_code == 201, first.json()
    assert [g["profile"] for g in first.json()["gpus"]] == ["4g.40gb"]
    # The compute instances have 40 GB on paper, shared with each other: not what "30,000 MiB for me" means.
    second = client.post(URL, body(mig_memory_mib=30_000), format="json")
    assert second.status_code == 409 and second.json()["code"] == "conflict"


@pytest.mark.parametrize("profile", ["3c.3g.40gb", "1c.3g.41gb", "1c.1g.10gb"])
def test_a_compute_instance_profile_that_cannot_exist_is_a_400(api_as, alice, split, profile):
    resp = api_as(alice).post(URL, body(mig_profile=profile), format="json")
    assert resp.status_code == 400 and "mig_profile" in resp.json()["fields"], resp.json()


def test_the_gpu_page_says_which_compute_instances_share_a_gpu_instances_memory(client, alice, split):
    client.force_login(alice)
    page = client.get(f"/fleet/gpus/{split.uuid}/").content.decode()
    assert 'data-gi="2"' in page and 'data-gi="1"' not in page  # the 4g.40gb is a GPU instance of its own
    note = page.split('data-gi="2">')[1].split("</p>")[0]
    assert "1c.3g.40gb" in note and "2c.3g.40gb" in note and "share its memory" in note
