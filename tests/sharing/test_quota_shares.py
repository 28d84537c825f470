"""Team quotas count a part of a GPU as its fraction, through the API: a quarter of a GPU for 4 hours is 1 GPU-hour,
a 1g.10gb MIG instance is 1/7 of a GPU (the fraction billing charges), and `max_concurrent_gpus` sums fractions
(four quarters held at once are one GPU). Bookings and jobs alike; cancelling gives back exactly what was counted."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.booking.models import Quota, QuotaHold, Reservation
from apps.booking.selectors import usage_by_month
from apps.fleet.devices import gpu_set_shares
from apps.jobs.models import ContainerImage
from tests.booking.conftest import slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"
JOBS = "/api/v1/jobs/"


def body(start: Any, end: Any, **extra: Any) -> dict[str, Any]:
    return {"team": "vision", "start": start.isoformat(), "end": end.isoformat(), **extra}


def quota(team: Any, **limits: Any) -> Quota:
    return Quota.objects.create(team=team, month=None, **limits)


def used(team: Any, start: Any) -> tuple[Decimal, Decimal]:
    month = date(start.year, start.month, 1)
    amount = usage_by_month(team_id=team.pk, months=[month])[month]
    return amount.gpu_hours, amount.cost


def test_gpu_hours_quota_takes_four_quarters_where_it_refuses_whole_gpus(api_as, alice, vision, sharing_fleet):
    quota(vision, gpu_hours=Decimal("4"))
    client = api_as(alice)
    start, end = slot(hours=4)
    whole = client.post(URL, body(start, end, gpu_model="A100-80GB", gpu_count=2), format="json")
    assert whole.status_code == 403, whole.json()  # 2 GPUs x 4 h = 8 GPU-hours > 4
    assert whole.json()["exceeded"] == ["gpu_hours"] and whole.json()["remaining"]["gpu_hours"] == "4.0000"
    for _ in range(4):  # 0.25 x 4 h = 1 GPU-hour each: 4 in all, exactly the quota
        resp = client.post(URL, body(start, end, gpu_share=0.25), format="json")
        assert resp.status_code == 201, resp.json()
    assert used(vision, start)[0] == Decimal("4.0000")
    # Nothing is left: even a 1g instance (4/7 GPU-hour) is refused, and the refusal reads in GPU-hours.
    more = client.post(URL, body(start, end, mig_profile="1g.10gb"), format="json")
    assert more.status_code == 403
    assert more.json()["code"] == "quota_exceeded" and more.json()["exceeded"] == ["gpu_hours"]
    assert more.json()["remaining"]["gpu_hours"] == "0.0000"
    assert more.json()["requested"]["gpu_hours"] == "0.5714"
    assert more.json()["requested"]["gpus"] == pytest.approx(0.1429)


def test_share_booking_counts_fraction_times_hours_and_cancel_gives_it_back(api_as, alice, vision, sharing_fleet):
    client = api_as(alice)
    start, end = slot(hours=4)
    quarter = client.post(URL, body(start, end, gpu_share=0.25), format="json")
    assert quarter.status_code == 201, quarter.json()
    # 0.25 x 4 h; the cost is the quarter's price (2.80 / 4) x 4 h, as billing charges it.
    assert used(vision, start) == (Decimal("1.0000"), Decimal("2.8000"))
    s2, e2 = slot(days=2, hours=2)
    half = client.post(URL, body(s2, e2, gpu_share=0.5), format="json")
    assert half.status_code == 201, half.json()
    assert half.json()["gpu_count"] == 1  # shown as one GPU's part; counted as half of one
    assert QuotaHold.objects.get(reservation_id=half.json()["id"]).gpus == Decimal("0.500000")
    month = date(start.year, start.month, 1)
    expected = Decimal("1.0000") + (Decimal("1.0000") if date(s2.year, s2.month, 1) == month else 0)
    assert used(vision, start)[0] == expected
    # Cancelling gives back exactly what the hold counted.
    assert client.delete(f"{URL}{quarter.json()['id']}/").status_code == 200
    assert client.delete(f"{URL}{half.json()['id']}/").status_code == 200
    assert used(vision, start) == (Decimal("0.0000"), Decimal("0.0000"))
    assert used(vision, s2) == (Decimal("0.0000"), Decimal("0.0000"))


def test_a_whole_booking_of_a_gpu_split_in_three_counts_one_gpu_exactly(api_as, alice, vision, sharing_fleet):
    gpu_set_shares(actor=None, gpu_uuid="GPU-shared-0", shares=3)
    start, end = slot(hours=3)
    resp = api_as(alice).post(URL, body(start, end, gpus=["GPU-shared-0"]), format="json")
    assert resp.status_code == 201, resp.json()
    assert QuotaHold.objects.get(reservation_id=resp.json()["id"]).gpus == Decimal("1.000000")
    assert used(vision, start) == (Decimal("3.0000"), Decimal("8.4000"))  # 1 GPU x 3 h at 2.80/h, not 0.999999


def test_mig_instance_counts_one_seventh(api_as, alice, vision, sharing_fleet):
    client = api_as(alice)
    start, end = slot(hours=7)
    resp = client.post(URL, body(start, end, mig_profile="1g.10gb"), format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["gpus"][0]["share"] == pytest.approx(1 / 7, abs=1e-6)
    assert used(vision, start) == (Decimal("1.0000"), Decimal("2.8000"))  # 1/7 x 7 h; 0.40/h x 7 h
    two = client.post(URL, body(*slot(days=3, hours=7), mig_profile="1g.10gb", gpu_count=2), format="json")
    assert two.status_code == 201, two.json()
    assert QuotaHold.objects.get(reservation_id=two.json()["id"]).gpus == Decimal("0.285714")


def test_max_concurrent_gpus_sums_fractions(api_as, alice, vision, sharing_fleet):
    gpu_set_shares(actor=None, gpu_uuid="GPU-shared-1", shares=4)
    quota(vision, max_concurrent_gpus=1)
    client = api_as(alice)
    start, end = slot(hour=10, hours=2)
    ids = []
    for n in range(4):
        resp = client.post(URL, body(start, end, gpu_share=0.25, gpus=["GPU-shared-0"]), format="json")
        assert resp.status_code == 201, (n, resp.json())
        ids.append(resp.json()["id"])
        if n == 2:
            # Three quarters held: a whole GPU is refused, and what is left reads as a fraction.
            whole = client.post(URL, body(start, end, gpu_model="A100-80GB", gpu_count=1), format="json")
            assert whole.status_code == 403
            assert whole.json()["exceeded"] == ["concurrent_gpus"]
            assert whole.json()["remaining"]["concurrent_gpus"] == 0.25
    # Four quarters are one GPU: a fifth slice, of another GPU, is over the limit.
    fifth = client.post(URL, body(start, end, gpu_share=0.25, gpus=["GPU-shared-1"]), format="json")
    assert fifth.status_code == 403, fifth.json()
    assert fifth.json()["code"] == "quota_exceeded" and fifth.json()["exceeded"] == ["concurrent_gpus"]
    assert fifth.json()["remaining"]["concurrent_gpus"] == 0
    overlapping = client.post(URL, body(start + timedelta(hours=1), end, mig_profile="1g.10gb"), format="json")
    assert overlapping.status_code == 403
    # Touching, not overlapping: fits.
    after = client.post(URL, body(end, end + timedelta(hours=2), gpu_share=0.25, gpus=["GPU-shared-1"]), format="json")
    assert after.status_code == 201, after.json()
    # The quota preview shows the same: nothing left at once in that window.
    preview = client.get(
        "/api/v1/booking/quota/",
        {"team": "vision", "start": start.isoformat(), "end": end.isoformat(), "gpu_count": 1},
    )
    assert preview.status_code == 200, preview.json()
    assert preview.json()["months"][0]["remaining"]["concurrent_gpus"] == 0
    assert preview.json()["fits"] is False
    # One quarter given back: a quarter of another GPU fits again.
    assert client.delete(f"{URL}{ids[0]}/").status_code == 200
    again = client.post(URL, body(start, end, gpu_share=0.25, gpus=["GPU-shared-1"]), format="json")
    assert again.status_code == 201, again.json()
    assert Reservation.objects.filter(team=vision, status="booked").count() == 5


def test_team_detail_shows_fractional_gpus_held_now(api_as, alice, vision, sharing_fleet):
    quota(vision, gpu_hours=Decimal("10"), max_concurrent_gpus=2)
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    end = start + timedelta(hours=1)
    client = api_as(alice)
    assert client.post(URL, body(start, end, gpu_share=0.25), format="json").status_code == 201
    assert client.post(URL, body(start, end, mig_profile="1g.10gb"), format="json").status_code == 201
    q = client.get("/api/v1/teams/vision/").json()["quota"]
    assert q["gpus_held_now"] == pytest.approx(0.3929)  # 0.25 + 1/7
    booked = Decimal(q["booked"]["gpu_hours"])
    if end.month == start.month:
        assert Decimal("0") < booked <= Decimal("0.3929")
        assert Decimal(q["remaining"]["gpu_hours"]) == Decimal("10") - booked
    assert Decimal(q["month_to_date_gpu_hours"]) <= Decimal("0.3929")


@pytest.fixture
def image(db: Any) -> None:
    ContainerImage.objects.create(name="portal-test/busybox:latest", description="busybox")


def job(**extra: Any) -> dict[str, Any]:
    return {"team": "vision", "image": "portal-test/busybox:latest", "command": ["true"], **extra}


def test_jobs_on_parts_count_their_fraction(api_as, alice, vision, sharing_fleet, image):
    quota(vision, gpu_hours=Decimal("1"))
    client = api_as(alice)
    now = timezone.now()
    whole = client.post(JOBS, job(max_duration_s=7200), format="json")
    assert whole.status_code == 403 and whole.json()["exceeded"] == ["gpu_hours"]  # 2 GPU-hours > 1
    quarters = []
    for _ in range(2):  # 0.25 x 2 h = 0.5 GPU-hour each
        resp = client.post(JOBS, job(gpu_share=0.25, max_duration_s=7200), format="json")
        assert resp.status_code == 201, resp.json()
        quarters.append(resp.json()["id"])
    assert used(vision, now)[0] == Decimal("1.0000")
    refused = client.post(JOBS, job(mig_profile="1g.10gb", max_duration_s=3600), format="json")
    assert refused.status_code == 403 and refused.json()["requested"]["gpu_hours"] == "0.1429"
    hold = QuotaHold.objects.get(job_id=quarters[0])
    assert hold.gpus == Decimal("0.250000") and hold.hourly_rate == Decimal("0.7000")
    # A queued job cancelled gives back its quarter.
    assert client.post(f"{JOBS}{quarters[0]}/cancel/").status_code == 202
    assert used(vision, now)[0] == Decimal("0.5000")
    mig = client.post(JOBS, job(mig_profile="1g.10gb", max_duration_s=3600), format="json")
    assert mig.status_code == 201, mig.json()
    assert QuotaHold.objects.get(job_id=mig.json()["id"]).gpus == Decimal("0.142857")
    assert used(vision, now)[0] == Decimal("0.6429")


@pytest.fixture
def nodes_up(sharing_fleet: dict[str, Any], image: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.fleet import commands
    from apps.fleet.models import Gpu

    for gpu in Gpu.objects.all():
        gpu.node.token_digest = "d" * 64
        gpu.node.last_heartbeat = timezone.now()
        gpu.node.save(update_fields=["token_digest", "last_heartbeat"])
    # The launch message to the node agent has no broker to go to here.
    monkeypatch.setattr(commands, "publish_command", lambda queue, task, envelope, **kw: None)


def test_job_start_on_a_part_checks_concurrent_gpus_by_fraction(api_as, alice, vision, nodes_up):
    from apps.jobs import scheduler
    from apps.jobs.models import Job, JobState
    from apps.jobs.scheduling import FAIR

    quota(vision, max_concurrent_gpus=1)
    client = api_as(alice)
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    for _ in range(3):  # three quarters held now
        resp = client.post(URL, body(start, start + timedelta(hours=2), gpu_share=0.25), format="json")
        assert resp.status_code == 201, resp.json()
    quarter = client.post(JOBS, job(gpu_share=0.25, max_duration_s=600), format="json").json()["id"]
    mig = client.post(JOBS, job(mig_profile="1g.10gb", max_duration_s=600), format="json").json()["id"]
    started = scheduler.run_pass(token=1, leader="test", policy=FAIR).started
    # 0.75 + 0.25 = 1 GPU: the quarter starts; 1 + 1/7 is over the limit: the MIG job waits.
    assert quarter in started and mig not in started
    assert Job.objects.get(pk=quarter).state == JobState.STARTING
    assert Job.objects.get(pk=mig).state == JobState.QUEUED


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_parallel_quarters_stop_at_the_quota(alice, bob, vision, make_token, sharing_fleet):
    """24 parallel requests (live server, several processes) for quarters of two shared GPUs, 8 quarters in all,
    by a team that may hold 1 GPU at once and 2 GPU-hours (a 2-hour quarter is 0.5): exactly 4 win, the rest are
    refused by the quota in the API's error shape, and the counters add up to what the winners hold."""
    from tests.booking.test_concurrency import race, start_server, used_hours

    gpu_set_shares(actor=None, gpu_uuid="GPU-shared-1", shares=4)
    quota(vision, max_concurrent_gpus=1, gpu_hours=Decimal("2"))
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob)]
    start, end = slot(hours=2)
    server = start_server()
    try:
        responses = race(24, lambda i: ("POST", server.url + URL, body(start, end, gpu_share=0.25), tokens[i % 2]))
    finally:
        server.stop()
    codes = [r.status_code for r in responses]
    assert codes.count(201) == 4, codes
    for r in responses:
        if r.status_code != 201:
            assert r.status_code in (403, 409), r.text
            if r.status_code == 403:
                assert r.json()["code"] == "quota_exceeded" and r.json()["exceeded"], r.json()
    assert used_hours(vision, date(start.year, start.month, 1)) == Decimal("2.0000")
    assert sum(QuotaHold.objects.filter(active=True).values_list("gpus", flat=True)) == Decimal("1")


