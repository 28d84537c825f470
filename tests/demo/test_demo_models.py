"""The demo agrees with itself: its usage history, prices, reservations, calendar and jobs name the models of the
GPUs they sit on, before and after the local agent registers the GPUs it really has."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from apps.billing import costing, selectors
from apps.billing.models import Price
from apps.booking.models import Allocation, Reservation
from apps.booking.services.calendar import calendar_feed_regenerate
from apps.core.redis import get_redis
from apps.fleet import services as fleet_services
from apps.fleet import tasks as fleet_tasks
from apps.fleet.demo import local_models
from apps.fleet.models import Gpu, GpuModel
from apps.identity.models import UnixAccount
from apps.jobs.models import Job
from workers.gpu.simulated import SimulatedBackend

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_live_state() -> None:
    redis = get_redis()
    for pattern in ("billing:*", "fleet:*"):
        keys = list(redis.scan_iter(pattern))
        if keys:
            redis.delete(*keys)


def _fleet_models() -> set[str]:
    return set(Gpu.objects.filter(retired_at__isnull=True).values_list("model__name", flat=True))


def _register_local_agent() -> None:
    """What the launcher's simulated local agent sends when it starts (workers.agent, seed 0)."""
    backend = SimulatedBackend("local", local_models(), seed=0)
    _, token = fleet_services.node_token_issue(node_name="local")
    fleet_tasks.register(
        {
            "node": "local",
            "token": token,
            "ts": time.time(),
            "gpus": [{k: v for k, v in info.to_dict().items() if k != "extra"} for info in backend.discover()],
            "agent_version": "0.1.0",
            "driver_version": "550.127.05",
            "hostname": "localhost",
            "backend": "simulated",
        }
    )


def _check(admin: Any) -> None:
    fleet = _fleet_models()
    assert fleet == set(local_models()) and len(fleet) == 5
    # Every model with a GPU has a price, on the price list admins read (the API behind the Prices page).
    priced = set(Price.objects.values_list("gpu_model__name", flat=True))
    assert fleet <= priced
    client = Client()
    client.force_login(admin)
    listed = client.get("/api/v1/prices/?limit=100")
    assert listed.status_code == 200, listed.content
    body = listed.json()
    rows = body["results"] if isinstance(body, dict) else body
    assert fleet <= {r["gpu_model"] for r in rows}
    # The monthly report bills the fleet's models, each of them (eight GPUs booked for two months).
    now = timezone.now()
    last = costing.previous_month(selectors.current_month(now=now))
    report = selectors.monthly_report(user=admin, month=last)
    assert {m["gpu_model"] for m in report["totals"]["by_gpu_model"]} == fleet
    # A reservation names the model of the GPUs it holds; so does a job.
    for allocation in Allocation.objects.filter(reservation__isnull=False).select_related("gpu", "reservation"):
        assert allocation.reservation.gpu_model_id == allocation.gpu.model_id, allocation.reservation.note
    for job in Job.objects.filter(gpus__isnull=False).distinct():
        assert set(job.gpus.values_list("model__name", flat=True)) <= set(job.gpu_models), job.name
    # The calendar: each event's summary names the model of the GPUs its description lists.
    gpu_model = {f"{g.node.name}/{g.index}": g.model.name for g in Gpu.objects.select_related("node", "model")}
    alice = get_user_model().objects.get(username="alice")
    key = calendar_feed_regenerate(user=alice)
    feed = Client().get(f"/book/calendar/{key}.ics")
    assert feed.status_code == 200
    text = feed.content.decode().replace("\r\n ", "")  # unfold long lines
    events = text.split("BEGIN:VEVENT")[1:]
    assert len(events) >= 3
    for event in events:
        summary = re.search(r"^SUMMARY:(.*)$", event, re.M).group(1)  # type: ignore[union-attr]
        held = re.search(r"GPUs: ([^\\\r\n]*)", event).group(1)  # type: ignore[union-attr]
        # A part is named by its GPU and the part: "local/3 · 1g.10gb", "local/2 · share 1/4".
        where = [g.split(" · ")[0].strip() for g in held.replace("\\,", ",").split(",") if g.strip()]
        models = {gpu_model[g] for g in where}
        assert models and all(m in summary for m in models), (summary, held)
    slices = [e for e in events if " · " in e]
    assert any(": 1 x 1g.10gb of A100-80GB" in e and "· 1g.10gb" in e for e in slices), slices
    assert any(": 0.25 of one A100-80GB" in e and "· share " in e for e in slices), slices


