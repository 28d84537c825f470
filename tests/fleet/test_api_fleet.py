"""GET /api/v1/nodes/, /api/v1/gpus/, /api/v1/gpus/{uuid}/history/: who may read, what they see."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from apps.telemetry.ingest import telemetry_ingest
from apps.telemetry.models import GpuHourlyRollup, GpuRollup
from tests.fleet.util import registered_node, row, telemetry

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/api/v1/nodes/", "/api/v1/gpus/", "/api/v1/gpus/GPU-n1-0/history/"])
def test_anonymous_is_401(api_as, path: str) -> None:
    registered_node("n1")
    response = api_as(None).get(path)
    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"


@pytest.mark.parametrize("who", ["alice", "bob", "charlie", "admin"])
def test_every_signed_in_user_sees_the_fleet_with_a_read_token(request, api_as, who: str) -> None:
    registered_node("n1")
    user = request.getfixturevalue(who)
    client = api_as(user, scopes=["read"])
    nodes = client.get("/api/v1/nodes/").json()["results"]
    assert [n["name"] for n in nodes] == ["n1"]
    assert nodes[0]["status"] == "online"
    assert [g["uuid"] for g in nodes[0]["gpus"]] == ["GPU-n1-0", "GPU-n1-1"]
    assert client.get("/api/v1/gpus/").json()["count"] == 2


def test_a_token_without_read_scope_cannot_list(api_as, bob) -> None:
    registered_node("n1")
    response = api_as(bob, scopes=["jobs:write"]).get("/api/v1/gpus/")
    assert response.status_code == 403


def test_gpus_carry_the_latest_telemetry_in_one_redis_read(api_as, bob, django_assert_max_num_queries) -> None:
    _, token = registered_node("n1")
    registered_node("n2", ("L40S-48GB",))
    now = time.time()
    telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0", util=77, mem=2048, temp=66, power=250.0)], ts=now))
    client = api_as(bob, scopes=["read"])
    client.get("/api/v1/gpus/")  # warm the token and session caches
    # Two of them only while a GPU is in use outside the portal (2 GiB here): was it released just now, and the
    # viewer's teams, to say whose processes they are.
    with django_assert_max_num_queries(8):
        body = client.get("/api/v1/gpus/").json()
    gpus = {g["uuid"]: g for g in body["results"]}
    assert set(gpus) == {"GPU-n1-0", "GPU-n1-1", "GPU-n2-0"}
    g = gpus["GPU-n1-0"]
    assert (g["utilization"], g["memory_used_mib"], g["temperature_c"], g["power_w"]) == (77, 2048, 66, 250.0)
    assert g["node"] == "n1" and g["node_status"] == "online" and g["status"] == "ok" and g["model"] == "A100-80GB"
    assert g["stale"] is False
    assert abs(datetime.fromisoformat(g["sampled_at"]).timestamp() - now) < 0.01
    assert gpus["GPU-n1-1"]["utilization"] is None and gpus["GPU-n1-1"]["stale"] is True


def test_gpus_filter_by_node_model_status_and_uuids(api_as, bob) -> None:
    registered_node("n1")
    registered_node("n2", ("L40S-48GB",))
    client = api_as(bob, scopes=["read"])
    assert client.get("/api/v1/gpus/?node=n2").json()["count"] == 1
    assert client.get("/api/v1/gpus/?model=H100-80GB").json()["count"] == 1
    assert client.get("/api/v1/gpus/?status=offline").json()["count"] == 0
    picked = client.get("/api/v1/gpus/?uuid=GPU-n2-0,GPU-n1-1,GPU-nowhere").json()["results"]
    assert sorted(g["uuid"] for g in picked) == ["GPU-n1-1", "GPU-n2-0"]
    assert client.get("/api/v1/gpus/?uuid=GPU-nowhere").json()["count"] == 0
    bad = client.get("/api/v1/gpus/?status=sleepy")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid"


def test_holders_are_shown_to_their_team_only(api_as, alice, charlie, admin, vision, monkeypatch) -> None:
    registered_node("n1")
    holder = {"kind": "reservation", "id": 7, "team": "vision", "team_id": vision.pk, "user": "alice", "until": None}
    monkeypatch.setattr("apps.fleet.selectors.gpu_holders", lambda: {"GPU-n1-0": holder})

    def held(user):
        gpus = {g["uuid"]: g for g in api_as(user, scopes=["read"]).get("/api/v1/gpus/").json()["results"]}
        return gpus["GPU-n1-0"]["holder"], gpus["GPU-n1-1"]["holder"]

    assert held(alice) == (holder, None)
    assert held(admin) == (holder, None)
    # Outsiders see what the fleet websocket shows them: that it is taken, and by which team.
    assert held(charlie) == ({"kind": "reservation", "team": "vision"}, None)


def test_history_serves_minute_and_hour_rollups(api_as, bob) -> None:
    node, _ = registered_node("n1")
    gpu = node.gpus.get(index=0)
    now = timezone.now().replace(second=0, microsecond=0)
    for i in range(3):
        GpuRollup.objects.create(gpu=gpu, minute=now - timedelta(minutes=i), samples=60, util_mean=10.0 * i)
    GpuRollup.objects.create(gpu=gpu, minute=now - timedelta(hours=30), samples=60, util_mean=99.0)
    GpuHourlyRollup.objects.create(gpu=gpu, hour=now.replace(minute=0) - timedelta(days=3), samples=3600, util_mean=5.0)
    client = api_as(bob, scopes=["read"])
    body = client.get("/api/v1/gpus/GPU-n1-0/history/?hours=1").json()
    assert body["resolution"] == "minute" and body["uuid"] == "GPU-n1-0"
    assert [p["util_mean"] for p in body["points"]] == [20.0, 10.0, 0.0]  # oldest first
    assert datetime.fromisoformat(body["points"][0]["t"]).tzinfo is not None
    assert len(client.get("/api/v1/gpus/GPU-n1-0/history/?hours=48").json()["points"]) == 4
    week = client.get("/api/v1/gpus/GPU-n1-0/history/?hours=168").json()
    assert week["resolution"] == "hour" and [p["util_mean"] for p in week["points"]] == [5.0]


def test_history_raw_comes_from_redis(api_as, bob) -> None:
    _, token = registered_node("n1")
    now = time.time()
    for i in range(3):
        telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0", util=i)], ts=now - 3 + i))
    body = api_as(bob, scopes=["read"]).get("/api/v1/gpus/GPU-n1-0/history/?resolution=raw").json()
    assert [p["util"] for p in body["points"]] == [0, 1, 2]


@pytest.mark.parametrize("query", ["hours=0", "hours=abc", "hours=999999", "resolution=second"])
def test_history_refuses_bad_parameters(api_as, bob, query: str) -> None:
    registered_node("n1")
    response = api_as(bob, scopes=["read"]).get(f"/api/v1/gpus/GPU-n1-0/history/?{query}")
    assert response.status_code == 400 and response.json()["code"] == "invalid"


def test_history_of_an_unknown_gpu_is_404(api_as, bob) -> None:
    response = api_as(bob, scopes=["read"]).get("/api/v1/gpus/GPU-nope/history/")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_the_holders_are_the_allocations_holding_each_gpu_now(api_as, alice, charlie, vision) -> None:
    from apps.booking.models import Allocation, AllocationKind, Reservation, ReservationStatus
    from apps.fleet.models import Gpu
    from apps.fleet.selectors import gpu_holders

    registered_node("n1")
    now = timezone.now()
    held_gpu, later_gpu = Gpu.objects.get(uuid="GPU-n1-0"), Gpu.objects.get(uuid="GPU-n1-1")

    def book(gpu: Gpu, start: datetime, end: datetime) -> Reservation:
        reservation = Reservation.objects.create(
            team=vision, user=alice, gpu_count=1, start=start, end=end, booked_end=end, status=ReservationStatus.ACTIVE
        )
        Allocation.objects.create(
            gpu=gpu,
            team=vision,
            user=alice,
            kind=AllocationKind.RESERVATION,
            reservation=reservation,
            start=start,
            end=end,
        )
        return reservation

    current = book(held_gpu, now - timedelta(minutes=30), now + timedelta(minutes=30))
    book(later_gpu, now + timedelta(hours=1), now + timedelta(hours=2))  # not yet: nobody holds it now
    assert gpu_holders() == {
        "GPU-n1-0": {
            "kind": "reservation",
            "id": current.pk,
            "team": "vision",
            "team_id": vision.pk,
            "user": "alice",
            "until": current.end.isoformat(),
        }
    }
    gpus = {g["uuid"]: g for g in api_as(charlie, scopes=["read"]).get("/api/v1/gpus/").json()["results"]}
    assert gpus["GPU-n1-0"]["holder"] == {"kind": "reservation", "team": "vision"}
    assert gpus["GPU-n1-1"]["holder"] is None
    # Released early: the allocation is cut at the release and the GPU is free at once.
    Allocation.objects.filter(reservation=current).update(end=now - timedelta(seconds=1))
    assert gpu_holders() == {}


def test_gpus_say_what_memory_is_in_use_outside_the_portal(api_as, bob, alice, vision) -> None:
    from apps.booking import services as booking
    from apps.booking.models import Reservation
    from apps.fleet.models import Gpu

    _, token = registered_node("n1")
    _, token2 = registered_node("n2", ("L40S-48GB",))
    now = time.time()
    rows = [row("GPU-n1-0", util=0, mem=20480), row("GPU-n1-1", util=0, mem=30720)]
    telemetry_ingest(telemetry("n1", token, rows, ts=now))
    telemetry_ingest(telemetry("n2", token2, [row("GPU-n2-0", util=0, mem=600)], ts=now))
    held = Gpu.objects.get(uuid="GPU-n1-1")
    start = timezone.now() - timedelta(minutes=1)
    resv = Reservation.objects.create(
        team=vision, user=alice, gpu_count=1, start=start, end=start + timedelta(hours=1),
        booked_end=start + timedelta(hours=1), status="active", gpu_model=held.model,
    )  # fmt: skip
    booking.allocations_create(
        gpus=[held], team=vision, user=alice, start=resv.start, end=resv.end, kind="reservation", reservation=resv
    )
    gpus = {g["uuid"]: g for g in api_as(bob, scopes=["read"]).get("/api/v1/gpus/").json()["results"]}
    assert gpus["GPU-n1-0"]["in_use_outside_mib"] == 20480  # nothing in the portal holds it
    assert gpus["GPU-n1-1"]["in_use_outside_mib"] is None  # a reservation's memory is its holder's
    assert gpus["GPU-n2-0"]["in_use_outside_mib"] is None  # the driver's own


def test_gpus_say_whose_processes_use_a_gpu_outside_the_portal(api_as, alice, bob, charlie, admin) -> None:
    """Named by the node's process listing and the users' Unix accounts: to their teammates and admins only; a uid
    no portal user has to admins only. A GPU the portal released a moment ago is not in use outside it (what it
    shows may be the job that just ended there)."""
    from apps.booking.models import Allocation
    from apps.fleet.models import Gpu
    from apps.identity.services import unix_uid_set

    unix_uid_set(user=alice, uid=1001, source="manual")
    unix_uid_set(user=charlie, uid=1003, source="manual")
    _, token = registered_node("n1", ("A100-80GB", "H100-80GB", "H100-80GB"))
    listing = {"o": [20480], "ou": [[1001, 15000], [1003, 5000], [4242, 480]]}
    rows = [row(f"GPU-n1-{i}", util=0, mem=20480, extra=listing) for i in range(3)]
    telemetry_ingest(telemetry("n1", token, rows, ts=time.time()))
    now = timezone.now()
    for i, ended in ((1, now - timedelta(seconds=10)), (2, now - timedelta(minutes=2))):
        Allocation.objects.create(
            gpu=Gpu.objects.get(uuid=f"GPU-n1-{i}"), team=alice.memberships.get().team, user=alice, kind="job",
            start=ended - timedelta(hours=1), end=ended,
        )  # fmt: skip

    def seen(user) -> dict[str, tuple[int | None, list[dict] | None]]:
        gpus = api_as(user, scopes=["read"]).get("/api/v1/gpus/").json()["results"]
        return {g["uuid"]: (g["in_use_outside_mib"], g["in_use_outside_by"]) for g in gpus}

    named = [
        {"user": "alice", "teams": ["vision"], "mib": 15000},
        {"user": "charlie", "teams": ["nlp"], "mib": 5000},
        {"uid": 4242, "mib": 480},
    ]
    assert seen(admin) == {
        "GPU-n1-0": (20480, named),
        "GPU-n1-1": (None, None),  # released 10 s ago
        "GPU-n1-2": (20480, named),  # released 2 minutes ago
    }
    assert seen(bob)["GPU-n1-0"] == (20480, [named[0], {"mib": 5000}, {"mib": 480}])
    assert seen(charlie)["GPU-n1-0"] == (20480, [{"mib": 15000}, named[1], {"mib": 480}])
    # An owner missing from the node's latest listing ran nothing then: only those listed with it count.
    listing = {"o": [20000], "ou": [[1003, 20000]]}
    telemetry_ingest(telemetry("n1", token, [row("GPU-n1-0", util=0, mem=20480, extra=listing)], ts=time.time() + 1))
    assert seen(admin)["GPU-n1-0"] == (20480, [{"user": "charlie", "teams": ["nlp"], "mib": 20000}])
