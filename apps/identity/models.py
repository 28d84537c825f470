"""Directory groups mapped to teams, the link from an identity provider's subject to a portal user, and the POSIX
uid a portal user's processes run as on the GPU nodes."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from apps.accounts.models import Role, Team


class GroupMapping(models.Model):
    """A directory group (OIDC groups claim or LDAP group) that puts its members in a team with a role."""

    group = models.CharField(max_length=255, help_text="group name or path as the directory sends it (exact match)")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="group_mappings")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    replaces_manual = models.BooleanField(
        default=False,
        help_text="let sign-in syncs change and remove memberships of this team that were added by hand",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["group", "team"], name="groupmapping_unique_group_team")]
        ordering = ["group", "team__slug"]

    def __str__(self) -> str:
        return f"{self.group} → {self.team} ({self.role})"


class ExternalIdentity(models.Model):
    """An OIDC subject (issuer + sub) signed in as this user: users are found by it, never by e-mail address."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_identities")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="externalidentity_unique_issuer_subject")
        ]
        verbose_name_plural = "external identities"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


# (uid_t)-1 means "no uid" to the kernel's calls (chown, setresuid), so the highest real uid is one below it.
UID_MAX = 2**32 - 2


class UnixAccountSource(models.TextChoices):
    MANUAL = "manual", "set by an administrator"
    LDAP = "ldap", "the directory's uidNumber at sign-in"
    OIDC = "oidc", "the identity provider's uid claim at sign-in"


class UnixAccount(models.Model):
    """The POSIX uid a portal user's processes run as on the GPU nodes: the node agent reports a GPU's processes by
    their owner's uid, and this says which portal user a uid is (one user per uid, never root)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="unix_account")
    # Big: uids run to 2**32 - 2, past PostgreSQL's integer.
    uid = models.PositiveBigIntegerField(
        unique=True, validators=[MinValueValidator(1), MaxValueValidator(UID_MAX)], help_text="never 0 (root)"
    )
    source = models.CharField(max_length=16, choices=UnixAccountSource.choices, default=UnixAccountSource.MANUAL)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(uid__gt=0, uid__lte=UID_MAX), name="unixaccount_uid_not_root_and_in_range"
            )
        ]
        ordering = ["uid"]

    def __str__(self) -> str:
        return f"uid {self.uid} → {self.user}"
