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
from apps.fleet.models import Pool
from apps.jobs.services.reports import LogLineIn
from apps.pools import selectors, services
from apps.pools.api import inputs
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
        data = inputs.body(request)
        refused: list[str] = []
        if "nodes" in data:
            nodes = inputs.nodes(data["nodes"])
            version = inputs.text(data, "version", max_length=64)
            refused = services.pool_inventory(pool=self.pool, nodes=nodes, driver=version)
            up = [n.name for n in nodes if n.up]
        else:
            up = inputs.names(data.get("up", []), "up", max_length=100)
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
        data = inputs.body(request)
        if "refused" in data:
            message = inputs.text(data, "refused", max_length=4000)
            services.pool_job_refused(pool=self.pool, job_id=job_id, message=message)
            return Response({"job_id": job_id, "state": "failed"})
        external_id = inputs.ident(data, "external_id", max_length=64)
        if not external_id:
            raise ValidationFailed("external_id is required.", fields={"external_id": ["1 to 64 characters"]})
        row = services.pool_job_submitted(pool=self.pool, job_id=job_id, external_id=external_id)
        return Response(services.follow_view(row))


class BridgeReservationRefusedView(BridgeView):
    """The scheduler refused to hold a reservation (`message`: its words): the portal gives the reservation up."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str, reservation_id: int) -> Response:
        message = inputs.text(inputs.body(request), "message", max_length=2000)
        ended = services.pool_reservation_refused(pool=self.pool, reservation_id=reservation_id, message=message)
        return Response({"reservation_id": reservation_id, "ended": ended})


class BridgeUsageView(BridgeView):
    """Accounting records (sacct) of ended jobs with GPUs: those that ran outside the portal go into the ledger."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str) -> Response:
        raw = inputs.body(request).get("records")
        if not isinstance(raw, list):
            raise ValidationFailed("records must be a list.", fields={"records": ["a list"]})
        records = []
        for item in raw:
            if not isinstance(item, dict):
                raise ValidationFailed("each record is an object.", fields={"records": ["objects"]})
            start, end = inputs.moment(item, "start"), inputs.moment(item, "end")
            if start is None or end is None:
                raise ValidationFailed("start and end are required.", fields={"records": ["start and end"]})
            records.append(
                services.UsageIn(
                    external_id=inputs.integer(item, "external_id", hi=inputs.INT64_MAX),
                    account=inputs.ident(item, "account", max_length=64),
                    node=inputs.ident(item, "node", max_length=100),
                    gpus=inputs.integer(item, "gpus"), start=start, end=end,
                )
            )  # fmt: skip
        return Response(services.pool_usage(pool=self.pool, records=records))


class BridgeReportView(BridgeView):
    """What the scheduler says about a job: pending, running (node and GPU indexes), or ended (outcome)."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str, job_id: int) -> Response:
        data = inputs.body(request)
        phase = inputs.ident(data, "phase", max_length=16)
        if phase not in {"pending", "running", "ended"}:
            raise ValidationFailed("phase must be pending, running or ended.", fields={"phase": ["unknown"]})
        report = services.JobReport(
            job_id=job_id, external_state=inputs.text(data, "external_state", max_length=32), phase=phase,
            node=inputs.ident(data, "node", max_length=100), gpu_indexes=inputs.indexes(data.get("gpu_indexes", [])),
            started_at=inputs.moment(data, "started_at"), ended_at=inputs.moment(data, "ended_at"),
            outcome=inputs.ident(data, "outcome", max_length=16), reason=inputs.ident(data, "reason", max_length=32),
            exit_code=inputs.optional_integer(data, "exit_code", lo=-inputs.INT32_MAX - 1),
            message=inputs.text(data, "message", max_length=4000),
            log_total=inputs.optional_integer(data, "log_total"),
        )  # fmt: skip
        return Response(services.pool_job_report(pool=self.pool, report=report))


class BridgeLogsView(BridgeView):
    """A batch of a job's output lines, numbered by the bridge from 1 per `epoch` (one reading of the file)."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str, job_id: int) -> Response:
        data = inputs.body(request)
        raw = data.get("lines")
        if not isinstance(raw, list):
            raise ValidationFailed("lines must be a list.", fields={"lines": ["a list"]})
        now = datetime.now(tz=UTC)
        lines = [
            LogLineIn(
                stream=inputs.ident(item, "stream", "stdout", max_length=16),
                text=inputs.text(item, "text"),
                at=inputs.moment(item, "at") or now,
            )
            for item in raw
            if isinstance(item, dict)
        ]
        stored = services.pool_job_logs(
            pool=self.pool,
            job_id=job_id,
            epoch=inputs.text(data, "epoch", max_length=40),
            first=inputs.integer(data, "first"),
            lines=lines,
        )
        return Response({"stored": stored})
