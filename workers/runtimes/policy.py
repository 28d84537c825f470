"""Container policy the agent enforces before it starts anything (defense in depth: the portal checks too).

A GPU node runs users' code, and the message that asks for a launch crossed the broker: the agent trusts
nothing in it. ``validate_launch_request`` turns a raw request dict into a ``LaunchSpec`` or raises
``PolicyViolation(field, message)``. Everything not explicitly understood is refused, so a new engine knob
cannot slip through by being ignored.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, TypeGuard

from .base import RESERVED_ENV, LaunchSpec, Mount


class PolicyViolation(ValueError):
    """A launch request the node refuses; ``field`` names the offending request key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ContainerPolicy:
    """The admin's rules for this node. Empty allow-lists allow nothing (deny by default).

    ``allowed_images`` holds image references or glob patterns ("registry.lab/team/*", "python:3.11");
    a pattern without a tag allows every tag of that repository, "*" allows any image.
    ``mount_prefixes`` are host directories that may be mounted read-only, ``writable_mount_prefixes``
    those that may also be mounted read-write. ``node_gpu_uuids``, when given, are the GPUs of this node:
    a request naming another GPU is refused.
    """

    allowed_images: Sequence[str] = ()
    mount_prefixes: Sequence[str] = ()
    writable_mount_prefixes: Sequence[str] = ()
    allowed_networks: Sequence[str] = ("none",)
    require_image: bool = True
    use_nvidia_runtime: bool = False
    node_gpu_uuids: Collection[str] | None = None
    mps: bool = False  # the node runs NVIDIA's MPS control daemon: shares get MPS limits (base.share_env)
    max_cpus: float | None = None
    max_memory_mib: int | None = None
    max_duration_s: int | None = None
    max_command_args: int = 4096
    max_command_bytes: int = 128 * 1024
    max_env_vars: int = 256
    max_env_value_bytes: int = 32 * 1024
    max_env_total_bytes: int = 256 * 1024
    max_mounts: int = 32


ALLOWED_FIELDS = frozenset(
    {
        "job_id",
        "image",
        "command",
        "env",
        "gpu_uuids",
        "gpu_share",
        "gpu_memory_mib",
        "cpus",
        "memory_mib",
        "max_duration_s",
        "mounts",
        "network",
    }
)

# Engine knobs that break isolation. A falsy value (privileged=False, cap_add=[]) is harmless and accepted so
# a portal that spells out defaults is not refused; anything else is refused with a message that says why.
FORBIDDEN_FIELDS: Mapping[str, str] = {
    "privileged": "privileged containers are not allowed",
    "network_mode": "network_mode is not accepted (host networking is not allowed); use network",
    "pid_mode": "sharing the host PID namespace is not allowed",
    "pid": "sharing the host PID namespace is not allowed",
    "ipc_mode": "sharing the host IPC namespace is not allowed",
    "ipc": "sharing the host IPC namespace is not allowed",
    "uts_mode": "sharing the host UTS namespace is not allowed",
    "userns_mode": "changing the user namespace is not allowed",
    "devices": "host devices are not allowed (GPUs are assigned by the portal)",
    "device_requests": "device requests are not allowed (GPUs are assigned by the portal)",
    "device_cgroup_rules": "device cgroup rules are not allowed",
    "cap_add": "adding capabilities is not allowed",
    "security_opt": "security options cannot be overridden",
    "cgroup_parent": "the cgroup parent cannot be chosen",
    "sysctls": "sysctls cannot be set",
    "ulimits": "ulimits cannot be raised",
    "volumes": "use mounts (checked against the node's allow-list)",
    "volumes_from": "mounting another container's volumes is not allowed",
    "binds": "use mounts (checked against the node's allow-list)",
    "runtime": "the container runtime is chosen by the node",
    "use_nvidia_runtime": "the NVIDIA runtime is node configuration, not a job setting",
}

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
# Commas would let one uuid smuggle a second GPU into CUDA_VISIBLE_DEVICES.
_GPU_UUID = re.compile(r"(GPU|MIG)-[A-Za-z0-9_./-]{1,200}")
_IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}")
_NETWORK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Mounting over these inside the container would undo the engine's masking of kernel interfaces.
_FORBIDDEN_CONTAINER_PREFIXES = ("/proc", "/sys", "/dev")


