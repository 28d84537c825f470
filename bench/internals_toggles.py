"""The off switches of `bench.internals_web`: each private-internals piece swapped for its supported alternative.

A toggle is a pair (turn the piece off, turn it back on); a piece the tree under test lacks gives None, and the
benchmark skips it. Django, DRF and the portal are imported inside the functions: the benchmark configures
Django (and may put another checkout first on sys.path) before any of them runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Toggle = tuple[Callable[[], None], Callable[[], None]]  # (turn the piece off, turn it back on)


def patch(obj: Any, name: str, value: Any) -> Toggle:
    original = obj.__dict__[name] if isinstance(obj, type) else getattr(obj, name)

    def off() -> None:
        setattr(obj, name, value)

    def on() -> None:
        setattr(obj, name, original)

    return off, on


def both(*toggles: Toggle) -> Toggle:
    return (lambda: [t[0]() for t in toggles] and None), (lambda: [t[1]() for t in reversed(toggles)] and None)


def import_from_tree(module_name: str) -> Any:
    """The module, if the tree under test has it (the editable install could find it in another checkout)."""
    import importlib

    import apps

    root = os.path.dirname(os.path.dirname(os.path.abspath(apps.__file__ or "")))
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return module if os.path.abspath(module.__file__ or "").startswith(root + os.sep) else None


def serializer_toggles() -> dict[str, Toggle] | None:
    """Off switches for the serializer mixins, wherever the tree keeps them (portal.internals, or
    apps.core.api.serializers before they moved); each mixin turned off defers to DRF's own method."""
    from rest_framework.fields import empty

    found: dict[str, Any] = {}
    for module_name in ("portal.internals.drf_input", "portal.internals.drf_output", "apps.core.api.serializers"):
        module = import_from_tree(module_name)
        if module is None:
            continue
        for name in ("FastInputMixin", "FastOutputMixin", "TemplateFieldsMixin"):
            if hasattr(module, name):
                found.setdefault(name, getattr(module, name))
    if not found:
        return None
    switches: dict[str, Toggle] = {}
    if "FastInputMixin" in found:
        mixin = found["FastInputMixin"]
        switches["FastInputMixin"] = patch(
            mixin, "run_validation", lambda self, data=empty, m=mixin: super(m, self).run_validation(data)
        )
    if "FastOutputMixin" in found:
        mixin = found["FastOutputMixin"]
        switches["FastOutputMixin"] = patch(
            mixin, "to_representation", lambda self, instance, m=mixin: super(m, self).to_representation(instance)
        )
    if "TemplateFieldsMixin" in found:
        mixin = found["TemplateFieldsMixin"]
        switches["TemplateFieldsMixin"] = patch(mixin, "get_fields", lambda self, m=mixin: super(m, self).get_fields())
    templates = [switches[n] for n in ("TemplateFieldsMixin",) if n in switches]
    for name, part in (("input", "FastInputMixin"), ("output", "FastOutputMixin")):
        parts = [switches[part]] if part in switches else []
        switches[name] = both(*parts, *templates)
    switches["all"] = both(*(t for n, t in list(switches.items()) if n.endswith("Mixin")))
    return switches


def pool_check_toggle() -> Toggle | None:
    """portal.pgbackend's socket poll in place of psycopg_pool's check (an empty query per checkout)."""
    from django.db import connection
    from psycopg_pool import ConnectionPool

    pool = getattr(connection, "pool", None)
    if pool is None or getattr(pool, "_check", None) is ConnectionPool.check_connection:
        return None
    from portal.pgbackend import base

    original = pool._check

    def off() -> None:  # the backend's `pool` property installs base.check_pooled_connection on every access
        base.check_pooled_connection = pool._check = ConnectionPool.check_connection

    def on() -> None:
        base.check_pooled_connection = pool._check = original

    return off, on


def negotiation_toggle() -> Toggle | None:
    from rest_framework.negotiation import DefaultContentNegotiation
    from rest_framework.views import APIView

    try:
        from apps.core.api.negotiation import ContentNegotiation
    except ImportError:
        return None
    if APIView.content_negotiation_class is not ContentNegotiation or ContentNegotiation is DefaultContentNegotiation:
        return None
    return patch(APIView, "content_negotiation_class", DefaultContentNegotiation)


@contextmanager
def plain_cursor() -> Iterator[Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        yield cursor


def statement_cursor_toggle() -> Toggle | None:
    from apps.core import rawsql

    if not hasattr(rawsql, "statement_cursor"):
        return None
    toggles = [patch(rawsql, "statement_cursor", plain_cursor)]
    for module_name in ("apps.booking.fastpath",):
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, "statement_cursor", None) is rawsql.statement_cursor:
            toggles.append(patch(module, "statement_cursor", plain_cursor))
    return both(*toggles)


def orm_insert(objs: Any) -> None:
    if not objs:
        return
    if len(objs) == 1:
        objs[0].save(force_insert=True)
    else:
        type(objs[0])._base_manager.bulk_create(objs)


def orm_update(model: Any, where: dict[str, Any], values: dict[str, Any]) -> int:
    lookups = {
        (f"{name}__in" if isinstance(value, list | tuple | set | frozenset) else name): value
        for name, value in where.items()
    }
    return int(model._base_manager.filter(**lookups).update(**values))


def orm_insert_with_child(parent: Any, child: Any, fk_attname: str) -> None:
    parent.save(force_insert=True)
    setattr(child, fk_attname, parent.pk)
    child.save(force_insert=True)


def writes_toggle() -> Toggle | None:
    from apps.core import rawsql

    names = {"insert": orm_insert, "update": orm_update, "insert_with_child": orm_insert_with_child}
    present = [patch(rawsql, name, fn) for name, fn in names.items() if hasattr(rawsql, name)]
    return both(*present) if present else None
