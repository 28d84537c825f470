"""What do events cost the code that emits them, and how fast are they fanned out and delivered?

Why: `publish()` runs inside hot transactions (every job transition, every booking): one INSERT into the outbox and,
after commit, one broker message nudging the fan-out. The figure to keep is that it adds well under a millisecond
to a transition. Fan-out and signed delivery run in the worker; their rate bounds how fast a burst drains.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/portal_events_bench REDIS_URL=redis://127.0.0.1:6379/13 \\
        .venv/bin/python -m bench.events_publish [--events 1000] [--endpoints 5]

PostgreSQL only, on a scratch database whose name ends in `_bench` (created and migrated). Timed, per event, as
wall time and as CPU time of the calling thread (the steadier figure on a shared machine):

- empty_tx: a transaction that writes one audit row (the baseline a transition already pays);
- publish_tx: the same transaction plus `publish()` (the outbox row; the nudge sent after commit);
- dispatch: `outbox.dispatch_event` with `--endpoints` matching endpoints (the deliveries created once);
- deliver: `delivery.deliver_webhook` (sign, POST to a receiver on 127.0.0.1 answering 200, record), one endpoint.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.billing_report import _ensure_database

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8")


class _Ok(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=5)
    args = parser.parse_args()
    _ensure_database()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    from apps.accounts.models import Team
    from apps.audit.services import audit_record
    from apps.events import delivery, outbox, secrets
    from apps.events.models import OutboxEvent, WebhookDelivery, WebhookEndpoint
    from apps.events.services import publish

    call_command("migrate", verbosity=0)
    team, _ = Team.objects.get_or_create(slug="bench-events", defaults={"name": "bench events"})
    WebhookEndpoint.objects.filter(team=team).delete()
    OutboxEvent.objects.filter(team=team).delete()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    for _ in range(args.endpoints):
        WebhookEndpoint.objects.create(
            team=team, url=url, events=["job.*"], secret_encrypted=secrets.encrypt(secrets.new_secret())
        )
    n = args.events

    def timed(label: str, fn: Any) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        for i in range(n):
            fn(i)
        wall, cpu = (time.perf_counter() - t0) / n * 1e6, (time.thread_time() - c0) / n * 1e6
        print(f"{label:12s} {wall:9.0f} us wall {cpu:9.0f} us CPU of the calling thread, per event")

    def empty(i: int) -> None:
        with transaction.atomic():
            audit_record(actor=None, action="bench.events", team=team, data={"i": i})

    def published(i: int) -> None:
        with transaction.atomic():
            audit_record(actor=None, action="bench.events", team=team, data={"i": i})
            publish("job.succeeded", team_id=team.pk, subject=f"jobs/{i}", data={"id": i, "state": "succeeded"})

    timed("empty_tx", empty)
    timed("publish_tx", published)
    ids = list(OutboxEvent.objects.filter(team=team, dispatched_at__isnull=True).values_list("pk", flat=True))
    timed("dispatch", lambda i: outbox.dispatch_event(ids[i]))
    first = WebhookEndpoint.objects.filter(team=team).order_by("pk").first()
    owed = list(WebhookDelivery.objects.filter(endpoint=first).values_list("pk", flat=True))
    timed("deliver", lambda i: delivery.deliver_webhook(owed[i]))
    server.shutdown()


if __name__ == "__main__":
    main()
