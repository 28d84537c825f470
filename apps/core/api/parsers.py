"""The API's JSON parser: DRF's, with a body nested too deeply for the decoder refused as a parse error.

The standard library's decoder raises RecursionError (not ValueError, which DRF's parser turns into a 400) on a
body nested about a thousand levels deep; a few kilobytes of `[` were enough to answer 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser as DrfJSONParser


class JSONParser(DrfJSONParser):
    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply.") from None
