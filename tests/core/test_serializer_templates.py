"""TemplateFieldsMixin's copies of template fields: each serializer owns its fields (and a list field's child),
bound to it, and validates exactly as DRF's own per-instance deep copies do."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from apps.core.api.serializers import TemplateFieldsMixin


class _Plain(serializers.Serializer):
    name = serializers.SlugField()
    tags = serializers.ListField(child=serializers.CharField(max_length=5), max_length=3, required=False)
    extra = serializers.DictField(child=serializers.IntegerField(min_value=0), required=False)
    nested = serializers.ListField(child=serializers.ListField(child=serializers.IntegerField()), required=False)


class _Templated(TemplateFieldsMixin, _Plain):
    pass


CASES: list[dict[str, Any]] = [
    {"name": "ok", "tags": ["a", "bb"], "extra": {"x": 1}, "nested": [[1, 2], [3]]},
    {"name": "bad name!", "tags": ["toolong", "ok", 7]},
    {"name": "ok", "tags": ["a", "b", "c", "d"]},
    {"name": "ok", "extra": {"x": -1, "y": "z"}},
    {"name": "ok", "nested": [[1, "x"]]},
    {"tags": "notalist"},
]


@pytest.mark.parametrize("data", CASES)
def test_validates_as_drf_does(data: dict[str, Any]) -> None:
    plain, templated = _Plain(data=data), _Templated(data=data)
    assert plain.is_valid() == templated.is_valid()
    assert plain.errors == templated.errors
    if plain.is_valid():
        assert plain.validated_data == templated.validated_data


def test_each_instance_owns_its_fields_and_their_children() -> None:
    one, two = _Templated(data={}), _Templated(data={})
    for name in ("tags", "extra", "nested"):
        a, b = one.fields[name], two.fields[name]
        assert a is not b and a.child is not b.child
        assert a.parent is one and b.parent is two
        assert a.child.parent is a and b.child.parent is b
        assert a.child.root is one
    # A child that has children of its own is rebuilt whole (DRF's deep copy).
    assert one.fields["nested"].child.child is not two.fields["nested"].child.child
    assert one.fields["nested"].child.child.parent is one.fields["nested"].child