def validate_launch_request(request: Mapping[str, Any], policy: ContainerPolicy) -> LaunchSpec:
    """Check a raw launch request against the node policy; return the spec to launch or raise PolicyViolation.

    Mount host paths in the returned spec are the resolved (symlink-free) paths that were checked.
    """
    if not isinstance(request, Mapping):
        raise PolicyViolation("request", "must be an object")
    for key, value in request.items():
        if key in FORBIDDEN_FIELDS:
            if value:
                raise PolicyViolation(key, FORBIDDEN_FIELDS[key])
        elif key not in ALLOWED_FIELDS:
            raise PolicyViolation(str(key), "unknown field")

    def get(key: str, default: object) -> object:
        # JSON null for an optional field means "not given", as a missing key does.
        value = request.get(key)
        return default if value is None else value

    return LaunchSpec(
        job_id=_check_job_id(request.get("job_id")),
        image=_check_image(request.get("image"), policy),
        command=_check_command(request.get("command"), policy),
        env=_check_env(get("env", {}), policy),
        gpu_uuids=_check_gpus(get("gpu_uuids", []), policy),
        cpus=_check_cpus(get("cpus", 0), policy),
        memory_mib=_check_bounded_int("memory_mib", get("memory_mib", 0), policy.max_memory_mib),
        max_duration_s=_check_bounded_int("max_duration_s", get("max_duration_s", 0), policy.max_duration_s),
        mounts=_check_mounts(get("mounts", []), policy),
        use_nvidia_runtime=policy.use_nvidia_runtime,
        network=_check_network(get("network", "none"), policy),
        gpu_share=_check_share(get("gpu_share", 1.0), get("gpu_uuids", [])),
        gpu_memory_mib=_check_bounded_int("gpu_memory_mib", get("gpu_memory_mib", 0), None),
        mps=policy.mps,
    )


