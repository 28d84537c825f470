"""Reads for identity: group mappings, and the POSIX uids of users."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet

from apps.identity.models import GroupMapping, UnixAccount


def group_mappings_list() -> QuerySet[GroupMapping]:
    return GroupMapping.objects.select_related("team").order_by("group", "team__slug")


def unix_accounts_list(usernames: Iterable[str] | None = None) -> QuerySet[UnixAccount]:
    """Users' POSIX uids by uid, with the user; only these users' when `usernames` is given."""
    qs = UnixAccount.objects.select_related("user").order_by("uid")
    return qs if usernames is None else qs.filter(user__username__in=list(usernames))


def unix_account_of(user: Any) -> UnixAccount | None:
    """The uid the user's processes run as on the GPU nodes, where the portal knows it."""
    return UnixAccount.objects.filter(user=user).first()


def unix_uids(user_ids: Iterable[int]) -> dict[int, int]:
    """{user id: POSIX uid} for those of the users who have one, in one query."""
    return dict(UnixAccount.objects.filter(user_id__in=list(user_ids)).values_list("user_id", "uid"))


def users_of_uids(uids: Iterable[int]) -> dict[int, tuple[str, list[str]]]:
    """{POSIX uid: (username, the slugs of the user's teams)} for those uids a portal user has (active users only),
    in one query: who runs the processes a node reports by owner."""
    wanted = list(uids)
    if not wanted:
        return {}
    rows = UnixAccount.objects.filter(uid__in=wanted, user__is_active=True).values_list(
        "uid", "user__username", "user__memberships__team__slug"
    )
    out: dict[int, tuple[str, list[str]]] = {}
    for uid, username, slug in rows:
        _, teams = out.setdefault(int(uid), (username, []))
        if slug is not None:
            teams.append(slug)
    return {uid: (name, sorted(teams)) for uid, (name, teams) in out.items()}
