"""GPU Portal project package: settings, URLs, ASGI/WSGI entry points, the Celery app and the launcher."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
