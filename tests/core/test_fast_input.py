"""FastInputMixin validates plain, valid input from a plan: it must accept exactly what DRF accepts, with the very
same values (types and time zones included), and leave everything else, errors above all, to DRF."""

from __future__ import annotations

import random
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers

from apps.booking.api.serializers import ReservationInput
from portal.internals.drf_input import FastInputMixin, _input_plan


def drf_result(cls: type[serializers.Serializer], data: Any) -> tuple[bool, str]:
    """DRF's own verdict on `data` (the mixin's plan skipped): (valid, repr of the value or of the errors)."""
    s = cls(data=data)
    try:
        return True, repr(super(FastInputMixin, s).run_validation(data))  # type: ignore[misc]
    except serializers.ValidationError as exc:
        return False, repr(exc.detail)


def mixin_result(cls: type[serializers.Serializer], data: Any) -> tuple[bool, str, bool]:
    """The mixin's verdict, and whether it validated without DRF (DRF builds `fields` on the instance)."""
    s = cls(data=data)
    valid = s.is_valid()
    planned = "fields" not in s.__dict__
    return valid, repr(s.validated_data if valid else s.errors), planned


class Sample(FastInputMixin, serializers.Serializer):
    slug = serializers.SlugField(max_length=12)
    title = serializers.CharField(required=False, allow_blank=True, max_length=8, default="untitled")
    raw = serializers.CharField(required=False, trim_whitespace=False, min_length=2, allow_null=True)
    count = serializers.IntegerField(min_value=1, max_value=9, required=False, allow_null=True)
    when = serializers.DateTimeField(required=False)
    there = serializers.DateTimeField(required=False, default_timezone=timezone.get_fixed_timezone(-300))
    ids = serializers.ListField(child=serializers.IntegerField(min_value=0), required=False, max_length=3)
    names = serializers.ListField(child=serializers.CharField(max_length=4), required=False, allow_empty=False)

    def validate_title(self, value: str) -> str:
        if value == "forbid":
            raise serializers.ValidationError("Not this one.")
        return value.upper()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("count") == 7:
            raise serializers.ValidationError({"count": ["Seven is reserved."]})
        return attrs


VALUES: dict[str, list[Any]] = {
    "slug": ["ok", "a-b_c", "bad slug", "", "  pad  ", "x" * 13, 5, None, True, ["ok"], "nul\x00", "é"],
    "title": ["t", " t ", "", "   ", "forbid", "x" * 9, 3, 2.5, None, {"a": 1}],
    "raw": ["ab", " a", "a", "  ", "", None, "\ud800x", 12],
    "count": [1, 9, 0, 10, 7, "5", 5.0, True, None, "x", 2**70],
    "when": [
        "2026-03-29T01:30:00+01:00",
        "2026-03-29T02:30:00",  # naive, and in Europe/Berlin a time that does not exist
        "2026-10-25T02:30:00",  # naive and ambiguous there
        "2026-01-01T00:00:00Z",
        "2026-01-01 00:00:00+00:00",
        "2026-01-01",
        "2026-13-01T00:00:00Z",
        "9999-12-31T23:59:59-14:00",
        "0001-01-01T00:00:00+14:00",
        "garbage",
        "",
        None,
        1700000000,
    ],
    "there": ["2026-06-01T12:00:00+02:00", "2026-06-01T12:00:00", None],
    "ids": [[], [0, 1], [1, 2, 3, 4], [-1], ["1"], [True], "1,2", None, [None], [1.0]],
    "names": [["a"], [], ["abcde"], [" ab "], [""], ["a", 1], [None], "a"],
}


GOOD: dict[str, list[Any]] = {  # plain and valid (each field's plain type): most inputs are like these
    "slug": ["ok", "a-b_c", "  pad  "],
    "title": ["t", " t ", ""],
    "raw": ["ab", " a", None],
    "count": [1, 9, None],
    "when": ["2026-03-29T01:30:00+01:00", "2026-01-01T00:00:00Z", "2026-01-01 00:00:00+00:00"],
    "there": ["2026-06-01T12:00:00+02:00"],
    "ids": [[], [0, 1]],
    "names": [["a"], [" ab "]],
}


def _random_input(rng: random.Random) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name, values in VALUES.items():
        if rng.random() < 0.7:
            data[name] = rng.choice(GOOD[name] if rng.random() < 0.9 else values)
    if rng.random() < 0.1:
        data["unknown"] = "ignored"
    return data


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/Sao_Paulo"])
def test_random_inputs_agree_with_drf(zone: str) -> None:
    rng = random.Random(zone)
    planned_valid = 0
    with timezone.override(zone):
        for _ in range(3000):
            data = _random_input(rng)
            valid, shown, planned = mixin_result(Sample, data)
            assert (valid, shown) == drf_result(Sample, data), data
            if planned:
                assert valid, f"the plan accepted what DRF refuses: {data}"
                planned_valid += 1
    assert planned_valid > 500  # the plan did the work for the plain, valid inputs


