"""Serializer helpers shared by the apps' APIs."""

from __future__ import annotations

import copy

from rest_framework import serializers


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
        return {
            name: copy.deepcopy(field) if _binds_children(field) else copy.copy(field)
            for name, field in templates.items()
        }


def _binds_children(field: serializers.Field) -> bool:
    # Nested serializers, list/dict fields and many-relations bind a child field to themselves when built: a
    # shallow copy would share that child (still bound to the template), so these are built anew as DRF does.
    return isinstance(field, serializers.BaseSerializer) or hasattr(field, "child") or hasattr(field, "child_relation")
