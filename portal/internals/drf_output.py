"""Rendering DRF serializers from a plan made once per class (FastOutputMixin).

Depends on DRF internals (see README.md): `Serializer._readable_fields`, the identity of the built-in fields'
`to_representation` methods, `SerializerMethodField.method_name`, `Field.get_attribute` raising `SkipField`.
`tests/core/test_fast_output.py` holds the output equal to DRF's own and fails when one of these changes.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.fields import SkipField, empty


class FastOutputMixin:
    """Renders an instance from a plan made once per class, without building and binding fields per instance.

    Why: DRF builds every field anew for every serializer instance (a deep copy of the declared fields, and for a
    ModelSerializer an introspection of the model per field) before it renders anything; for the job shown after
    each submission that was more CPU than the rendering itself (bench/internals_web.py).

    The plan holds the fields of one prototype instance of the class. Only fields whose output cannot depend on
    the serializer they are bound to are rendered through the prototype's fields: DRF's own plain fields (their
    `to_representation` is one of `_CONTEXT_FREE`), fields that declare `context_free_output = True`, and nested
    serializers that are context free themselves. A SerializerMethodField calls the method on the instance being
    rendered, so it sees that instance's context (a job's env values are shown to its submitter only). Anything
    else (hyperlinks and files read the request, relations, callable defaults) makes the class render the way
    DRF does.
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
_OutputPlan = list[tuple[str, "serializers.Field[Any, Any, Any, Any]", str | None]]

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


def _context_free(field: serializers.Field[Any, Any, Any, Any]) -> bool:
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
