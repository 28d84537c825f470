"""LDAP sign-in through django-auth-ldap, configured from the portal's `LDAP_*` settings, with the same group
sync as OIDC (the groups are the user's groups under `LDAP_GROUP_SEARCH_BASE`, by name and by DN), and the user's
POSIX uid taken from their entry (`LDAP_UID_ATTR`)."""

from __future__ import annotations

import logging
from typing import Any

import ldap
from django.conf import settings
from django.http import HttpRequest
from django_auth_ldap.backend import LDAPBackend, _LDAPUser
from django_auth_ldap.config import (
    GroupOfNamesType,
    GroupOfUniqueNamesType,
    LDAPGroupType,
    LDAPSearch,
    PosixGroupType,
)

from apps.accounts.types import User
from apps.identity import services
from apps.identity.models import ExternalIdentity, UnixAccountSource

logger = logging.getLogger(__name__)

_GROUP_TYPES: dict[str, tuple[type[LDAPGroupType], str]] = {
    "groupOfNames": (GroupOfNamesType, "(objectClass=groupOfNames)"),
    "groupOfUniqueNames": (GroupOfUniqueNamesType, "(objectClass=groupOfUniqueNames)"),
    "posixGroup": (PosixGroupType, "(objectClass=posixGroup)"),
}


class AnyOfGroupTypes(LDAPGroupType):  # type: ignore[misc]
    """Groups of several object classes in one directory (groupOfNames for the lab's teams beside posixGroup for
    Unix groups, say): a user's groups are the union of each type's search, each limited to its own object class
    (a posixGroup's members are uids, a groupOfNames' DNs). `is_member` is left to the base class (None: the
    caller reads `user_groups`)."""

    def __init__(self, types: list[tuple[LDAPGroupType, str]]) -> None:
        super().__init__()
        self.types = types

    def user_groups(self, ldap_user: _LDAPUser, group_search: LDAPSearch) -> list[tuple[str, dict[str, Any]]]:
        found: dict[str, tuple[str, dict[str, Any]]] = {}
        for group_type, object_filter in self.types:
            search = LDAPSearch(group_search.base_dn, group_search.scope, object_filter)
            for dn, attrs in group_type.user_groups(ldap_user, search):
                found.setdefault(dn.lower(), (dn, attrs))
        return list(found.values())


def group_type_names(value: str) -> list[str]:
    """`LDAP_GROUP_TYPE` as a list: one type, or several separated by commas (each once)."""
    return list(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))


def ldap_enabled() -> bool:
    return bool(settings.LDAP_SERVER_URI)


def ldap_settings() -> dict[str, Any]:
    """django-auth-ldap's settings (without its AUTH_LDAP_ prefix) from the portal's."""
    kinds = [_GROUP_TYPES[name] for name in group_type_names(settings.LDAP_GROUP_TYPE)]
    conf: dict[str, Any] = {
        "SERVER_URI": settings.LDAP_SERVER_URI,
        "BIND_DN": settings.LDAP_BIND_DN,
        "BIND_PASSWORD": settings.LDAP_BIND_PASSWORD,
        "START_TLS": settings.LDAP_START_TLS,
        "USER_SEARCH": LDAPSearch(settings.LDAP_USER_SEARCH_BASE, ldap.SCOPE_SUBTREE, settings.LDAP_USER_FILTER),
        "USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        "ALWAYS_UPDATE_USER": True,
        "CONNECTION_OPTIONS": {
            ldap.OPT_NETWORK_TIMEOUT: settings.LDAP_TIMEOUT_S,
            ldap.OPT_TIMEOUT: settings.LDAP_TIMEOUT_S,
        },
        # Group changes must show at the next sign-in, so nothing about groups is cached between sign-ins.
        "CACHE_TIMEOUT": 0,
    }
    if settings.LDAP_GROUP_SEARCH_BASE:
        if len(kinds) == 1:
            group_type, group_filter = kinds[0][0](), kinds[0][1]
        else:
            group_type = AnyOfGroupTypes([(kind(), object_filter) for kind, object_filter in kinds])
            group_filter = f"(|{''.join(object_filter for _, object_filter in kinds)})"
        conf["GROUP_SEARCH"] = LDAPSearch(settings.LDAP_GROUP_SEARCH_BASE, ldap.SCOPE_SUBTREE, group_filter)
        conf["GROUP_TYPE"] = group_type
    return conf


class PortalLDAPBackend(LDAPBackend):  # type: ignore[misc]
    """Username and password checked against the directory; teams synced from the user's groups.

    A local account (one with a password of its own, such as a break-glass admin) or an account made by single
    sign-on is never taken over by a directory user of the same name."""

    settings_prefix = "PORTAL_UNUSED_AUTH_LDAP_"

    @property
    def default_settings(self) -> dict[str, Any]:
        return ldap_settings()

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> User | None:
        if not ldap_enabled() or username is None:
            return None
        user: User | None = super().authenticate(request, username=username, password=password, **kwargs)
        return user

    def get_or_build_user(self, username: str, ldap_user: _LDAPUser) -> tuple[User, bool]:
        user, built = super().get_or_build_user(username, ldap_user)
        if not built and (user.has_usable_password() or ExternalIdentity.objects.filter(user_id=user.pk).exists()):
            raise ldap_user.AuthenticationFailed(f"{username!r} is a portal account not managed by the directory")
        return user, built

    def authenticate_ldap_user(self, ldap_user: _LDAPUser, password: str) -> User | None:
        user: User | None = super().authenticate_ldap_user(ldap_user, password)
        if user is None:
            return None
        if settings.LDAP_GROUP_SEARCH_BASE:
            groups = set(ldap_user.group_names) | set(ldap_user.group_dns)
            services.directory_sync(user=user, groups=groups, via="ldap")
        _uid_sync(user, ldap_user)
        return user


def _uid_sync(user: User, ldap_user: _LDAPUser) -> None:
    if settings.LDAP_UID_ATTR:
        values = (ldap_user.attrs or {}).get(settings.LDAP_UID_ATTR) or [None]
        services.unix_uid_from_directory(user=user, value=values[0], source=UnixAccountSource.LDAP)
