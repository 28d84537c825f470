"""Pools for people (GET /api/v1/pools/) and the endpoints a pool's bridge process polls and reports to.

The bridge authenticates with its pool's token (`Authorization: Bearer gpb_...`); user tokens and sessions do not
reach these views, and the token only reaches its own pool's jobs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.response import Response

from apps.core.api.base import PortalAPIView
from apps.core.errors import NotFound, ValidationFailed
from apps.fleet.messages import GpuReport
from apps.fleet.models import Pool
from apps.jobs.services.reports import LogLineIn
from apps.pools import selectors, services
from apps.pools.api.serializers import PoolOutput
from apps.pools.models import ExternalJob


class PoolListView(PortalAPIView):
    """Pools with their backend (`agents`, `slurm`) and live GPUs; nodes without a pool are the `agents` pool."""

    @extend_schema(responses={200: PoolOutput(many=True)})
    def get(self, request: Request) -> Response:
        return Response(PoolOutput(selectors.pools_with_gpus(), many=True).data)


class BridgeView(PortalAPIView):
    authentication_classes = ()
    permission_classes = ()
    pool: Pool

    def get_authenticate_header(self, request: Request) -> str:
        return "Bearer"

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        header = request.META.get("HTTP_AUTHORIZATION", "").split()
        pool = selectors.pool_for_token(header[1]) if len(header) == 2 and header[0] == "Bearer" else None
        if pool is None:
            raise exceptions.NotAuthenticated("A pool bridge token is required.")
        if pool.name != kwargs.get("name"):
            raise NotFound(f"Pool {kwargs.get('name')} is not this token's pool.")
        self.pool = pool


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise ValidationFailed("The body must be a JSON object.")
    return request.data


def _int(data: dict[str, Any], key: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationFailed(f"{key} must be an integer.", fields={key: ["an integer"]})
    return value


def _str(data: dict[str, Any], key: str, default: str = "") -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ValidationFailed(f"{key} must be a string.", fields={key: ["a string"]})
    return value


def _time(data: dict[str, Any], key: str) -> datetime | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationFailed(f"{key} must be a Unix time.", fields={key: ["seconds since the epoch"]})
    return datetime.fromtimestamp(value, tz=UTC)


def _nodes(raw: Any) -> list[services.NodeIn]:
    if not isinstance(raw, list):
        raise ValidationFailed("nodes must be a list.", fields={"nodes": ["a list"]})
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("gpus"), list):
            raise ValidationFailed("each node is an object with gpus.", fields={"nodes": ["objects with gpus"]})
        gpus = [
            GpuReport(
                uuid=_str(g, "uuid"),
                index=_int(g, "index"),
                model=_str(g, "model"),
                name=_str(g, "name"),
                memory_mib=_int(g, "memory_mib", 0),
                mig_mode=False,
            )
            for g in item["gpus"]
            if isinstance(g, dict)
        ]
        out.append(
            services.NodeIn(
                name=_str(item, "name"), hostname=_str(item, "hostname"), gpus=gpus, up=bool(item.get("up"))
            )
        )
    return out


def job_spec(row: ExternalJob) -> dict[str, Any]:
    """What a bridge needs to submit a job to its scheduler."""
    job = row.job
    return {
        "job_id": job.pk,
        "name": job.name,
        "team": job.team.slug,
        "image": job.image,
        "command": list(job.command),
        "env": dict(job.env),
        "gpu_count": job.gpu_count,
        "gpu_models": list(job.gpu_models),
        "cpus": float(job.cpus),
        "memory_mib": job.memory_mib,
        "max_duration_s": job.max_duration_s,
        "reservation": f"portal-res-{job.reservation_id}" if job.reservation_id else "",
    }


class BridgePollView(BridgeView):
    """The bridge's poll: its nodes (full inventory when `nodes` is sent, else `up`: names seen alive) in; the jobs
    to submit and the jobs to follow out."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str) -> Response:
        data = _body(request)
        refused: list[str] = []
        if "nodes" in data:
            nodes = _nodes(data["nodes"])
            refused = services.pool_inventory(pool=self.pool, nodes=nodes, driver=_str(data, "version"))
            up = [n.name for n in nodes if n.up]
        else:
            raw_up = data.get("up", [])
            up = [n for n in raw_up if isinstance(n, str)] if isinstance(raw_up, list) else []
        services.pool_heartbeat(pool=self.pool, node_names=up)
        services.bridge_touch(self.pool)
        submit = [job_spec(row) for row in services.pool_claim(pool=self.pool)]
        follow = [services.follow_view(row) for row in selectors.followed(self.pool) if row.external_id]
        reservations = selectors.mirrored_reservations(self.pool)
        return Response(
            {"pool": self.pool.name, "options": self.pool.options, "refused_nodes": refused, "submit": submit,
             "follow": follow, "reservations": reservations}
        )  # fmt: skip


