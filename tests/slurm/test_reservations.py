"""Reservations on Slurm-pool GPUs become Slurm reservations for the team's account: a direct sbatch from another
account is kept off them until the reservation ends in the portal; a reservation Slurm refuses is given up in the
portal with Slurm's words in the audit log."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.slurm.bridge_procs import POOL, BridgeStack, make_stack, running_stack
from tests.support.slurm import Slurm

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