def test_the_quota_preview_counts_a_part_as_its_fraction(api_as, alice, vision, sharing_fleet):
    quota(vision, gpu_hours=Decimal("4"))
    client = api_as(alice)
    start, end = slot(hours=4)
    window = {"team": "vision", "start": start.isoformat(), "end": end.isoformat(), "gpu_model": "A100-80GB"}

    def preview(**asked: Any) -> Any:
        return client.get("/api/v1/booking/quota/", {**window, **asked})

    whole = preview(gpu_count=2).json()
    assert whole["fits"] is False and whole["months"][0]["requested"]["gpu_hours"] == "8.0000"
    quarter = preview(gpu_share="0.25").json()
    assert quarter["fits"] is True and quarter["months"][0]["requested"]["gpu_hours"] == "1.0000"
    instances = preview(mig_profile="1g.10gb", gpu_count=7).json()  # 7 x 1/7 x 4 h
    assert instances["months"][0]["requested"]["gpu_hours"] == "4.0000"
    for bad in ({"gpu_share": "1.5"}, {"gpu_share": "x"}, {"mig_profile": "9g.99gb"},
                {"mig_profile": "1g.10gb", "gpu_share": "0.25"}):  # fmt: skip
        resp = preview(**bad)
        assert resp.status_code == 400, (bad, resp.json())
        assert resp.json()["code"] == "invalid" and resp.json()["fields"], resp.json()
