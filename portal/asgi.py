"""ASGI entry point: HTTP through Django's WSGI handler on a fixed thread pool, websockets through Channels' router
with portal authentication.

Why not Django's ASGI handler for HTTP: every view here is synchronous, and the ASGI handler runs each request's
sync part through asgiref on a thread of a per-request executor, adapting the middleware chain between sync and
async on the way; that costs more CPU per request than the WSGI handler (bench/internals_web.py).
portal/internals/wsgi_bridge.py runs the WSGI handler on a bounded pool of long-lived threads inside the same
event loop (one trip to a thread and back per request), so one process and one port still serve pages, the API
and websockets, and the ASGI middleware in front (body size limit, concurrency gate) still applies.
"""

from __future__ import annotations

import os
from typing import Any, cast

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# Defaults for the web process only (the environment can still set them):
# - no persistent connections: websocket consumers' database calls run on asgiref's threads, which come and go
#   and would each keep a connection until the garbage collector finds it (Django's docs: disable persistent
#   connections under ASGI); the launcher and compose give the web process a connection pool instead
#   (DB_POOL_MAX_SIZE). Celery workers and the scheduler, single-threaded and long-lived, keep theirs;
# - a statement (lock waits included) may run 30 s: a request stuck behind a lock answers 503, not never;
# - the token and team rows that every API request reads are cached in the process, invalidated by PostgreSQL's
#   notifications (apps/core/rowcache.py).
_WEB_DEFAULTS = {"DB_CONN_MAX_AGE": "0", "DB_STATEMENT_TIMEOUT_MS": "30000", "DB_ROW_CACHE": "1"}
_added = [name for name in _WEB_DEFAULTS if name not in os.environ]
os.environ.update({name: _WEB_DEFAULTS[name] for name in _added})
django_wsgi_app = get_wsgi_application()
for _name in _added:  # read by settings by now; child processes (and tests importing this) keep their own
    os.environ.pop(_name, None)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from apps.accounts.ws_auth import PortalWebsocketAuthMiddleware  # noqa: E402
from apps.core.body_limit import BodySizeLimit  # noqa: E402
from apps.core.concurrency import ConcurrencyGate  # noqa: E402
from apps.core.websocket import AllowedHostsOrNoOriginValidator, DatabaseUnavailableGuard  # noqa: E402
from portal.internals.wsgi_bridge import WsgiBridge  # noqa: E402
from portal.routing import websocket_urlpatterns  # noqa: E402

# The gate lets WEB_MAX_CONCURRENT_REQUESTS requests in at once; a few threads more serve what it does not count
# (the health probe) without waiting behind them.
_limit = int(settings.WEB_MAX_CONCURRENT_REQUESTS)
# (The cast: Django's WSGIHandler satisfies the WSGI protocol; its stubs spell the signature differently.)
django_http_app: Any = WsgiBridge(cast(Any, django_wsgi_app), workers=(_limit if _limit > 0 else 64) + 4)

application = ProtocolTypeRouter(
    {
        "http": BodySizeLimit(ConcurrencyGate(django_http_app)),
        "websocket": AllowedHostsOrNoOriginValidator(
            DatabaseUnavailableGuard(PortalWebsocketAuthMiddleware(URLRouter(websocket_urlpatterns)))
        ),
    }
)
