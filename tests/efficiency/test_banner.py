"""The idle banner on every page: the holder sees their open warnings; teammates do not see someone else's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from apps.efficiency.models import IdleMark, MarkState

pytestmark = pytest.mark.django_db


def test_holder_sees_the_warning_on_every_page(alice, bob, vision):
    now = timezone.now()
    IdleMark.objects.create(
        team=vision,
        user=alice,
        kind="reservation",
        source_id=77,
        state=MarkState.WARNED,
        idle_since=now - timedelta(minutes=31),
        warned_at=now,
        reclaim_at=now + timedelta(minutes=30),
    )
    client = Client()
    client.force_login(alice)
    for url in ("/", "/jobs/", "/fleet/"):
        page = client.get(url).content.decode()
        assert 'id="idle-banner"' in page and "reservation #77 has been idle" in page, url
    client.force_login(bob)
    page = client.get("/").content.decode()
    assert 'id="idle-banner"' in page and "#77" not in page and 'data-teams="vision"' in page
