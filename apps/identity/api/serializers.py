from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.accounts.models import Role, Team
from apps.identity.models import GroupMapping


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
