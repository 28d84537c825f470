"""The admin's lists: those of reservations and allocations read a page of rows in a fixed number of queries (each
row's label names its team and model, ``Reservation.__str__``, which must come with the page, not one query per row),
and every registered model's list opens."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from apps.booking import services
from tests.booking.conftest import slot

pytestmark = pytest.mark.django_db


def _book(alice: Any, vision: Any, n: int) -> None:
    for day in range(1, n + 1):
        start, end = slot(days=day)
        services.reservation_create(user=alice, team=vision, start=start, end=end, gpu_model="A100-80GB", gpu_count=2)


def _queries(client: Client, path: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path).status_code == 200
    return len(queries)


@pytest.mark.parametrize("path", ["/admin/booking/reservation/", "/admin/booking/allocation/"])
def test_admin_lists_do_not_query_per_row(admin, alice, vision, fleet, path) -> None:
    client = Client()
    client.force_login(admin)
    _book(alice, vision, 2)
    few = _queries(client, path)
    _book(alice, vision, 10)  # 12 reservations, 24 allocations
    assert _queries(client, path) == few


def test_every_admin_list_opens(admin, alice, vision, fleet) -> None:
    """Every registered model's list answers 200 (a wrong name in list_select_related is a 500)."""
    from django.contrib import admin as django_admin
    from django.urls import reverse

    _book(alice, vision, 1)
    client = Client()
    client.force_login(admin)
    for model in django_admin.site._registry:
        opts = model._meta
        path = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        assert client.get(path).status_code == 200, path
