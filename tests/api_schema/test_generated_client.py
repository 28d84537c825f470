"""A client generated from the portal's OpenAPI document with openapi-python-client, used as generated (no hand
edits): it submits a job with an Idempotency-Key against a live portal, and a retry with the same key gets the same
job instead of a second one."""

from __future__ import annotations

import importlib
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from apps.jobs.models import ContainerImage, Job
from tests.factories import GpuFactory, GpuModelFactory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

IMAGE = "portal-test/busybox:latest"


def _generate(schema_url: str, tmp_path: Path) -> str:
    document = tmp_path / "openapi.json"
    document.write_bytes(requests.get(schema_url, timeout=60).content)
    package = f"gpuportal_generated_{uuid.uuid4().hex[:8]}"
    argv = [str(Path(sys.executable).parent / "openapi-python-client"), "generate", "--path", str(document)]
    argv += ["--output-path", str(tmp_path / package), "--meta", "none"]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Unable to" not in done.stdout + done.stderr, done.stdout + done.stderr  # nothing left out
    sys.path.insert(0, str(tmp_path))
    return package


def test_a_generated_client_submits_a_job_with_an_idempotency_key(
    tmp_path: Path, alice: Any, vision: Any, make_token: Any, live_portal: Any
) -> None:
    GpuFactory(node__name="gen-node", model=GpuModelFactory(name="A100-80GB"), index=0)
    ContainerImage.objects.create(name=IMAGE, description="for the generated client")
    token = make_token(alice, ["read", "jobs:write"])
    package = _generate(f"{live_portal.url}/api/schema/?format=json", tmp_path)
    try:
        client_module = importlib.import_module(f"{package}.client")
        jobs_create = importlib.import_module(f"{package}.api.jobs.jobs_create")
        models = importlib.import_module(f"{package}.models")
        client = client_module.AuthenticatedClient(base_url=live_portal.url, token=token)
        body = models.JobInputRequest(
            team="vision", image=IMAGE, command=["echo", "hello"], gpu_count=1, max_duration_s=600
        )
        key = f"generated-{uuid.uuid4()}"
        first = jobs_create.sync_detailed(client=client, body=body, idempotency_key=key)
        assert first.status_code == 201, first.content
        job = first.parsed
        assert isinstance(job, models.JobDetailOutput)
        assert job.state == "queued" and job.team == "vision" and job.command == ["echo", "hello"]

        again = jobs_create.sync_detailed(client=client, body=body, idempotency_key=key)
        assert again.status_code == 201 and again.parsed.id == job.id
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert Job.objects.filter(user=alice).count() == 1

        refused = jobs_create.sync_detailed(
            client=client, body=models.JobInputRequest(team="vision", image="evil/miner", command=["x"])
        )
        assert refused.status_code == 400 and isinstance(refused.parsed, models.Error)
        assert refused.parsed.code == "image_not_allowed"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith(package)]:
            del sys.modules[name]
