"""portal.pgbackend: a persistent connection (CONN_MAX_AGE with CONN_HEALTH_CHECKS: the worker, the scheduler) is
checked before a task or scheduler pass without a round trip, and one the server closed is replaced; a pooled
connection the server closed is replaced at checkout (psycopg_pool's own check)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connections

from portal.pgbackend.base import DatabaseWrapper

pytestmark = pytest.mark.django_db(transaction=True)


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


def test_the_pool_replaces_a_connection_the_server_closed_at_checkout() -> None:
    wrapper = _pooled("pgbackend_replaced")
    try:
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


def _persistent(alias: str) -> DatabaseWrapper:
    default = connections["default"].settings_dict
    options = {k: v for k, v in default["OPTIONS"].items() if k != "pool"}
    settings_dict = {**default, "OPTIONS": options, "CONN_MAX_AGE": 600, "CONN_HEALTH_CHECKS": True}
    return DatabaseWrapper(settings_dict, alias=alias)


def _statements(wrapper: DatabaseWrapper) -> list[str]:
    """Every statement the connection sends from now on, through psycopg itself (below Django's wrappers)."""
    sent: list[str] = []
    conn: Any = wrapper.connection
    original = conn.execute
    original_cursor = conn.cursor

    def execute(query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return original(query, *args, **kwargs)

    def cursor(*args: Any, **kwargs: Any) -> Any:
        cur = original_cursor(*args, **kwargs)
        cur_execute = cur.execute

        def cursor_execute(query: Any, *a: Any, **kw: Any) -> Any:
            sent.append(str(query))
            return cur_execute(query, *a, **kw)

        cur.execute = cursor_execute
        return cur

    conn.execute = execute
    conn.cursor = cursor
    return sent


def test_a_persistent_connection_is_reused_without_a_health_query() -> None:
    wrapper = _persistent("pgbackend_persistent")
    try:
        wrapper.ensure_connection()
        first = wrapper.connection.info.backend_pid
        sent = _statements(wrapper)

        wrapper.close_if_unusable_or_obsolete()  # what Django and Celery's fixup do before each request/task
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT 2")

        assert wrapper.connection.info.backend_pid == first
        assert sent == ["SELECT 2"]  # Django's own is_usable() would have sent SELECT 1 first
    finally:
        wrapper.close()


def test_a_persistent_connection_the_server_closed_is_replaced_before_the_next_task() -> None:
    wrapper = _persistent("pgbackend_persistent_replaced")
    try:
        wrapper.ensure_connection()
        first = wrapper.connection.info.backend_pid
        _terminate(first)
        time.sleep(0.3)  # the server's closing message reaches the socket

        wrapper.close_if_unusable_or_obsolete()
        with wrapper.cursor() as cursor:  # no error: the health check saw the dead session and reconnected
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)

        assert wrapper.connection.info.backend_pid != first
    finally:
        wrapper.close()
