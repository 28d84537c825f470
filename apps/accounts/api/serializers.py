from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.accounts.models import ApiToken, Membership, Scope, Team


class TeamOutput(serializers.ModelSerializer[Team]):
    class Meta:
        model = Team
        fields = ["slug", "name", "share"]


class MembershipOutput(serializers.Serializer[Membership]):
    team = TeamOutput()
    role = serializers.CharField()


class MeOutput(serializers.Serializer[dict[str, Any]]):
    id = serializers.IntegerField()
    username = serializers.CharField()
    email = serializers.EmailField()
    is_admin = serializers.BooleanField(source="is_staff")
    teams = MembershipOutput(many=True)
    token_scopes = serializers.ListField(child=serializers.CharField(), allow_null=True)


class TokenInput(serializers.Serializer[dict[str, Any]]):
    name = serializers.CharField(max_length=100)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices), min_length=1, max_length=5)
    expires_days = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=90)


class TokenOutput(serializers.ModelSerializer[ApiToken]):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at"]


class TokenCreatedOutput(TokenOutput):
    token = serializers.SerializerMethodField(help_text="The token itself. Shown once; store it now.")

    class Meta(TokenOutput.Meta):
        fields = [*TokenOutput.Meta.fields, "token"]

    def get_token(self, obj: ApiToken) -> str:
        return str(self.context["plaintext"])


class MemberOutput(serializers.Serializer[Membership]):
    username = serializers.CharField(source="user.username")
    role = serializers.CharField()


class TeamDetailOutput(TeamOutput):
    members = serializers.SerializerMethodField()
    my_role = serializers.SerializerMethodField()
    quota = serializers.SerializerMethodField(help_text="this month's quota, booked and month-to-date GPU-hours")
    usage = serializers.SerializerMethodField(help_text="month-to-date usage and cost, live (apps.billing)")

    class Meta(TeamOutput.Meta):
        fields = [*TeamOutput.Meta.fields, "members", "my_role", "quota", "usage"]

    def get_usage(self, obj: Team) -> dict[str, Any]:
        from apps.billing.selectors import usage_summary

        return usage_summary(team=obj)

    def get_quota(self, obj: Team) -> dict[str, Any]:
        from apps.booking.selectors import quota_summary

        return quota_summary(team=obj)

    def get_members(self, obj: Team) -> list[dict[str, str]]:
        from apps.accounts.selectors import team_members

        return [{"username": m.user.username, "role": m.role} for m in team_members(team=obj)]

    def get_my_role(self, obj: Team) -> str | None:
        from apps.accounts.selectors import role_in

        user = self.context["request"].user
        return role_in(user=user, team=obj) or ("admin" if user.is_staff else None)
