"""The agent's link sends its recent job reports again when the broker comes back empty.

A real redis-server of the test's own (tests/support/private_services.PrivateRedis, no persistence) is killed and
started again: what sat in the `control` list is gone, as after a real Redis restart without a volume. Nothing
consumes `control` here, so the list shows exactly what the link published, in order.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.support.private_services import PrivateRedis
from workers.transport import CONTROL_QUEUE, PortalLink, make_celery, make_stream_client

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    with PrivateRedis() as private:
        yield private


def _link(server: PrivateRedis, **options: Any) -> PortalLink:
    url = server.url(0)
    link = PortalLink(make_celery(url, "n1"), node="n1", token="gpn_test", stream=make_stream_client(url), **options)
    link.start()
    return link


def _published(server: PrivateRedis) -> list[tuple[str, Any]]:
    """(task, its JSON argument) of every message waiting in `control`, oldest first (kombu LPUSHes)."""
    r = redis.Redis.from_url(server.url(0))
    out = []
    for raw in reversed(r.lrange(CONTROL_QUEUE, 0, -1)):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        # The node token is in the body, not repeated in the headers (broker monitors show headers).
        assert args[0]["token"] == "gpn_test" and "gpn_test" not in json.dumps(message["headers"])
        out.append((message["headers"]["task"], args[0]))
    return out


def _wait(what: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(0.05)


def _logs(job_id: int, first: int, *texts: str) -> dict[str, Any]:
    lines = [["stdout", text, 1.0] for text in texts]
    return {"batches": [{"job_id": job_id, "epoch": "e1", "first": first, "lines": lines}]}


def _reports(server: PrivateRedis) -> list[tuple[str, Any]]:
    return [(task, body.get("job_id") or body["batches"][0]["first"]) for task, body in _published(server)]


def test_reports_lost_with_the_broker_are_sent_again_after_it_fails(server: PrivateRedis) -> None:
    link = _link(server)
    try:
        link.send("jobs.report_started", {"job_id": 7, "handle": "pid:1", "at": 1.0})
        link.send("jobs.report_logs", _logs(7, 1, "start 7"))
        link.send("fleet.heartbeat", {"holds": []}, expires=15, critical=False)
        _wait(lambda: len(_published(server)) == 3, 10, "the three messages reach the broker")

        server.stop()  # the portal never took them: they die with this Redis
        link.send("jobs.report_logs", _logs(7, 2, "during"))  # fails, and waits
        _wait(lambda: link.stats.failures > 0, 10, "the link notices the outage")
        server.start()

        _wait(lambda: len(_published(server)) >= 3, 15, "the link sends again after the restart")
        time.sleep(0.5)
        assert _reports(server) == [("jobs.report_started", 7), ("jobs.report_logs", 1), ("jobs.report_logs", 2)]
        assert link.stats.replays == 1 and link.stats.replayed == 2  # not the heartbeat: it is sent anew anyway
    finally:
        link.stop()


def test_a_restart_between_two_sends_is_noticed_by_the_broker_run_id(server: PrivateRedis) -> None:
    link = _link(server, broker_check_s=0.2)
    try:
        link.send("jobs.report_logs", _logs(3, 1, "a", "b"))
        link.send("jobs.report_exit", {"job_id": 3, "state": "succeeded", "log_total": 2})
        _wait(lambda: len(_published(server)) == 2, 10, "the reports reach the broker")
        time.sleep(0.5)  # the link has learnt this Redis's run_id

        server.stop()  # quickly, while the link has nothing to send: no send ever fails
        server.start()  # empty: the reports are gone until the link sends them again

        _wait(lambda: len(_published(server)) == 2, 10, "the link notices the new run_id and sends again")
        assert _reports(server) == [("jobs.report_logs", 1), ("jobs.report_exit", 3)]
        assert link.stats.failures == 0 and link.stats.replays == 1
    finally:
        link.stop()


def test_only_recent_reports_within_the_bounds_are_kept(server: PrivateRedis) -> None:
    link = _link(server, replay_window_s=1.0, replay_max_weight=3_000)
    try:
        link.send("jobs.report_logs", _logs(1, 1, "old"))
        _wait(lambda: len(_published(server)) == 1, 10, "sent")
        time.sleep(1.2)  # out of the window
        link.send("jobs.report_logs", _logs(2, 1, "x" * 2_000))
        link.send("jobs.report_logs", _logs(3, 1, "y" * 2_000))  # over the weight bound: the first of these goes
        _wait(lambda: len(_published(server)) == 3 and link.stats.sent == 3, 10, "sent")
        assert link.replay() == 1
        _wait(lambda: len(_published(server)) == 4, 10, "sent again")
        assert [body["batches"][0]["job_id"] for _task, body in _published(server)] == [1, 2, 3, 3]
    finally:
        link.stop()
