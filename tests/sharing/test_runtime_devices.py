"""What a job on a part of a GPU is given: exactly its MIG instance (CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES,
the Docker device request), and for a share its budget: MPS client limits on an MPS node, otherwise time-slicing
with the job told its memory budget. The process runtime runs a real subprocess and reads its environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers.conftest import EventRecorder
from workers.runtimes.base import LaunchSpec, gpu_env
from workers.runtimes.docker import DockerRuntime
from workers.runtimes.policy import ContainerPolicy, PolicyViolation, validate_launch_request
from workers.runtimes.process import ProcessRuntime

MIG = "MIG-4b1a1c3e-0c9d-5a6b-9d7e-2f3a4b5c6d7e"
GPU = "GPU-11111111-2222-3333-4444-555555555555"


def _request(**extra: object) -> dict[str, object]:
    return {"job_id": 7, "image": "portal-test/busybox:latest", "command": ["true"], **extra}


def test_a_mig_instance_is_the_one_device_a_job_sees():
    policy = ContainerPolicy(allowed_images=("*",), node_gpu_uuids=[GPU, MIG], use_nvidia_runtime=True)
    spec = validate_launch_request(_request(gpu_uuids=[MIG]), policy)
    env = gpu_env(spec)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == MIG
    assert "GPUPORTAL_GPU_SHARE" not in env
    # create_kwargs builds the engine's arguments without calling it (no NVIDIA runtime here to run one).
    runtime = DockerRuntime(client=object(), agent="n1")  # type: ignore[arg-type]
    (request,) = runtime.create_kwargs(spec)["device_requests"]
    assert request["DeviceIDs"] == [MIG]
    # An instance of another node is refused.
    with pytest.raises(PolicyViolation):
        validate_launch_request(_request(gpu_uuids=["MIG-other"]), policy)


def test_a_share_on_a_time_sliced_gpu_is_told_its_budget():
    policy = ContainerPolicy(allowed_images=("*",), node_gpu_uuids=[GPU])
    spec = validate_launch_request(_request(gpu_uuids=[GPU], gpu_share=0.25, gpu_memory_mib=20480), policy)
    env = gpu_env(spec)
    assert env["CUDA_VISIBLE_DEVICES"] == GPU
    assert env["GPUPORTAL_GPU_ISOLATION"] == "none"
    assert env["GPUPORTAL_GPU_SHARE"] == "0.25"
    assert env["GPUPORTAL_GPU_MEMORY_MIB"] == "20480"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


@pytest.mark.parametrize(
    ("own", "given"),
    [
        ("max_split_size_mb:128", "max_split_size_mb:128,expandable_segments:True"),
        ("expandable_segments:False", "expandable_segments:False"),  # the job chose: kept
        (" garbage_collection_threshold:0.6 , ", "garbage_collection_threshold:0.6,expandable_segments:True"),
    ],
)
def test_a_shares_allocator_options_keep_the_jobs_own(own, given):
    policy = ContainerPolicy(allowed_images=("*",), node_gpu_uuids=[GPU])
    request = _request(gpu_uuids=[GPU], gpu_share=0.25, gpu_memory_mib=20480, env={"PYTORCH_CUDA_ALLOC_CONF": own})
    assert gpu_env(validate_launch_request(request, policy))["PYTORCH_CUDA_ALLOC_CONF"] == given
    whole = _request(gpu_uuids=[GPU], env={"PYTORCH_CUDA_ALLOC_CONF": own})
    assert gpu_env(validate_launch_request(whole, policy))["PYTORCH_CUDA_ALLOC_CONF"] == own  # not touched


def test_a_share_on_an_mps_node_gets_mps_limits():
    policy = ContainerPolicy(allowed_images=("*",), node_gpu_uuids=[GPU], mps=True)
    spec = validate_launch_request(_request(gpu_uuids=[GPU], gpu_share=0.5, gpu_memory_mib=40960), policy)
    env = gpu_env(spec)
    assert env["GPUPORTAL_GPU_ISOLATION"] == "mps"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"


@pytest.mark.parametrize(
    "extra",
    [{"gpu_share": 0}, {"gpu_share": 1.5}, {"gpu_share": True}, {"gpu_share": 0.5, "gpu_uuids": [GPU, MIG]}],
)
def test_bad_shares_are_refused(extra):
    policy = ContainerPolicy(allowed_images=("*",), node_gpu_uuids=[GPU, MIG])
    with pytest.raises(PolicyViolation):
        validate_launch_request(_request(**{"gpu_uuids": [GPU], **extra}), policy)


@pytest.mark.timeout(60)
def test_the_process_runtime_gives_a_share_its_environment(tmp_path: Path):
    recorder = EventRecorder()
    runtime = ProcessRuntime(state_dir=tmp_path / "state", events=recorder.events, timeout_grace_s=1.0)
    try:
        script = 'echo "$CUDA_VISIBLE_DEVICES $GPUPORTAL_GPU_ISOLATION $GPUPORTAL_GPU_MEMORY_MIB $GPUPORTAL_GPU_SHARE"'
        spec = LaunchSpec(
            job_id=9, image="", command=["sh", "-c", script], gpu_uuids=[GPU], gpu_share=0.25, gpu_memory_mib=20480
        )
        assert runtime.launch(spec)
        outcome = recorder.wait_exit(9)
        assert outcome.state == "succeeded"
        assert recorder.lines(9) == [f"{GPU} none 20480 0.25"]
    finally:
        runtime.close()
