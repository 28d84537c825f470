from typing import Any

from django.contrib import admin
from django.forms import ModelForm
from django.http import HttpRequest

from apps.identity import services
from apps.identity.models import ExternalIdentity, GroupMapping, UnixAccount


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


@admin.register(UnixAccount)
class UnixAccountAdmin(admin.ModelAdmin[UnixAccount]):
    """Which portal user a POSIX uid on the GPU nodes is (docs/identity.md). A directory user's is set again from
    the directory at each sign-in."""

    list_display = ("user", "uid", "source", "updated_at")
    list_select_related = ("user",)
    list_filter = ("source",)
    search_fields = ("user__username", "=uid")
    autocomplete_fields = ["user"]
    readonly_fields = ("updated_at",)

    def get_readonly_fields(self, request: HttpRequest, obj: UnixAccount | None = None) -> tuple[str, ...]:
        # The account is the user's: moving it to someone else is removing it and adding theirs.
        return ("user", "updated_at") if obj is not None else ("updated_at",)

    def save_model(self, request: HttpRequest, obj: UnixAccount, form: ModelForm[Any], change: bool) -> None:
        # Through the service, for its lock and its audit row; the form has already refused a taken uid.
        saved = services.unix_uid_set(user=obj.user, uid=obj.uid, source=obj.source, actor=request.user)
        if saved is not None:
            obj.pk, obj.updated_at = saved.pk, saved.updated_at

    def delete_model(self, request: HttpRequest, obj: UnixAccount) -> None:
        services.unix_uid_set(user=obj.user, uid=None, source=obj.source, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for account in queryset.select_related("user"):
            self.delete_model(request, account)
