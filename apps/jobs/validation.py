"""Checks of a job request that need no database: argv, env, mounts, container options.

Plain functions of plain data, so every rule is tested without a database; `services.job_submit` calls them and
adds the checks that do need one (image allow-list, models, fleet shape, reservation, quota). The node's agent
checks again with `workers/runtimes/policy.py` before it launches anything.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any

from apps.core.errors import Forbidden, ValidationFailed
from apps.jobs import conf

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})
MODEL_NAME_MAX = 64  # GpuModel.name's max_length

# Container options that would break isolation. A request that sets one of them (to anything truthy) is refused
# with 403 and nothing is queued; a falsy value (privileged: false) is what the portal does anyway.
FORBIDDEN_OPTIONS: Mapping[str, str] = {
    "privileged": "privileged containers are not allowed",
    "network_mode": "choosing the network mode is not allowed (host networking is refused)",
    "host_network": "host networking is not allowed",
    "pid_mode": "sharing the host PID namespace is not allowed",
    "pid": "sharing the host PID namespace is not allowed",
    "host_pid": "sharing the host PID namespace is not allowed",
    "ipc_mode": "sharing the host IPC namespace is not allowed",
    "ipc": "sharing the host IPC namespace is not allowed",
    "userns_mode": "changing the user namespace is not allowed",
    "uts_mode": "sharing the host UTS namespace is not allowed",
    "devices": "host devices are not allowed (GPUs are assigned by the scheduler)",
    "device_requests": "device requests are not allowed (GPUs are assigned by the scheduler)",
    "cap_add": "adding capabilities is not allowed",
    "security_opt": "security options cannot be changed",
    "volumes": "host volumes are not allowed; use mounts from the image's allow-list",
    "binds": "host binds are not allowed; use mounts from the image's allow-list",
    "volumes_from": "mounting another container's volumes is not allowed",
    "runtime": "the container runtime is chosen by the node",
    "sysctls": "sysctls cannot be set",
    "ulimits": "ulimits cannot be changed",
    "cgroup_parent": "the cgroup parent cannot be chosen",
    "user": "the container user cannot be chosen",
}


def policy_violation(field: str, message: str) -> Forbidden:
    return Forbidden(message, code="policy_violation", fields={field: [message]})


def check_options(options: Mapping[str, Any]) -> None:
    """Refuse forbidden container options (403 policy_violation)."""
    for key, value in options.items():
        if key in FORBIDDEN_OPTIONS and value not in (None, False, "", [], {}, 0):
            raise policy_violation(key, FORBIDDEN_OPTIONS[key])


def check_network(network: str | None) -> str:
    if network in (None, "", "none"):
        return "none"
    if network == "host":
        raise policy_violation("network", "host networking is not allowed")
    raise policy_violation("network", "jobs run without a network ('none')")


def check_command(command: Any) -> list[str]:
    """An argv list of strings; a shell string is refused with the message clients show."""
    if isinstance(command, str):
        raise ValidationFailed(
            "command must be a list of arguments",
            fields={"command": ["command must be a list of arguments (argv), not a shell string"]},
        )
    if not isinstance(command, list) or not command:
        raise ValidationFailed("command must be a list of arguments", fields={"command": ["a non-empty list"]})
    if not all(isinstance(arg, str) for arg in command):
        raise ValidationFailed("command must be a list of arguments", fields={"command": ["every item a string"]})
    if not command[0]:
        raise ValidationFailed("The program name cannot be empty.", fields={"command": ["empty program name"]})
    if any("\x00" in arg for arg in command):
        raise ValidationFailed("Arguments cannot contain NUL.", fields={"command": ["NUL in an argument"]})
    if len(command) > conf.MAX_COMMAND_ARGS:
        message = f"at most {conf.MAX_COMMAND_ARGS} arguments"
        raise ValidationFailed(f"command: {message}.", fields={"command": [message]})
    if sum(len(arg.encode()) + 1 for arg in command) > conf.MAX_COMMAND_BYTES:
        message = f"at most {conf.MAX_COMMAND_BYTES} bytes in all"
        raise ValidationFailed(f"command: {message}.", fields={"command": [message]})
    return list(command)


def check_env(env: Any) -> dict[str, str]:
    """POSIX names, string values, bounded sizes; the GPU variables are set by the node, never by the job."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ValidationFailed("env must be an object of strings.", fields={"env": ["an object of strings"]})
    problems: list[str] = []
    if len(env) > conf.MAX_ENV_VARS:
        problems.append(f"at most {conf.MAX_ENV_VARS} variables")
    total = 0
    out: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name) or len(name) > conf.MAX_ENV_NAME_CHARS:
            problems.append(f"{name!r} is not a valid variable name (letters, digits, _; not starting with a digit)")
            continue
        if name in RESERVED_ENV:
            problems.append(f"{name} is set by the node from the GPUs the job gets")
            continue
        if not isinstance(value, str):
            problems.append(f"{name}: the value must be a string")
            continue
        if "\x00" in value:
            problems.append(f"{name}: the value cannot contain NUL")
            continue
        size = len(value.encode())
        if size > conf.MAX_ENV_VALUE_BYTES:
            problems.append(f"{name}: value longer than {conf.MAX_ENV_VALUE_BYTES} bytes")
            continue
        total += len(name) + size + 2
        out[name] = value
    if total > conf.MAX_ENV_TOTAL_BYTES:
        problems.append(f"more than {conf.MAX_ENV_TOTAL_BYTES} bytes of environment in all")
    if problems:
        raise ValidationFailed(f"env: {problems[0]}.", fields={"env": problems})
    return out


