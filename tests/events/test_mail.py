"""Mail for the events a person opted into, and none for the others, through a real SMTP server (aiosmtpd) on
loopback; the Celery worker that sends it runs with the production settings (PORTAL_PRODUCTION=1, whose mail
backend is SMTP to EMAIL_HOST:EMAIL_PORT)."""

from __future__ import annotations

import email
import secrets
from collections.abc import Iterator
from email.message import Message
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from apps.events.models import DeliveryStatus, MailDelivery, MailPreference, OutboxEvent
from apps.events.services import publish
from apps.jobs import services as jobs
from apps.jobs.models import ContainerImage, JobState
from tests.conftest import free_port
from tests.fleet.procs import clean_fleet_redis, start_portal_worker, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


class Inbox:
    """aiosmtpd handler: keeps every message it is given."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content if isinstance(envelope.content, bytes) else str(envelope.content).encode()
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(content)))
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    yield inbox, port
    controller.stop()


def test_mail_follows_each_persons_preferences(
    tmp_path: Any, smtp: tuple[Inbox, int], alice: Any, bob: Any, charlie: Any, vision: Any, nlp: Any
) -> None:
    inbox, port = smtp
    MailPreference.objects.create(user=alice, job_finished=True, budget_thresholds=True)
    MailPreference.objects.create(user=bob, job_failed=True)
    MailPreference.objects.create(user=charlie)  # all off
    ContainerImage.objects.create(name="local/process")
    clean_fleet_redis()
    worker = start_portal_worker(
        tmp_path,
        PORTAL_PRODUCTION="1",
        SECRET_KEY=secrets.token_urlsafe(48),
        ALLOWED_HOSTS="portal.example.org",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(port),
        DEFAULT_FROM_EMAIL="portal@example.org",
        EVENTS_SWEEP_EVERY_S="2",
        PORTAL_URL="https://portal.example.org",
    )
    try:
        # Jobs through the real service: each publishes queued and its end.
        ended = {}
        for name, user, end in (
            ("alice_ok", alice, JobState.SUCCEEDED),
            ("bob_failed", bob, JobState.FAILED),
            ("bob_ok", bob, JobState.SUCCEEDED),  # bob did not opt in for finished jobs
        ):
            job = jobs.job_submit(user=user, team=vision, image="local/process", command=["true"], check_fleet=False)
            jobs.job_transition(job, JobState.STARTING)
            jobs.job_transition(job, end, reason="exit_code", exit_code=0 if end == JobState.SUCCEEDED else 1)
            ended[name] = job.pk
        publish("budget.threshold", team_id=vision.pk, subject="teams/vision/budget", data={"threshold": 80})
        publish("budget.threshold", team_id=nlp.pk, subject="teams/nlp/budget", data={"threshold": 80})
        publish("idle.warning", team_id=vision.pk, subject="gpus/GPU-1", data={"gpu": "GPU-1"}, user_id=bob.pk)
        publish("reservation.starting_soon", team_id=vision.pk, subject="reservations/9", data={}, user_id=alice.pk)

        def sent() -> bool:
            if OutboxEvent.objects.filter(dispatched_at__isnull=True).exists():
                return False
            return not MailDelivery.objects.exclude(status=DeliveryStatus.SUCCEEDED).exists()

        wait_for(sent, 120, "the mail sent", [worker])
    finally:
        worker.stop()

    got = sorted((tuple(to), str(message["Subject"])) for to, message in inbox.messages)
    assert got == sorted(
        [
            (("alice@example.org",), f"[GPU Portal] job succeeded: jobs/{ended['alice_ok']}"),
            (("bob@example.org",), f"[GPU Portal] job failed: jobs/{ended['bob_failed']}"),
        ]
    ), got
    assert all(message["From"] == "portal@example.org" for _, message in inbox.messages)
    bodies = {str(message["Subject"]): message.get_payload(decode=True).decode() for _, message in inbox.messages}
    job_mail = bodies[f"[GPU Portal] job succeeded: jobs/{ended['alice_ok']}"]
    assert f"Open: https://portal.example.org/jobs/{ended['alice_ok']}/" in job_mail
