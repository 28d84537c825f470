"""Keep secrets out of logs: personal API tokens (gpp_...), node tokens (gpn_...), Slurm bridge tokens (gpb_...),
webhook signing secrets (whsec_...) and Authorization headers are masked in every record. It lives in `workers`
(standard library only) because both sides use it: the portal's processes through Django's `LOGGING`, and the node
agent and the Slurm bridge, which do not import the portal's apps, on their own handlers."""

from __future__ import annotations

import logging
import re

_TOKEN = re.compile(r"(gpp|gpn|gpb)_[A-Za-z0-9_-]{8,}")
_WEBHOOK_SECRET = re.compile(r"(whsec)_[A-Za-z0-9+/=]{8,}")  # base64, apps/events/secrets.py
_AUTH = re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?(bearer|node)\s+)[^\s'\"]+")


def redact(text: str) -> str:
    text = _WEBHOOK_SECRET.sub(r"\1_[redacted]", _TOKEN.sub(r"\1_[redacted]", text))
    return _AUTH.sub(r"\1[redacted]", text)


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


def mask_handlers(logger: logging.Logger | None = None) -> None:
    """Put the filter on every handler of `logger` (the root logger by default) that lacks it. On the handlers, not
    the logger: a logger's filters do not see the records its children pass up to it."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactSecretsFilter) for f in handler.filters):
            handler.addFilter(RedactSecretsFilter())
