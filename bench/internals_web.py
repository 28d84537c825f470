"""What the web process's private-internals shortcuts save, in CPU, against the supported way of doing the same.

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python -m bench.internals_web \
        [--tree DIR] [--rounds 3] [--requests 150] [--calls 2000]

`--tree DIR` measures the code of another checkout (e.g. a `git worktree` of an older commit): its directory goes
first on sys.path. Everything runs in this one process against PostgreSQL (a scratch database,
`<name>_internals_<pid>`, created, migrated and dropped): requests go through the real Django application (its
WSGI handler, or the ASGI application for the bridge), so only CPU is compared (`time.process_time`, all of this
process's threads; the database server's CPU is not counted). Each comparison runs its variants interleaved, in
an order rotated from round to round, for `--rounds` rounds, and reports the median per call and the median of
the paired (same round) differences; the machine is shared, so figures move by several percent from run to run.

Pieces, each against its supported alternative (a piece missing from the tree is skipped):
  serializer mixins  FastInputMixin / FastOutputMixin / TemplateFieldsMixin  vs  DRF's own validation, rendering
  negotiation        the ContentNegotiation shortcut                         vs  DRF's DefaultContentNegotiation
  statement_cursor   rawsql.statement_cursor                                 vs  connection.cursor()
  rawsql writes      rawsql.insert / update / insert_with_child              vs  the ORM (save, bulk_create, update)
  pool check         portal.pgbackend's socket poll at pool checkout         vs  psycopg_pool's check_connection
  WSGI bridge        WsgiBridge                                 vs  Django's ASGIHandler, asgiref's WsgiToAsgi
First each path's CPU per request as shipped and how often one request runs each piece; then each piece alone
(micro: precise, and shown as a share of each path); then the paths with each piece on and off (the direct
measure, but a saving under a few percent is within its noise: the `control` variant runs the shipped code again).
The mixins and the bridge are found in portal.internals or where they were before (apps.core).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import urllib.parse
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from bench.interleave import interleaved, report
from bench.internals_toggles import (
    Toggle,
    both,
    import_from_tree,
    negotiation_toggle,
    orm_insert,
    orm_insert_with_child,
    orm_update,
    pool_check_toggle,
    serializer_toggles,
    statement_cursor_toggle,
    writes_toggle,
)


def setup(tree: str | None) -> None:
    if tree:
        tree = os.path.abspath(tree)
        sys.path.insert(0, tree)
        os.chdir(tree)  # Celery's Django fix-up puts the working directory first on sys.path
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit("bench.internals_web: set DATABASE_URL to a PostgreSQL server")
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    # The web process's settings (portal/asgi.py and the launcher): a connection pool, the row cache.
    os.environ.setdefault("DB_POOL_MAX_SIZE", "4")
    os.environ.setdefault("DB_ROW_CACHE", "1")
    os.environ.setdefault("DB_STATEMENT_TIMEOUT_MS", "30000")
    os.environ["API_RATE_PER_TOKEN"] = "100000000/min"
    os.environ["API_RATE_PER_IP"] = "100000000/min"
    import django
    from django.conf import settings

    name = urllib.parse.urlparse(url).path.lstrip("/") or "portal"
    settings.DATABASES["default"]["TEST"] = {"NAME": f"{name}_internals_{os.getpid()}"}
    django.setup()
    # Logs are formatted as in production but written nowhere: the terminal shows the results.
    import logging

    null = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setStream(null)
    import apps

    print(f"code under test: {os.path.dirname(os.path.dirname(apps.__file__ or ''))}")


def create_database() -> None:
    from django.db import connection

    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)


def drop_database() -> None:
    from django.db import connection

    try:
        from apps.core import rowcache

        rowcache.reset()
    except ImportError:
        pass
    connection.close()
    if getattr(connection, "pool", None) is not None:
        connection.close_pool()
    name = connection.settings_dict["NAME"]
    with connection._nodb_cursor() as cursor:  # threads of the ASGI variants may still hold connections
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
    connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)


# --- Seed ---------------------------------------------------------------------------------------------------


def seed() -> dict[str, Any]:
    from decimal import Decimal

    from django.utils import timezone

    from apps.accounts import services as accounts
    from apps.accounts.models import Role
    from apps.booking.models import BookingPolicy, Quota
    from apps.fleet.models import Gpu, GpuModel, GpuStatus, Node, NodeStatus
    from apps.jobs.models import ContainerImage

    BookingPolicy.objects.get_or_create(pk=1)
    model = GpuModel.objects.create(name="A100-80GB", memory_mib=81920, hourly_price=Decimal("2.2"))
    uuids = []
    for n in range(16):
        node = Node.objects.create(name=f"bench-{n:03d}", status=NodeStatus.ONLINE, last_heartbeat=timezone.now())
        rows = [
            Gpu(uuid=f"GPU-bench-{n:03d}-{i}", node=node, index=i, model=model, memory_mib=81920, status=GpuStatus.OK)
            for i in range(8)
        ]
        Gpu.objects.bulk_create(rows)
        uuids += [g.uuid for g in rows]
    admin = accounts.user_get_or_create(username="bench-admin", password="x" * 20, is_staff=True)
    team = accounts.team_create(actor=admin, slug="bench", name="Bench")
    Quota.objects.create(team=team, gpu_hours=Decimal("100000000"), budget_hard=Decimal("100000000000"))
    user = accounts.user_get_or_create(username="bench", password="x" * 20)
    accounts.membership_set(actor=admin, team=team, user=user, role=Role.MANAGER)
    _, token = accounts.token_create(
        user=user, name="bench", scopes=["read", "reservations:write", "jobs:write"], expires_days=1
    )
    ContainerImage.objects.create(name="local/process", description="bench")
    return {"token": token, "gpus": uuids, "team": team.slug, "user": user}


# --- Requests through the application -----------------------------------------------------------------------


class Requests:
    """POST bodies for bookings (each a fresh GPU and hour, so every one is a 201) and job submissions."""

    def __init__(self, data: dict[str, Any]) -> None:
        from django.utils import timezone

        self.data = data
        now = timezone.now().replace(minute=0, second=0, microsecond=0)
        self.base = now + timedelta(hours=2)
        self.booked = 0

    def booking(self) -> bytes:
        i = self.booked
        self.booked += 1
        gpus = self.data["gpus"]
        start = self.base + timedelta(hours=i // len(gpus))
        body = {"team": self.data["team"], "gpus": [gpus[i % len(gpus)]], "start": start.isoformat(),
                "end": (start + timedelta(hours=1)).isoformat(), "note": "bench"}  # fmt: skip
        return json.dumps(body).encode()

    def job(self) -> bytes:
        body = {"team": self.data["team"], "image": "local/process", "command": ["python", "train.py"],
                "env": {"SEED": "1"}, "gpu_count": 1, "max_duration_s": 600, "name": "bench"}  # fmt: skip
        return json.dumps(body).encode()


def environ(path: str, body: bytes, token: str) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "POST",
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "localhost:8000",
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "HTTP_ACCEPT": "*/*",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


def wsgi_post(app: Any, path: str, body: bytes, token: str) -> None:
    status: list[str] = []

    def start_response(s: str, headers: Any, exc_info: Any = None) -> Any:
        status.append(s)
        return lambda chunk: None

    result = app(environ(path, body, token), start_response)
    try:
        b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if not status[0].startswith("201"):
        raise SystemExit(f"POST {path}: {status[0]}: {b''.join(result)[:300]!r}")


class AsgiClient:
    """Calls an ASGI HTTP application on one event loop, the way a server would for one request."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def post(self, app: Any, path: str, body: bytes, token: str) -> None:
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"host", b"localhost:8000"), (b"authorization", f"Bearer {token}".encode()),
                        (b"accept", b"*/*"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
        }  # fmt: skip
        sent: list[dict[str, Any]] = []
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # a disconnect never comes while the request runs
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        self.loop.run_until_complete(app(scope, receive, send))
        if sent[0].get("status") != 201:
            raise SystemExit(f"ASGI POST {path}: {sent[0].get('status')}: {sent[1:]!r:.300}")


