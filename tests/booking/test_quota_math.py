"""Quota arithmetic and placement as plain functions: no database."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from apps.booking import quota as q
from apps.booking.placement import FreeGpu, place

BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_month_bounds_in_local_time():
    first, after = q.month_bounds(date(2026, 3, 1), BERLIN)
    assert first == utc(2026, 2, 28, 23)  # CET, UTC+1
    assert after == utc(2026, 3, 31, 22)  # CEST, UTC+2


def test_split_across_month_boundary_counts_each_side():
    # 22:00-02:00 Berlin time on the night of 31 Oct -> 1 Nov 2026 (CET after the October change).
    start = datetime(2026, 10, 31, 22, tzinfo=BERLIN)
    end = datetime(2026, 11, 1, 2, tzinfo=BERLIN)
    parts = q.split_by_month(start, end, BERLIN)
    assert parts == [(date(2026, 10, 1), Decimal(7200)), (date(2026, 11, 1), Decimal(7200))]


def test_month_boundary_depends_on_time_zone():
    start, end = utc(2026, 5, 31, 21), utc(2026, 5, 31, 23)
    assert [m for m, _ in q.split_by_month(start, end, UTC)] == [date(2026, 5, 1)]
    # 23:00-01:00 in Berlin: half of it is already June.
    assert q.split_by_month(start, end, BERLIN) == [
        (date(2026, 5, 1), Decimal(3600)),
        (date(2026, 6, 1), Decimal(3600)),
    ]


def test_dst_spring_forward_night_is_one_hour_shorter():
    # 29 Mar 2026: 02:00 CET jumps to 03:00 CEST. 00:00-06:00 local is 5 real hours.
    start = datetime(2026, 3, 29, 0, tzinfo=BERLIN)
    end = datetime(2026, 3, 29, 6, tzinfo=BERLIN)
    amounts = q.hold_amounts(start=start, end=end, gpu_count=2, hourly_rate=Decimal("5"), tz=BERLIN)
    assert amounts == {date(2026, 3, 1): q.Amount(Decimal("10.0000"), Decimal("25.0000"))}


def test_dst_fall_back_night_is_one_hour_longer():
    start = datetime(2026, 10, 25, 0, tzinfo=BERLIN)
    end = datetime(2026, 10, 25, 6, tzinfo=BERLIN)
    [(_, seconds)] = q.split_by_month(start, end, BERLIN)
    assert seconds == 7 * 3600


def test_long_booking_spans_three_months():
    start, end = utc(2026, 1, 20), utc(2026, 3, 10)
    parts = q.split_by_month(start, end, UTC)
    assert [m for m, _ in parts] == [date(2026, 1, 1), date(2026, 2, 1), date(2026, 3, 1)]
    assert sum(s for _, s in parts) == Decimal((end - start).total_seconds())


def test_hold_amounts_round_to_four_places():
    amounts = q.hold_amounts(
        start=utc(2026, 1, 1), end=utc(2026, 1, 1, 0, 20), gpu_count=1, hourly_rate=Decimal("1"), tz=UTC
    )
    assert amounts[date(2026, 1, 1)] == q.Amount(Decimal("0.3333"), Decimal("0.3333"))


def test_amounts_delta_when_cut_short():
    before = q.hold_amounts(
        start=utc(2026, 1, 31, 20), end=utc(2026, 2, 1, 4), gpu_count=1, hourly_rate=Decimal(2), tz=UTC
    )
    after = q.hold_amounts(
        start=utc(2026, 1, 31, 20), end=utc(2026, 1, 31, 22), gpu_count=1, hourly_rate=Decimal(2), tz=UTC
    )
    delta = q.amounts_delta(before, after)
    assert delta == {
        date(2026, 1, 1): q.Amount(Decimal("-2.0000"), Decimal("-4.0000")),
        date(2026, 2, 1): q.Amount(Decimal("-4.0000"), Decimal("-8.0000")),
    }


def test_peak_concurrency_touching_intervals_do_not_stack():
    t = utc(2026, 1, 1)
    h = timedelta(hours=1)
    intervals = [(t, t + 2 * h, 2), (t + 2 * h, t + 4 * h, 3), (t + h, t + 3 * h, 1)]
    assert q.peak_concurrency(intervals, t, t + 4 * h) == 4
    assert q.peak_concurrency(intervals, t + 3 * h, t + 4 * h) == 3
    assert q.peak_concurrency([], t, t + h) == 0


@pytest.mark.parametrize(
    "used,add,ok,exceeded",
    [
        ("0", "10", True, ()),
        ("5", "5", True, ()),
        ("5", "5.0001", False, ("gpu_hours",)),
        ("10", "0", True, ()),
    ],
)
def test_evaluate_gpu_hours(used, add, ok, exceeded):
    limits = q.Limits(gpu_hours=Decimal("10"))
    v = q.evaluate(limits=limits, used=q.Amount(Decimal(used)), add=q.Amount(Decimal(add)))
    assert v.ok is ok and v.exceeded == exceeded
    assert v.remaining["gpu_hours"] == Decimal("10") - Decimal(used)


def test_evaluate_budget_soft_warns_hard_refuses():
    limits = q.Limits(budget_soft=Decimal("100"), budget_hard=Decimal("150"))
    warn = q.evaluate(limits=limits, used=q.Amount(cost=Decimal("90")), add=q.Amount(cost=Decimal("20")))
    assert warn.ok and warn.warnings == ("budget_soft",)
    refuse = q.evaluate(limits=limits, used=q.Amount(cost=Decimal("140")), add=q.Amount(cost=Decimal("20")))
    assert not refuse.ok and refuse.exceeded == ("budget",)
    assert refuse.remaining["budget"] == Decimal("10.0000")


def test_evaluate_concurrency():
    limits = q.Limits(max_concurrent_gpus=4)
    assert q.evaluate(limits=limits, used=q.Amount(), add=q.Amount(), peak=2, add_gpus=2).ok
    v = q.evaluate(limits=limits, used=q.Amount(), add=q.Amount(), peak=3, add_gpus=2)
    assert v.exceeded == ("concurrent_gpus",) and v.remaining["concurrent_gpus"] == 1


def test_unlimited_quota_allows_everything():
    v = q.evaluate(
        limits=q.Limits(),
        used=q.Amount(Decimal(10**9), Decimal(10**9)),
        add=q.Amount(Decimal(1), Decimal(1)),
        peak=999,
        add_gpus=99,
    )
    assert v.ok and v.remaining == {"gpu_hours": None, "budget": None, "budget_soft": None, "concurrent_gpus": None}


def test_allowed_models():
    assert q.Limits().allows_model(7)
    assert q.Limits(allowed_model_ids=frozenset({1, 2})).allows_model(2)
    assert not q.Limits(allowed_model_ids=frozenset({1, 2})).allows_model(3)


def _free(spec: dict[str, list[int]]) -> list[FreeGpu]:
    ids = iter(range(1000))
    return [FreeGpu(next(ids), node, i) for node, idxs in spec.items() for i in idxs]


def _nodes(free: list[FreeGpu], picked: list[int] | None) -> dict[str, list[int]]:
    by_id = {g.id: g for g in free}
    out: dict[str, list[int]] = {}
    for i in picked or []:
        out.setdefault(by_id[i].node, []).append(by_id[i].index)
    return out


def test_place_best_fit_keeps_whole_nodes_whole():
    free = _free({"a": list(range(8)), "b": [0, 1, 2], "c": [4, 5, 6, 7]})
    assert _nodes(free, place(free, 3, {"a": 8, "b": 8, "c": 8})) == {"b": [0, 1, 2]}
    assert _nodes(free, place(free, 4, {"a": 8, "b": 8, "c": 8})) == {"c": [4, 5, 6, 7]}
    assert _nodes(free, place(free, 8, {"a": 8, "b": 8, "c": 8})) == {"a": list(range(8))}


def test_place_tie_prefers_partly_used_node():
    free = _free({"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]})
    # Both have 4 free; "b" is an 8-GPU node already half used, "a" a whole 4-GPU node.
    assert _nodes(free, place(free, 2, {"a": 4, "b": 8})) == {"b": [4, 5]}


def test_place_prefers_contiguous_run():
    free = _free({"a": [0, 2, 3, 5, 6, 7]})
    assert _nodes(free, place(free, 2, {"a": 8})) == {"a": [2, 3]}
    assert _nodes(free, place(free, 3, {"a": 8})) == {"a": [5, 6, 7]}
    assert _nodes(free, place(free, 4, {"a": 8})) == {"a": [0, 2, 3, 5]}


def test_place_spans_nodes_only_when_needed_and_allowed():
    free = _free({"a": [0, 1, 2, 3, 4], "b": [0, 1, 2], "c": [0, 1]})
    assert _nodes(free, place(free, 7, {})) == {"a": [0, 1, 2, 3, 4], "c": [0, 1]}
    assert place(free, 7, {}, allow_multi_node=False) is None
    assert place(free, 11, {}) is None
    assert place(free, 0, {}) is None


def test_place_takes_gpus_split_in_shares_last():
    # Node a: GPU 0 exclusive, 1 and 2 split in shares (`last`); node b: GPUs 0-2 exclusive, 3 split.
    free = [
        FreeGpu(1, "a", 0),
        FreeGpu(2, "a", 1, last=True),
        FreeGpu(3, "a", 2, last=True),
        FreeGpu(4, "b", 0),
        FreeGpu(5, "b", 1),
        FreeGpu(6, "b", 2),
        FreeGpu(7, "b", 3, last=True),
    ]
    sizes = {"a": 3, "b": 4}
    # Two GPUs: b gives two exclusive ones; best fit alone would take a (fewer left over) and its split pair.
    assert _nodes(free, place(free, 2, sizes)) == {"b": [0, 1]}
    # Three on a: its exclusive one, then split ones by index; four on b: the split one last.
    a_only = [g for g in free if g.node == "a"]
    assert _nodes(a_only, place(a_only, 3, sizes)) == {"a": [0, 1, 2]}
    assert _nodes(a_only, place(a_only, 2, sizes)) == {"a": [0, 1]}
    assert _nodes(free, place(free, 4, sizes)) == {"b": [0, 1, 2, 3]}


def test_place_takes_gpus_in_use_outside_the_portal_only_when_the_node_needs_them():
    # Node a: GPUs 0-3, 1 used outside the portal, 3 split in shares; node b: GPUs 0-1, both used outside it.
    free = [
        FreeGpu(1, "a", 0),
        FreeGpu(2, "a", 1, in_use_outside=True),
        FreeGpu(3, "a", 2),
        FreeGpu(4, "a", 3, last=True),
        FreeGpu(5, "b", 0, in_use_outside=True),
        FreeGpu(6, "b", 1, in_use_outside=True),
    ]
    sizes = {"a": 4, "b": 2}
    a_only = [g for g in free if g.node == "a"]
    # Two: GPUs 0 and 2 (no run of two without GPU 1); three: GPU 1 before the split one; four: all.
    assert _nodes(a_only, place(a_only, 2, sizes)) == {"a": [0, 2]}
    assert _nodes(a_only, place(a_only, 3, sizes)) == {"a": [0, 1, 2]}
    assert _nodes(a_only, place(a_only, 4, sizes)) == {"a": [0, 1, 2, 3]}
    # A node that gives the booking GPUs nobody uses outside the portal before best fit (b has exactly one or two
    # free, but both in use); never a reason to refuse: with a alone too small, b it is.
    assert _nodes(free, place(free, 1, sizes)) == {"a": [0]}
    assert _nodes(free, place(free, 2, sizes)) == {"a": [0, 2]}
    b_and_small_a = [g for g in free if g.node == "b" or g.index == 0]
    assert _nodes(b_and_small_a, place(b_and_small_a, 2, sizes, allow_multi_node=False)) == {"b": [0, 1]}


def test_parts_in_use_outside_the_portal_are_taken_last():
    from apps.booking.placement import FreeUnit, place_instances, place_share

    # GPU 10: instances 0-1 free, 0 in use outside the portal; GPU 20: instances 0-2 free, all clean.
    mig = [
        FreeUnit(1, 10, "a", 0, in_use_outside=True),
        FreeUnit(2, 10, "a", 1),
        FreeUnit(3, 20, "b", 0),
        FreeUnit(4, 20, "b", 1),
        FreeUnit(5, 20, "b", 2),
    ]
    assert place_instances(mig, 1) == [2]  # best fit (GPU 10), its clean instance rather than the first one
    assert place_instances(mig, 2) == [3, 4]  # best fit alone would take GPU 10's two, one of them in use
    assert place_instances(mig, 4) == [3, 4, 5, 2]  # no GPU has four: the largest first, then GPU 10's clean one
    assert place_instances([u for u in mig if u.parent == 10], 2) == [1, 2]  # never a reason to refuse
    # Shares: GPU 10 untouched and in use outside the portal, GPU 20 untouched and clean, GPU 30 partly held.
    shares = [FreeUnit(i, 10, "a", i, in_use_outside=True) for i in range(4)]
    shares += [FreeUnit(10 + i, 20, "b", i) for i in range(4)]
    totals = {10: 4, 20: 4, 30: 4}
    assert place_share(shares, 1, totals) == [10]
    assert place_share([*shares, FreeUnit(30, 30, "c", 3)], 1, totals) == [30]  # a shared GPU first, as before
    assert place_share(shares[:4], 2, totals) == [0, 1]  # never a reason to refuse
