from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.accounts.models import Role, Team
from apps.identity.models import UID_MAX, GroupMapping, UnixAccount
from apps.identity.services import MAX_UIDS_PER_LOAD


class GroupMappingInput(serializers.Serializer[dict[str, Any]]):
    group = serializers.CharField(max_length=255)
    team = serializers.SlugField(max_length=50, help_text="the team's slug")
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)
    replaces_manual = serializers.BooleanField(
        default=False, help_text="sign-in syncs may change and remove this team's memberships added by hand"
    )


class GroupMappingOutput(serializers.ModelSerializer[GroupMapping]):
    team: serializers.SlugRelatedField[Team] = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = GroupMapping
        fields = ["id", "group", "team", "role", "replaces_manual", "created_at"]


class UnixAccountEntry(serializers.Serializer[dict[str, Any]]):
    user = serializers.CharField(max_length=150, help_text="the portal username")
    uid = serializers.IntegerField(
        allow_null=True, min_value=1, max_value=UID_MAX, help_text="the POSIX uid; null removes the user's uid"
    )


class UnixAccountsLoadInput(serializers.Serializer[dict[str, Any]]):
    accounts = serializers.ListField(
        child=UnixAccountEntry(),
        allow_empty=False,
        max_length=MAX_UIDS_PER_LOAD,
        help_text="set together, all or nothing; uids may move between the users listed",
    )
    skip_unknown_users = serializers.BooleanField(
        default=False, help_text="leave out usernames the portal does not know instead of refusing the load"
    )


class UnixAccountOutput(serializers.ModelSerializer[UnixAccount]):
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = UnixAccount
        fields = ["user", "uid", "source", "updated_at"]


class UnixAccountsLoadOutput(serializers.Serializer[dict[str, Any]]):
    changed = serializers.IntegerField(help_text="how many users' uids changed")
    skipped = serializers.ListField(child=serializers.CharField(), help_text="usernames left out as unknown")
    accounts = UnixAccountOutput(many=True, help_text="the listed users' uids now (those who have one)")
