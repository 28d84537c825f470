"""The demo data: images, finished jobs with timelines and logs, one queued job; loading twice adds nothing."""

from __future__ import annotations

import pytest

from apps.accounts import demo as accounts_demo
from apps.jobs import demo
from apps.jobs.models import ContainerImage, Job, JobState

pytestmark = pytest.mark.django_db


def test_demo_loads_once() -> None:
    accounts_demo.load()
    demo.load()
    demo.load()
    assert set(ContainerImage.objects.values_list("name", flat=True)) >= {demo.BUSYBOX, demo.PROCESS}
    jobs = Job.objects.filter(name__startswith=demo.DEMO)
    assert jobs.count() == len(demo.FINISHED) + 1
    assert jobs.filter(state=JobState.QUEUED).count() == 1
    finished = jobs.exclude(state=JobState.QUEUED)
    assert {j.state for j in finished} == {"succeeded", "failed", "cancelled"}
    for job in finished:
        assert job.events.count() == 4 and job.log_lines.exists() and job.logs_complete
