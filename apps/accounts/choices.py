"""The accounts app's states as code constants."""

from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    MANAGER = "manager", "Manager"


class MembershipSource(models.TextChoices):
    """Who made a membership: a person (admin page, API, command) or a directory sync at sign-in."""

    MANUAL = "manual", "Added by hand"
    DIRECTORY = "directory", "From a directory group"


class Scope(models.TextChoices):
    READ = "read", "Read"
    JOBS_WRITE = "jobs:write", "Submit and cancel jobs"
    RESERVATIONS_WRITE = "reservations:write", "Book and release GPUs"
    WEBHOOKS_WRITE = "webhooks:write", "Manage the team's webhooks (managers)"
    ADMIN = "admin", "Administer (staff only)"