def test_demo_history_prices_reservations_and_calendar_follow_the_real_models(admin: Any) -> None:
    call_command("load_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert Reservation.objects.filter(note__startswith="demo: ").exists()  # the coming days' bookings
    uids = dict(UnixAccount.objects.values_list("user__username", "uid"))
    assert uids == {"alice": 1001, "bob": 1002, "carol": 1003}  # the uids their processes run as on a node
    _check(admin)
    # The local agent registers the GPUs it has: the same rows, the same models; nothing contradicts afterwards,
    # and loading again (each launcher start does) adds nothing.
    before = dict(Gpu.objects.values_list("uuid", "model__name"))
    _register_local_agent()
    assert dict(Gpu.objects.filter(retired_at__isnull=True).values_list("uuid", "model__name")) == before
    counts = (Reservation.objects.count(), Price.objects.count(), GpuModel.objects.count())
    call_command("load_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert (Reservation.objects.count(), Price.objects.count(), GpuModel.objects.count()) == counts
    assert dict(UnixAccount.objects.values_list("user__username", "uid")) == uids
    _check(admin)


def test_demo_history_counts_against_the_teams_quotas(admin: Any) -> None:
    """The history's bookings hold quota as bookings made through the portal do, at the price of their day, so the
    Book page's quota line and the Costs page's quota table agree with what the history billed."""
    from decimal import Decimal

    from apps.accounts.models import Team
    from apps.billing.demo import HISTORY_NOTE
    from apps.billing.models import UsageRecord
    from apps.booking.models import QuotaHold
    from apps.booking.selectors import quota_summary

    call_command("load_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    history = Reservation.objects.filter(note=HISTORY_NOTE)
    holds = {h.reservation_id: h for h in QuotaHold.objects.filter(reservation__in=history)}
    assert history.exists() and len(holds) == history.count()
    for r in history:
        assert (holds[r.pk].start, holds[r.pk].end, holds[r.pk].active) == (r.start, r.end, True)
    month = selectors.current_month()
    for team in Team.objects.filter(slug__in=["vision", "nlp"]):
        booked = Decimal(quota_summary(team=team)["booked"]["gpu_hours"])
        billed = sum(
            (u.gpu_seconds for u in UsageRecord.objects.filter(team=team, month=month, source="reservation")), 0
        )
        assert booked >= Decimal(billed) / 3600 > 0, (team.slug, booked, billed)
    # Loading again adds no holds.
    count = QuotaHold.objects.count()
    call_command("load_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert QuotaHold.objects.count() == count


def test_demo_history_shares_have_utilization_like_whole_gpus(admin: Any) -> None:
    """The history's share bookings are billed with a measured-looking utilization (their holders' process readings
    are not part of the history), so the heatmap has a row for the GPU split in shares and the efficiency figures do
    not count its hours as without telemetry."""
    from apps.billing.demo import HISTORY_NOTE, NO_TELEMETRY_SHARE
    from apps.billing.models import UsageRecord
    from apps.fleet.models import DeviceKind

    call_command("load_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    history = set(Reservation.objects.filter(note=HISTORY_NOTE).values_list("pk", flat=True))
    rows = UsageRecord.objects.filter(source="reservation", source_id__in=history, gpu__kind=DeviceKind.SHARE)
    measured = rows.filter(mean_utilization__isnull=False).count()
    assert rows.count() > 20 and measured >= rows.count() * (1 - 3 * NO_TELEMETRY_SHARE)
    assert all(0 <= u <= 1 for u in rows.exclude(mean_utilization=None).values_list("mean_utilization", flat=True))
    shared = Gpu.objects.filter(pk__in=rows.values("gpu__parent_id")).select_related("node", "model").get()
    heatmap = selectors.utilization_heatmap(month=costing.previous_month(selectors.current_month()))
    assert f"{shared.node.name}/{shared.index} {shared.model.name}" in heatmap["gpus"]