# --- Main ---------------------------------------------------------------------------------------------------


PathCosts = dict[str, tuple[float, dict[str, int]]]  # path -> (CPU µs per request as shipped, uses of each piece)

COUNTED = [  # (module, function): how often one request calls each
    ("apps.core.rawsql", "statement_cursor"),
    ("apps.booking.fastpath", "statement_cursor"),
    ("apps.core.rawsql", "insert"),
    ("apps.core.rawsql", "update"),
    ("apps.core.rawsql", "insert_with_child"),
]


def path_costs(data: dict[str, Any], reqs: Requests, args: argparse.Namespace) -> PathCosts:
    """Each path's CPU per request as shipped (median of rounds) and the calls of each counted piece in one request."""
    from django.core.handlers.wsgi import WSGIHandler

    wsgi_app = WSGIHandler()
    token = data["token"]
    out: PathCosts = {}
    for name, url, body in (("booking", "/api/v1/reservations/", reqs.booking), ("job", "/api/v1/jobs/", reqs.job)):

        def request(url: str = url, body: Callable[[], bytes] = body) -> None:
            wsgi_post(wsgi_app, url, body(), token)

        counts: dict[str, int] = {}
        restore = []
        for module_name, fn_name in COUNTED:
            module = sys.modules.get(module_name)
            original = getattr(module, fn_name, None)
            if module is None or original is None:
                continue
            key = "statement_cursor" if fn_name == "statement_cursor" else fn_name
            counts.setdefault(key, 0)

            def counting(*a: Any, _f: Any = original, _k: str = key, _c: dict[str, int] = counts, **kw: Any) -> Any:
                _c[_k] += 1
                return _f(*a, **kw)

            setattr(module, fn_name, counting)
            restore.append((module, fn_name, original))
        try:
            request()
        finally:
            for module, fn_name, original in restore:
                setattr(module, fn_name, original)
        us = statistics.median(interleaved({"as shipped": (request, None)}, args.requests, args.rounds)["as shipped"])
        out[name] = (us, counts)
        print(f"[path] POST {url}: {us:.0f} µs of CPU per request as shipped; calls per request: {counts}")
    return out


