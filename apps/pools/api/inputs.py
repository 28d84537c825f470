"""Readers for the bodies a pool's bridge posts. The bridge is the portal's own process, but what it sends comes from
the scheduler (node names, job output, accounting), so it is checked like any client's input: a wrong type, a number
outside its column, an identifier too long for its column or holding NUL (which PostgreSQL refuses in text) is a
400 naming the field; free text (messages, log lines) loses its NUL bytes, as job output from nodes does, and is cut
to its column.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from rest_framework.request import Request

from apps.core.errors import ValidationFailed
from apps.fleet.messages import GpuReport
from apps.pools import services

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
SMALLINT_MAX = 2**15 - 1
EPOCH_MAX = 253402300799.0  # 9999-12-31T23:59:59Z, datetime's last second


def body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise ValidationFailed("The body must be a JSON object.")
    return request.data


def integer(data: dict[str, Any], key: str, default: int | None = None, *, lo: int = 0, hi: int = INT32_MAX) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValidationFailed(f"{key} must be an integer from {lo} to {hi}.", fields={key: [f"an integer {lo}-{hi}"]})
    return value


def optional_integer(data: dict[str, Any], key: str, *, lo: int = 0, hi: int = INT32_MAX) -> int | None:
    return None if data.get(key) is None else integer(data, key, lo=lo, hi=hi)


def ident(data: dict[str, Any], key: str, default: str = "", *, max_length: int) -> str:
    """A name or id the portal stores or looks up as it is."""
    value = data.get(key, default)
    if not isinstance(value, str) or len(value) > max_length or "\x00" in value:
        raise ValidationFailed(
            f"{key} must be a string of at most {max_length} characters without NUL.",
            fields={key: [f"a string, at most {max_length} characters"]},
        )
    return value


def text(data: dict[str, Any], key: str, default: str = "", *, max_length: int | None = None) -> str:
    """Words from the scheduler or a job's output: kept, without NUL, cut to `max_length`."""
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ValidationFailed(f"{key} must be a string.", fields={key: ["a string"]})
    value = value.replace("\x00", "")
    return value if max_length is None else value[:max_length]


def moment(data: dict[str, Any], key: str) -> datetime | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationFailed(f"{key} must be a Unix time.", fields={key: ["seconds since the epoch"]})
    if not 0 <= value <= EPOCH_MAX:
        raise ValidationFailed(f"{key} is out of range.", fields={key: ["seconds since 1970, before the year 10000"]})
    return datetime.fromtimestamp(value, tz=UTC)


def names(raw: Any, key: str, *, max_length: int) -> list[str]:
    if not isinstance(raw, list):
        raise ValidationFailed(f"{key} must be a list of names.", fields={key: ["a list of names"]})
    return [ident({key: item}, key, max_length=max_length) for item in raw]


def indexes(raw: Any) -> list[int]:
    if not isinstance(raw, list):
        raise ValidationFailed("gpu_indexes must be a list of integers.", fields={"gpu_indexes": ["integers"]})
    return [integer({"gpu_indexes": i}, "gpu_indexes", hi=SMALLINT_MAX) for i in raw]


def nodes(raw: Any) -> list[services.NodeIn]:
    if not isinstance(raw, list):
        raise ValidationFailed("nodes must be a list.", fields={"nodes": ["a list"]})
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("gpus"), list):
            raise ValidationFailed("each node is an object with gpus.", fields={"nodes": ["objects with gpus"]})
        gpus = [
            GpuReport(
                uuid=ident(g, "uuid", max_length=96),
                index=integer(g, "index", hi=SMALLINT_MAX),
                model=ident(g, "model", max_length=64),
                name=text(g, "name", max_length=120),
                memory_mib=integer(g, "memory_mib", 0),
                mig_mode=False,
            )
            for g in item["gpus"]
            if isinstance(g, dict)
        ]
        out.append(
            services.NodeIn(
                name=ident(item, "name", max_length=100),
                hostname=ident(item, "hostname", max_length=255),
                gpus=gpus,
                up=bool(item.get("up")),
            )
        )
    return out
