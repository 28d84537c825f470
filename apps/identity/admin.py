from django.contrib import admin
from django.http import HttpRequest

from apps.identity.models import ExternalIdentity, GroupMapping


@admin.register(GroupMapping)
class GroupMappingAdmin(admin.ModelAdmin[GroupMapping]):
    """Applied at each member's next sign-in through OIDC or LDAP (docs/identity.md)."""

    list_display = ("group", "team", "role", "replaces_manual", "created_at")
    list_select_related = ("team",)
    list_filter = ("role", "replaces_manual", "team")
    search_fields = ("group", "team__slug")
    autocomplete_fields = ["team"]


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(admin.ModelAdmin[ExternalIdentity]):
    """Made at a user's first single sign-on; deleting one lets the subject sign in as a new user."""

    list_display = ("subject", "issuer", "user", "created_at", "last_login_at")
    list_select_related = ("user",)
    search_fields = ("subject", "user__username", "user__email")
    readonly_fields = ("user", "issuer", "subject", "created_at", "last_login_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
