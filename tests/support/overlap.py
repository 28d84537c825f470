"""Two writes that overlap on purpose: the first holds its transaction open after its write, the second runs
meanwhile. A count-then-insert cap without a lock lets the second pass (it cannot see the first's uncommitted row);
with the lock the second waits for the first's commit, then sees the row. Parallel HTTP requests on this 2-core
machine rarely overlap inside that window, so this is the test that fails when the lock is missing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction


def second_write_while_first_is_open(first: Callable[[], Any], second: Callable[[], Any]) -> dict[str, Any]:
    """Run `first` in a transaction held open until `second`, in another thread, has run for 1 s or finished.
    Returns {"second_waited": bool, "second": result or exception}."""
    wrote, finish = threading.Event(), threading.Event()
    out: dict[str, Any] = {}
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                first()
                wrote.set()
                finish.wait(timeout=30)
        except BaseException as exc:  # surfaced below: a failure in the thread must fail the test
            errors.append(exc)
            wrote.set()
        finally:
            connection.close()

    def race() -> None:
        try:
            out["second"] = second()
        except Exception as exc:  # the refusal under test is an exception
            out["second"] = exc
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    wrote.wait(timeout=30)
    racer = threading.Thread(target=race)
    racer.start()
    racer.join(timeout=1.0)
    out["second_waited"] = racer.is_alive()
    finish.set()
    holder.join(timeout=30)
    racer.join(timeout=30)
    assert not errors, errors
    return out
