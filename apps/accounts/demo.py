"""Demo users and teams (embedded default only). Every demo password is `demo`."""

from __future__ import annotations

from apps.accounts import services
from apps.accounts.models import Role, Team

DEMO_PASSWORD = "demo"  # noqa: S105 - printed by `make run`; demo data is refused in production


def load() -> None:
    admin = services.user_get_or_create(
        username="admin", password=DEMO_PASSWORD, email="admin@example.org", is_staff=True
    )
    alice = services.user_get_or_create(username="alice", password=DEMO_PASSWORD, email="alice@example.org")
    bob = services.user_get_or_create(username="bob", password=DEMO_PASSWORD, email="bob@example.org")
    carol = services.user_get_or_create(username="carol", password=DEMO_PASSWORD, email="carol@example.org")
    vision = Team.objects.filter(slug="vision").first() or services.team_create(
        actor=admin, slug="vision", name="Computer Vision", share=2
    )
    nlp = Team.objects.filter(slug="nlp").first() or services.team_create(
        actor=admin, slug="nlp", name="Natural Language Processing", share=1
    )
    services.membership_set(actor=admin, team=vision, user=alice, role=Role.MANAGER)
    services.membership_set(actor=admin, team=vision, user=bob, role=Role.MEMBER)
    services.membership_set(actor=admin, team=nlp, user=carol, role=Role.MEMBER)
