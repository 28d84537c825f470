"""Every API route and every websocket route, generated from the URL conf, against every role.

The cast (tests/conftest.py): anonymous; charlie (team nlp, the outsider); bob (vision member); alice (vision
manager); admin (staff); and bob again with a token holding only the `read` scope. Routes with an object id are
asked about an object of team vision, so for charlie it is another team's object.

A route (or method) that is in the URL conf but not in EXPECTATIONS fails `test_route_answers_role_as_expected`
for that route: a new endpoint cannot ship without someone writing down who may call it. An entry for a route
that no longer exists fails `test_expectations_name_only_existing_routes`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

ROLES = ("anonymous", "outsider", "member", "manager", "admin", "readonly")
_ALL_SCOPES = ["read", "jobs:write", "reservations:write", "webhooks:write"]

# pattern -> method -> expected status per role, in ROLES order:
#        (anonymous, outsider, member, manager, admin, readonly)
# The object for a route with an id belongs to team vision (member/manager's team; the outsider's other team).
# Unsafe methods send BODIES[pattern] (default `{}`): 400 there means "authorized, then validated".
EXPECTATIONS: dict[str, dict[str, tuple[int, int, int, int, int, int]]] = {
    "api/v1/health": {"GET": (200, 200, 200, 200, 200, 200)},
    "api/v1/me": {"GET": (401, 200, 200, 200, 200, 200)},
    "api/v1/tokens/": {
        "GET": (401, 200, 200, 200, 200, 200),
        # Creating a token needs only `read` (a token can never mint scopes it lacks): so readonly gets 400.
        "POST": (401, 400, 400, 400, 400, 400),
    },
    # The object is bob's own token: nobody but bob (and admins) can see it, managers included.
    "api/v1/tokens/<int:token_id>/": {"DELETE": (401, 404, 204, 404, 204, 204)},
    "api/v1/teams/": {"GET": (401, 200, 200, 200, 200, 200)},
    "api/v1/teams/<slug:slug>/": {"GET": (401, 404, 200, 200, 200, 200)},
    "api/v1/gpu-models/": {"GET": (401, 200, 200, 200, 200, 200)},
    "api/v1/nodes/": {"GET": (401, 200, 200, 200, 200, 200)},
    # Fleet-wide rows (GPUs, nodes) are not team-owned: every signed-in user reads them; only admins act on them.
    "api/v1/nodes/<segment:name>/drain/": {"POST": (401, 403, 403, 403, 200, 403)},
    "api/v1/nodes/<segment:name>/undrain/": {"POST": (401, 403, 403, 403, 200, 403)},
    "api/v1/gpus/": {"GET": (401, 200, 200, 200, 200, 200)},
    "api/v1/pools/": {"GET": (401, 200, 200, 200, 200, 200)},
    # A pool's bridge endpoints take only that pool's bridge token: no user token or session gets in.
    "api/v1/pools/<slug:name>/bridge/poll/": {"POST": (401, 401, 401, 401, 401, 401)},
    "api/v1/pools/<slug:name>/bridge/usage/": {"POST": (401, 401, 401, 401, 401, 401)},
    "api/v1/pools/<slug:name>/bridge/jobs/<int:job_id>/submitted/": {"POST": (401, 401, 401, 401, 401, 401)},
    "api/v1/pools/<slug:name>/bridge/jobs/<int:job_id>/report/": {"POST": (401, 401, 401, 401, 401, 401)},
    "api/v1/pools/<slug:name>/bridge/jobs/<int:job_id>/logs/": {"POST": (401, 401, 401, 401, 401, 401)},
    "api/v1/pools/<slug:name>/bridge/reservations/<int:reservation_id>/refused/": {
        "POST": (401, 401, 401, 401, 401, 401)
    },
    "api/v1/gpus/<segment:uuid>/history/": {"GET": (401, 200, 200, 200, 200, 200)},
    # 409 for the admin: authorized, but the GPU's node has no agent to probe it.
    "api/v1/gpus/<segment:uuid>/probe/": {"POST": (401, 403, 403, 403, 409, 403)},
    # Admins split a GPU in shares; the empty body is 400 for them (authorized, then validated).
    "api/v1/gpus/<segment:uuid>/shares/": {"POST": (401, 403, 403, 403, 400, 403)},
    "api/v1/images/": {"GET": (401, 200, 200, 200, 200, 200)},
    "api/v1/reservations/": {
        "GET": (401, 200, 200, 200, 200, 200),
        "POST": (401, 400, 400, 400, 400, 403),
    },
    "api/v1/reservations/<int:pk>/": {
        "GET": (401, 404, 200, 200, 200, 200),
        "DELETE": (401, 404, 200, 200, 200, 403),
        # The empty body is 400 for whoever may see it (authorized, then validated); the service then decides who
        # may change it (tests/booking/test_reservation_change.py).
        "PATCH": (401, 404, 400, 400, 400, 403),
    },
    "api/v1/availability/": {"GET": (401, 200, 200, 200, 200, 200)},
    # Everyone sees the timeline; other teams' slots by team name only (the marker check below).
    "api/v1/booking/timeline/": {"GET": (401, 200, 200, 200, 200, 200)},
    "api/v1/booking/quota/": {"GET": (401, 404, 200, 200, 200, 200)},
    "api/v1/jobs/": {
        "GET": (401, 200, 200, 200, 200, 200),
        "POST": (401, 400, 400, 400, 400, 403),
    },
    "api/v1/jobs/<int:job_id>/": {"GET": (401, 404, 200, 200, 200, 200)},
    "api/v1/jobs/<int:job_id>/cancel/": {"POST": (401, 404, 202, 202, 202, 403)},
    "api/v1/jobs/<int:job_id>/logs/": {"GET": (401, 404, 200, 200, 200, 200)},
    "api/v1/usage/": {"GET": (401, 200, 200, 200, 200, 200)},
    # Reports are for managers (their teams) and admins; asked about team vision (not the outsider's: 404).
    "api/v1/reports/monthly/": {"GET": (401, 404, 403, 200, 200, 403)},
    "api/v1/prices/": {
        "GET": (401, 200, 200, 200, 200, 200),
        "POST": (401, 403, 403, 403, 400, 403),
    },
    # Webhooks are the managers' (their teams) and admins'; plain members do not see them either.
    "api/v1/webhooks/": {"GET": (401, 200, 200, 200, 200, 200), "POST": (401, 400, 400, 400, 400, 403)},
    "api/v1/webhooks/<int:endpoint_id>/": {"DELETE": (401, 404, 404, 204, 204, 403)},
    "api/v1/webhooks/<int:endpoint_id>/rotate-secret/": {"POST": (401, 404, 404, 200, 200, 403)},
    "api/v1/webhooks/<int:endpoint_id>/deliveries/": {"GET": (401, 404, 404, 200, 200, 404)},
    "api/v1/me/notifications/": {"GET": (401, 200, 200, 200, 200, 200), "PATCH": (401, 200, 200, 200, 200, 200)},
    # Directory group -> team mappings: administrators only (the admin scope for tokens).
    "api/v1/group-mappings/": {"GET": (401, 403, 403, 403, 200, 403), "POST": (401, 403, 403, 403, 400, 403)},
    "api/v1/group-mappings/<int:mapping_id>/": {"DELETE": (401, 403, 403, 403, 204, 403)},
    # Users' POSIX uids (who runs which GPU process): administrators only; an empty load is a 400.
    "api/v1/unix-accounts/": {"GET": (401, 403, 403, 403, 200, 403), "POST": (401, 403, 403, 403, 400, 403)},
    # Members read their team's idle policy; only admins change it (an empty PATCH changes nothing: 200).
    "api/v1/teams/<slug:slug>/idle-policy/": {
        "GET": (401, 404, 200, 200, 200, 200),
        "PATCH": (401, 403, 403, 403, 200, 403),
    },
    # As the monthly report: managers (their teams) and admins; asked about team vision.
    "api/v1/reports/efficiency/": {"GET": (401, 404, 403, 200, 200, 403)},
    # The waitlist: members see their teams' entries and join (an empty body is 400); the one who joined, the
    # team's managers and admins may cancel.
    "api/v1/waitlist/": {"GET": (401, 200, 200, 200, 200, 200), "POST": (401, 400, 400, 400, 400, 403)},
    "api/v1/waitlist/<int:entry_id>/": {"DELETE": (401, 404, 200, 200, 200, 403)},
    "api/schema/": {"GET": (200, 200, 200, 200, 200, 200)},
    "api/docs/": {"GET": (200, 200, 200, 200, 200, 200)},
}

# JSON bodies for unsafe methods (default: {}).
BODIES: dict[str, dict[str, Any]] = {}

# Routes whose successful answers must still never mention the other team's object (list endpoints).
MARKER = "vision-private-marker"


# --- Routes from the URL conf --------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    pattern: str
    name: str | None
    methods: tuple[str, ...]
    params: tuple[str, ...]


def _walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry


def _methods_of(callback: Any) -> tuple[str, ...]:
    view = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view is None:
        return ("GET",)
    names = [m for m in getattr(view, "http_method_names", []) if m not in {"options", "head", "trace"}]
    return tuple(m.upper() for m in names if hasattr(view, m))


def api_routes() -> list[Route]:
    routes = []
    for pattern, entry in _walk(get_resolver().url_patterns):
        if not pattern.startswith("api/") or entry.name == "api-unknown-path":  # the catch-all 404 (test_errors)
            continue
        params = tuple(entry.pattern.converters) if hasattr(entry.pattern, "converters") else ()
        routes.append(Route(pattern, entry.name, _methods_of(entry.callback), params))
    return routes


def websocket_routes() -> list[str]:
    from portal.routing import websocket_urlpatterns

    return [pattern for pattern, _ in _walk(list(websocket_urlpatterns))]


# --- The cast and the objects ---------------------------------------------------------------------------


@dataclass
class Cast:
    users: dict[str, Any]
    vision: Any
    nlp: Any
    make_token: Callable[..., str]

    def client(self, role: str) -> APIClient:
        client = APIClient()
        if role == "anonymous":
            return client
        user = self.users[role]
        scopes = ["read"] if role == "readonly" else _ALL_SCOPES + (["admin"] if user.is_staff else [])
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.make_token(user, scopes)}")
        return client


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def cast(alice: Any, bob: Any, charlie: Any, admin: Any, vision: Any, nlp: Any, make_token: Any) -> Cast:
    users = {"outsider": charlie, "member": bob, "manager": alice, "admin": admin, "readonly": bob}
    return Cast(users=users, vision=vision, nlp=nlp, make_token=make_token)


def _gpu() -> Any:
    from tests.factories import GpuFactory

    return GpuFactory(node__name="matrix-node")


def _obj_token(cast: Cast) -> dict[str, Any]:
    from apps.accounts import services

    token, _ = services.token_create(user=cast.users["member"], name=MARKER, scopes=["read"], expires_days=30)
    return {"token_id": token.pk}


def _obj_team(cast: Cast) -> dict[str, Any]:
    return {"slug": cast.vision.slug}


def _obj_group_mapping(cast: Cast) -> dict[str, Any]:
    from apps.identity import services

    mapping = services.group_mapping_create(actor=None, group=MARKER, team=cast.vision.slug)
    return {"mapping_id": mapping.pk}


def _obj_reservation(cast: Cast) -> dict[str, Any]:
    from apps.booking import services

    gpu = _gpu()
    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    result = services.reservation_create(
        user=cast.users["member"],
        team=cast.vision,
        start=start,
        end=start + timedelta(hours=1),
        gpus=[gpu.uuid],
        note=MARKER,
    )
    reservation = getattr(result, "reservation", result)
    return {"pk": reservation.pk}


def _obj_waitlist(cast: Cast) -> dict[str, Any]:
    from apps.efficiency.waitlist import waitlist_join

    gpu = _gpu()
    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    entry = waitlist_join(
        user=cast.users["member"], team=cast.vision, gpu_model=gpu.model.name, gpu_count=1, start=start,
        end=start + timedelta(hours=1), note=MARKER,
    )  # fmt: skip
    return {"entry_id": entry.pk}


def _obj_job(cast: Cast) -> dict[str, Any]:
    from apps.jobs import services
    from apps.jobs.models import ContainerImage

    _gpu()
    image = ContainerImage.objects.get_or_create(name="portal-test/busybox:latest")[0]
    job = services.job_submit(
        user=cast.users["member"],
        team=cast.vision,
        image=image.name,
        command=["true"],
        name=MARKER,
        max_duration_s=600,
    )
    return {"job_id": job.pk}


def _obj_gpu(cast: Cast) -> dict[str, Any]:
    return {"uuid": _gpu().uuid}


def _obj_node(cast: Cast) -> dict[str, Any]:
    return {"name": _gpu().node.name}


def _obj_webhook(cast: Cast) -> dict[str, Any]:
    from apps.events import secrets
    from apps.events.models import WebhookEndpoint

    endpoint = WebhookEndpoint.objects.create(
        team=cast.vision, url=f"http://93.184.215.14/{MARKER}", events=["job.*"],
        secret_encrypted=secrets.encrypt(secrets.new_secret()),
    )  # fmt: skip
    return {"endpoint_id": endpoint.pk}


def _window_query(cast: Cast) -> str:
    _obj_reservation(cast)  # something of team vision's in the window, whose note must not leak
    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    return f"?start={start.isoformat()}&end={(start + timedelta(hours=2)).isoformat()}".replace("+", "%2B")


def _usage_row(cast: Cast) -> int:
    from decimal import Decimal

    from apps.billing.models import UsageRecord

    gpu = _gpu()
    start = (timezone.now() - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    row = UsageRecord.objects.create(
        team=cast.vision, user=cast.users["member"], gpu=gpu, gpu_model=gpu.model, source="reservation",
        source_id=987654, start=start, end=start + timedelta(hours=1), day=start.date(),
        month=start.date().replace(day=1), gpu_seconds=3600, hourly_price=Decimal("2.5"), cost=Decimal("2.5"),
    )  # fmt: skip
    return int(row.pk)


# List route -> maker of one row of team vision (returns its id; tokens: bob's own): the outsider's list must not
# contain it and the member's (bob's) must, so the probe is known to work.
LIST_PROBES: dict[str, Callable[[Cast], int]] = {
    "api/v1/tokens/": lambda cast: int(_obj_token(cast)["token_id"]),
    "api/v1/reservations/": lambda cast: int(_obj_reservation(cast)["pk"]),
    "api/v1/jobs/": lambda cast: int(_obj_job(cast)["job_id"]),
    "api/v1/usage/": _usage_row,
    "api/v1/waitlist/": lambda cast: int(_obj_waitlist(cast)["entry_id"]),
}


def _ids_in(body: Any) -> set[Any]:
    items = body.get("results", body) if isinstance(body, dict) else body
    return {item.get("id") for item in items if isinstance(item, dict)} if isinstance(items, list) else set()


# Route pattern -> maker of a query string (for reads that need one to get past validation).
QUERIES: dict[str, Callable[[Cast], str]] = {
    "api/v1/availability/": _window_query,
    "api/v1/booking/timeline/": _window_query,
    "api/v1/booking/quota/": lambda cast: f"?team={cast.vision.slug}",
    "api/v1/reports/monthly/": lambda cast: f"?team={cast.vision.slug}",
    "api/v1/reports/efficiency/": lambda cast: f"?team={cast.vision.slug}",
}

# Route pattern -> maker of the URL kwargs for an object of team vision. A route with parameters and no maker
# fails: add one here when you add such a route.
OBJECT_MAKERS: dict[str, Callable[[Cast], dict[str, Any]]] = {
    "api/v1/tokens/<int:token_id>/": _obj_token,
    "api/v1/teams/<slug:slug>/": _obj_team,
    "api/v1/teams/<slug:slug>/idle-policy/": _obj_team,
    "api/v1/reservations/<int:pk>/": _obj_reservation,
    "api/v1/waitlist/<int:entry_id>/": _obj_waitlist,
    "api/v1/jobs/<int:job_id>/": _obj_job,
    "api/v1/jobs/<int:job_id>/cancel/": _obj_job,
    "api/v1/jobs/<int:job_id>/logs/": _obj_job,
    "api/v1/gpus/<segment:uuid>/history/": _obj_gpu,
    "api/v1/gpus/<segment:uuid>/probe/": _obj_gpu,
    "api/v1/gpus/<segment:uuid>/shares/": _obj_gpu,
    "api/v1/nodes/<segment:name>/drain/": _obj_node,
    "api/v1/nodes/<segment:name>/undrain/": _obj_node,
    "api/v1/pools/<slug:name>/bridge/poll/": lambda cast: {"name": "cluster"},
    "api/v1/pools/<slug:name>/bridge/usage/": lambda cast: {"name": "cluster"},
    "api/v1/pools/<slug:name>/bridge/jobs/<int:job_id>/submitted/": lambda cast: {"name": "cluster", **_obj_job(cast)},
    "api/v1/pools/<slug:name>/bridge/jobs/<int:job_id>/report/": lambda cast: {"name": "cluster", **_obj_job(cast)},
    "api/v1/pools/<slug:name>/bridge/jobs/<int:job_id>/logs/": lambda cast: {"name": "cluster", **_obj_job(cast)},
    "api/v1/pools/<slug:name>/bridge/reservations/<int:reservation_id>/refused/": lambda cast: {
        "name": "cluster",
        "reservation_id": 1,
    },
    "api/v1/group-mappings/<int:mapping_id>/": _obj_group_mapping,
    "api/v1/webhooks/<int:endpoint_id>/": _obj_webhook,
    "api/v1/webhooks/<int:endpoint_id>/rotate-secret/": _obj_webhook,
    "api/v1/webhooks/<int:endpoint_id>/deliveries/": _obj_webhook,
}


def _url(pattern: str, kwargs: dict[str, Any]) -> str:
    def sub(match: re.Match[str]) -> str:
        return str(kwargs[match.group(2)])

    return "/" + re.sub(r"<(?:(\w+):)?(\w+)>", sub, pattern)


# --- The OpenAPI schema, to check that each real answer is documented -----------------------------------


@functools.cache
def _openapi() -> Any:
    import schemathesis
    from drf_spectacular.generators import SchemaGenerator
    from rest_framework.renderers import JSONRenderer

    raw = SchemaGenerator().get_schema(request=None, public=True)
    return schemathesis.openapi.from_dict(json.loads(JSONRenderer().render(raw)))


def _assert_documented(method: str, url: str, resp: Any) -> None:
    """The status is one the schema declares for this operation, and the body matches its schema."""
    import requests
    from schemathesis.core.transport import Response as SResponse

    schema = _openapi()
    path = url.split("?")[0]
    for template in schema.raw_schema["paths"]:
        if re.fullmatch(re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)), path):
            break
    else:
        raise AssertionError(f"{method} {path}: not in the OpenAPI schema")
    operation = schema[template][method]
    declared = set(operation.definition.raw["responses"])
    assert str(resp.status_code) in declared or "default" in declared, (
        f"{method} {url}: answered {resp.status_code}, the schema declares only {sorted(declared)}"
    )
    prepared = requests.Request(method, "http://testserver" + url).prepare()
    headers = {k: [v] for k, v in resp.items()}
    operation.validate_response(SResponse(resp.status_code, headers, resp.content, prepared, elapsed=0.0, verify=False))


# --- HTTP matrix ---------------------------------------------------------------------------------------

_ROUTES = api_routes()
_CASES = [(r, m, role) for r in _ROUTES for m in r.methods for role in ROLES]


def _assert_error_shape(resp: Any, where: str) -> None:
    body = resp.json()
    assert isinstance(body, dict) and {"code", "detail", "fields"} <= set(body), f"{where}: not the error shape: {body}"


def _call(route: Route, method: str, role: str, cast: Cast) -> tuple[str, Any, int | None]:
    """Make the route's object (and list probe), call it as `role`: (url, response, probe id)."""
    kwargs: dict[str, Any] = {}
    if route.params:
        maker = OBJECT_MAKERS.get(route.pattern)
        assert maker is not None, f"/{route.pattern} takes {route.params}: add an OBJECT_MAKERS entry"
        kwargs = maker(cast)
    client = cast.client(role)
    probe_id = LIST_PROBES[route.pattern](cast) if method == "GET" and route.pattern in LIST_PROBES else None
    url = _url(route.pattern, kwargs)
    if route.pattern in QUERIES:
        url += QUERIES[route.pattern](cast)
    body = BODIES.get(route.pattern, {})
    if method in {"GET", "DELETE"}:
        resp = client.generic(method, url)
    else:
        resp = client.generic(method, url, json.dumps(body), content_type="application/json")
    return url, resp, probe_id


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("route", "method", "role"), _CASES, ids=[f"{m} /{r.pattern} as {role}" for r, m, role in _CASES]
)
def test_route_answers_role_as_expected(route: Route, method: str, role: str, cast: Cast) -> None:
    table = EXPECTATIONS.get(route.pattern, {})
    url, resp, probe_id = _call(route, method, role, cast)
    where = f"{method} {url} as {role}"
    # The observed status is in the message so the reviewer can check it and copy it into the table.
    assert method in table, (
        f"{method} /{route.pattern} has no EXPECTATIONS entry (observed {resp.status_code} as {role})"
    )
    expected = table[method][ROLES.index(role)]
    assert resp.status_code == expected, f"{where}: {resp.status_code} (expected {expected}): {resp.content[:300]!r}"
    if resp.status_code >= 400 and url.startswith("/api/v1/"):
        _assert_error_shape(resp, where)
    if role in {"outsider", "anonymous"} and resp.status_code < 300 and not route.pattern.startswith("api/schema"):
        assert MARKER not in resp.content.decode(errors="replace"), f"{where}: leaks team vision's object"
    if probe_id is not None and resp.status_code == 200:
        listed = probe_id in _ids_in(resp.json())
        if role == "outsider":
            assert not listed, f"{where}: lists team vision's row {probe_id}"
        elif role == "member":
            assert listed, f"{where}: does not list the team's own row {probe_id} (probe broken?)"


