"""Reservations on Slurm-pool GPUs become Slurm reservations for the team's account: a direct sbatch from another
account is kept off them until the reservation ends in the portal; a reservation Slurm refuses is given up in the
portal with Slurm's words in the audit log; a reservation Slurm holds on other nodes than the booking is pointed at
the booking's (the portal moves a booking when its GPU is gone or repartitioned)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.slurm.bridge_procs import POOL, BridgeStack, make_stack, running_stack
from tests.support.slurm import SPARE_NODE, Slurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(slurm: Slurm, live_portal: LiveServer, alice: Any, make_token: Any, tmp_path: Path) -> Iterator[BridgeStack]:
    slurm.add_account("physics")
    made = make_stack(slurm, live_portal, alice, make_token, tmp_path)
    made.api_token = make_token(alice, ["read", "jobs:write", "reservations:write"])
    yield from running_stack(made)


def _book(stack: BridgeStack) -> Any:
    pools = {p["name"]: p for p in stack.api("GET", "/api/v1/pools/").json()}
    gpu = pools[POOL]["gpus"][0]["uuid"]
    now = datetime.now(tz=UTC)
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    body = {
        "team": "vision",
        "gpus": [gpu],
        "start": start.isoformat(),
        "end": (start + timedelta(hours=2)).isoformat(),
    }
    return stack.api("POST", "/api/v1/reservations/", json=body)


def _slurm_reservation(slurm: Slurm, rid: int) -> str:
    out = slurm.run("scontrol", "show", "reservation", f"portal-res-{rid}", "--oneliner", check=False)
    return out.stdout if out.returncode == 0 else ""


def _pending_reason(slurm: Slurm, job_id: str) -> str:
    return slurm.run("squeue", "-h", "-j", job_id, "-o", "%T|%r").stdout.strip()


def test_reservation_keeps_other_accounts_off_until_cancelled(stack: BridgeStack) -> None:
    slurm = stack.slurm
    resp = _book(stack)
    assert resp.status_code == 201, resp.text
    rid = int(resp.json()["id"])
    shown = stack.wait(lambda: _slurm_reservation(slurm, rid), 30, "the Slurm reservation")
    assert "Accounts=vision" in shown and f"Nodes={slurm.node}" in shown
    direct = slurm.run("sbatch", "--parsable", "-A", "physics", "--gres=gpu:1", "-t", "1", "-o", "/dev/null",
                       "--wrap", "true").stdout.strip()  # fmt: skip
    time.sleep(3)  # a scheduling cycle or two: it would have started at once on a free node
    state = _pending_reason(slurm, direct)
    assert state.startswith("PENDING|"), state
    assert "Reserv" in state or "ReqNodeNotAvail" in state or "Resources" in state, state
    assert stack.api("DELETE", f"/api/v1/reservations/{rid}/").status_code == 200
    stack.wait(lambda: not _slurm_reservation(slurm, rid), 30, "the Slurm reservation to go")
    assert slurm.wait_job(direct, {"COMPLETED"}, timeout=60)


def test_slurm_refusal_ends_the_portal_reservation(stack: BridgeStack) -> None:
    from apps.audit.models import AuditEvent
    from apps.booking.models import Reservation

    slurm = stack.slurm
    busy = slurm.run("sbatch", "--parsable", "-A", "physics", "--gres=gpu:1", "-t", "5", "-o", "/dev/null",
                     "--wrap", "sleep 300").stdout.strip()  # fmt: skip
    try:
        slurm.wait_job(busy, {"RUNNING"})
        resp = _book(stack)
        assert resp.status_code == 201, resp.text
        rid = int(resp.json()["id"])
        done = stack.wait(
            lambda: (r := Reservation.objects.get(pk=rid)).status in {"cancelled", "released"} and r, 30, "the refusal"
        )
        assert done.released_reason == "scheduler"
        entry = AuditEvent.objects.filter(action="reservation.refused").latest("id")
        assert "busy" in str(entry.data).lower(), entry.data
        assert not _slurm_reservation(slurm, rid)
    finally:
        slurm.run("scancel", busy, check=False)


def _nodes_of(shown: str) -> str:
    fields = dict(item.split("=", 1) for item in shown.split() if "=" in item)
    return fields.get("Nodes", "")


def _mirrored(stack: BridgeStack) -> int:
    resp = _book(stack)
    assert resp.status_code == 201, resp.text
    rid = int(resp.json()["id"])
    shown = stack.wait(lambda: _slurm_reservation(stack.slurm, rid), 30, "the Slurm reservation")
    assert _nodes_of(shown) == stack.slurm.node, shown
    return rid


def test_a_reservation_slurm_holds_on_other_nodes_is_pointed_at_the_bookings(stack: BridgeStack) -> None:
    """What the portal asks for is what Slurm holds: after the portal moved a booking to another node of the pool,
    or an admin changed the reservation in Slurm, the bridge updates the reservation's nodes, and the booking
    stands."""
    from apps.booking.models import Reservation

    slurm = stack.slurm
    rid = _mirrored(stack)
    slurm.run("scontrol", "update", f"ReservationName=portal-res-{rid}", f"Nodes={SPARE_NODE}")
    shown = stack.wait(
        lambda: (s := _slurm_reservation(slurm, rid)) and _nodes_of(s) == slurm.node and s, 30, "the move back"
    )
    assert "Accounts=vision" in shown
    assert f"portal-res-{rid} moved from {SPARE_NODE} to {slurm.node}" in stack.log()
    assert Reservation.objects.get(pk=rid).status in {"booked", "active"}


def test_slurm_refusing_the_move_ends_the_portal_reservation(stack: BridgeStack) -> None:
    """The booking's node is held by another reservation by the time the bridge points Slurm's at it: Slurm refuses,
    and the portal gives the booking up with Slurm's words, as when Slurm refuses a new one."""
    from apps.audit.models import AuditEvent
    from apps.booking.models import Reservation

    slurm = stack.slurm
    rid = _mirrored(stack)
    stack.kill_bridge()  # so that the reservation stays where the test puts it until the blocker is in place
    slurm.run("scontrol", "update", f"ReservationName=portal-res-{rid}", f"Nodes={SPARE_NODE}")
    slurm.run("scontrol", "create", "reservation", "ReservationName=blocker", "StartTime=now", "Duration=180",
              "Accounts=physics", f"Nodes={slurm.node}")  # fmt: skip
    try:
        stack.start_bridge()
        done = stack.wait(
            lambda: (r := Reservation.objects.get(pk=rid)).status in {"cancelled", "released"} and r, 30, "the refusal"
        )
        assert done.released_reason == "scheduler"
        entry = AuditEvent.objects.filter(action="reservation.refused", target_id=str(rid)).latest("id")
        assert "busy" in str(entry.data).lower() or "overlap" in str(entry.data).lower(), entry.data
        stack.wait(lambda: not _slurm_reservation(slurm, rid), 30, "the Slurm reservation to go")
    finally:
        slurm.run("scontrol", "delete", "ReservationName=blocker", check=False)


