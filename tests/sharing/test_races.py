"""50 real parallel HTTP requests (live server, several worker processes) for a quarter of one shared GPU and for
one 1g.10gb MIG instance: exactly as many winners as there are shares or instances, the rest 409 `conflict` in the
API's error shape, and the SQL audit finds no device held twice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from apps.booking.models import Allocation
from tests.booking.conftest import slot
from tests.booking.test_concurrency import body, overlapping_pairs, race, start_server
from tests.conftest import LiveServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

URL = "/api/v1/reservations/"


@pytest.fixture
def racing_portal(transactional_db: Any) -> Iterator[LiveServer]:
    server = start_server()
    yield server
    server.stop()


def _race(portal: Any, tokens: list[str], **extra: Any) -> Counter[int]:
    start, end = slot(hours=2)
    teams = ["vision", "vision", "nlp"]
    responses = race(50, lambda i: ("POST", portal.url + URL, body(teams[i % 3], start, end, **extra), tokens[i % 3]))
    for r in responses:
        if r.status_code == 409:
            assert r.json()["code"] == "conflict" and r.json()["detail"], r.json()
    return Counter(r.status_code for r in responses)


def test_fifty_requests_for_a_quarter_give_four_winners(alice, bob, charlie, make_token, sharing_fleet, racing_portal):
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob, charlie)]
    codes = _race(racing_portal, tokens, gpu_share=0.25, gpus=["GPU-shared-0"])
    assert codes == {201: 4, 409: 46}, codes
    held = Allocation.objects.filter(active=True)
    assert held.count() == 4
    assert {a.gpu.parent_id for a in held} == {sharing_fleet["shared"].pk}
    assert overlapping_pairs() == 0


def test_fifty_requests_for_a_mig_profile_give_seven_winners(
    alice, bob, charlie, make_token, sharing_fleet, racing_portal
):
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob, charlie)]
    codes = _race(racing_portal, tokens, mig_profile="1g.10gb")
    assert codes == {201: 7, 409: 43}, codes
    held = Allocation.objects.filter(active=True)
    assert held.values("gpu_id").distinct().count() == 7
    assert all(a.gpu.mig_profile == "1g.10gb" for a in held)
    assert overlapping_pairs() == 0


def test_whole_gpu_and_shares_race_on_one_gpu(alice, bob, charlie, make_token, sharing_fleet, racing_portal):
    """Whole-GPU requests and quarter requests for the same GPU at once: either one whole booking and no share,
    or shares only (at most four)."""
    tokens = {t: make_token(u, ["read", "reservations:write"]) for t, u in (("vision", alice), ("nlp", charlie))}
    start, end = slot(hours=2)

    def make(i: int) -> tuple[str, str, dict[str, Any], str]:
        team = ("vision", "nlp")[i % 3 % 2]
        extra: dict[str, Any] = {"gpus": ["GPU-shared-0"]}
        if i % 2:
            extra["gpu_share"] = 0.25
        return ("POST", racing_portal.url + URL, body(team, start, end, **extra), tokens[team])

    responses = race(40, make)
    assert {r.status_code for r in responses} <= {201, 409}
    won = [r.json() for r in responses if r.status_code == 201]
    shares = [w["gpus"][0]["share"] for w in won]
    assert shares == [1.0] or (shares and all(s == 0.25 for s in shares) and len(shares) <= 4), shares
    assert overlapping_pairs() == 0


def test_fifty_requests_for_a_quarter_of_any_gpu_give_four_winners(
    alice, bob, charlie, make_token, sharing_fleet, racing_portal
):
    """No model and no GPU named: placement still runs under the placement lock of every model with shares, so
    the racers pick from what the others left instead of all reaching for the first free share."""
    tokens = [make_token(u, ["read", "reservations:write"]) for u in (alice, bob, charlie)]
    codes = _race(racing_portal, tokens, gpu_share=0.25)
    assert codes == {201: 4, 409: 46}, codes
    held = Allocation.objects.filter(active=True)
    assert held.values("gpu_id").distinct().count() == 4
    assert {a.gpu.parent_id for a in held} == {sharing_fleet["shared"].pk}
    assert overlapping_pairs() == 0


def test_whole_bookings_by_model_and_shares_race_for_the_last_gpu(
    alice, bob, charlie, make_token, sharing_fleet, racing_portal
):
    """The model's exclusive GPUs are booked: whole-GPU requests by model (which then take the shared GPU through
    all its shares) and quarter requests at once give one whole booking and no share, or four shares."""
    from apps.accounts.models import Team
    from apps.booking.services import reservation_create

    start, end = slot(hours=2)
    for _ in range(2):
        reservation_create(
            user=alice, team=Team.objects.get(slug="vision"), start=start, end=end, gpu_model="A100-80GB", gpu_count=1
        )
    tokens = {t: make_token(u, ["read", "reservations:write"]) for t, u in (("vision", alice), ("nlp", charlie))}

    def make(i: int) -> tuple[str, str, dict[str, Any], str]:
        team = ("vision", "nlp")[i % 3 % 2]
        extra: dict[str, Any] = {"gpu_share": 0.25} if i % 2 else {"gpu_model": "A100-80GB", "gpu_count": 1}
        return ("POST", racing_portal.url + URL, body(team, start, end, **extra), tokens[team])

    responses = race(40, make)
    assert {r.status_code for r in responses} <= {201, 409}
    won = [r.json()["gpus"] for r in responses if r.status_code == 201]
    shares = sorted(g["share"] for gpus in won for g in gpus)
    assert shares in ([1.0], [0.25] * 4), won
    assert {g["uuid"] for gpus in won for g in gpus} == {"GPU-shared-0"}
    assert overlapping_pairs() == 0
