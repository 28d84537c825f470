"""Job pages: the list with filters, the submit form, one job's page (timeline, live logs, GPUs, cost)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from apps.accounts.models import Team
from apps.booking.selectors import bookable_parts, reservations_current_and_upcoming
from apps.core.errors import ApplicationError, NotFound
from apps.fleet.models import GpuModel
from apps.jobs import selectors, services
from apps.jobs.filtersets import JobFilterSet
from apps.jobs.forms import JobForm
from apps.jobs.models import JobState
from apps.jobs.users import signed_in

# The service's error fields that the form shows under another field.
_FORM_FIELD = {"reservation_id": "reservation", "mig_profile": "part", "gpu_share": "part"}


def _form_for(request: HttpRequest) -> JobForm:
    teams = list(Team.objects.visible_to(request.user).order_by("slug"))
    images = list(selectors.images_visible_to(user=request.user).values_list("name", flat=True))
    models = list(GpuModel.objects.order_by("name").values_list("name", flat=True))
    reservations = reservations_current_and_upcoming(user=request.user, now=timezone.now())
    # ?reservation=ID&team=SLUG (the home page's "run a job in it"): the form starts with them chosen.
    initial = {k: request.GET[k] for k in ("reservation", "team") if request.GET.get(k)}
    return JobForm(
        request.POST or None,
        initial=initial,
        teams=teams,
        images=images,
        models=models,
        reservations=reservations,
        parts=bookable_parts(),
    )


def cli_download(request: HttpRequest) -> HttpResponse:
    """The `gpuportal` client as one file (it needs only `requests`), for CI images: no login, nothing secret."""
    path = Path(settings.BASE_DIR) / "cli" / "gpuportal.py"
    response = HttpResponse(path.read_bytes(), content_type="text/x-python; charset=utf-8")
    response["Content-Disposition"] = 'inline; filename="gpuportal.py"'
    response["Cache-Control"] = "public, max-age=300"
    return response


@login_required
def index(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state") or None
    team = request.GET.get("team") or None
    mine = request.GET.get("mine") == "1"
    filters = JobFilterSet(
        {"state": state or "", "team": team or "", "user": request.user.get_username() if mine else ""},
        queryset=selectors.jobs_visible_to(user=request.user),
    )
    # A filter the page's own form cannot produce (an edited URL): the whole list rather than an error page.
    jobs = filters.qs if filters.is_valid() else filters.queryset
    page = Paginator(jobs, 50).get_page(request.GET.get("page"))
    return render(
        request,
        "jobs/index.html",
        {
            "page": page,
            "states": JobState.choices,
            "teams": Team.objects.visible_to(request.user).order_by("slug"),
            "filters": {"state": state or "", "team": team or "", "mine": mine},
        },
    )


@login_required
def submit(request: HttpRequest) -> HttpResponse:
    form = _form_for(request)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            team = Team.objects.visible_to(request.user).get(slug=data["team"])
            job = services.job_submit(
                user=signed_in(request.user),
                team=team,
                name=data["name"],
                image=data["image"],
                command=data["command"],
                env=data["env"],
                gpu_count=data["gpu_count"],
                gpu_model=data["gpu_model"] or None,
                cpus=data["cpus"],
                memory_mib=data["memory_mib"],
                max_duration_s=data["max_duration_s"],
                priority=data["priority"],
                reservation_id=data["reservation"],
                **data["part"],
            )
        except ApplicationError as exc:
            placed = False
            for field, errors in exc.fields.items():
                target = _FORM_FIELD.get(field, field)
                if target in form.fields:
                    for error in errors:
                        form.add_error(target, error)
                    placed = True
            if not placed:
                form.add_error(None, exc.detail)
        else:
            messages.success(request, f"Job {job.pk}{f' “{job.name}”' if job.name else ''} queued.")
            return redirect("jobs:detail", job_id=job.pk)
    return render(request, "jobs/submit.html", {"form": form})


@login_required
def detail(request: HttpRequest, job_id: int) -> HttpResponse:
    try:
        job = selectors.job_get(user=request.user, job_id=job_id)
    except NotFound:
        raise Http404("No such job.") from None
    now = timezone.now()
    return render(
        request,
        "jobs/detail.html",
        {
            "job": job,
            "events": selectors.job_events(job=job),
            "gpus": selectors.job_gpus_used(job=job),
            "cost": job.cost(now),
            "runtime_s": int(job.runtime_seconds(now)),
            "can_cancel": not job.is_terminal,
        },
    )


@login_required
@require_POST
def cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    try:
        job = selectors.job_get(user=request.user, job_id=job_id)
        services.job_cancel(job=job, user=signed_in(request.user))
        messages.success(request, f"Cancelling job {job_id}{f' “{job.name}”' if job.name else ''}.")
    except NotFound:
        raise Http404("No such job.") from None
    except ApplicationError as exc:
        messages.error(request, exc.detail)
    return redirect("jobs:detail", job_id=job_id)
