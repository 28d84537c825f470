"""Origin checking for websocket handshakes that still admits non-browser clients.

Channels' AllowedHostsOriginValidator refuses a handshake without an `Origin` header, which shuts out the CLI and
scripts that authenticate with `Authorization: Bearer` (DESIGN.md: websockets take a session cookie or a bearer
token). The check exists against cross-site websocket hijacking, which needs a browser, and browsers always send
`Origin` on a websocket handshake: so a foreign Origin is refused, a missing one is admitted (such a client has no
ambient cookie to abuse; it must present its own credentials).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import ParseResult

from channels.security.websocket import OriginValidator
from django.conf import settings


class BrowserOriginValidator(OriginValidator):
    """Refuse a handshake whose Origin is not one of ours; admit one with no Origin (not a browser)."""

    def valid_origin(self, parsed_origin: ParseResult | None) -> bool:
        if parsed_origin is None:
            return True
        return bool(self.validate_origin(parsed_origin))


def AllowedHostsOrNoOriginValidator(application: Any) -> BrowserOriginValidator:
    allowed_hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
    return BrowserOriginValidator(application, allowed_hosts)