class BridgeSubmittedView(BridgeView):
    """The bridge submitted a job (`external_id`), or the scheduler refused it (`refused`: its words)."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str, job_id: int) -> Response:
        data = _body(request)
        if "refused" in data:
            services.pool_job_refused(pool=self.pool, job_id=job_id, message=_str(data, "refused")[:4000])
            return Response({"job_id": job_id, "state": "failed"})
        external_id = _str(data, "external_id")
        if not external_id or len(external_id) > 64:
            raise ValidationFailed("external_id is required.", fields={"external_id": ["1 to 64 characters"]})
        row = services.pool_job_submitted(pool=self.pool, job_id=job_id, external_id=external_id)
        return Response(services.follow_view(row))


class BridgeReservationRefusedView(BridgeView):
    """The scheduler refused to hold a reservation (`message`: its words): the portal gives the reservation up."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str, reservation_id: int) -> Response:
        message = _str(_body(request), "message")[:2000]
        ended = services.pool_reservation_refused(pool=self.pool, reservation_id=reservation_id, message=message)
        return Response({"reservation_id": reservation_id, "ended": ended})


class BridgeUsageView(BridgeView):
    """Accounting records (sacct) of ended jobs with GPUs: those that ran outside the portal go into the ledger."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str) -> Response:
        raw = _body(request).get("records")
        if not isinstance(raw, list):
            raise ValidationFailed("records must be a list.", fields={"records": ["a list"]})
        records = []
        for item in raw:
            if not isinstance(item, dict):
                raise ValidationFailed("each record is an object.", fields={"records": ["objects"]})
            start, end = _time(item, "start"), _time(item, "end")
            if start is None or end is None:
                raise ValidationFailed("start and end are required.", fields={"records": ["start and end"]})
            records.append(
                services.UsageIn(
                    external_id=_int(item, "external_id"), account=_str(item, "account"), node=_str(item, "node"),
                    gpus=_int(item, "gpus"), start=start, end=end,
                )
            )  # fmt: skip
        return Response(services.pool_usage(pool=self.pool, records=records))


class BridgeReportView(BridgeView):
    """What the scheduler says about a job: pending, running (node and GPU indexes), or ended (outcome)."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str, job_id: int) -> Response:
        data = _body(request)
        phase = _str(data, "phase")
        if phase not in {"pending", "running", "ended"}:
            raise ValidationFailed("phase must be pending, running or ended.", fields={"phase": ["unknown"]})
        indexes = data.get("gpu_indexes", [])
        if not isinstance(indexes, list) or not all(isinstance(i, int) for i in indexes):
            raise ValidationFailed("gpu_indexes must be a list of integers.", fields={"gpu_indexes": ["integers"]})
        exit_code = data.get("exit_code")
        log_total = data.get("log_total")
        report = services.JobReport(
            job_id=job_id, external_state=_str(data, "external_state"), phase=phase, node=_str(data, "node"),
            gpu_indexes=indexes, started_at=_time(data, "started_at"), ended_at=_time(data, "ended_at"),
            outcome=_str(data, "outcome"), reason=_str(data, "reason"),
            exit_code=exit_code if isinstance(exit_code, int) else None, message=_str(data, "message")[:4000],
            log_total=log_total if isinstance(log_total, int) else None,
        )  # fmt: skip
        return Response(services.pool_job_report(pool=self.pool, report=report))


class BridgeLogsView(BridgeView):
    """A batch of a job's output lines, numbered by the bridge from 1 per `epoch` (one reading of the file)."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str, job_id: int) -> Response:
        data = _body(request)
        raw = data.get("lines")
        if not isinstance(raw, list):
            raise ValidationFailed("lines must be a list.", fields={"lines": ["a list"]})
        now = datetime.now(tz=UTC)
        lines = [
            LogLineIn(stream=_str(item, "stream", "stdout"), text=_str(item, "text"), at=_time(item, "at") or now)
            for item in raw
            if isinstance(item, dict)
        ]
        stored = services.pool_job_logs(
            pool=self.pool, job_id=job_id, epoch=_str(data, "epoch")[:40], first=_int(data, "first"), lines=lines
        )
        return Response({"stored": stored})
