"""Reads for identity: group mappings."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.identity.models import GroupMapping


def group_mappings_list() -> QuerySet[GroupMapping]:
    return GroupMapping.objects.select_related("team").order_by("group", "team__slug")
