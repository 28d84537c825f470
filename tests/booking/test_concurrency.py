"""Real parallel HTTP requests against live server processes (threads + a barrier + requests).

The server runs several uvicorn worker processes, so requests really race in the database: one process would
run Django's sync views on one thread and serialize them. The advisory and row locks decide, the exclusion
constraint behind them. After every race an SQL audit proves that no two active allocations of one GPU overlap
and that the quota holds.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import requests
from django.db import connection
from django.utils import timezone

from apps.booking.models import Allocation, Quota, QuotaUsage
from tests.booking.conftest import slot
from tests.conftest import REPO, LiveServer, free_port, subprocess_env, wait_http

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

URL = "/api/v1/reservations/"


def start_server(workers: int = 3, **env: str) -> LiveServer:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "portal.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--no-access-log",
            "--lifespan",
            "off",
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=subprocess_env(**env),
    )
    server = LiveServer(proc, port)
    try:
        wait_http(server.url + "/api/v1/health", proc=proc, timeout=60)
    except Exception:
        server.stop()
        raise
    return server


@pytest.fixture
def racing_portal(transactional_db: Any) -> Iterator[LiveServer]:
    server = start_server()
    yield server
    server.stop()


def race(n: int, make: Callable[[int], tuple[str, str, dict[str, Any] | None, str]]) -> list[requests.Response]:
    """n requests released together by a barrier; make(i) -> (method, url, json, token)."""
    barrier = threading.Barrier(n)
    results: list[requests.Response | None] = [None] * n
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        method, url, body, token = make(i)
        session = requests.Session()
        try:
            barrier.wait(timeout=60)
            results[i] = session.request(
                method, url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=120
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return [r for r in results if r is not None]


def overlapping_pairs() -> int:
    """The SQL audit: pairs of active allocations of one GPU whose [start, end) intersect."""
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT count(*) FROM booking_allocation a JOIN booking_allocation b
               ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.active AND b.active
               AND a.start < b."end" AND b.start < a."end" """
        )
        return int(cursor.fetchone()[0])


def used_hours(team: Any, month: Any) -> Decimal:
    """The team's counted GPU-hours in a month, over all its usage rows (slots)."""
    from apps.booking.selectors import usage_by_month

    return usage_by_month(team_id=team.pk, months=[month])[month].gpu_hours


def body(team: str, start: datetime, end: datetime, **extra: Any) -> dict[str, Any]:
    return {"team": team, "start": start.isoformat(), "end": end.isoformat(), **extra}


def test_fifty_requests_for_one_gpu_give_one_booking(alice, bob, charlie, make_token, fleet, racing_portal):
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob, charlie)]
    teams = ["vision", "vision", "nlp"]
    start, end = slot(hours=2)
    responses = race(
        50,
        lambda i: ("POST", racing_portal.url + URL, body(teams[i % 3], start, end, gpus=["GPU-big-0"]), tokens[i % 3]),
    )
    codes = Counter(r.status_code for r in responses)
    assert codes == {201: 1, 409: 49}, codes
    assert all(r.json()["code"] == "conflict" for r in responses if r.status_code == 409)
    assert Allocation.objects.filter(active=True).count() == 1
    assert overlapping_pairs() == 0


def test_fifty_requests_by_model_fill_the_node_exactly(alice, bob, make_token, fleet, racing_portal):
    """12 A100 exist: 50 concurrent one-GPU bookings by model give exactly 12 bookings on 12 different GPUs."""
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob)]
    start, end = slot(hours=2)
    responses = race(
        50,
        lambda i: (
            "POST",
            racing_portal.url + URL,
            body("vision", start, end, gpu_model="A100-80GB", gpu_count=1),
            tokens[i % 2],
        ),
    )
    codes = Counter(r.status_code for r in responses)
    assert codes == {201: 12, 409: 38}, codes
    assert overlapping_pairs() == 0
    assert Allocation.objects.filter(active=True).values("gpu_id").distinct().count() == 12


