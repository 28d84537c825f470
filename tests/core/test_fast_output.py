"""FastOutputMixin renders from a plan made once per class: the output must be exactly DRF's, method fields must
see the context of the serializer being rendered, and anything that may read the context must fall back to DRF."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from rest_framework import serializers

from portal.internals.drf_output import FastOutputMixin


def drf_render(serializer: serializers.BaseSerializer) -> Any:
    """What DRF itself renders (fields bound to this instance), nested FastOutputMixin serializers included."""
    original = FastOutputMixin.to_representation

    def plain(self: Any, instance: Any) -> Any:
        return serializers.Serializer.to_representation(self, instance)

    FastOutputMixin.to_representation = plain  # type: ignore[method-assign]
    try:
        return serializer.data
    finally:
        FastOutputMixin.to_representation = original  # type: ignore[method-assign]


class Part(FastOutputMixin, serializers.Serializer):
    name = serializers.CharField()
    size = serializers.IntegerField()


class Thing(FastOutputMixin, serializers.Serializer):
    id = serializers.IntegerField()
    label = serializers.CharField(source="meta.label")
    optional = serializers.CharField(required=False)
    nullable = serializers.CharField(allow_null=True)
    price = serializers.DecimalField(max_digits=8, decimal_places=2)
    at = serializers.DateTimeField()
    kind = serializers.ChoiceField(choices=[("a", "A"), ("b", "B")])
    blob = serializers.JSONField()
    parts = Part(many=True)
    main = Part()
    viewer = serializers.SerializerMethodField()

    def get_viewer(self, obj: Any) -> str:
        return f"{self.context.get('who')} sees {obj.id}"


def _thing(i: int, **extra: Any) -> SimpleNamespace:
    values: dict[str, Any] = {
        "id": i,
        "meta": SimpleNamespace(label=f"thing {i}"),
        "nullable": None,
        "price": Decimal("12.5"),
        "at": datetime(2026, 12, 4, 5, 6, 7, 123000, tzinfo=UTC),
        "kind": "b",
        "blob": {"k": [1, 2]},
        "parts": [SimpleNamespace(name="p", size=1), SimpleNamespace(name="q", size=2)],
        "main": SimpleNamespace(name="m", size=3),
    }
    values.update(extra)
    return SimpleNamespace(**values)


def test_output_is_what_drf_renders() -> None:
    for obj in (_thing(1), _thing(2, optional="here"), _thing(3, at=None, blob=None)):
        fast = Thing(obj, context={"who": "ann"}).data
        assert fast == drf_render(Thing(obj, context={"who": "ann"}))
        assert list(fast) == list(drf_render(Thing(obj, context={"who": "ann"})))  # the same key order
    assert "optional" not in Thing(_thing(1)).data  # a missing non-required attribute is skipped, as DRF does
    assert Thing(_thing(2, optional="here")).data["optional"] == "here"
    many = Thing([_thing(1), _thing(2)], many=True, context={"who": "ann"})
    assert many.data == drf_render(Thing([_thing(1), _thing(2)], many=True, context={"who": "ann"}))


def test_the_plan_is_used_and_no_fields_are_bound_per_instance() -> None:
    serializer = Thing(_thing(1), context={"who": "ann"})
    assert serializer.data["viewer"] == "ann sees 1"
    assert "fields" not in serializer.__dict__  # DRF's cached_property: set only if this instance bound its fields
    assert Thing.__dict__["_output_plan"] is not None


def test_method_fields_see_their_own_serializers_context() -> None:
    wrong: list[str] = []
    barrier = threading.Barrier(8)

    def render(who: str) -> None:
        barrier.wait()
        for i in range(200):
            got = Thing(_thing(i), context={"who": who}).data["viewer"]
            if got != f"{who} sees {i}":
                wrong.append(got)

    threads = [threading.Thread(target=render, args=(f"user{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


class ContextField(serializers.Field):
    """A field whose output depends on the serializer it is bound to."""

    def to_representation(self, value: Any) -> str:
        return f"{self.context['who']}:{value}"


class WithContextField(FastOutputMixin, serializers.Serializer):
    id = serializers.IntegerField()
    tagged = ContextField(source="id")


class NestedWithMethod(FastOutputMixin, serializers.Serializer):
    id = serializers.IntegerField()
    who = serializers.SerializerMethodField()

    def get_who(self, obj: Any) -> str:
        return str(self.context["who"])


class WithNestedMethod(FastOutputMixin, serializers.Serializer):
    id = serializers.IntegerField()
    child = NestedWithMethod(source="*")


class WithCallableDefault(FastOutputMixin, serializers.Serializer):
    id = serializers.IntegerField()
    extra = serializers.CharField(default=lambda: "x")


@pytest.mark.parametrize("cls", [WithContextField, WithNestedMethod, WithCallableDefault])
def test_fields_that_may_read_the_context_fall_back_to_drf(cls: type) -> None:
    obj = SimpleNamespace(id=7)
    first = cls(obj, context={"who": "ann"}).data
    second = cls(obj, context={"who": "bob"}).data
    assert cls.__dict__["_output_plan"] is None
    assert first == drf_render(cls(obj, context={"who": "ann"}))
    assert second == drf_render(cls(obj, context={"who": "bob"}))
    if cls is WithContextField:
        assert (first["tagged"], second["tagged"]) == ("ann:7", "bob:7")
    if cls is WithNestedMethod:
        assert (first["child"]["who"], second["child"]["who"]) == ("ann", "bob")


def test_a_field_may_declare_itself_context_free() -> None:
    class Passthrough(serializers.Field):
        context_free_output = True

        def to_representation(self, value: Any) -> Any:
            return value

    class WithPassthrough(FastOutputMixin, serializers.Serializer):
        value = Passthrough()

    assert WithPassthrough(SimpleNamespace(value=[1, "a"])).data == {"value": [1, "a"]}
    assert WithPassthrough.__dict__["_output_plan"] is not None