@pytest.mark.parametrize(
    "data",
    [
        {"slug": "ok"},
        {"slug": " ok ", "title": " hi ", "raw": " ab ", "count": 3, "ids": [0, 5], "names": ["ab", " c "]},
        {"slug": "ok", "title": "", "raw": None, "count": None},
        {"slug": "ok", "when": "2026-03-29T03:30:00+02:00", "there": "2026-06-01T12:00:00Z"},
    ],
)
def test_plain_valid_input_is_planned_and_equal(data: dict[str, Any]) -> None:
    with timezone.override("Europe/Berlin"):
        valid, shown, planned = mixin_result(Sample, data)
        assert valid and planned
        assert (valid, shown) == drf_result(Sample, data)


@pytest.mark.parametrize(
    "data",
    [
        {"slug": "ok", "count": "3"},  # a number as text: DRF converts it
        {"slug": "ok", "when": "2026-03-29T02:30:00"},  # naive: DRF decides in the current time zone
        {"slug": "ok", "title": "forbid"},  # validate_title refuses
        {"slug": "ok", "count": 7},  # validate() refuses
        {"slug": "ok", "ids": [1, 2, 3, 4]},  # the list's own max_length
    ],
)
def test_anything_else_goes_to_drf(data: dict[str, Any]) -> None:
    with timezone.override("Europe/Berlin"):
        valid, shown, planned = mixin_result(Sample, data)
        assert not planned
        assert (valid, shown) == drf_result(Sample, data)


def test_forms_and_partial_updates_go_to_drf() -> None:
    from django.http import QueryDict

    form = QueryDict("slug=ok&count=3")
    s = Sample(data=form)
    assert s.is_valid() and "fields" in s.__dict__ and s.validated_data["count"] == 3
    s = Sample(data={"count": 3}, partial=True)
    assert s.is_valid() and "fields" in s.__dict__ and dict(s.validated_data) == {"count": 3}


def test_classes_the_plan_cannot_run() -> None:
    class Email(FastInputMixin, serializers.Serializer):
        address = serializers.EmailField()  # a CharField subclass: may behave otherwise

    class Formats(FastInputMixin, serializers.Serializer):
        when = serializers.DateTimeField(input_formats=["%d.%m.%Y %H:%M", "iso-8601"])

    class OwnInternal(FastInputMixin, serializers.Serializer):
        name = serializers.CharField()

        def to_internal_value(self, data: Any) -> Any:
            return {"name": "always"}

    class ClassValidators(FastInputMixin, serializers.Serializer):
        a = serializers.IntegerField()

        class Meta:
            validators = [lambda attrs: None]

    class Sourced(FastInputMixin, serializers.Serializer):
        a = serializers.IntegerField(source="b")

    for cls in (Email, Formats, OwnInternal, ClassValidators, Sourced):
        assert _input_plan(cls) is None, cls.__name__
    s = OwnInternal(data={"name": "given"})
    assert s.is_valid() and s.validated_data == {"name": "always"}


BOOKINGS: list[dict[str, Any]] = [
    {"team": "ml", "gpus": ["GPU-1"], "start": "2027-01-01T10:00:00+00:00", "end": "2027-01-01T11:00:00+00:00"},
    {"team": "ml", "gpu_model": "A100", "gpu_count": 2, "start": "2027-01-01T10:00:00Z", "end": "2027-01-02T10:00Z"},
    {"team": "ml", "gpu_model": "A100", "start": "2027-01-01T10:00:00Z", "end": "2027-01-01T11:00:00Z"},
    {"team": "ml", "start": "2027-01-01T10:00:00Z", "end": "2027-01-01T11:00:00Z"},
    {"team": "m l", "gpus": ["GPU-1"], "start": "2027-01-01T10:00:00Z", "end": "2027-01-01T11:00:00Z"},
    {"team": "ml", "gpus": ["GPU-1"], "start": "2027-01-01T10:00:00", "end": "2027-01-01T11:00:00"},
    {"team": "ml", "gpus": "GPU-1", "start": "2027-01-01T10:00:00Z", "end": "2027-01-01T11:00:00Z"},
    {"team": "ml", "gpu_model": "A100", "gpu_count": 0, "start": "2027-01-01T10:00Z", "end": "2027-01-01T11:00Z"},
    {"team": "ml", "gpus": ["GPU-1"], "start": "2027-01-01T10:00Z", "end": "2027-01-01T11:00Z", "note": "x" * 501},
]


@pytest.mark.parametrize("data", BOOKINGS)
def test_reservation_input_agrees_with_drf(data: dict[str, Any]) -> None:
    with timezone.override("Europe/Berlin"):
        valid, shown, _ = mixin_result(ReservationInput, data)
        assert (valid, shown) == drf_result(ReservationInput, data)


def test_the_booking_input_is_planned() -> None:
    assert _input_plan(ReservationInput) is not None
    valid, _, planned = mixin_result(ReservationInput, BOOKINGS[0])
    assert valid and planned
