"""The pure placement rules for fractions of a GPU and for gangs (apps.jobs.scheduling.sharing)."""

from __future__ import annotations

import pytest

from apps.jobs.scheduling.sharing import MILLI, ShareCandidate, best_fit_share, best_fit_whole


def c(node: int, gpu: int, free: int, node_whole_free: int = 0) -> ShareCandidate:
    return ShareCandidate(node=node, gpu=gpu, free_milli=free, node_whole_free=node_whole_free)


def test_a_fraction_fills_a_shared_gpu_before_opening_a_whole_one() -> None:
    chosen = best_fit_share([c(0, 0, MILLI, 8), c(1, 3, 600, 0)], 500)
    assert chosen == c(1, 3, 600, 0)


def test_among_shared_gpus_the_tightest_fit_wins() -> None:
    chosen = best_fit_share([c(0, 0, 900), c(0, 1, 260), c(1, 0, 300)], 250)
    assert chosen == c(0, 1, 260)


def test_a_whole_gpu_is_opened_on_the_node_with_fewest_whole_gpus_left() -> None:
    chosen = best_fit_share([c(0, 0, MILLI, 8), c(1, 0, MILLI, 2), c(2, 0, 100, 0)], 250)
    assert chosen == c(1, 0, MILLI, 2)


def test_nothing_fits() -> None:
    assert best_fit_share([c(0, 0, 200), c(1, 1, 240)], 250) is None
    assert best_fit_share([], 250) is None


@pytest.mark.parametrize("need", [0, -1, MILLI + 1])
def test_impossible_shares_are_refused(need: int) -> None:
    with pytest.raises(ValueError):
        best_fit_share([c(0, 0, MILLI)], need)


def test_a_gang_takes_the_node_left_with_fewest_free_gpus() -> None:
    assert best_fit_whole({0: 8, 1: 4, 2: 2, 3: 5}, 4) == 1
    assert best_fit_whole({0: 8, 1: 4}, 8) == 0
    assert best_fit_whole({0: 3, 1: 2}, 4) is None
    with pytest.raises(ValueError):
        best_fit_whole({0: 8}, 0)


def test_ties_break_by_node_then_gpu_whatever_the_input_order() -> None:
    a = [c(2, 1, 500), c(1, 3, 500), c(1, 0, 500)]
    assert best_fit_share(a, 500) == best_fit_share(list(reversed(a)), 500) == c(1, 0, 500)