def test_partial_overlaps_containment_and_touching_windows_race(alice, charlie, make_token, fleet, racing_portal):
    """Windows on one GPU (hours from 08:00): three touching ones that can all be booked, and overlapping,
    containing and contained ones that clash with them or each other. Whatever order the database sees them
    in, no two granted windows overlap; touching ones are never refused because of each other."""
    tokens = {
        "vision": make_token(alice, ["read", "reservations:write"]),
        "nlp": make_token(charlie, ["read", "reservations:write"]),
    }
    base, _ = slot(hour=8)
    h = timedelta(hours=1)
    windows = [(0, 2), (2, 4), (4, 6), (1, 3), (3, 5), (0.5, 1.5), (-1, 7), (1.5, 2.5), (5, 6), (2, 2.5)]
    responses = race(
        len(windows) * 2,
        lambda i: (
            "POST",
            racing_portal.url + URL,
            body(
                ("vision", "nlp")[i % 2],
                base + windows[i // 2][0] * h,
                base + windows[i // 2][1] * h,
                gpus=["GPU-big-0"],
            ),
            tokens[("vision", "nlp")[i % 2]],
        ),
    )
    assert {r.status_code for r in responses} <= {201, 409}
    assert overlapping_pairs() == 0
    granted = sorted(
        (datetime.fromisoformat(r.json()["start"]), datetime.fromisoformat(r.json()["end"]))
        for r in responses
        if r.status_code == 201
    )
    assert granted
    for (_, e1), (s2, _) in itertools.pairwise(granted):
        assert e1 <= s2
    # Every refused window really clashed with a granted one.
    for r in responses:
        if r.status_code == 409:
            assert r.json()["conflicts"], r.json()


def test_touching_windows_race_all_succeed(alice, charlie, make_token, fleet, racing_portal):
    tokens = [make_token(alice, ["read", "reservations:write"]), make_token(charlie, ["read", "reservations:write"])]
    base, _ = slot(hour=6)
    h = timedelta(hours=1)
    responses = race(
        8,
        lambda i: (
            "POST",
            racing_portal.url + URL,
            body(("vision", "nlp")[i % 2], base + i * h, base + (i + 1) * h, gpus=["GPU-big-0"]),
            tokens[i % 2],
        ),
    )
    assert [r.status_code for r in responses] == [201] * 8, [r.json() for r in responses if r.status_code != 201]
    assert overlapping_pairs() == 0


def test_quota_race_stays_within_the_quota(alice, bob, make_token, fleet, vision, racing_portal):
    """Each request fits the quota alone (2 of 10 GPU-hours); 30 together must not exceed it: exactly 5 win."""
    Quota.objects.create(team=vision, gpu_hours=Decimal("10"))
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob)]
    start, _ = slot(hours=1)
    h = timedelta(hours=1)
    gpus = [f"GPU-big-{i}" for i in range(8)] + [f"GPU-small-{i}" for i in range(4)]

    def make(i: int) -> tuple[str, str, dict[str, Any], str]:
        # Distinct GPU/time cells, so only the quota can refuse.
        s = start + (i // len(gpus)) * 2 * h
        return "POST", racing_portal.url + URL, body("vision", s, s + 2 * h, gpus=[gpus[i % len(gpus)]]), tokens[i % 2]

    responses = race(30, make)
    codes = Counter(r.status_code for r in responses)
    assert codes == {201: 5, 403: 25}, codes
    refused = [r.json() for r in responses if r.status_code == 403]
    assert all(b["code"] == "quota_exceeded" and "remaining" in b for b in refused)
    total = sum(QuotaUsage.objects.filter(team=vision).values_list("gpu_hours", flat=True))
    assert total == Decimal("10.0000")
    assert Allocation.objects.filter(active=True).count() == 5
    assert overlapping_pairs() == 0


def test_concurrency_limit_race(alice, bob, make_token, fleet, vision, racing_portal):
    """max 3 GPUs at once: 12 concurrent one-GPU bookings of the same window on distinct GPUs give exactly 3."""
    Quota.objects.create(team=vision, max_concurrent_gpus=3)
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob)]
    start, end = slot(hours=2)
    gpus = [f"GPU-big-{i}" for i in range(8)] + [f"GPU-small-{i}" for i in range(4)]
    responses = race(
        12, lambda i: ("POST", racing_portal.url + URL, body("vision", start, end, gpus=[gpus[i]]), tokens[i % 2])
    )
    assert Counter(r.status_code for r in responses) == {201: 3, 403: 9}


def test_cancel_and_early_release_free_the_gpus_at_once(alice, charlie, make_token, fleet, racing_portal):
    vision_token = make_token(alice, ["read", "reservations:write"])
    nlp_token = make_token(charlie, ["read", "reservations:write"])
    url = racing_portal.url + URL
    auth = {"Authorization": f"Bearer {vision_token}"}
    nlp_auth = {"Authorization": f"Bearer {nlp_token}"}
    # Before start: cancel, then the other team books the same GPU and window at once.
    start, end = slot(hours=2)
    r = requests.post(url, json=body("vision", start, end, gpus=["GPU-big-0"]), headers=auth, timeout=30).json()
    assert (
        requests.post(url, json=body("nlp", start, end, gpus=["GPU-big-0"]), headers=nlp_auth, timeout=30).status_code
        == 409
    )
    assert requests.delete(f"{url}{r['id']}/", headers=auth, timeout=30).json()["status"] == "cancelled"
    assert (
        requests.post(url, json=body("nlp", start, end, gpus=["GPU-big-0"]), headers=nlp_auth, timeout=30).status_code
        == 201
    )
    # Running: release early, then the other team books the rest of the slot at once.
    now = timezone.localtime()
    s = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    running = requests.post(
        url, json=body("vision", s, s + timedelta(hours=3), gpus=["GPU-big-1"]), headers=auth, timeout=30
    ).json()
    assert running["status"] == "active"
    released = requests.delete(f"{url}{running['id']}/", headers=auth, timeout=30).json()
    assert released["status"] == "released"
    after = requests.post(
        url, json=body("nlp", s, s + timedelta(hours=3), gpus=["GPU-big-1"]), headers=nlp_auth, timeout=30
    )
    assert after.status_code == 201, after.json()
    assert overlapping_pairs() == 0