_DOC_CASES = [(r, m, role) for r, m, role in _CASES if role in {"outsider", "member", "admin"}]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("route", "method", "role"), _DOC_CASES, ids=[f"{m} /{r.pattern} as {role}" for r, m, role in _DOC_CASES]
)
def test_answer_is_what_the_openapi_schema_documents(route: Route, method: str, role: str, cast: Cast) -> None:
    """On real objects (which the fuzz test rarely finds): the status is declared and the body matches."""
    if not route.pattern.startswith("api/v1/"):
        pytest.skip("not an API v1 operation")
    url, resp, _ = _call(route, method, role, cast)
    _assert_documented(method, url, resp)


@pytest.mark.django_db
@pytest.mark.parametrize("route", _ROUTES, ids=[f"/{r.pattern}" for r in _ROUTES])
def test_unimplemented_methods_are_refused_in_shape(route: Route, cast: Cast) -> None:
    kwargs = OBJECT_MAKERS[route.pattern](cast) if route.params and route.pattern in OBJECT_MAKERS else {}
    if route.params and not kwargs:
        pytest.skip("no object maker (the matrix test fails for it)")
    url = _url(route.pattern, kwargs)
    for method in ("PUT", "PATCH", "POST", "DELETE"):
        if method in route.methods:
            continue
        for role in ("anonymous", "member", "admin"):
            resp = cast.client(role).generic(method, url, "{}", content_type="application/json")
            assert resp.status_code in {401, 403, 405}, f"{method} {url} as {role}: {resp.status_code}"
            if url.startswith("/api/v1/"):
                _assert_error_shape(resp, f"{method} {url} as {role}")


