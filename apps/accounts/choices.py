"""The accounts app's states as code constants."""

from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    MANAGER = "manager", "Manager"


class Scope(models.TextChoices):
    READ = "read", "Read"
    JOBS_WRITE = "jobs:write", "Submit and cancel jobs"
    RESERVATIONS_WRITE = "reservations:write", "Book and release GPUs"
    WEBHOOKS_WRITE = "webhooks:write", "Manage the team's webhooks (managers)"
    ADMIN = "admin", "Administer (staff only)"
