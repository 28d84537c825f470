"""Serializer helpers shared by the apps' APIs."""

from __future__ import annotations

import copy
from typing import Any, cast

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils.dateparse import parse_datetime
from rest_framework import ISO_8601, serializers
from rest_framework.fields import SkipField, empty
from rest_framework.settings import api_settings


class TemplateFieldsMixin:
    """Builds a serializer class's fields once and gives each instance copies of them.

    Why: DRF builds every field anew for every serializer instance (a deep copy of the declared fields, and for a
    ModelSerializer an introspection of the model per field). For the job shown after each submission that was a
    millisecond of the request's CPU, more than the data it renders.

    Each instance still gets its own field objects, bound to it (`bind` sets the field's parent, name and source
    on the copy), so concurrent requests never share a bound field or each other's context. A field object that is
    not yet bound holds only its constructor's settings, which a shallow copy may share; a field that binds a child
    of its own (nested serializer, list field, many-relation) is copied the way DRF copies it (deep).
    """

    _field_templates: dict[str, serializers.Field]

    def get_fields(self) -> dict[str, serializers.Field]:
        cls = type(self)
        templates = cls.__dict__.get("_field_templates")  # the class's own: a subclass's fields differ
        if templates is None:
            templates = super().get_fields()  # type: ignore[misc]
            cls._field_templates = templates
        return {name: _copy_field(field) for name, field in templates.items()}


def _binds_children(field: serializers.Field) -> bool:
    # Nested serializers, list/dict fields and many-relations bind a child field to themselves when built: a
    # shallow copy would share that child (still bound to the template).
    return isinstance(field, serializers.BaseSerializer) or hasattr(field, "child") or hasattr(field, "child_relation")


def _copy_field(field: serializers.Field) -> serializers.Field:
    """A copy of an unbound template field that the new serializer may bind. A list or dict field of plain
    values (ListField(child=CharField())) gets a shallow copy of its child too, re-parented to the copy: DRF's
    deep copy rebuilds both from their constructor arguments, which was ~4% of a booking request's CPU for its
    `gpus` field. Nested serializers and relations are still built anew, as DRF does."""
    if not _binds_children(field):
        return copy.copy(field)
    child = getattr(field, "child", None)
    if isinstance(field, serializers.BaseSerializer) or child is None or _binds_children(child):
        return copy.deepcopy(field)
    clone = copy.copy(field)
    clone.child = copy.copy(child)  # type: ignore[attr-defined]
    clone.child.parent = clone  # type: ignore[attr-defined]  # already named and sourced by the template's bind
    return clone


class FastOutputMixin(TemplateFieldsMixin):
    """Renders an instance from a plan made once per class, without binding fields for every instance.

    Why: binding copies of all fields to each serializer (even from templates) was most of the cost of showing a
    job after its submission: ~11% of the web process's CPU at 45 jobs/s, against ~5% for the rendering itself.

    The plan holds the fields of one prototype instance of the class. Only fields whose output cannot depend on
    the serializer they are bound to are rendered through the prototype's fields: DRF's own plain fields (their
    `to_representation` is one of `_CONTEXT_FREE`), fields that declare `context_free_output = True`, and nested
    serializers that are context free themselves. A SerializerMethodField calls the method on the instance being
    rendered, so it sees that instance's context (a job's env values are shown to its submitter only). Anything
    else (hyperlinks and files read the request, relations, callable defaults) makes the class render the way
    DRF does, field copies and all. `tests/core/test_fast_output.py` holds the output equal to DRF's.
    """

    _output_plan: Any  # set on each class when it first renders (not inherited: a subclass has other fields)

    def to_representation(self, instance: Any) -> dict[str, Any]:
        cls = type(self)
        plan = cls.__dict__.get("_output_plan", _UNPLANNED)
        if plan is _UNPLANNED:
            plan = _output_plan(cls)
            cls._output_plan = plan  # two threads may both build it: the same plan, the last one kept
        if plan is None:
            return super().to_representation(instance)  # type: ignore[misc,no-any-return]
        ret: dict[str, Any] = {}
        for name, field, method_name in plan:
            if method_name is not None:
                ret[name] = getattr(self, method_name)(instance)
                continue
            try:
                attribute = field.get_attribute(instance)
            except SkipField:
                continue
            ret[name] = None if attribute is None else field.to_representation(attribute)
        return ret


_UNPLANNED = object()
_OutputPlan = list[tuple[str, serializers.Field, str | None]]

_CONTEXT_FREE = {
    cls.to_representation
    for cls in (
        serializers.CharField,
        serializers.IntegerField,
        serializers.BigIntegerField,
        serializers.FloatField,
        serializers.BooleanField,
        serializers.DecimalField,
        serializers.DateTimeField,
        serializers.DateField,
        serializers.TimeField,
        serializers.DurationField,
        serializers.UUIDField,
        serializers.ChoiceField,
        serializers.JSONField,
        serializers.ReadOnlyField,
        serializers.ModelField,
    )
}


def _output_plan(cls: type) -> _OutputPlan | None:
    """The plan of `cls`, or None when one of its fields must be rendered bound to each instance."""
    prototype = cls(context={})
    plan: _OutputPlan = []
    for field in prototype._readable_fields:
        if isinstance(field, serializers.SerializerMethodField):
            plan.append((str(field.field_name), field, field.method_name))
        elif _context_free(field):
            plan.append((str(field.field_name), field, None))
        else:
            return None
    return plan


def _context_free(field: serializers.Field) -> bool:
    """Whether the field renders the same whatever serializer it is bound to (see FastOutputMixin)."""
    if field.default is not empty and callable(field.default):  # may be given the field, and so its parent
        return False
    if isinstance(field, serializers.ListSerializer):
        return _nested_context_free(field.child)
    if isinstance(field, serializers.BaseSerializer):
        return _nested_context_free(field)
    if getattr(type(field), "context_free_output", False):
        return True
    return type(field).to_representation in _CONTEXT_FREE


def _nested_context_free(serializer: Any) -> bool:
    # A nested serializer renders through the prototype's copy of it: only when nothing in it reads the context.
    cls: type[FastOutputMixin] = type(serializer)
    if not issubclass(cls, FastOutputMixin):
        return False
    plan = cls.__dict__.get("_output_plan", _UNPLANNED)
    if plan is _UNPLANNED:
        plan = _output_plan(cls)
        cls._output_plan = plan
    return plan is not None and all(method_name is None for _, _, method_name in plan)


class FastInputMixin(TemplateFieldsMixin):
    """Validates well-formed input from a plan made once per class, without building the serializer's fields.

    Why: a DRF serializer copies and binds all of its fields for each instance before it looks at the data, and
    then validates through several layers per field; for a booking's five fields that was ~10% of the web
    process's CPU, more than the quota arithmetic. Most requests send input of the expected types, so the plan
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
    if kind is None and getattr(type(field), "identity_input", False):
        kind = "any"
        for method in ("run_validation", "validate_empty_values", "get_value", "run_validators"):
            if getattr(type(field), method) is not getattr(serializers.Field, method):
                return None
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
    # ("any": a field whose to_internal_value returns the value as given, declared with `identity_input = True`.)
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