def test_expectations_name_only_existing_routes() -> None:
    existing = {r.pattern: set(r.methods) for r in _ROUTES}
    stale = [p for p in EXPECTATIONS if p not in existing]
    assert not stale, f"EXPECTATIONS names routes that are gone: {stale}"
    for pattern, table in EXPECTATIONS.items():
        assert set(table) <= existing[pattern], (
            f"/{pattern}: entries for methods it lacks: {set(table) - existing[pattern]}"
        )
        for method, row in table.items():
            assert len(row) == len(ROLES), f"{method} /{pattern}: one status per role {ROLES}"


# --- Websocket routes ------------------------------------------------------------------------------------

# pattern -> roles that may connect (everyone else is refused). Per-object routes are asked about team vision's.
WS_EXPECTATIONS: dict[str, set[str]] = {
    "ws/fleet/": {"outsider", "member", "manager", "admin", "readonly"},
    "ws/jobs/": {"outsider", "member", "manager", "admin", "readonly"},  # each hears only its own teams' jobs
    "ws/jobs/<int:job_id>/": {"member", "manager", "admin", "readonly"},
    "ws/teams/<slug:slug>/": {"member", "manager", "admin", "readonly"},
    "ws/bookings/": {"outsider", "member", "manager", "admin", "readonly"},
    "": set(),  # every other path: no stream, closed with 4404 (asked here at "/")
}
WS_OBJECT_MAKERS: dict[str, Callable[[Cast], dict[str, Any]]] = {
    "ws/jobs/<int:job_id>/": _obj_job,
    "ws/teams/<slug:slug>/": _obj_team,
}


