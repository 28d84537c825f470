"""The job serializers render from a plan built once per class (FastOutputMixin, portal/internals/drf_output.py):
the output must be exactly DRF's, and every serializer instance must render with its own
context (the env values only its submitter may see)."""

from __future__ import annotations

import threading

import pytest
from django.utils import timezone
from rest_framework import serializers

from apps.jobs import services
from apps.jobs.api.serializers import JobDetailOutput, JobInput, JobOutput, LogLineOutput
from tests.core.test_fast_output import drf_render

pytestmark = pytest.mark.django_db


class PlainDetail(JobDetailOutput):
    """The same serializer with DRF's own field building (no templates) at the top level."""

    get_fields = serializers.ModelSerializer.get_fields


def _started_job(alice, vision, fleet, submit):
    job = submit(alice, vision, env={"WANDB_API_KEY": "s3cret"}, gpu_count=2, gpu_model="H100-80GB", name="x")
    job = services.job_start(job=job, node=fleet["node02"], gpus=fleet["gpus02"][:2], now=timezone.now())
    from apps.jobs.selectors import job_get

    return job_get(user=alice, job_id=job.pk)


def test_output_is_what_drf_builds(alice, bob, vision, fleet, submit):
    job = _started_job(alice, vision, fleet, submit)
    for viewer in (alice, bob):
        fast = JobDetailOutput(job, context={"user": viewer}).data
        plain = drf_render(PlainDetail(job, context={"user": viewer}))
        assert fast == plain
        assert list(fast) == list(plain)
    assert [g["uuid"] for g in fast["gpus"]] == ["GPU-h100-0000", "GPU-h100-0001"]
    assert [e["to_state"] for e in fast["events"]] == ["queued", "starting"]


def test_each_instance_renders_with_its_own_context(alice, bob, vision, fleet, submit):
    job = _started_job(alice, vision, fleet, submit)
    mine = JobDetailOutput(job, context={"user": alice})
    theirs = JobDetailOutput(job, context={"user": bob})
    # Both bound before either renders: a field object shared between them would now belong to `theirs`.
    assert mine.fields["env"] is not theirs.fields["env"]
    assert mine.fields["gpus"] is not theirs.fields["gpus"]
    assert mine.data["env"] == {"WANDB_API_KEY": "s3cret"}
    assert theirs.data["env"] == {"WANDB_API_KEY": "***"}


def test_concurrent_renders_for_different_users(alice, bob, vision, fleet, submit):
    job = _started_job(alice, vision, fleet, submit)
    expected = {alice.pk: "s3cret", bob.pk: "***"}
    barrier = threading.Barrier(8)
    wrong: list[str] = []

    def render(viewer) -> None:
        barrier.wait()
        for _ in range(100):
            value = JobDetailOutput(job, context={"user": viewer}).data["env"]["WANDB_API_KEY"]
            if value != expected[viewer.pk]:
                wrong.append(f"{viewer.username} saw {value}")

    threads = [threading.Thread(target=render, args=((alice, bob)[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_input_validation_is_unchanged(db):
    ok = JobInput(data={"image": "x", "command": ["a"], "name": "n"})
    assert ok.is_valid(), ok.errors
    too_long = JobInput(data={"image": "x", "command": ["a"], "name": "n" * 201})
    assert not too_long.is_valid() and "name" in too_long.errors
    missing = JobInput(data={"command": ["a"]})
    assert not missing.is_valid() and "image" in missing.errors
    # Errors of one instance never show up in the next.
    assert JobInput(data={"image": "x", "command": ["a"]}).is_valid()


def test_list_and_log_output_is_what_drf_builds(alice, bob, vision, fleet, submit):
    from apps.jobs.models import JobLogLine

    first = _started_job(alice, vision, fleet, submit)
    second = submit(alice, vision, gpu_count=1)
    jobs = [first, second]
    for viewer in (alice, bob):
        fast = JobOutput(jobs, many=True, context={"user": viewer}).data
        assert fast == drf_render(JobOutput(jobs, many=True, context={"user": viewer}))
    now = timezone.now()
    lines = [JobLogLine(job=first, seq=i, stream="stdout" if i % 2 else "stderr", at=now, line=f"l{i}") for i in (1, 2)]
    assert LogLineOutput(lines, many=True).data == drf_render(LogLineOutput(lines, many=True))
    for rendered in (JobOutput, LogLineOutput):  # the fast path, not the fallback
        assert rendered.__dict__.get("_output_plan") is not None, rendered
