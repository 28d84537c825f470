"""The booking body's msgspec validation (apps/booking/api/inputs.py) agrees with DRF's ReservationInput: whatever
it accepts, DRF accepts with the same data; what it is unsure of goes to DRF."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from apps.booking.api.inputs import reservation_input_fast
from apps.booking.api.serializers import ReservationInput

START = datetime(2027, 3, 1, 9, tzinfo=UTC)


def _request(raw: bytes, content_type: str = "application/json") -> Request:
    django_request = APIRequestFactory().post("/api/v1/reservations/", data=raw, content_type=content_type)
    return Request(django_request, parsers=[JSONParser()])


def _drf(raw: bytes) -> tuple[bool, dict[str, Any]]:
    serializer = ReservationInput(data=json.loads(raw))
    ok = serializer.is_valid()
    return ok, dict(serializer.validated_data) if ok else {}


def _agree(body: Any) -> dict[str, Any] | None:
    raw = json.dumps(body).encode()
    fast = reservation_input_fast(_request(raw))
    if fast is not None:
        ok, expected = _drf(raw)
        assert ok, f"msgspec accepted what DRF refuses: {body!r}"
        assert fast == expected, body
    return fast


def test_an_ordinary_booking_is_validated_without_drf_and_equals_drf() -> None:
    by_uuid = {"team": "vision", "gpus": ["GPU-a", "GPU-b"], "start": START.isoformat(), "end": "2027-03-01T10:00:00Z"}
    by_model = {
        "team": "nlp-2",
        "gpu_model": "A100-80GB",
        "gpu_count": 2,
        "start": "2027-03-01T09:00:00+01:00",
        "end": "2027-03-01T11:30:00+01:00",
        "note": "ablation runs",
    }
    for body in (by_uuid, by_model, {**by_model, "gpus": []}, {**by_uuid, "gpu_count": None, "gpu_model": ""}):
        assert _agree(body) is not None, body


def test_what_drf_would_change_or_refuse_goes_to_drf() -> None:
    base = {"team": "vision", "gpus": ["GPU-a"], "start": START.isoformat(), "end": "2027-03-01T10:00:00Z"}
    unsure = [
        {**base, "team": " vision"},  # trimmed by DRF
        {**base, "team": "vision\n"},
        {**base, "start": "2027-03-01T09:00:00"},  # naive: read in the installation's zone
        {**base, "gpus": None},
        {**base, "gpus": ["GPU-a "]},
        {**base, "gpus": [], "gpu_model": "A100-80GB"},  # a model without a count
        {**base, "gpus": [], "gpu_count": 1},
        {**base, "gpus": ["x" * 97]},
        {**base, "note": "a\x00b"},
        {**base, "gpu_count": "2", "gpus": [], "gpu_model": "A100-80GB"},
        {**base, "gpu_count": 0},
        {**base, "gpu_count": True},
        [base],
    ]
    for body in unsure:
        assert _agree(body) is None, body
    assert reservation_input_fast(_request(b"{not json")) is None
    assert reservation_input_fast(_request(json.dumps(base).encode(), "text/plain")) is None


def _shifted(hours: int) -> str:
    """START moved by `hours`, written in another UTC offset."""
    return (START + timedelta(hours=hours)).astimezone(timezone(timedelta(hours=hours % 5))).isoformat()


_text = st.one_of(
    st.sampled_from(["vision", "A100-80GB", "GPU-a", "", " x", "x ", "a\x00", "ü", "x" * 64, "x" * 65, "-_9"]),
    st.text(max_size=12),
)
_times = st.one_of(
    st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.sampled_from([UTC, None])
    ).map(lambda d: d.isoformat()),
    st.sampled_from(
        ["2027-03-01T09:00:00Z", "2027-03-01 09:00:00+00:00", "2027-03-01", "not a time", "2027-13-01T00:00:00Z"]
    ),
    st.integers(-48, 48).map(_shifted),
)
_values: dict[str, st.SearchStrategy[Any]] = {
    "team": _text,
    "start": _times,
    "end": _times,
    "gpu_count": st.one_of(st.none(), st.integers(-2, 1030), st.sampled_from([1.0, 2.5, "3", True])),
    "gpu_model": st.one_of(st.none(), _text),
    "gpus": st.one_of(st.none(), st.lists(_text, max_size=4), _text),
    "note": st.one_of(_text, st.none(), st.integers()),
}


@settings(max_examples=3000, deadline=None)
@given(st.fixed_dictionaries({}, optional=_values))
def test_msgspec_never_accepts_what_drf_refuses_or_reads_differently(body: dict[str, Any]) -> None:
    _agree(body)


_VALID = {"team": "vision", "gpus": ["GPU-a"], "start": START.isoformat(), "end": "2027-03-01T10:00:00Z"}


@settings(max_examples=3000, deadline=None)
@given(st.data())
def test_a_valid_booking_with_fields_changed_agrees(data: st.DataObject) -> None:
    body = dict(_VALID)
    for key in data.draw(st.sets(st.sampled_from(sorted(_values)), max_size=3)):
        body[key] = data.draw(_values[key])
    _agree(body)
