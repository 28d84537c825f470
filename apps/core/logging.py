"""Keep secrets out of logs: API tokens (gpp_...) and Authorization headers are masked in every record."""

from __future__ import annotations

import logging
import re

_TOKEN = re.compile(r"(gpp|gpn)_[A-Za-z0-9_-]{8,}")
_AUTH = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?(bearer|node)\s+)[^\s'\"]+")


def redact(text: str) -> str:
    return _AUTH.sub(r"\1[redacted]", _TOKEN.sub(r"\1_[redacted]", text))


class RedactSecretsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True
