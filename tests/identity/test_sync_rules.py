"""The group sync rules as a plain function (apps/identity/sync.py), without a database."""

from __future__ import annotations

from apps.identity.sync import DIRECTORY, MANUAL, Held, Mapping, plan_sync

VISION, NLP = 1, 2


def test_a_mapped_group_adds_the_team_with_its_role() -> None:
    plan = plan_sync(groups=["gpu-vision"], mappings=[Mapping("gpu-vision", VISION, "member")], held=[])
    assert plan.add == {VISION: "member"} and not plan.change and not plan.remove


def test_the_highest_role_of_several_matching_groups_wins() -> None:
    mappings = [Mapping("gpu-vision", VISION, "member"), Mapping("vision-leads", VISION, "manager")]
    plan = plan_sync(groups=["gpu-vision", "vision-leads"], mappings=mappings, held=[])
    assert plan.add == {VISION: "manager"}


def test_unmapped_groups_do_nothing() -> None:
    plan = plan_sync(groups=["staff", "printers"], mappings=[Mapping("gpu-vision", VISION, "member")], held=[])
    assert plan.empty


def test_a_directory_membership_goes_when_the_group_goes() -> None:
    plan = plan_sync(
        groups=[], mappings=[Mapping("gpu-vision", VISION, "member")], held=[Held(VISION, "member", DIRECTORY)]
    )
    assert plan.remove == {VISION} and not plan.add


def test_a_directory_membership_follows_a_role_change() -> None:
    plan = plan_sync(
        groups=["vision-leads"],
        mappings=[Mapping("vision-leads", VISION, "manager")],
        held=[Held(VISION, "member", DIRECTORY)],
    )
    assert plan.change == {VISION: "manager"}


def test_an_unchanged_directory_membership_is_left_as_it_is() -> None:
    plan = plan_sync(
        groups=["gpu-vision"],
        mappings=[Mapping("gpu-vision", VISION, "member")],
        held=[Held(VISION, "member", DIRECTORY)],
    )
    assert plan.empty


def test_a_directory_membership_whose_mapping_was_deleted_goes() -> None:
    plan = plan_sync(groups=["gpu-vision"], mappings=[], held=[Held(VISION, "member", DIRECTORY)])
    assert plan.remove == {VISION}


def test_a_manual_membership_is_not_removed_by_a_sync() -> None:
    plan = plan_sync(
        groups=[], mappings=[Mapping("gpu-vision", VISION, "member")], held=[Held(VISION, "manager", MANUAL)]
    )
    assert plan.empty


def test_a_manual_membership_keeps_its_role_when_the_group_maps_another() -> None:
    plan = plan_sync(
        groups=["gpu-vision"],
        mappings=[Mapping("gpu-vision", VISION, "member")],
        held=[Held(VISION, "manager", MANUAL)],
    )
    assert plan.empty


def test_a_mapping_that_replaces_manual_takes_the_membership_over() -> None:
    mappings = [Mapping("gpu-vision", VISION, "member", replaces_manual=True)]
    taken = plan_sync(groups=["gpu-vision"], mappings=mappings, held=[Held(VISION, "manager", MANUAL)])
    assert taken.change == {VISION: "member"}
    gone = plan_sync(groups=[], mappings=mappings, held=[Held(VISION, "manager", MANUAL)])
    assert gone.remove == {VISION}


def test_manual_memberships_of_other_teams_are_untouched_by_a_takeover() -> None:
    mappings = [Mapping("gpu-vision", VISION, "member", replaces_manual=True)]
    plan = plan_sync(groups=[], mappings=mappings, held=[Held(NLP, "member", MANUAL)])
    assert plan.empty