def micro(
    data: dict[str, Any],
    reqs: Requests,
    args: argparse.Namespace,
    toggles: dict[str, Toggle | None],
    costs: PathCosts,
) -> None:
    def per(piece: str, **fixed: int) -> list[tuple[str, float, int]]:
        """(path, CPU, uses) of `piece` on each path: `fixed` uses where the view's code says, else counted."""
        return [(p, us, fixed.get(p, uses.get(piece, 0))) for p, (us, uses) in costs.items()]

    from django.db import connection
    from rest_framework.negotiation import DefaultContentNegotiation
    from rest_framework.renderers import JSONRenderer
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory

    n, rounds = args.calls, args.rounds
    ser: Any = toggles.get("serializers")
    if ser:
        from apps.booking.api.serializers import ReservationInput
        from apps.jobs.api.serializers import JobDetailOutput, JobInput
        from apps.jobs.selectors import job_get

        booking_body = json.loads(reqs.booking())
        job_body = json.loads(reqs.job())

        def booking_input() -> Any:
            s = ReservationInput(data=booking_body)
            assert s.is_valid(), s.errors
            return s.validated_data

        def job_input() -> Any:
            s = JobInput(data=job_body)
            assert s.is_valid(), s.errors
            return s.validated_data

        from apps.jobs.models import Job

        job = job_get(user=data["user"], job_id=Job.objects.order_by("-pk").values_list("pk", flat=True)[0])

        def job_output() -> Any:
            return JobDetailOutput(job, context={"user": data["user"]}).data

        for title, fn, key, uses in (
            ("ReservationInput validation", booking_input, "input", per("", booking=1)),
            ("JobInput validation", job_input, "input", per("", job=1)),
            ("JobDetailOutput rendering", job_output, "output", per("", job=1)),
        ):
            toggle = ser[key]
            r = interleaved({"mixins (as shipped)": (fn, None), "plain DRF": (fn, toggle)}, n, rounds)
            report(f"[micro] {title}", r, "mixins (as shipped)", shares=uses)

    neg = toggles.get("negotiation")
    if neg is not None:
        from apps.core.api.negotiation import ContentNegotiation

        factory = APIRequestFactory()
        request = Request(factory.post("/api/v1/jobs/", HTTP_ACCEPT="*/*"))
        renderers = [JSONRenderer()]
        ours, drf = ContentNegotiation(), DefaultContentNegotiation()
        r = interleaved(
            {"shortcut (as shipped)": (lambda: ours.select_renderer(request, renderers), None),
             "DRF DefaultContentNegotiation": (lambda: drf.select_renderer(request, renderers), None)},
            n * 5, rounds,
        )  # fmt: skip
        report("[micro] content negotiation, Accept: */*", r, "shortcut (as shipped)", shares=per("", booking=1, job=1))

    if toggles.get("statement_cursor") is not None:
        from apps.core import rawsql

        sql = "SELECT id, slug FROM accounts_team WHERE slug = %s"

        def kept() -> Any:
            with rawsql.statement_cursor() as cursor:
                cursor.execute(sql, [data["team"]])
                return cursor.fetchone()

        def plain() -> Any:
            with connection.cursor() as cursor:
                cursor.execute(sql, [data["team"]])
                return cursor.fetchone()

        r = interleaved(
            {"statement_cursor (as shipped)": (kept, None), "connection.cursor()": (plain, None)}, n, rounds
        )
        report("[micro] one SELECT of one row", r, "statement_cursor (as shipped)", shares=per("statement_cursor"))

    if toggles.get("writes") is not None:
        from django.db import transaction
        from django.utils import timezone

        from apps.core import rawsql
        from apps.jobs.models import Job, JobEvent

        job_id = Job.objects.order_by("-pk").values_list("pk", flat=True)[0]

        def event() -> JobEvent:
            return JobEvent(job_id=job_id, at=timezone.now(), from_state="queued", to_state="queued", message="b")

        def raw_insert() -> None:
            rawsql.insert([event()])

        def orm_one() -> None:
            orm_insert([event()])

        def raw_update() -> None:
            rawsql.update(Job, {"id": job_id, "state": "queued"}, {"message": "x", "pending_message": "y"})

        def orm_upd() -> None:
            orm_update(Job, {"id": job_id, "state": "queued"}, {"message": "x", "pending_message": "y"})

        with transaction.atomic():
            r = interleaved(
                {"rawsql.insert (as shipped)": (raw_insert, None), "Model.save()": (orm_one, None)}, n, rounds
            )
            report("[micro] INSERT one row", r, "rawsql.insert (as shipped)", shares=per("insert"))
            r = interleaved(
                {"rawsql.update (as shipped)": (raw_update, None), "QuerySet.update()": (orm_upd, None)}, n, rounds
            )
            report("[micro] conditional UPDATE of one row", r, "rawsql.update (as shipped)", shares=per("update"))
            if hasattr(rawsql, "insert_with_child"):
                template = Job.objects.get(pk=job_id)

                def pair() -> tuple[Job, JobEvent]:
                    job = Job(**{f.attname: getattr(template, f.attname) for f in Job._meta.concrete_fields})
                    job.pk, job.idempotency_key = None, ""
                    return job, event()

                def raw_pair() -> None:
                    rawsql.insert_with_child(*pair(), "job_id")

                def orm_pair() -> None:
                    orm_insert_with_child(*pair(), "job_id")

                r = interleaved(
                    {"insert_with_child (as shipped)": (raw_pair, None), "two Model.save()": (orm_pair, None)},
                    n,
                    rounds,
                )
                report("[micro] INSERT a job and its first event", r, "insert_with_child (as shipped)",
                       shares=per("insert_with_child"))  # fmt: skip
            transaction.set_rollback(True)