def _field(shown: str, name: str) -> str:
    return dict(item.split("=", 1) for item in shown.split() if "=" in item).get(name, "")


def test_a_changed_end_reaches_slurm_and_a_refused_one_keeps_the_booking(stack: BridgeStack) -> None:
    """Extending (or shortening) a booking in the portal moves the Slurm reservation's end on the next poll. Where
    Slurm refuses (an admin reserved the node in Slurm for right after), the booking stands, and Slurm keeps the
    old end."""
    from apps.booking.models import Reservation
    from workers.slurm_bridge.bridge import _slurm_time

    slurm = stack.slurm
    rid = _mirrored(stack)
    booked = Reservation.objects.get(pk=rid)
    later = booked.end + timedelta(hours=1)
    resp = stack.api("PATCH", f"/api/v1/reservations/{rid}/", json={"end": later.isoformat()})
    assert resp.status_code == 200, resp.text
    wanted = _slurm_time(later.timestamp())
    stack.wait(lambda: _field(_slurm_reservation(slurm, rid), "EndTime") == wanted, 30, "the new end in Slurm")
    assert f"portal-res-{rid} now ends at {wanted}" in stack.log()

    # Someone reserves the node in Slurm directly from the booking's end on; a further extension is refused there.
    after = _slurm_time((later + timedelta(minutes=1)).timestamp())
    slurm.run("scontrol", "create", "reservation", "ReservationName=admin-maint", f"StartTime={after}",
              "Duration=60", "Accounts=physics", f"Nodes={slurm.node}")  # fmt: skip
    try:
        further = later + timedelta(hours=1)
        resp = stack.api("PATCH", f"/api/v1/reservations/{rid}/", json={"end": further.isoformat()})
        assert resp.status_code == 200, resp.text
        refused = f"Slurm refused to move the end of reservation portal-res-{rid} to {_slurm_time(further.timestamp())}"
        stack.wait(lambda: refused in stack.log(), 30, "the refusal")
        time.sleep(2)  # more polls: no retry, nothing given up
        assert stack.log().count(refused) == 1
        assert _field(_slurm_reservation(slurm, rid), "EndTime") == wanted
        assert Reservation.objects.get(pk=rid).status in {"booked", "active"}
    finally:
        slurm.run("scontrol", "delete", "ReservationName=admin-maint", check=False)
