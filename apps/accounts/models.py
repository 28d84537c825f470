"""Teams, memberships and personal API tokens."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import User
from django.db import models
from django.utils import timezone

from apps.accounts.choices import MembershipSource as MembershipSource
from apps.accounts.choices import Role as Role
from apps.accounts.choices import Scope as Scope
from apps.accounts.scoping import ScopedQuerySet
from apps.accounts.triggers import rowcache_triggers


class TeamQuerySet(ScopedQuerySet["Team"]):
    team_path = "pk"


class Team(models.Model):
    """A group that books GPUs, runs jobs and is billed together."""

    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=120)
    share = models.PositiveIntegerField(default=1, help_text="relative fair-share weight for the scheduler")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TeamQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]
        triggers = rowcache_triggers()

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A user's role in a team."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    # A directory sync at sign-in adds and removes only its own memberships (apps/identity), unless a group
    # mapping says it may take over manual ones.
    source = models.CharField(max_length=16, choices=MembershipSource.choices, default=MembershipSource.MANUAL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="membership_unique_user_team")]
        ordering = ["team__slug", "user__username"]
        triggers = rowcache_triggers()

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def active(self) -> ApiTokenQuerySet:
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class ApiToken(models.Model):
    """A personal API token: shown once, stored as a SHA-256 hash, limited by scopes and an expiry."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The public part of the token, for lookup and for people to recognise it; never enough to authenticate.
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64, help_text="sha256 hex of the whole token")
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        triggers = rowcache_triggers(bookkeeping="last_used_at")

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes or Scope.ADMIN in self.scopes


class UserRowCacheTriggers(User):
    """Django's user table, seen from this app to declare the row cache's triggers on it (no table of its own)."""

    class Meta:
        proxy = True
        triggers = rowcache_triggers(bookkeeping="last_login")