def paths(data: dict[str, Any], reqs: Requests, args: argparse.Namespace, toggles: dict[str, Toggle | None]) -> None:
    from django.core.handlers.wsgi import WSGIHandler

    wsgi_app = WSGIHandler()
    token = data["token"]
    n, rounds = args.requests, args.rounds

    def book() -> None:
        wsgi_post(wsgi_app, "/api/v1/reservations/", reqs.booking(), token)

    def submit() -> None:
        wsgi_post(wsgi_app, "/api/v1/jobs/", reqs.job(), token)

    present = {name: t for name, t in toggles.items() if t is not None}
    # (The three mixins are also in "serializer mixins".)
    singles = [t for name, t in present.items() if not name.endswith("Mixin")]
    everything = both(*singles) if singles else None
    for title, fn in (
        ("POST /api/v1/reservations/ (WSGI handler)", book),
        ("POST /api/v1/jobs/ (WSGI handler)", submit),
    ):
        # The control runs the shipped code as a variant of its own: its "saving" shows how far noise alone goes.
        variants: dict[str, tuple[Callable[[], Any], Toggle | None]] = {"as shipped": (fn, None), "control": (fn, None)}
        for name, toggle in present.items():
            variants[f"without {name}"] = (fn, toggle)
        if everything is not None and len(present) > 1:
            variants["without any of them"] = (fn, everything)
        r = interleaved(variants, n, rounds)
        report(f"[path] {title}", r, "as shipped", path=True)


