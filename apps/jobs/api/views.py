"""Jobs API: images, submit/list, detail, cancel, logs. Thin: parse, call a service or selector, render."""

from __future__ import annotations

import functools
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Scope, Team
from apps.accounts.scoping import team_ids_of
from apps.accounts.types import User
from apps.booking import selectors as booking_selectors
from apps.core.api.base import PortalAPIView, ScopedListAPIView, ScopedRetrieveAPIView
from apps.core.errors import NotFound, ValidationFailed
from apps.core.idempotency import idempotent
from apps.jobs import selectors, services, validation
from apps.jobs.api.serializers import ImageOutput, JobDetailOutput, JobInput, JobOutput, LogLineOutput, LogsOutput
from apps.jobs.filtersets import JobFilterSet
from apps.jobs.models import ContainerImage, Job
from apps.jobs.users import signed_in

MAX_LOG_LIMIT = 5000


class ImageListView(ScopedListAPIView):
    """Container images admins allow jobs to use."""

    model = ContainerImage
    serializer_class = ImageOutput

    def base_queryset(self) -> QuerySet[Any]:
        return ContainerImage.objects.filter(enabled=True).order_by("name")


@functools.cache
def _job_input_names() -> frozenset[str]:
    return frozenset(JobInput().fields)


def _team_for(user: User, slug: str | None) -> Team:
    if slug:
        # With `is_member` for the user (one query), which job_submit's membership check then uses.
        team = booking_selectors.team_for_booking(slug=slug, user=user)
        if team is None:
            raise NotFound(f"No team {slug!r}.", fields={"team": ["no such team"]})
        return team
    ids = team_ids_of(user)
    if len(ids) == 1:
        return Team.objects.get(pk=ids[0])
    raise ValidationFailed("Say which team the job is for.", fields={"team": ["required: you are in several teams"]})


class JobListCreateView(ScopedListAPIView):
    """GET: jobs you can see (filters: state, team, user). POST: submit a job (honours Idempotency-Key)."""

    model = Job
    serializer_class = JobOutput
    write_scope = Scope.JOBS_WRITE

    filter_backends = [DjangoFilterBackend]
    filterset_class = JobFilterSet

    def base_queryset(self) -> QuerySet[Any]:
        return selectors.jobs_visible_to(user=self.request.user)

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "user": self.request.user}

    @extend_schema(request=JobInput, responses={201: JobDetailOutput})
    @idempotent
    def post(self, request: Request) -> Response:
        data = request.data if isinstance(request.data, dict) else None
        if data is None:
            raise ValidationFailed("The body must be a JSON object.")
        validation.check_options(data)
        unknown = sorted(set(data) - _job_input_names())
        if unknown:
            raise ValidationFailed(f"Unknown field {unknown[0]!r}.", fields={k: ["unknown field"] for k in unknown})
        payload = JobInput(data=data)
        payload.is_valid(raise_exception=True)
        v = payload.validated_data
        user = signed_in(request.user)
        job = services.job_submit(
            user=user,
            team=_team_for(user, v.get("team")),
            name=v.get("name", ""),
            image=v["image"],
            command=v["command"],
            env=v.get("env"),
            mounts=v.get("mounts"),
            gpu_count=v.get("gpu_count", 1),
            gpu_model=v.get("gpu_model"),
            gpu_models=v.get("gpu_models"),
            mig_profile=v.get("mig_profile"),
            gpu_share=v.get("gpu_share"),
            mig_memory_mib=v.get("mig_memory_mib"),
            pool=v.get("pool"),
            cpus=v.get("cpus"),
            memory_mib=v.get("memory_mib"),
            max_duration_s=v.get("max_duration_s"),
            priority=v.get("priority", 0),
            reservation_id=v.get("reservation"),
            network=v.get("network"),
            idempotency_key=request.META.get("HTTP_IDEMPOTENCY_KEY", "")[:255],
        )
        body = JobDetailOutput(job, context={"user": request.user}).data
        return Response(body, status=status.HTTP_201_CREATED)


class JobDetailView(ScopedRetrieveAPIView):
    """One job: state, reason, exit code, node and GPUs, timeline, cost so far."""

    model = Job
    serializer_class = JobDetailOutput
    lookup_url_kwarg = "job_id"

    def base_queryset(self) -> QuerySet[Any]:
        return selectors.job_detail_queryset(user=self.request.user)

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "user": self.request.user}


class JobCancelView(PortalAPIView):
    """Cancel a job: a queued one at once, a running one is stopped on its node (SIGTERM, grace, SIGKILL)."""

    write_scope = Scope.JOBS_WRITE

    @extend_schema(request=None, responses={202: JobDetailOutput})
    def post(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get(user=request.user, job_id=job_id)
        job = services.job_cancel(job=job, user=signed_in(request.user))
        job = selectors.job_get(user=request.user, job_id=job.pk)
        return Response(JobDetailOutput(job, context={"user": request.user}).data, status=status.HTTP_202_ACCEPTED)


class JobLogsView(PortalAPIView):
    """Log lines after `after` (a sequence number), oldest first; poll with the returned `last_seq` to follow."""

    @extend_schema(
        parameters=[
            OpenApiParameter("after", int, description="only lines with seq greater than this"),
            OpenApiParameter("limit", int, description=f"at most this many lines (max {MAX_LOG_LIMIT})"),
        ],
        responses=LogsOutput,
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get(user=request.user, job_id=job_id)
        try:
            after = int(request.query_params.get("after", "0"))
            limit = min(max(int(request.query_params.get("limit", "1000")), 1), MAX_LOG_LIMIT)
        except ValueError:
            raise ValidationFailed("after and limit must be integers.") from None
        page = selectors.job_log_page(job=job, after=after, limit=limit, now=timezone.now())
        last = page.last_seq
        return Response(
            {
                "job": job.pk,
                "state": job.state,
                "lines": LogLineOutput(page.lines, many=True).data,
                "last_seq": last,
                "more": bool(page.lines) and not page.waiting and last < job.log_seq,
                "waiting": page.waiting,
                "logs_complete": job.logs_complete and not page.waiting and last >= job.log_seq,
            }
        )
