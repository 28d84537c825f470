"""A reservation's page (/book/reservations/<id>/): what it holds, its times, its ledger cost and utilization, its
jobs; visible to its team and admins only; cancel and release from the page, refused for members who did not book
it; the Book page, the job page and the Efficiency page link to it."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.billing import services as billing
from apps.booking import services
from apps.booking.models import Quota, Reservation, ReservationStatus
from apps.fleet.models import Gpu
from tests.billing import helpers
from tests.booking.conftest import slot

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _page(user: Any, reservation_id: int) -> Any:
    return _client(user).get(f"/book/reservations/{reservation_id}/")


def _past(team: Any, user: Any, util: float | None) -> Reservation:
    """A two-hour reservation of two GPUs that ended yesterday, billed by the closer, with minute telemetry at a
    constant `util` percent on the first GPU only (None: no telemetry)."""
    gpu_list = helpers.gpus(2, node=f"node-{util}")
    start = (timezone.now() - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    end = start + timedelta(hours=2)
    allocations = helpers.reserve(team, user, gpu_list, start, end)
    Reservation.objects.filter(pk=allocations[0].reservation_id).update(
        status=ReservationStatus.RELEASED, activated_at=start, ended_at=end
    )
    if util is not None:
        helpers.rollups(gpu_list[0], start, end, util)
    billing.ledger_close(now=timezone.now())
    return Reservation.objects.get(pk=allocations[0].reservation_id)


def test_the_page_needs_a_signed_in_user(vision: Any, alice: Any) -> None:
    r = _past(vision, alice, None)
    response = Client().get(f"/book/reservations/{r.pk}/")
    assert response.status_code == 302 and "/accounts/login" in response["Location"]


def test_team_members_and_admins_see_it_other_teams_get_404(vision: Any, alice: Any, bob: Any, charlie: Any,
                                                             admin: Any) -> None:  # fmt: skip
    r = _past(vision, alice, 40.0)
    for user in (alice, bob, admin):
        response = _page(user, r.pk)
        assert response.status_code == 200, user
        assert f"Reservation #{r.pk}" in response.content.decode()
    assert _page(charlie, r.pk).status_code == 404
    assert _page(alice, r.pk + 1000).status_code == 404


def test_it_shows_devices_times_cost_and_the_measured_utilization(vision: Any, alice: Any) -> None:
    r = _past(vision, alice, 40.0)
    page = _page(alice, r.pk).content.decode()
    for gpu in r.allocations.all():
        assert f'data-uuid="{gpu.gpu.uuid}"' in page
    # Two GPUs for two hours at the helpers' 2.50/h: 4 GPU-hours, 10.00.
    assert 'id="res-gpu-hours">4.00<' in page and 'id="res-cost">10.00 EUR<' in page
    # One GPU of two reported 40%: the mean is of the measured half, and the page says the telemetry is partial.
    assert "40% mean while held" in page and "telemetry for 50% of the time" in page
    assert 'id="end-form"' not in page  # ended: nothing to cancel


def test_without_telemetry_the_page_says_utilization_is_unknown(vision: Any, alice: Any) -> None:
    page = _page(alice, _past(vision, alice, None).pk).content.decode()
    assert "not known: the ledger has no telemetry for it yet" in page


def test_the_booker_cancels_an_upcoming_reservation_from_its_page(vision: Any, alice: Any, fleet: Any) -> None:
    start, end = slot(days=1)
    r = services.reservation_create(
        user=alice, team=vision, start=start, end=end, gpu_count=1, gpu_model="A100-80GB"
    ).reservation
    page = _page(alice, r.pk).content.decode()
    assert 'id="end-form"' in page and ">Cancel<" in page
    assert 'data-live="false"' in page  # not started: nothing to watch yet
    # Not started: what it will cost, from its quota hold (one A100 at 2.50/h for two hours).
    assert 'id="res-booked">2.00 GPU-hours, about 5.00 EUR at today\'s price<' in page
    response = _client(alice).post(f"/book/reservations/{r.pk}/end/", follow=True)
    assert response.status_code == 200
    assert f"Cancelled reservation #{r.pk}." in response.content.decode()
    r.refresh_from_db()
    assert r.status == ReservationStatus.CANCELLED
    assert not r.allocations.filter(active=True).exists()
    # Twice: the second is refused with the reason, not an error page.
    response = _client(alice).post(f"/book/reservations/{r.pk}/end/", follow=True)
    assert response.status_code == 200 and "already ended" in response.content.decode()


def test_a_started_reservation_is_released_and_its_page_shows_why(vision: Any, alice: Any, fleet: Any) -> None:
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    r = services.reservation_create(
        user=alice, team=vision, start=start, end=start + timedelta(hours=2), gpu_count=1, gpu_model="A100-80GB"
    ).reservation
    services.reservations_tick(now=timezone.now())
    assert "Release its GPUs now" in _page(alice, r.pk).content.decode()
    _client(alice).post(f"/book/reservations/{r.pk}/end/")
    r.refresh_from_db()
    assert r.status == ReservationStatus.RELEASED and r.end < r.booked_end
    page = _page(alice, r.pk).content.decode()
    assert "Released early." in page and "booked until" in page


def test_a_member_who_did_not_book_it_cannot_end_it(vision: Any, alice: Any, bob: Any, charlie: Any,
                                                     fleet: Any) -> None:  # fmt: skip
    start, end = slot(days=2)
    r = services.reservation_create(
        user=alice, team=vision, start=start, end=end, gpu_count=1, gpu_model="A100-80GB"
    ).reservation
    assert 'id="end-form"' not in _page(bob, r.pk).content.decode()  # bob is a member; alice booked it
    response = _client(bob).post(f"/book/reservations/{r.pk}/end/", follow=True)
    assert "Only the member who booked it" in response.content.decode()
    assert _client(charlie).post(f"/book/reservations/{r.pk}/end/").status_code == 404
    assert Client().post(f"/book/reservations/{r.pk}/end/").status_code == 302  # to the login
    r.refresh_from_db()
    assert r.status == ReservationStatus.BOOKED


def test_the_job_page_links_its_reservation(vision: Any, alice: Any) -> None:
    from apps.jobs.models import Job, JobState

    r = _past(vision, alice, None)
    job = Job.objects.create(
        team=vision, user=alice, name="in-reservation", image="local/process", command=["true"], gpu_count=1,
        cpus=Decimal(1), memory_mib=1024, max_duration_s=600, reservation=r, state=JobState.SUCCEEDED,
    )  # fmt: skip
    page = _client(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert f'href="/book/reservations/{r.pk}/"' in page
    assert f'href="/jobs/{job.pk}/"' in _page(alice, r.pk).content.decode()


def test_a_share_shows_its_part_and_that_memory_is_not_isolated(vision: Any, alice: Any, fleet: Any) -> None:
    from apps.booking.services.layout import gpu_shares_change

    gpu_shares_change(actor=None, gpu_uuid=fleet["gpus"]["big/7"].uuid, shares=4)
    start, end = slot(days=1)
    r = services.reservation_create(
        user=alice, team=vision, start=start, end=end, gpu_share=Decimal("0.25")
    ).reservation
    page = _page(alice, r.pk).content.decode()
    assert "0.25 of one A100-80GB" in page and "big/7 · share" in page
    assert "no memory isolation" in page


def test_an_active_reservation_shows_its_devices_live(vision: Any, alice: Any, fleet: Any) -> None:
    now = timezone.localtime()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    r = services.reservation_create(
        user=alice, team=vision, start=start, end=start + timedelta(hours=2), gpu_count=1, gpu_model="H100-80GB"
    ).reservation
    services.reservations_tick(now=timezone.now())
    page = _page(alice, r.pk).content.decode()
    assert 'data-live="true"' in page and '<td class="util">' in page
    assert "portal/pages/reservation.js" in page


def test_the_page_charts_its_gpus_use_over_its_window(vision: Any, alice: Any) -> None:
    """Two hours of minutes on the first of its two GPUs at 40%: 120 points of the two GPUs' mean (the second
    reported nothing, so the mean is the first's), in the page's data for the chart."""
    import json
    import re

    r = _past(vision, alice, 40.0)
    page = _page(alice, r.pk).content.decode()
    assert 'id="chart-reservation"' in page
    data = json.loads(re.search(r'<script id="reservation-series" type="application/json">(.*?)</script>', page)[1])
    assert len(data["series"]) == 120 and {p["util"] for p in data["series"]} == {40.0}
    assert data["series"][0]["t"] == r.start.isoformat() and data["hourly"] is False
    # A booking that has not started has nothing to chart.
    start, end = slot(days=2, hours=2)
    later = services.reservation_create(
        user=alice, team=vision, start=start, end=end, gpus=[r.allocations.first().gpu.uuid]
    )
    assert 'id="chart-reservation"' not in _page(alice, later.reservation.pk).content.decode()


def test_a_share_charts_its_gpus_utilization_and_says_memory_is_not_read_per_share(
    vision: Any, alice: Any, fleet: Any
) -> None:
    import json
    import re

    from apps.booking.services.layout import gpu_shares_change

    gpu = fleet["gpus"]["big/7"]
    gpu_shares_change(actor=None, gpu_uuid=gpu.uuid, shares=4)
    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    r = services.reservation_create(
        user=alice, team=vision, start=start, end=start + timedelta(hours=1), gpu_share=Decimal("0.25")
    ).reservation
    helpers.rollups(gpu, start - timedelta(minutes=5), now, 70.0)  # the GPU's, every holder's together
    page = _page(alice, r.pk).content.decode()
    assert "every holder of its shares together (memory is not read per share)" in page
    data = json.loads(re.search(r'<script id="reservation-series" type="application/json">(.*?)</script>', page)[1])
    assert data["series"] and {(p["util"], p["mem"]) for p in data["series"]} == {(70.0, None)}
    assert data["series"][0]["t"] == r.start.replace(second=0, microsecond=0).isoformat()  # from its start on


def test_a_share_charts_what_is_its_own_where_the_node_tells_the_holders_apart(
    vision: Any, alice: Any, bob: Any, fleet: Any
) -> None:
    """Alice and Bob each hold a quarter of one GPU (their uids known). Per minute the node read what no job did
    there (others: 50% and 12,000 MiB, of which Bob's uid 30% and 8,000 MiB) and the job run in Alice's reservation
    (10% and 1,000 MiB): her chart is 30% and 5,000 MiB, against her share's memory; Bob's processes are not hers.
    Without Bob's uid, whose work is whose cannot be told: the GPU's utilization again."""
    import json
    import re

    from apps.booking.services.layout import gpu_shares_change
    from apps.identity.models import UnixAccount
    from apps.jobs.models import Job, JobState
    from apps.telemetry.models import GpuRollup, JobMemoryMinute, OwnerMinute

    gpu = fleet["gpus"]["big/7"]
    gpu_shares_change(actor=None, gpu_uuid=gpu.uuid, shares=4)
    UnixAccount.objects.create(user=alice, uid=1001)
    bobs = UnixAccount.objects.create(user=bob, uid=1002)
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    first, second = Gpu.devices.filter(parent=gpu).order_by("index")[:2]
    (held,) = helpers.reserve(vision, alice, [first], start, start + timedelta(hours=2))
    helpers.reserve(vision, bob, [second], start, start + timedelta(hours=2))
    mine = held.reservation
    job = Job.objects.create(
        team=vision, user=alice, image="x", command=["python", "serve.py"], gpu_count=1, cpus=Decimal(1),
        memory_mib=1024, max_duration_s=3600, state=JobState.RUNNING, reservation=mine,
    )  # fmt: skip
    minutes = [start + timedelta(minutes=i) for i in range(10)]
    GpuRollup.objects.bulk_create(
        GpuRollup(gpu=gpu, minute=m, samples=60, util_mean=95.0, mem_used_max=40_000, others_util_mean=50.0,
                  others_mem_max=12_000)
        for m in minutes
    )  # fmt: skip
    OwnerMinute.objects.bulk_create(
        OwnerMinute(gpu=gpu, uid=1002, minute=m, mem_used_max=8_000, util_mean=30.0) for m in minutes
    )
    JobMemoryMinute.objects.bulk_create(
        JobMemoryMinute(job=job, gpu=gpu, minute=m, mem_used_max=1_000, util_mean=10.0) for m in minutes
    )

    def chart(r: Reservation) -> tuple[str, dict[str, Any]]:
        page = _page(alice, r.pk).content.decode()
        data = re.search(r'<script id="reservation-series" type="application/json">(.*?)</script>', page)
        return page, json.loads(data[1])

    page, data = chart(mine)
    assert "What is its own on its GPU, per minute" in page
    assert [(p["util"], p["mem"]) for p in data["series"]] == [(30.0, 5_000)] * 10
    assert data["series"][0]["t"] == start.isoformat() and data["total"] == first.memory_mib > 0
    bobs.delete()
    page, data = chart(mine)
    assert "every holder of its shares together (memory is not read per share): another holder's" in page
    assert {(p["util"], p["mem"]) for p in data["series"]} == {(95.0, None)}


def test_own_minutes_chart_per_hour_as_the_mean_and_the_most_memory() -> None:
    from datetime import UTC, datetime

    from apps.telemetry.selectors import minutes_series

    t0 = datetime(2026, 12, 1, 9, 58, tzinfo=UTC)
    minutes = {t0: (10.0, 100), t0 + timedelta(minutes=1): (30.0, 300), t0 + timedelta(minutes=2): (None, 50)}
    assert minutes_series(minutes, hourly=False)[1] == {"t": "2026-12-01T09:59:00+00:00", "util": 30.0, "mem": 300}
    assert minutes_series(minutes, hourly=True) == [
        {"t": "2026-12-01T09:00:00+00:00", "util": 20.0, "mem": 300},
        {"t": "2026-12-01T10:00:00+00:00", "util": None, "mem": 50},
    ]


def test_the_booker_moves_the_end_from_its_page(vision: Any, alice: Any, charlie: Any, nlp: Any, fleet: Any) -> None:
    start, end = slot(days=1)
    r = services.reservation_create(user=alice, team=vision, start=start, end=end, gpus=["GPU-big-0"]).reservation
    page = _page(alice, r.pk).content.decode()
    local_end = timezone.localtime(end)
    assert 'id="change-end-form"' in page and f'value="{local_end:%Y-%m-%dT%H:%M}"' in page
    later = local_end + timedelta(hours=1)
    # The field's value as a browser sends it: local time, no offset.
    response = _client(alice).post(
        f"/book/reservations/{r.pk}/change-end/", {"end": f"{later:%Y-%m-%dT%H:%M}"}, follow=True
    )
    assert f"Reservation #{r.pk} now ends at {later:%Y-%m-%d %H:%M}." in response.content.decode()
    assert "soft budget" not in response.content.decode()
    r.refresh_from_db()
    assert r.end == later
    # Over the team's soft budget: made, and the page says so.
    Quota.objects.create(team=vision, budget_soft=Decimal("5"))
    further = f"{later + timedelta(minutes=15):%Y-%m-%dT%H:%M}"
    response = _client(alice).post(f"/book/reservations/{r.pk}/change-end/", {"end": further}, follow=True)
    month = f"{timezone.localtime(later):%Y-%m}"
    assert f"Note: the team is now over its soft budget for {month}." in response.content.decode()
    later += timedelta(minutes=15)
    # Refusals come back as messages on the page, and change nothing.
    services.reservation_create(user=charlie, team=nlp, start=later, end=later + timedelta(hours=1), gpus=["GPU-big-0"])
    for value, said in [
        (f"{later + timedelta(minutes=30):%Y-%m-%dT%H:%M}", "already held"),
        (f"{later + timedelta(minutes=5):%Y-%m-%dT%H:%M}", "Must align to 15 minutes."),
        ("next tuesday", "Give the new end as a date and a time."),
    ]:
        response = _client(alice).post(f"/book/reservations/{r.pk}/change-end/", {"end": value}, follow=True)
        assert response.status_code == 200 and said in response.content.decode(), value
    r.refresh_from_db()
    assert r.end == later
    # Another team's member does not see it at all.
    outsider = _client(charlie).post(f"/book/reservations/{r.pk}/change-end/", {"end": "2030-01-01T00:00"})
    assert outsider.status_code == 404
