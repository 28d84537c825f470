"""ASGI entry point: HTTP through Django, websockets through Channels' router with portal authentication."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# Defaults for the web process only (the environment can still set them):
# - each ASGI request runs its sync part in a thread of its own, so a persistent connection is never reused by
#   the next request, only left for the garbage collector (Django's docs: disable persistent connections under
#   ASGI); Celery workers and the scheduler, single-threaded and long-lived, keep theirs;
# - a statement (lock waits included) may run 30 s: a request stuck behind a lock answers 503, not never.
_WEB_DEFAULTS = {"DB_CONN_MAX_AGE": "0", "DB_STATEMENT_TIMEOUT_MS": "30000"}
_added = [name for name in _WEB_DEFAULTS if name not in os.environ]
os.environ.update({name: _WEB_DEFAULTS[name] for name in _added})
django_asgi_app = get_asgi_application()
for _name in _added:  # read by settings by now; child processes (and tests importing this) keep their own
    os.environ.pop(_name, None)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from apps.accounts.ws_auth import PortalWebsocketAuthMiddleware  # noqa: E402
from apps.core.body_limit import BodySizeLimit  # noqa: E402
from apps.core.concurrency import ConcurrencyGate  # noqa: E402
from apps.core.websocket import AllowedHostsOrNoOriginValidator, DatabaseUnavailableGuard  # noqa: E402
from portal.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodySizeLimit(ConcurrencyGate(django_asgi_app)),
        "websocket": AllowedHostsOrNoOriginValidator(
            DatabaseUnavailableGuard(PortalWebsocketAuthMiddleware(URLRouter(websocket_urlpatterns)))
        ),
    }
)
