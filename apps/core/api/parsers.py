"""The API's JSON parser: DRF's, refusing two kinds of valid-looking JSON that Python's decoder lets through to
code that cannot handle them, each of which answered 500:

- a body nested about a thousand levels deep: the standard library's decoder raises RecursionError, not the
  ValueError that DRF's parser turns into a 400 (a few kilobytes of `[` were enough);
- a string holding a lone UTF-16 surrogate (`"\\ud800"`): JSON allows the escape and Python decodes it to a `str`
  that cannot be encoded as UTF-8, so PostgreSQL's driver, and the renderer of any error message that quotes it,
  fail.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from typing import IO, Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser as DrfJSONParser

# A \u escape in the surrogate range. Only a body that has one is walked; valid pairs (an emoji written as two
# escapes) decode to one code point and pass.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def has_lone_surrogate(data: Any) -> bool:
    """Whether any string (key or value) in decoded JSON holds an unpaired surrogate. Iterative: the data may be
    nested nearly as deep as the decoder allows."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class JSONParser(DrfJSONParser):
    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        raw = stream.read()
        try:
            data = super().parse(io.BytesIO(raw), media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None
        if _SURROGATE_ESCAPE.search(raw) and has_lone_surrogate(data):
            raise ParseError("JSON parse error - a string holds an unpaired UTF-16 surrogate (\\ud800-\\udfff).")
        return data
