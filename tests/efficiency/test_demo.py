"""The demo: team vision's short idle policy, and the CUDA-OOM job with its memory curve, OOM kind and advice."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from apps.efficiency.jobinfo import job_efficiency
from apps.efficiency.models import IdlePolicy
from apps.jobs.models import Job

pytestmark = pytest.mark.django_db


def test_demo_has_an_oom_job_with_its_memory_curve(admin: Any) -> None:
    call_command("load_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    call_command("load_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115  (idempotent)
    policy = IdlePolicy.objects.get(team__slug="vision")
    assert (policy.warn_after_min, policy.reclaim_after_min) == (10, 5)
    job = Job.objects.get(name="demo: llm finetune (batch 64)")
    eff = job_efficiency(job)
    assert eff.failure == "cuda_oom" and len(eff.series) == 14
    assert eff.gpu_memory_peak_mib == eff.gpu_memory_total_mib  # it climbed to the GPU's capacity
    assert [a["code"] for a in eff.advice] == ["cuda_oom", "amp"]
    assert str(eff.gpu_memory_peak_mib) in eff.advice[0]["detail"]
