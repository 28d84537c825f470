"""The agent's container policy: what a launch request may ask for, and every refusal."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from workers.runtimes.base import LaunchSpec, Mount
from workers.runtimes.policy import (
    ContainerPolicy,
    PolicyViolation,
    image_allowed,
    parse_image,
    validate_launch_request,
)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "imagenet").mkdir(parents=True)
    (root / "scratch").mkdir()
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text("x")
    return root


@pytest.fixture
def policy(data_dir: Path) -> ContainerPolicy:
    return ContainerPolicy(
        allowed_images=["registry.lab/vision/*", "python:3.11", "portal-test/busybox"],
        mount_prefixes=[str(data_dir)],
        writable_mount_prefixes=[str(data_dir / "scratch")],
        node_gpu_uuids={"GPU-1111", "GPU-2222"},
        max_cpus=16,
        max_memory_mib=65536,
        max_duration_s=86400,
    )


def request(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "job_id": 7,
        "image": "registry.lab/vision/train:2.1",
        "command": ["python", "train.py", "--epochs", "3"],
        "env": {"WANDB_MODE": "offline"},
        "gpu_uuids": ["GPU-1111"],
        "cpus": 4,
        "memory_mib": 16384,
        "max_duration_s": 3600,
        "mounts": [],
        "network": "none",
    }
    base.update(overrides)
    return base


def refused(policy: ContainerPolicy, **overrides: Any) -> PolicyViolation:
    with pytest.raises(PolicyViolation) as caught:
        validate_launch_request(request(**overrides), policy)
    return caught.value


def test_a_plain_request_becomes_a_launch_spec(policy: ContainerPolicy, data_dir: Path) -> None:
    mounts = [{"host_path": str(data_dir / "imagenet"), "container_path": "/data"}]
    spec = validate_launch_request(request(mounts=mounts), policy)

    assert spec == LaunchSpec(
        job_id=7,
        image="registry.lab/vision/train:2.1",
        command=["python", "train.py", "--epochs", "3"],
        env={"WANDB_MODE": "offline"},
        gpu_uuids=["GPU-1111"],
        cpus=4.0,
        memory_mib=16384,
        max_duration_s=3600,
        mounts=[Mount(os.path.realpath(data_dir / "imagenet"), "/data", True)],
        use_nvidia_runtime=False,
        network="none",
    )


def test_the_nvidia_runtime_comes_from_the_node_not_the_request(data_dir: Path) -> None:
    gpu_node = ContainerPolicy(allowed_images=["*"], use_nvidia_runtime=True)
    assert validate_launch_request(request(), gpu_node).use_nvidia_runtime is True
    with pytest.raises(PolicyViolation) as caught:
        validate_launch_request(request(use_nvidia_runtime=True), ContainerPolicy(allowed_images=["*"]))
    assert caught.value.field == "use_nvidia_runtime"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("privileged", True),
        ("network_mode", "host"),
        ("pid_mode", "host"),
        ("ipc_mode", "host"),
        ("uts_mode", "host"),
        ("userns_mode", "host"),
        ("devices", ["/dev/nvidia0:/dev/nvidia0"]),
        ("device_requests", [{"count": -1}]),
        ("cap_add", ["SYS_ADMIN"]),
        ("security_opt", ["seccomp=unconfined"]),
        ("volumes", {"/": {"bind": "/host"}}),
        ("binds", ["/:/host"]),
        ("ulimits", [{"name": "nofile", "soft": 1048576, "hard": 1048576}]),
        ("runtime", "nvidia"),
        ("sysctls", {"net.ipv4.ip_forward": "1"}),
        ("cgroup_parent", "/"),
    ],
)
def test_isolation_breaking_fields_are_refused(policy: ContainerPolicy, field: str, value: object) -> None:
    violation = refused(policy, **{field: value})
    assert violation.field == field


def test_spelled_out_safe_defaults_are_accepted(policy: ContainerPolicy) -> None:
    spec = validate_launch_request(request(privileged=False, cap_add=[], devices=[], security_opt=None), policy)
    assert spec.job_id == 7


def test_null_optional_fields_mean_defaults() -> None:
    anything = ContainerPolicy(allowed_images=["*"])
    spec = validate_launch_request(request(env=None, gpu_uuids=None, mounts=None, network=None, cpus=None), anything)
    assert (spec.env, spec.gpu_uuids, spec.mounts, spec.network, spec.cpus) == ({}, [], [], "none", 0.0)


def test_unknown_fields_are_refused(policy: ContainerPolicy) -> None:
    assert refused(policy, entrypoint=["/bin/sh"]).field == "entrypoint"


@pytest.mark.parametrize("network", ["host", "container:abc123", "bridge", "", 5])
def test_host_and_foreign_networks_are_refused(policy: ContainerPolicy, network: object) -> None:
    assert refused(policy, network=network).field == "network"


def test_host_network_refusal_says_why(policy: ContainerPolicy) -> None:
    assert "host networking" in refused(policy, network="host").message


@pytest.mark.parametrize(
    "image",
    ["registry.lab/nlp/train:1", "python:3.12", "evil.example/vision/train:1", "", "registry.lab/../x", None],
)
def test_images_off_the_allow_list_are_refused(policy: ContainerPolicy, image: object) -> None:
    assert refused(policy, image=image).field == "image"


def test_image_references_compare_as_docker_resolves_them() -> None:
    assert parse_image("busybox") == ("docker.io/library/busybox", None, None)
    assert parse_image("localhost:5000/a/b:1") == ("localhost:5000/a/b", "1", None)
    assert image_allowed("docker.io/library/python:3.11", ["python:3.11"])
    assert image_allowed("portal-test/busybox:latest", ["portal-test/busybox"])  # no tag: any tag
    assert image_allowed("portal-test/busybox", ["portal-test/busybox:latest"])  # implied :latest
    assert not image_allowed("python:3.11-slim", ["python:3.11"])
    assert not image_allowed("anything:1", [])  # an empty allow-list allows nothing


@pytest.mark.parametrize(
    "command",
    ["python train.py", [], ["python", 3], ["python", None], [""], ["python", "a\x00b"], None],
)
def test_command_must_be_an_argv_list_of_strings(policy: ContainerPolicy, command: object) -> None:
    assert refused(policy, command=command).field == "command"


def test_oversized_command_is_refused(data_dir: Path) -> None:
    small = ContainerPolicy(allowed_images=["*"], max_command_bytes=100)
    with pytest.raises(PolicyViolation, match="bytes"):
        validate_launch_request(request(command=["echo", "x" * 200]), small)


@pytest.mark.parametrize(
    "env",
    [
        {"1BAD": "x"},
        {"BAD-NAME": "x"},
        {"": "x"},
        {"A B": "x"},
        {"OK": 5},
        {"OK": "a\x00b"},
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        {"NVIDIA_VISIBLE_DEVICES": "all"},
        ["A=1"],
    ],
)
def test_invalid_or_reserved_env_is_refused(policy: ContainerPolicy, env: object) -> None:
    assert refused(policy, env=env).field == "env"


def test_env_values_and_totals_are_bounded() -> None:
    tight = ContainerPolicy(allowed_images=["*"], max_env_value_bytes=10, max_env_total_bytes=30, max_env_vars=3)
    for env in ({"A": "x" * 11}, {"A": "x" * 10, "B": "x" * 10, "C": "x" * 9}, {f"V{i}": "" for i in range(4)}):
        with pytest.raises(PolicyViolation) as caught:
            validate_launch_request(request(env=env), tight)
        assert caught.value.field == "env"


@pytest.mark.parametrize(
    "gpus",
    [["GPU-9999"], ["GPU-1111", "GPU-1111"], ["GPU-1111,GPU-2222"], ["0"], "GPU-1111", [1]],
)
def test_foreign_or_malformed_gpus_are_refused(policy: ContainerPolicy, gpus: object) -> None:
    assert refused(policy, gpu_uuids=gpus).field == "gpu_uuids"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("job_id", 0),
        ("job_id", True),
        ("job_id", "7"),
        ("cpus", -1),
        ("cpus", float("nan")),
        ("cpus", 64),
        ("cpus", 0),  # with a node limit, "unlimited" would dodge it
        ("memory_mib", True),
        ("memory_mib", 1 << 20),
        ("memory_mib", 1.5),
        ("max_duration_s", 0),
        ("max_duration_s", 86401),
    ],
)
def test_numbers_out_of_range_are_refused(policy: ContainerPolicy, field: str, value: object) -> None:
    assert refused(policy, **{field: value}).field == field


def test_mount_outside_the_allow_list_is_refused(policy: ContainerPolicy, tmp_path: Path) -> None:
    violation = refused(policy, mounts=[{"host_path": str(tmp_path / "secrets"), "container_path": "/s"}])
    assert violation.field == "mounts" and "not allowed" in violation.message


def test_sibling_with_a_common_name_prefix_is_not_under_the_prefix(policy: ContainerPolicy, data_dir: Path) -> None:
    sibling = data_dir.parent / "data2"
    sibling.mkdir()
    assert refused(policy, mounts=[[str(sibling), "/d"]]).field == "mounts"


def test_dotdot_in_a_mount_path_is_refused(policy: ContainerPolicy, data_dir: Path) -> None:
    escape = f"{data_dir}/imagenet/../../secrets"
    assert "'..'" in refused(policy, mounts=[[escape, "/d"]]).message
    inside_but_dotted = f"{data_dir}/scratch/../imagenet"
    assert refused(policy, mounts=[[inside_but_dotted, "/d"]]).field == "mounts"


def test_symlink_out_of_the_allowed_tree_is_refused(policy: ContainerPolicy, data_dir: Path, tmp_path: Path) -> None:
    (data_dir / "imagenet" / "innocent").symlink_to(tmp_path / "secrets")
    violation = refused(policy, mounts=[[str(data_dir / "imagenet" / "innocent"), "/d"]])
    assert "not allowed" in violation.message


def test_symlinked_allow_list_prefix_still_matches(data_dir: Path, tmp_path: Path) -> None:
    link = tmp_path / "data-link"
    link.symlink_to(data_dir)
    linked = ContainerPolicy(allowed_images=["*"], mount_prefixes=[str(link)])
    spec = validate_launch_request(request(mounts=[[str(data_dir / "imagenet"), "/d"]]), linked)
    assert spec.mounts == [Mount(os.path.realpath(data_dir / "imagenet"), "/d", True)]


def test_missing_or_relative_host_path_is_refused(policy: ContainerPolicy, data_dir: Path) -> None:
    assert "does not exist" in refused(policy, mounts=[[str(data_dir / "nope"), "/d"]]).message
    assert refused(policy, mounts=[["data/imagenet", "/d"]]).field == "mounts"


def test_read_write_needs_a_writable_prefix(policy: ContainerPolicy, data_dir: Path) -> None:
    rw_dataset = {"host_path": str(data_dir / "imagenet"), "container_path": "/d", "read_only": False}
    assert "read-write" in refused(policy, mounts=[rw_dataset]).message
    rw_scratch = {"host_path": str(data_dir / "scratch"), "container_path": "/out", "read_only": False}
    spec = validate_launch_request(request(mounts=[rw_scratch]), policy)
    assert spec.mounts[0].read_only is False


@pytest.mark.parametrize("target", ["/", "/proc", "/proc/sys", "/sys/fs", "/dev", "relative", "/a/../etc", "/a\x00"])
def test_reserved_or_bad_container_paths_are_refused(policy: ContainerPolicy, data_dir: Path, target: str) -> None:
    assert refused(policy, mounts=[[str(data_dir / "imagenet"), target]]).field == "mounts"


@pytest.mark.parametrize(
    "mounts",
    [
        "/data:/data",
        [["/only-one"]],
        [{"host_path": "/x", "container_path": "/y", "propagation": "shared"}],
        [{"host_path": "/x", "container_path": "/y", "read_only": "no"}],
    ],
)
def test_malformed_mounts_are_refused(policy: ContainerPolicy, mounts: object) -> None:
    assert refused(policy, mounts=mounts).field == "mounts"


def test_same_container_path_twice_is_refused(policy: ContainerPolicy, data_dir: Path) -> None:
    twice = [[str(data_dir / "imagenet"), "/d"], [str(data_dir / "scratch"), "/d/"]]
    assert "twice" in refused(policy, mounts=twice).message


def test_no_mount_allow_list_means_no_mounts(data_dir: Path) -> None:
    bare = ContainerPolicy(allowed_images=["*"])
    with pytest.raises(PolicyViolation):
        validate_launch_request(request(mounts=[[str(data_dir), "/d"]]), bare)


def test_process_runtime_nodes_may_take_requests_without_an_image() -> None:
    process_node = ContainerPolicy(require_image=False)
    assert validate_launch_request(request(image=""), process_node).image == ""
    with pytest.raises(PolicyViolation):
        validate_launch_request(request(image=""), ContainerPolicy(allowed_images=["*"]))


def test_violation_names_field_and_reason() -> None:
    violation = PolicyViolation("network", "host networking is not allowed")
    assert (violation.field, violation.message) == ("network", "host networking is not allowed")
    assert str(violation) == "network: host networking is not allowed"
