"""Prices with validity periods: price_set, re-rating the open month, closed months refused, list price sync."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from apps.audit.models import AuditEvent
from apps.billing import selectors, services
from apps.billing.models import MonthClose, MonthStatus, Price, UsageRecord
from apps.core.errors import ValidationFailed
from tests.billing import helpers

pytestmark = pytest.mark.django_db


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_the_first_price_change_keeps_the_list_price_as_history(admin):
    model = helpers.gpu_model(price="2.5000")
    services.price_set(actor=admin, gpu_model=model, hourly_price="3.10", valid_from=utc(2026, 10, 10))
    points = [(p.valid_from, p.hourly_price) for p in Price.objects.order_by("valid_from")]
    assert points == [(utc(1970, 1, 1), Decimal("2.5")), (utc(2026, 10, 10), Decimal("3.1"))]
    assert selectors.price_at(gpu_model_id=model.pk, at=utc(2026, 10, 9)) == Decimal("2.5")
    assert selectors.price_at(gpu_model_id=model.pk, at=utc(2026, 10, 10)) == Decimal("3.1")
    assert AuditEvent.objects.filter(action="billing.price_set").count() == 1


def test_a_date_means_local_midnight(admin, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    model = helpers.gpu_model()
    price = services.price_set(actor=admin, gpu_model=model, hourly_price="1", valid_from=date(2026, 11, 1))
    assert price.valid_from == utc(2026, 10, 31, 23)


def test_a_price_change_into_the_open_month_rerates_its_rows(admin, vision, bob):
    [gpu] = helpers.gpus(1)
    helpers.reserve(vision, bob, [gpu], utc(2026, 10, 5, 10), utc(2026, 10, 5, 14))
    services.ledger_close(now=utc(2026, 10, 6))
    assert UsageRecord.objects.get().cost == Decimal("10")  # 4 h x 2.50
    services.price_set(
        actor=admin, gpu_model=gpu.model, hourly_price="4", valid_from=utc(2026, 10, 5, 12), now=utc(2026, 10, 6)
    )
    rows = list(UsageRecord.objects.order_by("start").values_list("gpu_seconds", "hourly_price", "cost"))
    assert rows == [(7200, Decimal("2.5"), Decimal("5")), (7200, Decimal("4"), Decimal("8"))]
    event = AuditEvent.objects.get(action="billing.price_set")
    assert event.data["rerated_rows_removed"] == 1 and event.data["rerated_rows_written"] == 2


def test_a_price_change_into_a_closed_month_is_refused(admin, vision, bob):
    model = helpers.gpu_model()
    MonthClose.objects.create(month=date(2026, 9, 1), status=MonthStatus.CLOSED, closed_at=utc(2026, 10, 1))
    with pytest.raises(ValidationFailed) as exc:
        services.price_set(actor=admin, gpu_model=model, hourly_price="9", valid_from=utc(2026, 9, 20))
    assert exc.value.code == "month_closed"
    # Before the closed month counts too: the price would apply through it.
    with pytest.raises(ValidationFailed):
        services.price_set(actor=admin, gpu_model=model, hourly_price="9", valid_from=utc(2026, 8, 20))
    assert not Price.objects.exists()
    # After it is fine; and a re-opened month accepts changes again.
    services.price_set(actor=admin, gpu_model=model, hourly_price="9", valid_from=utc(2026, 10, 1))
    MonthClose.objects.filter(month=date(2026, 9, 1)).update(status=MonthStatus.REOPENED)
    services.price_set(actor=admin, gpu_model=model, hourly_price="8", valid_from=utc(2026, 9, 20))


def test_a_backdated_price_bounded_by_a_later_one_may_precede_a_closed_month_only_if_it_ends_before(admin):
    model = helpers.gpu_model()
    services.price_set(actor=admin, gpu_model=model, hourly_price="3", valid_from=utc(2026, 8, 1))
    MonthClose.objects.create(month=date(2026, 9, 1), status=MonthStatus.CLOSED, closed_at=utc(2026, 10, 1))
    # [Jul 10, Aug 1) touches no closed month.
    services.price_set(actor=admin, gpu_model=model, hourly_price="2", valid_from=utc(2026, 7, 10))


def test_the_list_price_follows_the_price_in_force(admin):
    model = helpers.gpu_model(price="2.5000")
    now = utc(2026, 10, 10, 12)
    services.price_set(actor=admin, gpu_model=model, hourly_price="3", valid_from=now - timedelta(days=1), now=now)
    services.price_set(actor=admin, gpu_model=model, hourly_price="5", valid_from=now + timedelta(days=1), now=now)
    assert services.list_prices_sync(now=now) == 1
    model.refresh_from_db()
    assert model.hourly_price == Decimal("3")
    assert services.list_prices_sync(now=now) == 0
    assert services.list_prices_sync(now=now + timedelta(days=2)) == 1
    model.refresh_from_db()
    assert model.hourly_price == Decimal("5")


@pytest.mark.parametrize(
    "body,field",
    [
        ({"gpu_model": "A100-80GB", "valid_from": "2026-09-15", "hourly_price": "3"}, "valid_from"),
        ({"gpu_model": "A100-80GB", "valid_from": "2026-10-15T10:00:00", "hourly_price": "3"}, "valid_from"),
        ({"gpu_model": "A100-80GB", "valid_from": "yesterday", "hourly_price": "3"}, "valid_from"),
        ({"gpu_model": "A100-80GB", "valid_from": "2026-10-15", "hourly_price": "-1"}, "hourly_price"),
        ({"gpu_model": "A100-80GB", "valid_from": "2026-10-15", "hourly_price": "1.123456"}, "hourly_price"),
        ({"gpu_model": "nope", "valid_from": "2026-10-15", "hourly_price": "3"}, "gpu_model"),
    ],
)
def test_price_api_refuses_bad_input_and_closed_months(api_as, admin, body, field):
    helpers.gpu_model()
    MonthClose.objects.create(month=date(2026, 9, 1), status=MonthStatus.CLOSED, closed_at=utc(2026, 10, 1))
    resp = api_as(admin).post("/api/v1/prices/", body, format="json")
    assert resp.status_code == 400, resp.content
    assert field in resp.json()["fields"]
    assert not Price.objects.exists()


def test_price_api_admin_sets_and_everyone_reads(api_as, admin, alice, bob):
    helpers.gpu_model()
    resp = api_as(admin).post(
        "/api/v1/prices/",
        {"gpu_model": "A100-80GB", "valid_from": "2026-10-15T00:00:00+00:00", "hourly_price": "3.25"},
        format="json",
    )
    assert resp.status_code == 201, resp.content
    assert resp.json()["hourly_price"] == "3.2500"
    assert api_as(alice).post("/api/v1/prices/", {}, format="json").status_code == 403
    listing = api_as(bob).get("/api/v1/prices/?gpu_model=A100-80GB").json()["results"]
    assert [p["hourly_price"] for p in listing] == ["2.5000", "3.2500"]
    assert api_as(None).get("/api/v1/prices/").status_code == 401