def _mount_key(item: Any) -> tuple[str, str, bool]:
    if not isinstance(item, Mapping):
        raise ValidationFailed("Each mount is {host_path, container_path, read_only}.", fields={"mounts": ["object"]})
    extra = set(item) - {"host_path", "container_path", "read_only"}
    if extra:
        raise ValidationFailed(f"Unknown mount field {sorted(extra)[0]!r}.", fields={"mounts": ["unknown field"]})
    host, target, read_only = (
        item.get("host_path"),
        item.get("container_path", item.get("host_path")),
        item.get("read_only", True),
    )
    if not isinstance(host, str) or not isinstance(target, str) or not isinstance(read_only, bool):
        raise ValidationFailed(
            "host_path and container_path are strings, read_only a boolean.", fields={"mounts": ["types"]}
        )
    return posixpath.normpath(host) if host else host, posixpath.normpath(target) if target else target, read_only


def check_mounts(mounts: Any, allowed: Any) -> list[dict[str, Any]]:
    """Only mounts the image's allow-list names; read-write only where the list says read-write (403 otherwise)."""
    if mounts in (None, []):
        return []
    if not isinstance(mounts, list):
        raise ValidationFailed("mounts must be a list.", fields={"mounts": ["a list"]})
    allowed_keys: dict[tuple[str, str], bool] = {}
    for entry in allowed if isinstance(allowed, list) else []:
        try:
            host, target, read_only = _mount_key(entry)
        except ValidationFailed:
            continue
        allowed_keys[(host, target)] = read_only
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for item in mounts:
        host, target, read_only = _mount_key(item)
        if (host, target) not in allowed_keys:
            raise policy_violation("mounts", f"mounting {host!r} at {target!r} is not on this image's allow-list")
        if not read_only and allowed_keys[(host, target)]:
            raise policy_violation("mounts", f"{host!r} may only be mounted read-only")
        if target in seen:
            raise ValidationFailed(f"{target!r} is mounted twice.", fields={"mounts": ["mounted twice"]})
        seen.add(target)
        out.append({"host_path": host, "container_path": target, "read_only": read_only})
    return out


def check_gpu_models(gpu_model: Any, gpu_models: Any) -> list[str]:
    """One model name, or a list of acceptable ones; empty means any model."""
    names: list[str] = []
    for value in (gpu_model, gpu_models):
        if value in (None, "", []):
            continue
        items = [value] if isinstance(value, str) else value
        # A model's name is at most 64 characters (GpuModel.name); PostgreSQL refuses NUL in any text it compares.
        if not isinstance(items, list) or not all(
            isinstance(v, str) and v and len(v) <= MODEL_NAME_MAX and "\x00" not in v for v in items
        ):
            raise ValidationFailed(
                "gpu_model is a model name (gpu_models: a list of names).", fields={"gpu_model": ["model names"]}
            )
        names.extend(items)
    return sorted(set(names))