async def ws_outcome(url: str, headers: dict[str, str], wait: float = 1.5) -> str:
    """'accepted' if the socket is open after `wait` s (or sent data); 'refused' if the handshake failed or the
    server closed it first; the close code is appended to refusals for the failure message."""
    import websockets
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    try:
        async with websockets.connect(url, additional_headers=headers, open_timeout=5, max_size=None) as ws:
            try:
                await asyncio.wait_for(ws.recv(), timeout=wait)
                return "accepted"
            except TimeoutError:
                return "accepted"
            except ConnectionClosed as exc:
                return f"refused (close {exc.rcvd.code if exc.rcvd else None})"
    except InvalidStatus as exc:
        return f"refused (HTTP {exc.response.status_code})"


@pytest.mark.slow
@pytest.mark.parametrize("pattern", websocket_routes())
def test_websocket_route_admits_only_allowed_roles(pattern: str, cast: Cast, live_portal: Any) -> None:
    allowed = WS_EXPECTATIONS.get(pattern)
    assert allowed is not None, f"websocket /{pattern} has no WS_EXPECTATIONS entry: write down who may connect"
    kwargs: dict[str, Any] = {}
    if "<" in pattern:
        maker = WS_OBJECT_MAKERS.get(pattern)
        assert maker is not None, f"websocket /{pattern}: add a WS_OBJECT_MAKERS entry"
        kwargs = maker(cast)
    url = live_portal.ws_url + _url(pattern, kwargs)
    headers_for = {"anonymous": {}}
    for role in ROLES[1:]:
        user = cast.users[role]
        scopes = ["read"] if role == "readonly" else _ALL_SCOPES
        headers_for[role] = {"Authorization": f"Bearer {cast.make_token(user, scopes)}"}

    async def run_all() -> dict[str, str]:
        return {role: await ws_outcome(url, headers_for[role]) for role in ROLES}

    outcomes = asyncio.run(run_all())
    wrong = {role: got for role, got in outcomes.items() if (got == "accepted") != (role in allowed)}
    assert not wrong, f"/{pattern}: {wrong} (allowed: {sorted(allowed)})"
