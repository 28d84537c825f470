"""The job form (labels, help, the team's reservations as a select), the job page's command, and the GPUs
of ended jobs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from apps.billing.models import SourceKind, UsageRecord
from apps.booking.models import ReservationStatus
from apps.jobs.forms import JobForm
from apps.jobs.models import ContainerImage, JobState
from tests.billing import helpers
from tests.pages import builders


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_job_form_labels_say_what_they_ask_for(bob: Any) -> None:
    html = _client(bob).get("/jobs/new/").content.decode()
    for label in ("GPUs", "GPU model", "CPUs", "Memory (MiB)", "Max duration (s)", "Container image", "Reservation"):
        assert f">{label} <" in html, label
    assert "Gpu count" not in html and "Memory mib" not in html and "Gpu model" not in html
    assert "host memory for the container, in MiB" in html


def test_job_form_offers_the_teams_current_and_upcoming_reservations(
    vision: Any, nlp: Any, bob: Any, charlie: Any
) -> None:
    now = timezone.now()
    a100 = helpers.gpu_model("A100-80GB")
    on_now = builders.reservation(vision, bob, start=now - timedelta(hours=1), status=ReservationStatus.ACTIVE)
    later = builders.reservation(vision, bob, start=now + timedelta(days=1), gpu_model=a100, gpu_count=2)
    ended = builders.reservation(vision, bob, start=now - timedelta(hours=5), hours=1)
    cancelled = builders.reservation(vision, bob, status=ReservationStatus.CANCELLED)
    other_team = builders.reservation(nlp, charlie)
    html = _client(bob).get("/jobs/new/").content.decode()
    select = html[html.index('name="reservation"') : html.index("</select>", html.index('name="reservation"'))]
    assert '<optgroup label="vision">' in select
    assert f'value="{on_now.pk}"' in select and f'value="{later.pk}"' in select
    assert f"#{later.pk} · 2 x A100-80GB · " in select and f"#{on_now.pk} · 1 x GPU · " in select
    assert "(now)" in select.split(f'value="{on_now.pk}"')[1].split("</option>")[0]
    for absent in (ended, cancelled, other_team):
        assert f'value="{absent.pk}"' not in select
    assert select.index(f'value="{on_now.pk}"') < select.index(f'value="{later.pk}"')  # soonest first


def test_job_form_takes_a_reservation_from_the_select_and_refuses_an_unknown_one(vision: Any, bob: Any) -> None:
    r = builders.reservation(vision, bob)
    ContainerImage.objects.get_or_create(name="local/process")
    common = dict(teams=[vision], images=["local/process"], models=[], reservations=[r])
    data = {
        "team": "vision", "image": "local/process", "command": "true", "gpu_count": 1, "cpus": 1,
        "memory_mib": 1024, "max_duration_s": 60, "priority": 0,
    }  # fmt: skip
    form = JobForm({**data, "reservation": str(r.pk)}, **common)
    assert form.is_valid(), form.errors
    assert form.cleaned_data["reservation"] == r.pk
    form = JobForm({**data, "reservation": ""}, **common)
    assert form.is_valid() and form.cleaned_data["reservation"] is None
    form = JobForm({**data, "reservation": "999999"}, **common)
    assert not form.is_valid() and "reservation" in form.errors


def test_home_link_preselects_the_reservation(vision: Any, bob: Any) -> None:
    r = builders.reservation(vision, bob)
    html = _client(bob).get(f"/jobs/new/?team=vision&reservation={r.pk}").content.decode()
    assert f'<option value="{r.pk}" selected>' in html


def test_ended_job_shows_the_gpu_it_ran_on_from_its_allocation(vision: Any, bob: Any) -> None:
    [gpu] = helpers.gpus(1, node="ran-here")
    now = timezone.now()
    job = builders.job(
        vision, bob, state=JobState.FAILED, started_at=now - timedelta(minutes=5), ended_at=now - timedelta(minutes=2)
    )
    helpers.run_job(vision, bob, gpu, now - timedelta(minutes=5), now - timedelta(minutes=2), job_id=job.pk)
    html = _client(bob).get(f"/jobs/{job.pk}/").content.decode()
    assert f'data-uuid="{gpu.uuid}"' in html and "ran-here/0" in html
    assert "<dd>1 h 00 min</dd>" in html  # max duration, 3600 s
    assert "Not placed yet" not in html


def test_ended_job_shows_the_gpu_it_ran_on_from_the_ledger(vision: Any, bob: Any) -> None:
    [gpu] = helpers.gpus(1, node="ledger-node")
    now = timezone.now()
    job = builders.job(vision, bob, state=JobState.SUCCEEDED, started_at=now - timedelta(hours=1), ended_at=now)
    start = now - timedelta(hours=1)
    UsageRecord.objects.create(
        team=vision, user=bob, gpu=gpu, gpu_model=gpu.model, source=SourceKind.JOB, source_id=job.pk,
        start=start, end=now, day=timezone.localdate(start), month=timezone.localdate(start).replace(day=1),
        gpu_seconds=3600, hourly_price=gpu.model.hourly_price, cost=gpu.model.hourly_price,
    )  # fmt: skip
    html = _client(bob).get(f"/jobs/{job.pk}/").content.decode()
    assert "ledger-node/0" in html and "Not placed yet" not in html


def test_job_page_says_when_a_job_is_not_placed_and_when_its_gpus_were_not_recorded(vision: Any, bob: Any) -> None:
    queued = builders.job(vision, bob)
    assert "Not placed yet." in _client(bob).get(f"/jobs/{queued.pk}/").content.decode()
    now = timezone.now()
    ran = builders.job(vision, bob, state=JobState.FAILED, gpu_count=2, started_at=now - timedelta(minutes=3))
    html = _client(bob).get(f"/jobs/{ran.pk}/").content.decode()
    assert "Not placed yet" not in html and "Ran on 2 GPUs; which ones was not recorded." in html


def test_success_message_names_the_job(vision: Any, bob: Any) -> None:
    job = builders.job(vision, bob, name="resnet sweep")
    response = _client(bob).post(f"/jobs/{job.pk}/cancel/", follow=True)
    assert f"Cancelling job {job.pk} “resnet sweep”." in response.content.decode()


def test_job_page_shows_the_command_as_it_would_be_typed(vision: Any, bob: Any) -> None:
    """The argv list is quoted where an argument needs it: `-c 'import os; print(1)'` is one argument, not four."""
    job = builders.job(vision, bob, command=["python3", "-c", "import os; print(1)", "--out", "/data/it's here"])
    html = _client(bob).get(f"/jobs/{job.pk}/").content.decode()
    expected = """python3 -c 'import os; print(1)' --out '/data/it'"'"'s here'"""
    assert f"<code>{escape(expected)}</code>" in html
