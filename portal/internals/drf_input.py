"""Validating well-formed DRF input from a plan made once per class (FastInputMixin).

Depends on DRF internals (see README.md): the built-in fields' attributes (`trim_whitespace`, `allow_blank`,
`allow_empty`, `input_formats`, `timezone`/`default_timezone()`, `validators`, `child`), the methods a serializer
or field may override to validate its own way, and the order DRF validates in (field, `validate_<field>`,
`validate()`). `tests/core/test_fast_input.py` holds the verdicts and values equal to DRF's own and fails when one
of these changes.
"""

from __future__ import annotations

from typing import Any, cast

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils.dateparse import parse_datetime
from rest_framework import ISO_8601, serializers
from rest_framework.fields import empty
from rest_framework.settings import api_settings

_UNPLANNED = object()


class FastInputMixin:
    """Validates well-formed input from a plan made once per class, without building the serializer's fields.

    Why: a DRF serializer copies and binds all of its fields for each instance before it looks at the data, and
    then validates through several layers per field; for a booking that was more than a tenth of the request's
    CPU (bench/internals_web.py). Most requests send input of the expected types, so the plan
    checks exactly that case directly: a JSON object (a dict, not a form) whose values are of the fields' plain
    types (a str for a CharField/SlugField, an int for an IntegerField, an ISO 8601 string with an offset for a
    DateTimeField, a list of such for a ListField), run through the fields' own validators (length, range, slug,
    NUL characters...), the serializer's `validate_<field>` methods and its `validate()`.

    Anything else goes to DRF untouched: a value of another type (a number as a string, a naive datetime), a
    validator or `validate()` that refuses (DRF then says what is wrong, in its words), a partial update, or a
    class with a field the plan does not know (subclasses of the field types included: they may override
    behaviour). So the plan only ever accepts what DRF would accept, with the same values; errors always come from
    DRF. `tests/core/test_fast_input.py` holds both equal over valid and invalid inputs.
    """

    _input_plan: Any  # set on each class when it first validates (not inherited: a subclass has other fields)

    def run_validation(self, data: Any = empty) -> Any:
        cls = type(self)
        plan = cls.__dict__.get("_input_plan", _UNPLANNED)
        if plan is _UNPLANNED:
            plan = _input_plan(cls)
            cls._input_plan = plan  # two threads may both build it: the same plan, the last one kept
        if (
            plan is not None
            and type(data) is dict
            and not getattr(self, "partial", False)
            and getattr(self, "parent", None) is None
        ):
            try:
                attrs = _run_input_plan(self, plan, data)
                attrs = self.validate(attrs)  # type: ignore[attr-defined]
            except (_NotPlain, serializers.ValidationError, DjangoValidationError):
                pass  # DRF validates it again and words the error
            else:
                if attrs is not None:
                    return attrs
        return super().run_validation(data)  # type: ignore[misc]


class _NotPlain(Exception):
    """The input is not of the plain, valid shape the plan checks: DRF validates it."""


# (field name, kind, field template, child template for a list, default or `empty`, allow_null, required)
_InputStep = tuple[str, str, serializers.Field, Any, Any, bool, bool]


def _input_kind(field: serializers.Field) -> str | None:
    kind = {
        serializers.CharField: "str",
        serializers.SlugField: "str",
        serializers.IntegerField: "int",
        serializers.DateTimeField: "datetime",
        serializers.ListField: "list",
    }.get(type(field))
    if kind == "datetime":
        formats = getattr(field, "input_formats", api_settings.DATETIME_INPUT_FORMATS)
        if [str(f).lower() for f in formats] != [ISO_8601]:
            return None  # another format could parse the text differently
    if any(getattr(v, "requires_context", False) for v in field.validators):
        return None
    return kind


def _input_plan(cls: type) -> list[_InputStep] | None:
    """The plan of `cls`, or None when DRF must validate every input (a field or validator the plan cannot run)."""
    for method in ("to_internal_value", "run_validators", "validate_empty_values", "get_value"):
        if getattr(cls, method) is not getattr(serializers.Serializer, method):
            return None  # the class validates its own way: the plan would skip it
    prototype = cls()
    if prototype.get_validators():  # type: ignore[attr-defined]  # class-level validators (Meta.validators)
        return None
    plan: list[_InputStep] = []
    for name, field in prototype.get_fields().items():  # type: ignore[attr-defined]  # unbound copies
        if field.read_only:
            continue
        if field.source not in (None, name) or (field.default is not empty and callable(field.default)):
            return None
        kind = _input_kind(field)
        child = None
        if kind == "list":
            child = field.child  # type: ignore[attr-defined]
            if _input_kind(child) not in ("str", "int") or child.source not in (None, "") or child.allow_null:
                return None
        if kind is None:
            return None
        plan.append((name, kind, field, child, field.default, field.allow_null, field.required))
    return plan


def _plain_value(kind: str, field: serializers.Field, value: Any) -> Any:
    """`value` as DRF's `field.run_validation` returns it, for a value of the plain type; else _NotPlain."""
    if kind == "str":
        if type(value) is not str:
            raise _NotPlain
        if field.trim_whitespace:  # type: ignore[attr-defined]
            value = value.strip()
        if value == "":
            if not field.allow_blank:  # type: ignore[attr-defined]
                raise _NotPlain
            return ""  # DRF returns a blank before any validator
    elif kind == "int":
        if type(value) is not int:  # not bool, not "5", not 5.0: DRF converts those its own way
            raise _NotPlain
    elif kind == "datetime":
        if type(value) is not str:
            raise _NotPlain
        try:
            parsed = parse_datetime(value)
        except ValueError:
            raise _NotPlain from None
        if parsed is None or parsed.tzinfo is None or parsed.utcoffset() is None:
            raise _NotPlain  # naive: DRF makes it aware (and checks it exists in the time zone)
        zone = field.timezone if hasattr(field, "timezone") else field.default_timezone()  # type: ignore[attr-defined]
        if zone is None:
            raise _NotPlain
        try:
            value = parsed.astimezone(zone)
        except OverflowError:
            raise _NotPlain from None
    for validator in field.validators:
        try:
            cast(Any, validator)(value)  # context validators are excluded by the plan
        except (serializers.ValidationError, DjangoValidationError):
            raise _NotPlain from None
    return value


def _run_input_plan(serializer: Any, plan: list[_InputStep], data: dict[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for name, kind, field, child, default, allow_null, required in plan:
        value = data.get(name, empty)
        if value is empty:
            if required:
                raise _NotPlain
            if default is empty:
                continue
            value = default  # DRF does not validate a default
        elif value is None:
            if not allow_null:
                raise _NotPlain
        elif kind == "list":
            if type(value) is not list or (not field.allow_empty and not value):  # type: ignore[attr-defined]
                raise _NotPlain
            child_kind = "str" if isinstance(child, serializers.CharField) else "int"
            value = [_plain_value(child_kind, child, item) for item in value]
            for validator in field.validators:
                try:
                    cast(Any, validator)(value)  # context validators are excluded by the plan
                except (serializers.ValidationError, DjangoValidationError):
                    raise _NotPlain from None
        else:
            value = _plain_value(kind, field, value)
        method = getattr(serializer, f"validate_{name}", None)
        if method is not None:
            value = method(value)
        attrs[name] = value
    return attrs
