"""portal.pgpool: a pooled connection is checked without a round trip, and one the server closed is replaced."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connections

from portal.pgpool.base import DatabaseWrapper, check_pooled_connection
from tests.conftest import requires_postgres

pytestmark = [requires_postgres, pytest.mark.django_db(transaction=True)]


def _terminate(pid: int) -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert cursor.fetchone() == (True,)


def _pooled(alias: str) -> DatabaseWrapper:
    default = connections["default"].settings_dict
    options = {k: v for k, v in default["OPTIONS"].items() if k != "pool"}
    options["pool"] = {"min_size": 1, "max_size": 2, "timeout": 5}
    settings_dict = {**default, "OPTIONS": options, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": True}
    return DatabaseWrapper(settings_dict, alias=alias)


def test_a_healthy_connection_passes_without_a_query() -> None:
    wrapper = _pooled("pgpool_quiet")
    try:
        wrapper.ensure_connection()
        conn: Any = wrapper.connection

        def no_query(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("the check sent a query")

        original = conn.execute
        conn.execute = no_query
        try:
            check_pooled_connection(conn)
        finally:
            conn.execute = original
    finally:
        wrapper.close()
        wrapper.close_pool()


def test_a_connection_the_server_closed_is_refused() -> None:
    import psycopg

    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as conn:
        check_pooled_connection(conn)
        _terminate(conn.info.backend_pid)
        time.sleep(0.3)  # the server's closing message reaches the socket
        with pytest.raises(psycopg.OperationalError):
            check_pooled_connection(conn)


def test_the_pool_replaces_a_connection_the_server_closed_at_checkout() -> None:
    wrapper = _pooled("pgpool_replaced")
    try:
        assert wrapper.pool._check is check_pooled_connection  # not Django's round trip per checkout
        wrapper.ensure_connection()
        first = wrapper.connection.info.backend_pid
        wrapper.close()  # back to the pool
        _terminate(first)
        time.sleep(0.3)

        wrapper.ensure_connection()  # no error for the request: the dead one was dropped at checkout

        assert wrapper.connection.info.backend_pid != first
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
    finally:
        wrapper.close()
        wrapper.close_pool()
