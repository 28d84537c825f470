"""Quotas through the API: GPU-hours, budget (soft warns, hard refuses), allowed models, concurrency, months,
DST; what cancel and early release give back; the team detail and the quota preview."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings
from django.utils import timezone

from apps.booking.models import Allocation, BookingPolicy, Reservation
from tests.booking.conftest import book_body, slot

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


def usage(team, month: date) -> tuple[Decimal, Decimal]:
    from apps.booking.selectors import usage_by_month

    used = usage_by_month(team_id=team.pk, months=[month])[month]
    return used.gpu_hours, used.cost


def test_gpu_hours_quota_refuses_with_remaining(alice, api_as, fleet, quota, vision):
    quota(gpu_hours=Decimal("10"))
    client = api_as(alice)
    start, end = slot(hours=2)
    assert client.post(URL, book_body(start=start, end=end, gpu_count=4), format="json").status_code == 201  # 8 h
    s2, e2 = slot(days=2, hours=2)
    resp = client.post(URL, book_body(start=s2, end=e2, gpu_count=2), format="json")  # 4 h more: 12 > 10
    assert resp.status_code == 403
    body = resp.json()
    assert body["code"] == "quota_exceeded"
    assert body["exceeded"] == ["gpu_hours"]
    assert body["remaining"]["gpu_hours"] == "2.0000"
    assert body["requested"]["gpu_hours"] == "4.0000"
    assert Reservation.objects.count() == 1 and Allocation.objects.count() == 4
    # Exactly what is left still fits.
    assert client.post(URL, book_body(start=s2, end=e2, gpu_count=1), format="json").status_code == 201


def test_budget_soft_warns_and_hard_refuses(alice, api_as, fleet, quota):
    quota(budget_soft=Decimal("20"), budget_hard=Decimal("30"))
    client = api_as(alice)
    start, end = slot(hours=4)
    first = client.post(URL, book_body(start=start, end=end, gpu_count=1), format="json")  # 4 h x 2.50 = 10
    assert first.status_code == 201 and first.json()["warnings"] == []
    second = client.post(URL, book_body(start=start, end=end, gpu_count=1), format="json")  # 20: not over soft
    assert second.json()["warnings"] == []
    third = client.post(URL, book_body(start=start, end=end, gpu_count=1), format="json")  # 30 > 20: warn
    assert third.status_code == 201
    [warning] = third.json()["warnings"]
    assert warning["code"] == "budget_soft_exceeded"
    fourth = client.post(URL, book_body(start=start, end=end, gpu_count=1), format="json")  # 40 > 30: refuse
    assert fourth.status_code == 403
    assert fourth.json()["exceeded"] == ["budget"] and fourth.json()["remaining"]["budget"] == "0.0000"
    assert fourth.json()["currency"]


def test_model_not_allowed_is_403(alice, api_as, fleet, quota, a100):
    quota(allowed_models=[a100])
    start, end = slot()
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpu_model="H100-80GB"), format="json")
    assert resp.status_code == 403
    assert resp.json()["code"] == "model_not_allowed"
    assert resp.json()["allowed_models"] == ["A100-80GB"]
    named = api_as(alice).post(URL, book_body(start=start, end=end, gpus=["GPU-small-4"]), format="json")
    assert named.status_code == 403
    assert not Reservation.objects.exists()


def test_max_concurrent_gpus(alice, api_as, fleet, quota):
    quota(max_concurrent_gpus=3)
    client = api_as(alice)
    start, end = slot(hour=10, hours=2)
    assert client.post(URL, book_body(start=start, end=end, gpu_count=2), format="json").status_code == 201
    overlapping = client.post(
        URL, book_body(start=start + timedelta(hours=1), end=end + timedelta(hours=1), gpu_count=2), format="json"
    )
    assert overlapping.status_code == 403
    assert overlapping.json()["exceeded"] == ["concurrent_gpus"]
    assert overlapping.json()["remaining"]["concurrent_gpus"] == 1
    after = client.post(URL, book_body(start=end, end=end + timedelta(hours=2), gpu_count=3), format="json")
    assert after.status_code == 201  # touching, not overlapping


def test_month_specific_quota_overrides_default(alice, api_as, fleet, quota):
    start, end = slot(hours=2)
    month = date(start.year, start.month, 1)
    quota(gpu_hours=Decimal("100"))
    quota(month=month, gpu_hours=Decimal("1"))
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpu_count=1), format="json")
    assert resp.status_code == 403


def _month_after_next() -> date:
    today = timezone.localdate()
    m = today.month + 2
    return date(today.year + (m - 1) // 12, (m - 1) % 12 + 1, 1)


def _book_across_month(client, hours_each_side: int = 2):
    first = _month_after_next()
    tz = timezone.get_current_timezone()
    midnight = datetime(first.year, first.month, 1, tzinfo=tz)
    start, end = midnight - timedelta(hours=hours_each_side), midnight + timedelta(hours=hours_each_side)
    resp = client.post(URL, book_body(start=start, end=end, gpu_count=2), format="json")
    before = date(start.year, start.month, 1) if start.month != first.month else first
    return resp, date((midnight - timedelta(days=1)).year, (midnight - timedelta(days=1)).month, 1), first, before


def test_booking_across_month_boundary_counts_in_each_month(alice, api_as, fleet, vision):
    resp, prev, first, _ = _book_across_month(api_as(alice))
    assert resp.status_code == 201, resp.json()
    assert usage(vision, prev) == (Decimal("4.0000"), Decimal("10.0000"))
    assert usage(vision, first) == (Decimal("4.0000"), Decimal("10.0000"))


def test_month_boundary_quota_checked_per_month(alice, api_as, fleet, quota):
    prev_first = _month_after_next()
    prev = date(prev_first.year - (prev_first.month == 1), (prev_first.month - 2) % 12 + 1, 1)
    quota(month=prev, gpu_hours=Decimal("3"))  # only 3 GPU-h in the earlier month; 4 would be counted there
    resp, *_ = _book_across_month(api_as(alice))
    assert resp.status_code == 403
    assert resp.json()["month"] == prev.strftime("%Y-%m")


@override_settings(TIME_ZONE="Europe/Berlin")
def test_month_boundary_in_berlin_time(alice, api_as, fleet, vision):
    resp, prev, first, _ = _book_across_month(api_as(alice), hours_each_side=1)
    assert resp.status_code == 201, resp.json()
    assert usage(vision, prev)[0] == Decimal("2.0000")
    assert usage(vision, first)[0] == Decimal("2.0000")


def _next_dst_change(tz: ZoneInfo) -> date:
    day = timezone.localdate() + timedelta(days=1)
    for _ in range(400):
        a = datetime(day.year, day.month, day.day, 0, tzinfo=tz).utcoffset()
        b = datetime(day.year, day.month, day.day, 6, tzinfo=tz).utcoffset()
        if a != b:
            return day
        day += timedelta(days=1)
    raise AssertionError("no DST change within 400 days")


@override_settings(TIME_ZONE="Europe/Berlin")
def test_dst_night_counts_real_hours(alice, api_as, fleet, vision):
    BookingPolicy.objects.update_or_create(pk=1, defaults={"max_advance_days": 400})
    tz = ZoneInfo("Europe/Berlin")
    day = _next_dst_change(tz)
    start = datetime(day.year, day.month, day.day, 0, tzinfo=tz)
    end = datetime(day.year, day.month, day.day, 6, tzinfo=tz)
    real_hours = Decimal((end - start.astimezone(ZoneInfo("UTC"))).total_seconds()) / 3600
    assert real_hours in (5, 7)
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpu_count=2), format="json")
    assert resp.status_code == 201, resp.json()
    assert usage(vision, date(day.year, day.month, 1))[0] == real_hours * 2


def test_cancel_gives_the_quota_back(alice, api_as, fleet, quota, vision):
    quota(gpu_hours=Decimal("8"))
    client = api_as(alice)
    start, end = slot(hours=2)
    r = client.post(URL, book_body(start=start, end=end, gpu_count=4), format="json").json()
    assert client.post(URL, book_body(start=start, end=end, gpu_count=1), format="json").status_code == 403
    assert client.delete(f"{URL}{r['id']}/").status_code == 200
    assert usage(vision, date(start.year, start.month, 1))[0] == Decimal("0.0000")
    assert client.post(URL, book_body(start=start, end=end, gpu_count=4), format="json").status_code == 201


def test_team_detail_shows_quota_and_booked_hours(alice, api_as, fleet, quota):
    quota(gpu_hours=Decimal("100"), max_concurrent_gpus=8, budget_hard=Decimal("500"))
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    end = start + timedelta(hours=1)
    resp = api_as(alice).post(URL, book_body(start=start, end=end, gpu_count=2), format="json")
    assert resp.status_code == 201
    body = api_as(alice).get("/api/v1/teams/vision/").json()
    q = body["quota"]
    assert q["limits"]["gpu_hours"] == "100.0000" and q["limits"]["max_concurrent_gpus"] == 8
    month_start = date(start.year, start.month, 1)
    if end.month == month_start.month:
        # Held from the moment of booking (the slot had begun): a little under 2 GPU-hours.
        booked = Decimal(q["booked"]["gpu_hours"])
        assert Decimal("1.5") < booked <= Decimal("2")
        assert Decimal(q["remaining"]["gpu_hours"]) == Decimal("100") - booked
    assert q["gpus_held_now"] == 2
    assert Decimal(q["month_to_date_gpu_hours"]) <= Decimal("2")


def test_quota_preview(alice, charlie, api_as, fleet, quota):
    quota(gpu_hours=Decimal("5"))
    start, end = slot(hours=2)
    params = {
        "team": "vision",
        "start": start.isoformat(),
        "end": end.isoformat(),
        "gpu_count": 2,
        "gpu_model": "A100-80GB",
    }
    body = api_as(alice).get("/api/v1/booking/quota/", params).json()
    assert body["fits"] is True
    assert body["months"][0]["requested"] == {"gpu_hours": "4.0000", "cost": "10.0000"}
    params["gpu_count"] = 3
    body = api_as(alice).get("/api/v1/booking/quota/", params).json()
    assert body["fits"] is False and body["months"][0]["exceeded"] == ["gpu_hours"]
    assert api_as(charlie).get("/api/v1/booking/quota/", params).status_code == 404
