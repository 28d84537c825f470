"""Two reservations of shares of one GPU told apart by their holders' uids: the agent's `"ou"` list through
ingest and the minute flush into OwnerMinute, then the idle scan and the ledger judging each reservation by what
is its own (the GPU's work of no job, less what the other holders' uids ran)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.billing import services as billing
from apps.billing.models import UsageRecord
from apps.booking.models import ReservationStatus
from apps.efficiency import services
from apps.fleet import services as fleet_services
from apps.fleet.messages import check_row
from apps.fleet.models import Gpu
from apps.identity.models import UnixAccount
from apps.telemetry.ingest import telemetry_ingest
from apps.telemetry.models import GpuRollup, OwnerMinute
from apps.telemetry.rollups import accumulator_owners, flush_rollups
from apps.telemetry.selectors import other_holders_uids
from tests.efficiency.conftest import write_minutes
from tests.fleet.util import row, telemetry
from tests.sharing.test_idle_parts import _active

pytestmark = pytest.mark.django_db

ALICE_UID, BOB_UID = 1001, 1002


def _owners(gpu: Gpu, start: datetime, minutes: int, *, total: tuple[float, int], **per_uid: tuple[float, int]) -> None:
    """The GPU's work of no job per minute (`total`: SM %, MiB) and each uid's part of it (`uid_<n>=(%, MiB)`)."""
    end = start + timedelta(minutes=minutes)
    GpuRollup.objects.filter(gpu=gpu, minute__gte=start, minute__lt=end).update(
        others_util_mean=total[0], others_mem_max=total[1]
    )
    OwnerMinute.objects.filter(gpu=gpu, minute__gte=start, minute__lt=end).delete()
    OwnerMinute.objects.bulk_create(
        [
            OwnerMinute(gpu=gpu, uid=int(key.removeprefix("uid_")), minute=start + timedelta(minutes=i),
                        util_mean=util, mem_used_max=mem)
            for i in range(minutes)
            for key, (util, mem) in per_uid.items()
        ]
    )  # fmt: skip


def test_the_row_carries_each_owners_work() -> None:
    parsed = check_row(row("GPU-x", extra={"o": [5_000, 40], "ou": [[1001, 3_000, 30], [1002, 2_000]]}))
    assert parsed.others_by_uid == {1001: (3_000, 30), 1002: (2_000, None)}
    bad = [[-1, 10], [True, 10], ["1001", 10], [1003, -5], [1004, 10**9], [1005, 10, 101], [2**32, 1], 7, [1]]
    parsed = check_row(row("GPU-x", mem_total=81_920, extra={"o": [100, 1], "ou": bad}))
    assert parsed.others_by_uid == {1005: (10, None)}  # a bad entry is left out alone; a bad % drops the % alone
    # Owners travel only beside a sound total: both are the same listing's.
    assert check_row(row("GPU-x", extra={"o": [-1], "ou": [[1001, 3]]})).others_by_uid is None
    assert check_row(row("GPU-x", extra={"o": [5], "ou": "no"})).others_by_uid is None


def test_owner_means_are_over_every_tick_that_read_the_gpus_processes() -> None:
    """An owner absent from a tick ran nothing in it: its mean is over all the minute's `"o"` ticks, so the
    owners' means add up to the GPU's."""
    raw = {
        "GPU-a|ju_n0": "4", "GPU-a|ju_s0": "160", "GPU-a|o1001": "3000", "GPU-a|ou_s1001": "120",
        "GPU-a|o1002": "500", "GPU-a|ou_s1002": "40", "GPU-a|o1003": "10", "GPU-b|o7": "1", "GPU-a|oops": "1",
    }  # fmt: skip
    assert accumulator_owners(raw) == {
        (1001, "GPU-a"): (3000, 30.0),
        (1002, "GPU-a"): (500, 10.0),
        (1003, "GPU-a"): (10, None),  # its % was never read
        (7, "GPU-b"): (1, None),
    }


def test_owners_go_through_ingest_into_minutes_of_shared_gpus_only(settings, sharing_fleet) -> None:
    minute = int(datetime.now(UTC).timestamp() // 60 * 60) - 120
    settings.TELEMETRY_MAX_AGE_S = 300
    _, token = fleet_services.node_token_issue(node_name="shared")
    ticks = (
        (5, {"o": [3_000, 50], "ou": [[ALICE_UID, 2_000, 40], [BOB_UID, 1_000, 10]]}),
        (25, {"o": [4_000, 20], "ou": [[ALICE_UID, 4_000, 20]]}),  # Bob's process ended
        (45, {"o": [0, 0], "ou": []}),
    )
    for offset, extra in ticks:
        rows = [row("GPU-shared-0", mem=30_000, extra=extra), row("GPU-shared-1", mem=9_000, extra=extra)]
        assert telemetry_ingest(telemetry("shared", token, rows, ts=minute + offset), now=minute + offset).accepted == 2
    flush_rollups(now=minute + 60 + 300 + 6)
    at = datetime.fromtimestamp(minute, tz=UTC)
    rollup = GpuRollup.objects.get(gpu__uuid="GPU-shared-0", minute=at)
    assert (rollup.others_mem_max, rollup.others_util_mean) == (4_000, round(70 / 3, 3))
    owners = {o.uid: (o.mem_used_max, o.util_mean) for o in OwnerMinute.objects.filter(gpu__uuid="GPU-shared-0")}
    assert owners == {ALICE_UID: (4_000, 20.0), BOB_UID: (1_000, round(10 / 3, 3))}
    # GPU-shared-1 is not split in shares: one holder's, whose figures are the GPU's rollup.
    assert not OwnerMinute.objects.filter(gpu__uuid="GPU-shared-1").exists()


def test_whose_work_is_taken_out() -> None:
    uids = {1: ALICE_UID, 2: BOB_UID}
    assert other_holders_uids(1, [], uids) == frozenset()  # alone: everything of no job's is the holder's
    assert other_holders_uids(1, [2], uids) == frozenset({BOB_UID})
    assert other_holders_uids(3, [2], uids) == frozenset({BOB_UID})  # the holder's own uid need not be known
    assert other_holders_uids(1, [1, 2], uids) == frozenset({BOB_UID})  # a second reservation of the same person
    assert other_holders_uids(2, [3], uids) is None  # a neighbour whose uid is unknown: cannot be told
    assert other_holders_uids(2, [None], uids) is None


def _map(alice: Any, bob: Any) -> None:
    UnixAccount.objects.create(user=alice, uid=ALICE_UID)
    UnixAccount.objects.create(user=bob, uid=BOB_UID)


def test_of_two_reservations_on_one_gpu_the_idle_one_is_reclaimed_and_the_busy_one_kept(alice, bob, sharing_fleet):
    shared = sharing_fleet["shared"]
    _map(alice, bob)
    mine, theirs = _active(alice, gpu_share=0.25), _active(bob, gpu_share=0.25)
    start = mine.start
    # Bob's notebook keeps the GPU at 80%; Alice's holds a model and computes nothing.
    write_minutes(shared, start, 196, util=80, mem=30_000)
    _owners(shared, start, 196, total=(80.0, 16_000), uid_1001=(0.0, 6_000), uid_1002=(80.0, 10_000))
    assert services.idle_scan(now=start + timedelta(minutes=180)).warned == [f"reservations/{mine.pk}"]
    assert services.idle_scan(now=start + timedelta(minutes=196)).reclaimed == [f"reservations/{mine.pk}"]
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.status != ReservationStatus.ACTIVE and theirs.status == ReservationStatus.ACTIVE


def test_work_of_no_holder_counts_to_both(alice, bob, sharing_fleet):
    """A process whose owner holds no reservation (an admin's tool under another uid) may be either holder's: it
    keeps both busy rather than reclaiming one on a guess."""
    shared = sharing_fleet["shared"]
    _map(alice, bob)
    mine, theirs = _active(alice, gpu_share=0.25), _active(bob, gpu_share=0.25)
    assert theirs.start == mine.start
    write_minutes(shared, mine.start, 200, util=60, mem=20_000)
    _owners(shared, mine.start, 200, total=(60.0, 8_000), uid_1001=(0.0, 2_000), uid_1002=(0.0, 2_000))
    assert services.idle_scan(now=mine.start + timedelta(minutes=200)).warned == []


def test_a_neighbour_without_a_known_uid_keeps_the_gpus_figures(alice, bob, sharing_fleet):
    shared = sharing_fleet["shared"]
    UnixAccount.objects.create(user=alice, uid=ALICE_UID)  # Bob's uid is not known
    mine, _ = _active(alice, gpu_share=0.25), _active(bob, gpu_share=0.25)
    write_minutes(shared, mine.start, 200, util=80, mem=30_000)
    _owners(shared, mine.start, 200, total=(80.0, 16_000), uid_1001=(0.0, 6_000), uid_1002=(80.0, 10_000))
    assert services.idle_scan(now=mine.start + timedelta(minutes=200)).warned == []


def test_each_reservations_ledger_rows_carry_its_own_work(vision, alice, bob, sharing_fleet):
    from tests.billing.helpers import reserve

    parent = sharing_fleet["shared"]
    first, second, third = Gpu.devices.filter(parent=parent).order_by("index")[:3]
    _map(alice, bob)
    end = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    start = end - timedelta(hours=1)
    earlier = start - timedelta(hours=1)
    write_minutes(parent, earlier, 120, util=90.0, mem=40_000)
    _owners(parent, earlier, 120, total=(45.0, 12_000), uid_1001=(5.0, 6_000), uid_1002=(40.0, 6_000))
    # The earlier hour: Alice and Bob.
    (alices,) = reserve(vision, alice, [first], earlier, start)
    (bobs,) = reserve(vision, bob, [second], earlier, start)
    # The later hour: the same two and a third holder whose uid is not known. Alice's and Bob's parts cannot be told
    # (Carol's work may be in either); Carol's can: what is left once theirs is taken out, nothing.
    (alices_later,) = reserve(vision, alice, [first], start, end)
    (bobs_later,) = reserve(vision, bob, [second], start, end)
    carol = type(alice).objects.create_user("carol-owner")
    (carols,) = reserve(vision, carol, [third], start, end)
    billing.ledger_close(now=timezone.now())

    def utilization(allocation: Any) -> Decimal | None:
        (record,) = UsageRecord.objects.filter(source="reservation", source_id=allocation.reservation_id)
        assert record.share == Decimal("0.25")
        return record.mean_utilization

    assert utilization(alices) == Decimal("0.05") and utilization(bobs) == Decimal("0.40")
    assert [utilization(a) for a in (alices_later, bobs_later, carols)] == [None, None, Decimal(0)]
