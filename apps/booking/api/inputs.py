"""A booking's body decoded and validated by msgspec, with DRF's `ReservationInput` as the authority.

Every booking request is validated, and DRF's serializer (its fields deep-copied and bound per instance, each
value through its field's validators) costs more CPU than the rest of the view around it. msgspec checks the same
types and bounds straight from the request's bytes. It accepts only what DRF would accept unchanged: anything it
rejects or is unsure of (whitespace DRF would trim, a naive time, a number given as a string, a cross-field rule
broken) goes to `ReservationInput`, which gives the error in the API's shape or the value DRF would give.
`tests/booking/test_reservation_input.py` holds the two equal over generated bodies.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec
from django.http.request import RawPostDataException
from msgspec import UNSET, UnsetType
from rest_framework.request import Request

Slug = Annotated[str, msgspec.Meta(pattern=r"^[-a-zA-Z0-9_]+\Z")]  # DRF's SlugField without allow_unicode
GpuUuid = Annotated[str, msgspec.Meta(min_length=1, max_length=96)]  # CharField: not blank


class ReservationBody(msgspec.Struct, frozen=True):
    """The fields of `ReservationInput` with its types and bounds; UNSET for a field the body leaves out."""

    team: Slug
    start: datetime
    end: datetime
    gpu_count: Annotated[int, msgspec.Meta(ge=1, le=1024)] | UnsetType | None = UNSET
    gpu_model: Annotated[str, msgspec.Meta(max_length=64)] | UnsetType | None = UNSET
    gpus: Annotated[list[GpuUuid], msgspec.Meta(max_length=256)] | UnsetType = UNSET
    note: Annotated[str, msgspec.Meta(max_length=500)] | UnsetType = UNSET
    # Parts of GPUs: rare enough to leave to ReservationInput (present means "not the fast path").
    mig_profile: Any = UNSET
    gpu_share: Any = UNSET
    mig_memory_mib: Any = UNSET


_DECODER = msgspec.json.Decoder(ReservationBody)


def _plain(text: str) -> bool:
    """A string DRF's CharField keeps as it is: nothing to trim, no NUL (its validators refuse those)."""
    return text == text.strip() and "\x00" not in text


def reservation_input_fast(request: Request) -> dict[str, Any] | None:
    """The validated data `ReservationInput` would give, or None: then validate with `ReservationInput`."""
    if request.content_type.split(";")[0].strip() != "application/json":
        return None
    try:
        body = _DECODER.decode(request.body)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, RawPostDataException):
        # Invalid (msgspec, like json, gives up on a deeply nested body with RecursionError), or the body was
        # already parsed by DRF (an idempotency key's fingerprint): DRF's parser and serializer say what is wrong.
        return None
    if body.start.tzinfo is None or body.end.tzinfo is None:
        return None  # DRF reads a naive time in the installation's zone
    if body.mig_profile is not UNSET or body.gpu_share is not UNSET or body.mig_memory_mib is not UNSET:
        return None
    data = {f: getattr(body, f) for f in body.__struct_fields__ if getattr(body, f) is not UNSET}
    data.setdefault("note", "")
    strings = [data["note"], *data.get("gpus", ())] + ([data["gpu_model"]] if data.get("gpu_model") else [])
    if not all(_plain(s) for s in strings):
        return None
    # ReservationInput.validate's rules: a model with a count, or named GPUs.
    if not data.get("gpus") and (not data.get("gpu_model") or data.get("gpu_count") is None):
        return None
    return data
