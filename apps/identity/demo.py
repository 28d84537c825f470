"""Demo POSIX uids (embedded default only): the uids the demo users' processes run as on a GPU node, so the
admin's "Unix accounts" list shows what a directory's `uidNumber` fills in (docs/identity.md, "POSIX uids")."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from apps.identity.models import UnixAccount, UnixAccountSource
from apps.identity.services import unix_uid_set

# The first uids Debian gives regular users.
DEMO_UIDS = {"alice": 1001, "bob": 1002, "carol": 1003}


def load() -> None:
    for username, uid in DEMO_UIDS.items():
        user = get_user_model().objects.filter(username=username).first()
        # A uid an admin gave someone else in this installation stays theirs; loading again changes nothing.
        if user is not None and not UnixAccount.objects.filter(uid=uid).exclude(user=user).exists():
            unix_uid_set(user=user, uid=uid, source=UnixAccountSource.MANUAL)
