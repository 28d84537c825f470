"""Booking parts of GPUs through the API: a MIG instance by profile, a share of a shared GPU, the whole-GPU rules
(a shared GPU whole only when all its shares are free; a GPU in MIG mode only by its instances), and the 400s."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.booking.models import Allocation, Reservation
from apps.core.errors import Conflict
from apps.fleet.devices import gpu_set_shares
from apps.fleet.models import Gpu
from apps.telemetry.metrics import render as render_metrics
from apps.telemetry.publisher import FleetPublisher
from tests.booking.conftest import slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


def body(**extra: Any) -> dict[str, Any]:
    start, end = slot(hours=2)
    return {"team": "vision", "start": start.isoformat(), "end": end.isoformat(), **extra}


def test_book_a_mig_instance_by_profile(api_as, alice, sharing_fleet):
    resp = api_as(alice).post(URL, body(mig_profile="1g.10gb"), format="json")
    assert resp.status_code == 201, resp.json()
    (entry,) = resp.json()["gpus"]
    assert entry["uuid"].startswith("MIG-")
    assert entry["profile"] == "1g.10gb"
    assert entry["parent"] == "GPU-mig-0"
    assert entry["share"] == pytest.approx(1 / 7, abs=1e-6)
    assert entry["model"] == "A100-80GB"
    held = Allocation.objects.get(reservation_id=resp.json()["id"])
    assert held.gpu.kind == "mig" and held.gpu.parent_id == sharing_fleet["mig"].pk
    # The detail endpoint shows the same device.
    again = api_as(alice).get(f"{URL}{resp.json()['id']}/").json()["gpus"]
    assert again == resp.json()["gpus"]


def test_seven_instances_then_conflict(api_as, alice, sharing_fleet):
    client = api_as(alice)
    granted = {client.post(URL, body(mig_profile="1g.10gb"), format="json").json()["gpus"][0]["uuid"] for _ in range(7)}
    assert len(granted) == 7
    refused = client.post(URL, body(mig_profile="1g.10gb"), format="json")
    assert refused.status_code == 409
    assert refused.json()["code"] == "conflict"


def test_book_a_quarter_of_a_shared_gpu(api_as, alice, sharing_fleet):
    resp = api_as(alice).post(URL, body(gpu_share=0.25), format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["gpus"] == [
        {"uuid": "GPU-shared-0", "node": "shared", "index": 0, "model": "A100-80GB", "profile": None, "share": 0.25}
    ]
    half = api_as(alice).post(URL, body(gpu_share=0.5, gpus=["GPU-shared-0"]), format="json")
    assert half.status_code == 201, half.json()
    assert half.json()["gpus"][0]["share"] == 0.5
    # 0.25 left: another half does not fit.
    assert api_as(alice).post(URL, body(gpu_share=0.5), format="json").status_code == 409


def test_whole_gpu_refused_while_a_share_is_held(api_as, alice, bob, sharing_fleet):
    assert api_as(alice).post(URL, body(gpu_share=0.75), format="json").status_code == 201  # three shares
    resp = api_as(bob).post(URL, body(gpus=["GPU-shared-0"]), format="json")
    assert resp.status_code == 409
    assert resp.json()["code"] == "conflict"
    assert resp.json()["detail"]
    # Each held share is reported on its GPU: the physical GPU's node and index, whichever share it is.
    conflicts = resp.json()["conflicts"]
    assert len(conflicts) == 3
    assert {(c["node"], c["gpu_index"]) for c in conflicts} == {("shared", 0)}


def test_whole_gpu_of_a_free_shared_gpu_holds_every_share(api_as, alice, sharing_fleet):
    resp = api_as(alice).post(URL, body(gpus=["GPU-shared-0"]), format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["gpus"][0]["uuid"] == "GPU-shared-0"
    assert resp.json()["gpus"][0]["share"] == 1.0
    assert Allocation.objects.filter(reservation_id=resp.json()["id"]).count() == 4
    assert resp.json()["gpu_count"] == 1  # one GPU, held by all its shares
    assert api_as(alice).post(URL, body(gpu_share=0.25), format="json").status_code == 409


def test_by_model_whole_gpus_take_exclusive_ones_first_then_a_shared_one_through_all_its_shares(
    api_as, alice, sharing_fleet
):
    client = api_as(alice)
    resp = client.post(URL, body(gpu_model="A100-80GB", gpu_count=2), format="json")
    assert resp.status_code == 201, resp.json()
    assert {g["uuid"] for g in resp.json()["gpus"]} == {"GPU-mig-1", "GPU-shared-1"}
    # No exclusive one left: the shared GPU, all of whose shares are free, is booked whole (never the MIG one).
    whole = client.post(URL, body(gpu_model="A100-80GB", gpu_count=1), format="json")
    assert whole.status_code == 201, whole.json()
    assert whole.json()["gpus"] == [
        {"uuid": "GPU-shared-0", "node": "shared", "index": 0, "model": "A100-80GB", "profile": None, "share": 1.0}
    ]
    held = Allocation.objects.filter(reservation_id=whole.json()["id"]).select_related("gpu")
    assert sorted(a.gpu.kind for a in held) == ["share"] * 4
    assert client.post(URL, body(gpu_model="A100-80GB", gpu_count=1), format="json").status_code == 409
    assert client.post(URL, body(gpu_share=0.25), format="json").status_code == 409


def test_by_model_a_held_share_keeps_the_shared_gpu_from_whole_bookings(api_as, alice, bob, sharing_fleet):
    assert api_as(alice).post(URL, body(gpu_share=0.25), format="json").status_code == 201
    assert api_as(bob).post(URL, body(gpu_model="A100-80GB", gpu_count=2), format="json").status_code == 201
    refused = api_as(bob).post(URL, body(gpu_model="A100-80GB", gpu_count=1), format="json")
    assert refused.status_code == 409
    assert refused.json()["code"] == "conflict"
    # What is in the way: the two whole GPUs bob booked and alice's quarter, shown on its GPU.
    assert sorted((c["node"], c["gpu_index"]) for c in refused.json()["conflicts"]) == [
        ("mig", 1),
        ("shared", 0),
        ("shared", 1),
    ]


def test_mig_mode_gpu_is_not_booked_whole(api_as, alice, sharing_fleet):
    resp = api_as(alice).post(URL, body(gpus=["GPU-mig-0"]), format="json")
    assert resp.status_code == 400
    assert resp.json()["code"] == "mig_mode"


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"mig_profile": "9g.99gb"}, "mig_profile"),
        ({"mig_profile": "big"}, "mig_profile"),
        ({"gpu_share": 0}, "gpu_share"),
        ({"gpu_share": 1.5}, "gpu_share"),
        ({"gpu_share": 0.3}, "gpu_share"),
        ({"gpu_share": 0.25, "gpu_count": 2}, "gpu_count"),
        ({"gpu_share": 0.25, "mig_profile": "1g.10gb"}, "gpu_share"),
    ],
)
def test_bad_profile_or_share_is_400(api_as, alice, sharing_fleet, extra, field):
    resp = api_as(alice).post(URL, body(**extra), format="json")
    assert resp.status_code == 400, resp.json()
    assert resp.json()["code"]
    assert field in resp.json()["fields"]
    assert not Reservation.objects.exists()


@pytest.mark.parametrize(
    "extra,field,detail",
    [
        # An exclusive GPU has no shares, a GPU not in MIG mode no instances: the layout cannot give them.
        (
            {"gpu_share": 0.25, "gpus": ["GPU-mig-1"]},
            "gpu_share",
            "No GPU among the GPUs named is split in shares: ask for whole GPUs or a MIG instance.",
        ),
        (
            {"mig_profile": "1g.10gb", "gpus": ["GPU-shared-0"]},
            "mig_profile",
            "No MIG instance of profile '1g.10gb' among the GPUs named (no GPU in MIG mode).",
        ),
        (
            {"mig_profile": "3g.40gb"},
            "mig_profile",
            "No MIG instance of profile '3g.40gb' in the fleet (instances: 1g.10gb).",
        ),
        (
            {"gpu_share": 0.25, "gpu_model": "H100-80GB"},
            "gpu_share",
            "No GPU of model H100-80GB is split in shares: ask for whole GPUs or a MIG instance.",
        ),
    ],
)
def test_a_part_the_layout_cannot_give_is_400_not_409(api_as, alice, sharing_fleet, extra, field, detail):
    from tests.factories import GpuModelFactory

    GpuModelFactory(name="H100-80GB")
    resp = api_as(alice).post(URL, body(**extra), format="json")
    assert resp.status_code == 400, resp.json()
    assert resp.json()["code"] == "invalid" and resp.json()["detail"] == detail
    assert field in resp.json()["fields"]
    assert not Reservation.objects.exists()


def test_a_part_of_an_unknown_gpu_is_404(api_as, alice, sharing_fleet):
    resp = api_as(alice).post(URL, body(gpu_share=0.25, gpus=["GPU-nope"]), format="json")
    assert resp.status_code == 404 and resp.json()["fields"] == {"gpus": ["Unknown: GPU-nope."]}
    # Naming the shared GPU, or one of its shares, books it.
    share = Gpu.devices.filter(parent__uuid="GPU-shared-0").order_by("index").last()
    assert share is not None
    for named in ("GPU-shared-0", share.uuid):
        assert api_as(alice).post(URL, body(gpu_share=0.25, gpus=[named]), format="json").status_code == 201


def test_shares_cannot_change_while_held(alice, vision, api_as, sharing_fleet):
    assert api_as(alice).post(URL, body(gpu_share=0.25), format="json").status_code == 201
    with pytest.raises(Conflict):
        gpu_set_shares(actor=None, gpu_uuid="GPU-shared-0", shares=2)
    gpu_set_shares(actor=None, gpu_uuid="GPU-shared-1", shares=2)
    assert Gpu.devices.filter(parent__uuid="GPU-shared-1", retired_at__isnull=True).count() == 2


def test_parts_stay_out_of_the_physical_gpu_lists(sharing_fleet):
    assert Gpu.objects.count() == 4
    assert Gpu.devices.filter(retired_at__isnull=True).count() == 4 + 7 + 4


def test_gpu_api_lists_instances_and_free_shares(api_as, alice, charlie, sharing_fleet):
    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    held = {"team": "vision", "start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    assert api_as(alice).post(URL, {**held, "gpu_share": 0.25}, format="json").status_code == 201
    mig = api_as(alice).post(URL, {**held, "mig_profile": "1g.10gb"}, format="json").json()["gpus"][0]["uuid"]
    for viewer, sees_user in ((alice, True), (charlie, False)):
        gpus = {g["uuid"]: g for g in api_as(viewer).get("/api/v1/gpus/").json()["results"]}
        assert set(gpus) == {"GPU-mig-0", "GPU-mig-1", "GPU-shared-0", "GPU-shared-1"}
        shared = gpus["GPU-shared-0"]
        assert (shared["shares"], shared["shares_free"], shared["mig_devices"]) == (4, 3, [])
        assert (gpus["GPU-shared-1"]["shares"], gpus["GPU-shared-1"]["shares_free"]) == (1, 1)
        instances = gpus["GPU-mig-0"]["mig_devices"]
        assert len(instances) == 7
        assert {i["profile"] for i in instances} == {"1g.10gb"}
        assert all(i["memory_mib"] == 9728 for i in instances)
        (mine,) = [i for i in instances if i["holder"]]
        assert mine["uuid"] == mig
        assert mine["holder"]["team"] == "vision"
        assert ("user" in mine["holder"]) is sees_user


def test_metrics_export_mig_instances_with_dcgm_labels(api_as, alice, client, sharing_fleet):
    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    held = {"team": "vision", "start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    mig = api_as(alice).post(URL, {**held, "mig_profile": "1g.10gb"}, format="json").json()["gpus"][0]["uuid"]
    text = render_metrics()
    lines = [line for line in text.splitlines() if line.startswith("gpuportal_mig_instance_")]
    assert len(lines) == 14  # 7 instances x (memory, allocated)
    memory = [line for line in lines if line.startswith("gpuportal_mig_instance_memory_mib")]
    assert all('UUID="GPU-mig-0"' in line and 'GPU_I_PROFILE="1g.10gb"' in line for line in memory)
    assert {line.split('GPU_I_ID="')[1].split('"')[0] for line in memory} == {str(i) for i in range(7, 14)}
    assert all(line.endswith(" 9728") for line in memory)
    allocated = [line for line in lines if line.startswith("gpuportal_mig_instance_allocated")]
    assert sum(int(line.rsplit(" ", 1)[1]) for line in allocated) == 1
    gi = Gpu.devices.get(uuid=mig).gi_id
    assert any(f'GPU_I_ID="{gi}"' in line and line.endswith(" 1") for line in allocated)


@pytest.mark.django_db(transaction=True)  # the publisher closes stale connections, as its process does
def test_fleet_snapshot_shows_parts_with_their_holders(api_as, alice, sharing_fleet):
    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    held = {"team": "vision", "start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    assert api_as(alice).post(URL, {**held, "gpu_share": 0.25}, format="json").status_code == 201
    assert api_as(alice).post(URL, {**held, "mig_profile": "1g.10gb"}, format="json").status_code == 201
    gpus = {g["uuid"]: g for g in FleetPublisher().build()["gpus"]}
    assert set(gpus) == {"GPU-mig-0", "GPU-mig-1", "GPU-shared-0", "GPU-shared-1"}
    shared, mig = gpus["GPU-shared-0"], gpus["GPU-mig-0"]
    assert shared["parts"] == {"kind": "share", "total": 4, "free": 3}
    assert [(h["part"], h["mem"], h["team"]) for h in shared["holder"]] == [("share 1/4", 20480, "vision")]
    assert mig["parts"] == {"kind": "mig", "total": 7, "free": 6}
    assert [(h["part"], h["mem"]) for h in mig["holder"]] == [("1g.10gb", 9728)]
    assert "parts" not in gpus["GPU-shared-1"] and gpus["GPU-shared-1"]["holder"] is None


def test_timeline_shows_parts_as_lanes_of_their_gpu(api_as, alice, charlie, sharing_fleet):
    start, end = slot(hours=2)
    assert api_as(alice).post(URL, body(gpu_share=0.5), format="json").status_code == 201
    assert api_as(alice).post(URL, body(mig_profile="1g.10gb"), format="json").status_code == 201
    params = {"start": start.isoformat(), "end": end.isoformat()}
    for viewer in (alice, charlie):
        data = api_as(viewer).get("/api/v1/booking/timeline/", params).json()
        gpus = {g["id"]: g for g in data["gpus"]}
        assert len(gpus) == 4  # physical GPUs only
        by_gpu = sorted(
            (gpus[s["gpu_id"]]["uuid"], s.get("profile"), s["share"], s["lane"], s["lanes"]) for s in data["slots"]
        )
        assert by_gpu == [
            ("GPU-mig-0", "1g.10gb", pytest.approx(1 / 7, abs=1e-6), 0, 7),
            ("GPU-shared-0", None, 0.25, 0, 4),
            ("GPU-shared-0", None, 0.25, 1, 4),
        ]
        assert gpus[sharing_fleet["shared"].pk]["shares"] == 4 and gpus[sharing_fleet["mig"].pk]["mig_mode"]


def test_bookable_parts_name_the_models_that_give_them(sharing_fleet):
    from apps.booking.selectors import bookable_parts
    from apps.fleet.devices import gpu_set_shares
    from tests.factories import GpuFactory, GpuModelFactory, NodeFactory

    h100 = GpuModelFactory(name="H100-80GB")
    GpuFactory(node=NodeFactory(name="h"), index=0, model=h100, uuid="GPU-h100-0")
    gpu_set_shares(actor=None, gpu_uuid="GPU-h100-0", shares=2)
    parts = {p["value"]: p["models"] for p in bookable_parts()}
    assert parts == {
        "mig:1g.10gb": ["A100-80GB"],
        "share:0.25": ["A100-80GB"],
        "share:0.5": ["A100-80GB", "H100-80GB"],
        "share:0.75": ["A100-80GB"],
    }


def test_lists_say_what_a_booking_or_job_of_parts_holds(alice, vision, ready, sent, client):
    """The home page, the jobs list and the job form's reservation choice name the part, not "1 x GPU"."""
    from apps.booking.selectors import reservations_current_and_upcoming
    from apps.booking.services import reservation_create
    from apps.jobs import services as job_services

    start, end = slot(days=1, hour=10, hours=2)
    kw: dict[str, Any] = {"user": alice, "team": vision, "start": start, "end": end}
    mig = reservation_create(**kw, mig_profile="1g.10gb", gpu_count=2).reservation
    half = reservation_create(**kw, gpu_share="0.5").reservation
    whole = reservation_create(**kw, gpu_model="A100-80GB", gpu_count=1).reservation
    with CaptureQueriesContext(connection) as queries:
        texts = {r.pk: r.size_text for r in reservations_current_and_upcoming(user=alice, now=timezone.now())}
    assert len(queries) == 2  # the reservations, and the parts of them all
    assert texts == {
        mig.pk: "2 1g.10gb instances of A100-80GB",
        half.pk: "0.5 of A100-80GB",
        whole.pk: "1 x A100-80GB",
    }
    job = job_services.job_submit(
        user=alice, team=vision, image="portal-test/busybox:latest", command=["true"], max_duration_s=600,
        gpu_share=0.25,
    )  # fmt: skip
    client.force_login(alice)
    home = client.get("/").content.decode()
    assert f"#{half.pk} · 0.5 of A100-80GB" in home
    assert "vision · 0.25 of a GPU" in home
    listing = client.get("/jobs/").content.decode()
    assert f'<tr data-job="{job.pk}">' in listing and "<td>0.25 of a GPU</td>" in listing
    form = client.get("/jobs/new/").content.decode()
    assert f"#{mig.pk} · 2 1g.10gb instances of A100-80GB · " in form


