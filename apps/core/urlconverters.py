"""`<segment:name>`: one path segment, as Django's `<str:...>`, but never one holding NUL.

A NUL can be sent percent-encoded (`/api/v1/nodes/%00/drain/`); no GPU uuid or node name holds one, and PostgreSQL
refuses it in any text it compares, so `<str:...>` turned such a request into a 500. With this converter the path
matches no route: a 404 like any other path that names nothing. Importing the module registers the converter.
"""

from __future__ import annotations

from django.urls import register_converter


class SegmentConverter:
    regex = r"[^/\x00]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(SegmentConverter, "segment")
