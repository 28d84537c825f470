"""The advisor's plot on the job page renders in a real browser (Chromium): the advisor runs on the CPU here, its
result line is the job's log, and the page draws throughput and memory against batch size for both precisions."""

from __future__ import annotations

import shutil
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from apps.jobs.models import Job, JobLogLine, JobReason, JobState
from tests.browser.test_pages import signed_in
from workers.probes.advisor import main

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium"),
]

PAINTED = """id => { const c = document.getElementById(id); const d = c.getContext('2d')
  .getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++;
  return n; }"""
TINY = ["--device", "cpu", "--d-model", "16", "--layers", "1", "--seq-len", "8", "--vocab", "50", "--steps", "1"]


def test_advisor_plot_renders(
    live_portal: Any, alice: Any, vision: Any, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    assert main([*TINY, "--max-batch", "4", "--limit-mib", "64"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    ended = timezone.now()
    job = Job.objects.create(
        team=vision, user=alice, image="local/process", command=["python", "-m", "workers.probes.advisor"],
        gpu_count=1, cpus=Decimal(1), memory_mib=1024, max_duration_s=600, state=JobState.SUCCEEDED,
        reason=JobReason.EXIT_CODE, exit_code=0, started_at=ended - timedelta(minutes=2), ended_at=ended,
    )  # fmt: skip
    JobLogLine.objects.bulk_create(
        [JobLogLine(job=job, seq=i + 1, at=ended, line=text) for i, text in enumerate(lines)]
    )
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/jobs/{job.pk}/")
        page.wait_for_function("() => document.getElementById('chart-job-advisor').dataset.rendered === '1'")
        assert "Best: batch" in page.inner_text("#job-advisor-best")
        runs = page.evaluate("JSON.parse(document.getElementById('job-advisor-data').textContent).runs.length")
        assert runs == 6  # batch 1, 2, 4 in fp32 and bf16
        box = page.locator("#chart-job-advisor").bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 100
        painted = page.evaluate(PAINTED, "chart-job-advisor")
        assert painted > 1000  # lines, axes and legend drawn, not an empty canvas


def test_oom_job_memory_curve_and_efficiency_page_render(
    live_portal: Any, alice: Any, vision: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.efficiency.demo import oom_memory_curve
    from tests.factories import GpuFactory, GpuModelFactory, NodeFactory

    model = GpuModelFactory(name="H100-80GB", memory_mib=81920, hourly_price=Decimal("3.9"))
    gpu = GpuFactory(node=NodeFactory(name="n1"), index=0, model=model, uuid="GPU-b-0")
    started = timezone.now().replace(second=0, microsecond=0) - timedelta(hours=1)
    job = Job.objects.create(
        team=vision, user=alice, image="x", command=["python", "train.py"], gpu_count=1, cpus=Decimal(1),
        memory_mib=1024, max_duration_s=3600, state=JobState.FAILED, reason=JobReason.EXIT_CODE, exit_code=1,
        started_at=started, ended_at=started + timedelta(minutes=10),
    )  # fmt: skip
    job.gpus.set([gpu])
    oom_memory_curve(gpu=gpu, start=started, minutes=10)
    JobLogLine.objects.create(job=job, seq=1, at=started, line="torch.OutOfMemoryError: CUDA out of memory.")
    with signed_in(live_portal, alice, monkeypatch) as page:
        page.goto(f"{live_portal.url}/jobs/{job.pk}/")
        page.wait_for_function("() => document.getElementById('chart-job-gpu').dataset.rendered === '1'")
        assert page.evaluate(PAINTED, "chart-job-gpu") > 1000
        assert "CUDA out of memory" in page.inner_text("#job-failure-kind")
        assert "81920 MiB" in page.inner_text("#job-mem-peak")
        page.wait_for_selector("#job-logs >> text=CUDA out of memory")  # the log fetch is done before leaving
        page.goto(f"{live_portal.url}/efficiency/")
        page.wait_for_function("() => document.getElementById('chart-efficiency-teams').dataset.rendered === '1'")
        assert page.locator("#efficiency-csv").count() == 1