def _check_share(value: object, gpus: object) -> float:
    """A job's share of its one GPU: above 0, at most 1; below 1 only with exactly one GPU."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise PolicyViolation("gpu_share", "must be a number above 0 and at most 1")
    if value < 1 and not (isinstance(gpus, list) and len(gpus) == 1):
        raise PolicyViolation("gpu_share", "a share is of exactly one GPU")
    return float(value)


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass; True must not pass as job 1 or 1 MiB.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_job_id(value: object) -> int:
    if not _is_int(value) or value <= 0:
        raise PolicyViolation("job_id", "must be a positive integer")
    return int(value)


def parse_image(ref: str) -> tuple[str, str | None, str | None]:
    """Split an image reference into (repository, tag, digest) the way Docker resolves it.

    "busybox" is "docker.io/library/busybox", so an allow-list entry and a request that spell the same image
    differently still compare equal.
    """
    name, _, digest = ref.partition("@")
    tag: str | None = None
    colon, slash = name.rfind(":"), name.rfind("/")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    parts = name.split("/")
    first = parts[0]
    if len(parts) == 1 or not ("." in first or ":" in first or first == "localhost"):
        name = "docker.io/" + ("library/" if len(parts) == 1 else "") + name
    return name, tag, digest or None


def image_allowed(ref: str, patterns: Sequence[str]) -> bool:
    repo, tag, digest = parse_image(ref)
    if tag is None and digest is None:
        tag = "latest"
    for pattern in patterns:
        if pattern == "*":
            return True
        p_repo, p_tag, p_digest = parse_image(pattern)
        if not fnmatchcase(repo, p_repo):
            continue
        if p_tag is not None and (tag is None or not fnmatchcase(tag, p_tag)):
            continue
        if p_digest is not None and digest != p_digest:
            continue
        return True
    return False


def _check_image(value: object, policy: ContainerPolicy) -> str:
    if value in (None, "") and not policy.require_image:
        return ""
    if not isinstance(value, str) or not _IMAGE_REF.fullmatch(value) or ".." in value:
        raise PolicyViolation("image", "must be an image reference")
    if not image_allowed(value, policy.allowed_images):
        raise PolicyViolation("image", f"image {value!r} is not on this node's allow-list")
    return value


def _check_command(value: object, policy: ContainerPolicy) -> list[str]:
    # An argv list, never a shell string: a string would be split by whoever runs it, differently each time.
    if not isinstance(value, list) or not value:
        raise PolicyViolation("command", "must be a non-empty list of strings (argv)")
    if not all(isinstance(arg, str) for arg in value):
        raise PolicyViolation("command", "every argument must be a string")
    if any("\x00" in arg for arg in value):
        raise PolicyViolation("command", "arguments cannot contain NUL")
    if not value[0]:
        raise PolicyViolation("command", "the program name cannot be empty")
    if len(value) > policy.max_command_args:
        raise PolicyViolation("command", f"at most {policy.max_command_args} arguments")
    if sum(len(arg.encode()) + 1 for arg in value) > policy.max_command_bytes:
        raise PolicyViolation("command", f"at most {policy.max_command_bytes} bytes in all")
    return list(value)


def _check_env(value: object, policy: ContainerPolicy) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise PolicyViolation("env", "must be an object of strings")
    if len(value) > policy.max_env_vars:
        raise PolicyViolation("env", f"at most {policy.max_env_vars} variables")
    total = 0
    env: dict[str, str] = {}
    for name, val in value.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise PolicyViolation("env", f"invalid variable name {name!r}")
        if name in RESERVED_ENV:
            raise PolicyViolation("env", f"{name} is set by the node from the assigned GPUs")
        if not isinstance(val, str):
            raise PolicyViolation("env", f"{name}: value must be a string")
        if "\x00" in val:
            raise PolicyViolation("env", f"{name}: value cannot contain NUL")
        size = len(val.encode())
        if size > policy.max_env_value_bytes:
            raise PolicyViolation("env", f"{name}: value longer than {policy.max_env_value_bytes} bytes")
        total += len(name) + size + 2
        env[name] = val
    if total > policy.max_env_total_bytes:
        raise PolicyViolation("env", f"more than {policy.max_env_total_bytes} bytes in all")
    return env


def _check_gpus(value: object, policy: ContainerPolicy) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(u, str) for u in value):
        raise PolicyViolation("gpu_uuids", "must be a list of GPU uuids")
    for uuid in value:
        if not _GPU_UUID.fullmatch(uuid):
            raise PolicyViolation("gpu_uuids", f"invalid GPU uuid {uuid!r}")
        if policy.node_gpu_uuids is not None and uuid not in policy.node_gpu_uuids:
            raise PolicyViolation("gpu_uuids", f"{uuid} is not a GPU of this node")
    if len(set(value)) != len(value):
        raise PolicyViolation("gpu_uuids", "a GPU is listed twice")
    return list(value)


def _check_cpus(value: object, policy: ContainerPolicy) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise PolicyViolation("cpus", "must be a non-negative number")
    if policy.max_cpus is not None and not 0 < value <= policy.max_cpus:
        raise PolicyViolation("cpus", f"must be in (0, {policy.max_cpus}] on this node")
    return float(value)


def _check_bounded_int(field: str, value: object, limit: int | None) -> int:
    if not _is_int(value) or value < 0:
        raise PolicyViolation(field, "must be a non-negative integer")
    number = int(value)
    # With a node limit, 0 ("unlimited") would dodge it.
    if limit is not None and not 0 < number <= limit:
        raise PolicyViolation(field, f"must be in [1, {limit}] on this node")
    return number


def _check_network(value: object, policy: ContainerPolicy) -> str:
    if not isinstance(value, str) or not value:
        raise PolicyViolation("network", "must be a network name")
    if value == "host":
        raise PolicyViolation("network", "host networking is not allowed")
    if value.startswith("container:") or not _NETWORK_NAME.fullmatch(value):
        raise PolicyViolation("network", "joining another container's network is not allowed")
    if value not in policy.allowed_networks:
        raise PolicyViolation("network", f"network {value!r} is not allowed on this node")
    return value


def _has_dotdot(path: str) -> bool:
    return ".." in path.split("/")


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _resolved_prefixes(prefixes: Sequence[str]) -> list[str]:
    # Resolve the admin's prefixes too: /data may itself be a symlink to /mnt/disk1/data.
    return [os.path.realpath(p) for p in prefixes if p and os.path.isabs(p)]


def _check_mounts(value: object, policy: ContainerPolicy) -> list[Mount]:
    if not isinstance(value, list):
        raise PolicyViolation("mounts", "must be a list")
    if len(value) > policy.max_mounts:
        raise PolicyViolation("mounts", f"at most {policy.max_mounts} mounts")
    readable = _resolved_prefixes([*policy.mount_prefixes, *policy.writable_mount_prefixes])
    writable = _resolved_prefixes(policy.writable_mount_prefixes)
    mounts: list[Mount] = []
    seen: set[str] = set()
    for item in value:
        host, target, read_only = _mount_fields(item)
        if not os.path.isabs(host) or "\x00" in host or _has_dotdot(host):
            raise PolicyViolation("mounts", f"host path {host!r} must be absolute without '..'")
        try:
            # Resolve symlinks before the prefix check: /data/link -> /etc must not pass as "under /data".
            resolved = os.path.realpath(host, strict=True)
        except OSError as exc:
            raise PolicyViolation("mounts", f"host path {host!r} does not exist") from exc
        allowed = writable if not read_only else readable
        if not any(_under(resolved, prefix) for prefix in allowed):
            kind = "read-write" if not read_only else "read-only"
            raise PolicyViolation("mounts", f"host path {host!r} is not allowed {kind} on this node")
        if not target.startswith("/") or "\x00" in target or _has_dotdot(target):
            raise PolicyViolation("mounts", f"container path {target!r} must be absolute without '..'")
        target = posixpath.normpath(target)
        if target == "/" or any(_under(target, p) for p in _FORBIDDEN_CONTAINER_PREFIXES):
            raise PolicyViolation("mounts", f"container path {target!r} is reserved")
        if target in seen:
            raise PolicyViolation("mounts", f"container path {target!r} is mounted twice")
        seen.add(target)
        mounts.append(Mount(resolved, target, read_only))
    return mounts


def _mount_fields(item: object) -> tuple[str, str, bool]:
    if isinstance(item, Mapping):
        host, target, read_only = (
            item.get("host_path"),
            item.get("container_path"),
            item.get("read_only", True),
        )
        extra = set(item) - {"host_path", "container_path", "read_only"}
        if extra:
            raise PolicyViolation("mounts", f"unknown mount field {sorted(extra)[0]!r}")
    elif isinstance(item, list | tuple) and len(item) in (2, 3):
        host, target = item[0], item[1]
        read_only = item[2] if len(item) == 3 else True
    else:
        raise PolicyViolation("mounts", "each mount is {host_path, container_path, read_only}")
    if not isinstance(host, str) or not isinstance(target, str) or not isinstance(read_only, bool):
        raise PolicyViolation("mounts", "host_path and container_path are strings, read_only a boolean")
    return host, target, read_only
