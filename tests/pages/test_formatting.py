"""Money and quantities on pages: cents and two decimals, grouped by thousands (the API keeps full precision)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.booking.models import Quota
from apps.core.templatetags.portal_format import argv, duration, money, percent, quantity
from tests.billing import helpers


@pytest.mark.parametrize(
    "value,text",
    [
        (0.00559999999999999, "0.01"),
        ("2000.0000", "2,000.00"),
        (Decimal("1234567.005"), "1,234,567.01"),
        (Decimal("-0.001"), "0.00"),
        ("0", "0.00"),
        (None, "—"),
        ("", "—"),
        ("not a number", "—"),
        (float("nan"), "—"),
    ],
)
def test_money_and_quantities_show_two_decimals_grouped(value: Any, text: str) -> None:
    assert money(value) == text
    assert quantity(value) == text


def test_money_names_its_currency_and_percent_rounds() -> None:
    assert money("204.6", "EUR") == "204.60 EUR"
    assert money(None, "EUR") == "—"
    assert percent("0.4251") == "43%" and percent(None) == "—"


def test_team_cost_page_prints_no_raw_decimals(vision: Any, bob: Any) -> None:
    Quota.objects.create(
        team=vision, gpu_hours=Decimal("2000"), budget_soft=Decimal("4000"), budget_hard=Decimal("5000")
    )
    [gpu] = helpers.gpus(1, model=helpers.gpu_model("A100-80GB", "2.1000"))
    now = timezone.now()
    # 16 s of one GPU at 2.10/h: a cost of 0.00933..., GPU-hours 0.00444...
    helpers.run_job(vision, bob, gpu, now - timedelta(seconds=16), now - timedelta(seconds=0.5))
    client = Client()
    client.force_login(bob)
    html = client.get("/costs/teams/vision/").content.decode()
    table = html[html.index('id="quota"') : html.index("</table>", html.index('id="quota"'))]
    assert "2,000.00" in table and "4,000.00 EUR" in table and "5,000.00 EUR" in table
    assert "2000.0000" not in html and "4000.0000" not in html
    for cell in table.split("<td>")[1:]:
        figure = cell.split("</td>")[0].replace(" EUR", "").replace(",", "")
        if figure.replace(".", "").isdigit():  # every figure in the quota table has exactly two decimals
            assert len(figure.split(".")[1]) == 2, figure


@pytest.mark.parametrize(
    "seconds,text",
    [(0, "0 s"), (45, "45 s"), (185, "3 min 05 s"), (14400, "4 h 00 min"), (3725.6, "1 h 02 min"), (None, "—")],
)
def test_durations_read_in_hours_minutes_and_seconds(seconds: Any, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    "value,text",
    [
        (["python", "train.py"], "python train.py"),
        (["sh", "-c", "echo a b"], "sh -c 'echo a b'"),
        (["echo", ""], "echo ''"),
        (["printf", "it's"], "printf 'it'\"'\"'s'"),
        ([], ""),
        (None, ""),
    ],
)
def test_a_command_reads_as_it_would_be_typed(value: Any, text: str) -> None:
    assert argv(value) == text