def bridge(data: dict[str, Any], reqs: Requests, args: argparse.Namespace) -> None:
    module = import_from_tree("portal.internals.wsgi_bridge") or import_from_tree("apps.core.wsgi_bridge")
    if module is None:
        print("\n(no WSGI bridge in this tree)")
        return
    WsgiBridge = module.WsgiBridge
    from asgiref.wsgi import WsgiToAsgi
    from django.core.handlers.asgi import ASGIHandler
    from django.core.handlers.wsgi import WSGIHandler

    from apps.core.body_limit import BodySizeLimit
    from apps.core.concurrency import ConcurrencyGate

    client = AsgiClient()
    token = data["token"]
    wsgi_app = WSGIHandler()
    apps_ = {
        "WsgiBridge (as shipped)": BodySizeLimit(ConcurrencyGate(WsgiBridge(wsgi_app, workers=8))),
        "Django ASGIHandler": BodySizeLimit(ConcurrencyGate(ASGIHandler())),
        "asgiref WsgiToAsgi": BodySizeLimit(ConcurrencyGate(WsgiToAsgi(wsgi_app))),
    }
    for title, path, body in (
        ("POST /api/v1/reservations/ (ASGI application)", "/api/v1/reservations/", reqs.booking),
        ("POST /api/v1/jobs/ (ASGI application)", "/api/v1/jobs/", reqs.job),
    ):
        variants = {
            name: ((lambda app=app, path=path, body=body: client.post(app, path, body(), token)), None)
            for name, app in apps_.items()
        }
        r = interleaved(variants, args.requests, args.rounds)  # type: ignore[arg-type]
        report(f"[path] {title}", r, "WsgiBridge (as shipped)", path=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.internals_web", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", help="measure the code of this checkout instead of this one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=150, help="requests per variant and round (paths)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per variant and round (micro)")
    parser.add_argument("--only", choices=["micro", "paths", "bridge"], action="append")
    parser.add_argument("--piece", action="append", help="only these pieces in the path measures (repeatable)")
    args = parser.parse_args(argv)
    setup(args.tree)
    create_database()
    try:
        data = seed()
        reqs = Requests(data)
        from django.core.handlers.wsgi import WSGIHandler

        wsgi_post(WSGIHandler(), "/api/v1/jobs/", reqs.job(), data["token"])  # a job for the micro measures
        ser = serializer_toggles()
        ser = ser or {}
        toggles: dict[str, Toggle | None] = {
            "FastInputMixin": ser.get("FastInputMixin"),
            "FastOutputMixin": ser.get("FastOutputMixin"),
            "TemplateFieldsMixin": ser.get("TemplateFieldsMixin"),
            "serializer mixins": ser.get("all"),
            "negotiation": negotiation_toggle(),
            "statement_cursor": statement_cursor_toggle(),
            "writes": writes_toggle(),
            "pgbackend pool check": pool_check_toggle(),
        }
        if args.piece:
            toggles = {name: (t if name in args.piece else None) for name, t in toggles.items()}
        print("pieces found: " + ", ".join(name for name, t in toggles.items() if t is not None) or "none")
        only = set(args.only or ["micro", "paths", "bridge"])
        if "micro" in only:
            costs = path_costs(data, reqs, args)
            micro(data, reqs, args, {**toggles, "serializers": ser}, costs)  # type: ignore[dict-item]
        if "paths" in only:
            paths(data, reqs, args, toggles)
        if "bridge" in only:
            bridge(data, reqs, args)
    finally:
        drop_database()
    return 0


if __name__ == "__main__":
    sys.exit(main())