def test_an_extension_races_bookings_of_the_time_it_adds(alice, charlie, make_token, fleet, vision, racing_portal):
    """One PATCH extending a booking by an hour and 29 bookings of that hour on the same GPU, released together:
    exactly one of the thirty gets the hour, whichever the database sees first; the quota counts only the winner."""
    vision_token = make_token(alice, ["read", "reservations:write"])
    nlp_token = make_token(charlie, ["read", "reservations:write"])
    url = racing_portal.url + URL
    start, end = slot(hours=2)
    auth = {"Authorization": f"Bearer {vision_token}"}
    r = requests.post(url, json=body("vision", start, end, gpus=["GPU-big-0"]), headers=auth, timeout=30).json()
    month = timezone.localtime(start).date().replace(day=1)
    counted = used_hours(vision, month)
    later = end + timedelta(hours=1)

    def make(i: int) -> tuple[str, str, dict[str, Any] | None, str]:
        if i == 0:
            return "PATCH", f"{url}{r['id']}/", {"end": later.isoformat()}, vision_token
        return "POST", url, body("nlp", end, later, gpus=["GPU-big-0"]), nlp_token

    responses = race(30, make)
    won = [i for i, resp in enumerate(responses) if resp.status_code in (200, 201)]
    assert len(won) == 1, Counter(resp.status_code for resp in responses)
    assert {resp.status_code for i, resp in enumerate(responses) if i not in won} == {409}
    assert overlapping_pairs() == 0
    extended = won == [0]
    assert used_hours(vision, month) == counted + (1 if extended else 0)
    assert Allocation.objects.filter(active=True, gpu__uuid="GPU-big-0", start__lt=later, end__gt=end).count() == 1


def test_month_boundary_and_dst_in_berlin(alice, make_token, fleet, vision, transactional_db):
    """The server in Europe/Berlin: a booking across local midnight at a month's end counts in both months;
    one across the next DST change counts the real hours."""
    from apps.booking.models import BookingPolicy

    BookingPolicy.objects.update_or_create(pk=1, defaults={"max_advance_days": 400})
    tz = ZoneInfo("Europe/Berlin")
    server = start_server(workers=1, TIME_ZONE="Europe/Berlin")
    try:
        token = make_token(alice, ["read", "reservations:write"])
        auth = {"Authorization": f"Bearer {token}"}
        today = timezone.now().astimezone(tz).date()
        m = today.month + 2
        first = datetime((today.year * 12 + m - 1) // 12, (m - 1) % 12 + 1, 1, tzinfo=tz)
        resp = requests.post(
            server.url + URL,
            json=body("vision", first - timedelta(hours=3), first + timedelta(hours=1), gpus=["GPU-big-0"]),
            headers=auth,
            timeout=30,
        )
        assert resp.status_code == 201, resp.json()
        before = (first - timedelta(days=1)).date().replace(day=1)
        assert used_hours(vision, before) == Decimal("3.0000")
        assert used_hours(vision, first.date()) == Decimal("1.0000")

        day = today + timedelta(days=1)
        while (
            datetime(day.year, day.month, day.day, 0, tzinfo=tz).utcoffset()
            == datetime(day.year, day.month, day.day, 6, tzinfo=tz).utcoffset()
        ):
            day += timedelta(days=1)
        s = datetime(day.year, day.month, day.day, 0, tzinfo=tz)
        e = datetime(day.year, day.month, day.day, 6, tzinfo=tz)
        month = s.date().replace(day=1)
        had = used_hours(vision, month)
        resp = requests.post(server.url + URL, json=body("vision", s, e, gpus=["GPU-big-1"]), headers=auth, timeout=30)
        assert resp.status_code == 201, resp.json()
        real = Decimal(int((e - s.astimezone(ZoneInfo("UTC"))).total_seconds())) / 3600
        assert real in (5, 7)
        assert used_hours(vision, month) - had == real
        # The API answers in the server's zone, with the offset.
        assert resp.json()["start"].endswith(("+01:00", "+02:00"))
    finally:
        server.stop()