def test_availability_counts_whole_gpus_a_shared_one_free_only_while_none_of_its_shares_is_held(
    api_as, alice, sharing_fleet
):
    start, end = slot(hours=2)
    window = {"start": start.isoformat(), "end": end.isoformat()}

    def a100() -> dict[str, Any]:
        body = api_as(alice).get("/api/v1/availability/", window).json()
        return next(m for m in body["models"] if m["model"] == "A100-80GB")

    # Three can be booked whole (the GPU in MIG mode is booked by its instances): all free, and four never fit.
    assert (a100()["total"], a100()["free"]) == (3, 3)
    four = api_as(alice).post(URL, body(gpu_model="A100-80GB", gpu_count=4), format="json")
    assert four.status_code == 400 and four.json()["fields"]["gpu_count"] == ["At most 3."], four.json()
    assert api_as(alice).post(URL, body(mig_profile="1g.10gb"), format="json").status_code == 201
    assert a100()["free"] == 3  # an instance of the MIG GPU takes no whole GPU
    assert api_as(alice).post(URL, body(gpu_share=0.25), format="json").status_code == 201
    assert (a100()["free"], a100()["max_free_on_one_node"]) == (2, 1)  # a quarter held: that GPU is not free whole
    # By model, the two free ones are what a whole booking gets; a third is refused, as availability said.
    assert api_as(alice).post(URL, body(gpu_model="A100-80GB", gpu_count=2), format="json").status_code == 201
    assert a100()["free"] == 0
    assert api_as(alice).post(URL, body(gpu_model="A100-80GB", gpu_count=1), format="json").status_code == 409


def test_the_reservation_list_costs_the_same_queries_for_one_part_booking_or_many(api_as, alice, vision, ready):
    """Each part names its GPU (`parent`): loaded with the page, not one query per part held."""
    from apps.booking.services import reservation_create

    client = api_as(alice)

    def queries_for_list() -> int:
        with CaptureQueriesContext(connection) as queries:
            resp = client.get(URL, {"limit": 1000})
        assert resp.status_code == 200
        return len(queries)

    start, end = slot(days=1, hour=10, hours=2)
    reservation_create(user=alice, team=vision, start=start, end=end, mig_profile="1g.10gb")
    reservation_create(user=alice, team=vision, start=start, end=end, gpu_share="0.25")
    queries_for_list()  # the first request of a token also notes its use
    few = queries_for_list()
    for _ in range(4):
        reservation_create(user=alice, team=vision, start=start, end=end, mig_profile="1g.10gb")
    reservation_create(user=alice, team=vision, start=start, end=end, gpu_share="0.5")
    body = client.get(URL, {"limit": 1000}).json()
    assert body["count"] == 7 and all(g.get("parent") or g["share"] for r in body["results"] for g in r["gpus"])
    assert queries_for_list() == few
