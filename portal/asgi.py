"""ASGI entry point: HTTP through Django, websockets through Channels' router with portal authentication."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from apps.accounts.ws_auth import PortalWebsocketAuthMiddleware  # noqa: E402
from apps.core.body_limit import BodySizeLimit  # noqa: E402
from apps.core.websocket import AllowedHostsOrNoOriginValidator  # noqa: E402
from portal.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodySizeLimit(django_asgi_app),
        "websocket": AllowedHostsOrNoOriginValidator(
            PortalWebsocketAuthMiddleware(URLRouter(websocket_urlpatterns))
        ),
    }
)
