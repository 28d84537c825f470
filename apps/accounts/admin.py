from django.contrib import admin
from django.http import HttpRequest

from apps.accounts.models import ApiToken, Membership, Team


class MembershipInline(admin.TabularInline[Membership, Team]):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin[Team]):
    list_display = ("slug", "name", "share", "created_at")
    search_fields = ("slug", "name")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin[Membership]):
    list_display = ("user", "team", "role", "source")
    list_filter = ("role", "source", "team")
    search_fields = ("user__username", "team__slug")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    """Tokens are created by their owners (settings page, API, create_token); admins may only revoke."""

    list_display = ("name", "user", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "user__username")
    readonly_fields = ("user", "name", "prefix", "digest", "scopes", "created_at", "last_used_at")
    exclude = ()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
