"""How the node agent talks to the portal: Celery messages through the broker, nothing else. No Django here.

Agent -> portal: Celery tasks by name on queue `control` (consumed by the portal's worker), each with one JSON
object argument carrying `node` and `token`:

- `fleet.register`: at start, then every `register_every_s` (idempotent); gpus [{uuid, index, model, name,
  memory_mib, mig_mode}], agent_version, driver_version, hostname, backend. No expiry.
- `fleet.heartbeat`: every `heartbeat_s` (5 s); agent_version, holds. Expires after 3 heartbeats.
- telemetry: every second, workers.gpu.base.build_message (type, v, seq, f, g) plus node and token. By default
  appended to the Redis stream `fleet:ingest` (XADD, field "m", MAXLEN ~ 20000), which the portal's ingest
  consumers read in batches: Celery's per-message overhead is most of the cost at fleet scale (see
  apps/telemetry/stream.py and bench/fleet_ingest.py). With `telemetry_via="celery"` it is the task
  `telemetry.ingest` instead, expiring after TELEMETRY_EXPIRES_S (10 s). Either way a backlog after an outage is
  dropped, not replayed.
- `fleet.probe_result`: after a probe; gpu_uuid, result (torch_probe JSON) or error. No expiry.

Portal -> agent: tasks on the node's own queue `node.<name>`, signed by the portal with HMAC-SHA256 keyed by the
SHA-256 of the node token (see apps/fleet/commands.py); `verify_command` checks them.

One sender thread (`PortalLink`) publishes everything, so a slow or absent broker never stalls the 1 Hz sampler:
telemetry waits in a short queue and the oldest is dropped when it is full (a sample is worth a second), while
registration and probe results wait until they are sent.

Job reports are sent again after a broker outage. A message the broker accepted is not yet one the portal has
processed: it may still wait in the `control` list, or sit prefetched in a portal worker, and a Redis that restarts
without persistence (or a worker whose connection drops, which discards what it prefetched) loses it. There is no
acknowledgement from the portal to the agent, so the link keeps the job reports it sent in the last
REPLAY_WINDOW_S (bounded by REPLAY_MAX_WEIGHT characters) and publishes them once more, in their order, when the
broker comes back after failing or when its `run_id` changes (a restart the link did not see fail). Every job
report is idempotent on the portal (log lines are placed by the agent's own numbering), so a second copy of one
that did arrive changes nothing.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlparse

from celery import Celery

from workers.internals import celery_wire

logger = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
CONTROL_QUEUE = "control"
COMMAND_VERSION = 1
COMMAND_MAX_AGE_S = 600.0
TELEMETRY_EXPIRES_S = 10.0
TELEMETRY_BACKLOG = 5  # telemetry messages kept while the broker is unreachable
TELEMETRY_STREAM = "fleet:ingest"  # apps.telemetry.keys.INGEST_STREAM
TELEMETRY_STREAM_MAXLEN = 20_000
# Job reports sent again after a broker outage (see above): the portal applies each idempotently.
REPLAY_TASKS = frozenset({"jobs.report_started", "jobs.report_logs", "jobs.report_exit"})
REPLAY_WINDOW_S = 60.0  # longer than a healthy control queue's backlog; older ones were processed long ago
REPLAY_MAX_WEIGHT = 8_000_000  # about the characters of log text kept for replay (~16 MB of Python strings)
BROKER_CHECK_S = 5.0  # how often the link asks Redis for its run_id


def node_queue(node: str) -> str:
    return f"node.{node}"


def broker_url_for(url: str) -> str:
    """Celery's spelling of a Redis URL: kombu wants `redis+socket://PATH?virtual_host=DB` for a unix socket, where
    redis-py (and the portal's REDIS_URL) say `unix://PATH?db=DB`."""
    parsed = urlparse(url)
    if parsed.scheme in {"unix", "socket"}:
        db = parse_qs(parsed.query).get("db", ["0"])[0]
        auth = f":{parsed.password}@" if parsed.password else ""
        return f"redis+socket://{auth}{parsed.path}?virtual_host={db}"
    return url


def redis_url_for(url: str) -> str:
    """redis-py's spelling of the broker URL (the inverse of broker_url_for for unix sockets)."""
    parsed = urlparse(url)
    if parsed.scheme == "redis+socket":
        db = parse_qs(parsed.query).get("virtual_host", ["0"])[0]
        auth = f":{parsed.password}@" if parsed.password else ""
        return f"unix://{auth}{parsed.path}?db={db}"
    return url


def make_stream_client(broker_url: str) -> Any:
    """A redis-py client on the broker's Redis: the telemetry stream, the job reports (celery_wire), the pings.

    One quick retry, as the link's sends through Celery had: the link itself keeps what failed and tries again
    every second, so redis-py's default backoff (up to ~7 s over three retries) would only hold the thread."""
    import redis
    from redis.backoff import ConstantBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        redis_url_for(broker_url), socket_connect_timeout=5, socket_timeout=5, retry=Retry(ConstantBackoff(0.2), 1)
    )


def make_celery(broker_url: str, node: str) -> Celery:
    """The agent's own Celery app: same broker as the portal, JSON only, no result backend."""
    from workers.internals.kombu_clients import reuse_redis_clients

    reuse_redis_clients()
    app = Celery(f"gpuportal-agent-{node}", broker=broker_url_for(broker_url), set_as_current=True)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_backend=None,
        task_ignore_result=True,
        task_default_queue=node_queue(node),
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        # No ack emulation: kombu would record every received command in the broker's `unacked` hash and remove
        # it at the ack (two MULTI/EXEC round trips per message), to redeliver it after visibility_timeout if the
        # agent died in between. Commands are acked on receipt (task_acks_late=False) and refused when stale, and
        # the portal resends a launch nobody acknowledged, so that redelivery an hour later would only be refused.
        broker_transport_options={
            "socket_timeout": 10,
            "socket_connect_timeout": 5,
            "visibility_timeout": 3600,
            "ack_emulation": False,
        },
        task_time_limit=900,
    )
    return app


# --- Portal -> agent commands --------------------------------------------------------------------------------


class CommandRejected(Exception):
    """A command this agent refuses (not for this node, bad signature, too old)."""


def token_key(token: str) -> bytes:
    """The HMAC key of commands: the SHA-256 hex digest of the node token, as the portal stores it."""
    return hashlib.sha256(token.encode()).hexdigest().encode()


def canonical(node: str, task: str, ts: float, body: dict[str, Any]) -> bytes:
    """The signed bytes; must match apps.fleet.commands.canonical."""
    return json.dumps(
        {"v": COMMAND_VERSION, "node": node, "task": task, "ts": ts, "body": body},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()


def sign_command(*, node: str, token: str, task: str, body: dict[str, Any], ts: float | None = None) -> dict[str, Any]:
    """A signed command envelope (the portal signs its own; tests and tools use this)."""
    ts = round(time.time() if ts is None else ts, 3)
    sig = hmac.new(token_key(token), canonical(node, task, ts, body), hashlib.sha256).hexdigest()
    return {"v": COMMAND_VERSION, "node": node, "task": task, "ts": ts, "body": body, "sig": sig}


def verify_command(
    envelope: Any, *, node: str, token: str, task: str, now: float | None = None, max_age_s: float = COMMAND_MAX_AGE_S
) -> dict[str, Any]:
    """The body of a command signed for this node and task, or CommandRejected."""
    if not isinstance(envelope, dict) or envelope.get("v") != COMMAND_VERSION:
        raise CommandRejected("not a v1 command envelope")
    if envelope.get("node") != node or envelope.get("task") != task:
        raise CommandRejected(f"command for {envelope.get('node')!r}/{envelope.get('task')!r}, not {node}/{task}")
    body, ts, sig = envelope.get("body"), envelope.get("ts"), envelope.get("sig")
    if not isinstance(body, dict) or not isinstance(ts, int | float) or not isinstance(sig, str):
        raise CommandRejected("malformed command envelope")
    expected = hmac.new(token_key(token), canonical(node, task, ts, body), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, sig):
        raise CommandRejected("bad signature")
    now = time.time() if now is None else now
    if abs(now - ts) > max_age_s:
        raise CommandRejected(f"command is {now - ts:.0f} s old")
    return body


# --- Agent -> portal --------------------------------------------------------------------------------------------


@dataclass
class LinkStats:
    sent: int = 0
    failures: int = 0
    dropped_telemetry: int = 0
    replays: int = 0  # times the recent job reports were sent again
    replayed: int = 0  # messages sent again


@dataclass
class _Outgoing:
    task: str
    payload: dict[str, Any]
    expires: float | None
    critical: bool
    weight: int = 0  # > 0: kept after sending, for replay (see REPLAY_TASKS)


def _replay_weight(task: str, body: dict[str, Any]) -> int:
    """How much a job report costs to keep for replay: its log text, or a flat 200 for the small reports."""
    if task not in REPLAY_TASKS:
        return 0
    if task != "jobs.report_logs":
        return 200
    total = 0
    for batch in body.get("batches") or ():
        for line in batch.get("lines") or ():
            total += 40 + (len(line[1]) if len(line) > 1 and isinstance(line[1], str) else 0)
    return max(total, 200)


class PortalLink:
    """Publishes the agent's messages to queue `control` from one thread."""

    def __init__(
        self,
        app: Celery,
        *,
        node: str,
        token: str,
        telemetry_backlog: int = TELEMETRY_BACKLOG,
        stream: Any | None = None,
        broker: Any | None = None,
        replay_window_s: float = REPLAY_WINDOW_S,
        replay_max_weight: int = REPLAY_MAX_WEIGHT,
        broker_check_s: float = BROKER_CHECK_S,
    ) -> None:
        self.app = app
        self.stream = stream  # a redis-py client: telemetry goes to the stream; None: as Celery tasks
        # A redis-py client on the broker, asked for its run_id (None: restarts are noticed only by failures).
        self.broker = broker if broker is not None else stream
        self.node = node
        self.token = token
        self.stats = LinkStats()
        self._telemetry: collections.deque[_Outgoing] = collections.deque(maxlen=telemetry_backlog)
        self._control: collections.deque[_Outgoing] = collections.deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        # Job reports sent in the last replay_window_s: (monotonic time sent, message), oldest first.
        self._sent: collections.deque[tuple[float, _Outgoing]] = collections.deque()
        self._sent_weight = 0
        self.replay_window_s = replay_window_s
        self.replay_max_weight = replay_max_weight
        self.broker_check_s = broker_check_s
        self._broker_id: str | None = None
        self._broker_checked = 0.0

    def envelope(self, **body: Any) -> dict[str, Any]:
        return {"node": self.node, "token": self.token, "ts": round(time.time(), 3), **body}

    def send(self, task: str, body: dict[str, Any], *, expires: float | None = None, critical: bool = True) -> None:
        """Queue a control message (`critical`: kept until sent; else dropped after one failed attempt)."""
        item = _Outgoing(task, self.envelope(**body), expires, critical, _replay_weight(task, body))
        with self._cond:
            self._control.append(item)
            self._cond.notify()

    def telemetry(self, message: dict[str, Any]) -> None:
        """The sampler's `send`: never blocks; when the backlog is full the oldest sample goes."""
        item = _Outgoing("telemetry.ingest", {**message, "token": self.token}, TELEMETRY_EXPIRES_S, False)
        with self._cond:
            if len(self._telemetry) == self._telemetry.maxlen:
                self.stats.dropped_telemetry += 1
            self._telemetry.append(item)
            self._cond.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"portal-link-{self.node}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        """Stop after sending what is queued (for at most `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._cond:
                if not self._control and not self._telemetry:
                    break
            time.sleep(0.05)
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def pending(self) -> int:
        with self._cond:
            return len(self._control) + len(self._telemetry)

    def _next(self) -> _Outgoing | None:
        with self._cond:
            while not self._control and not self._telemetry:
                if self._stop.is_set():
                    return None
                self._cond.wait(1.0)
                if self._broker_check_due():
                    return _CHECK
            return self._control.popleft() if self._control else self._telemetry.popleft()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._broker_check_due():
                self._check_broker()
            item = self._next()
            if item is _CHECK:
                continue
            if item is None:
                return
            if self._failing and self.broker is not None:
                # Ask Redis before sending: once it answers, the replayed reports go out ahead of this message.
                try:
                    self.broker.ping()
                except Exception:
                    self.stats.failures += 1
                    self._requeue(item)
                    self._stop.wait(1.0)
                    continue
                self._requeue(item, always=True)
                self._recovered()
                continue
            try:
                if item.task == "telemetry.ingest" and self.stream is not None:
                    self.stream.xadd(
                        TELEMETRY_STREAM,
                        {"m": json.dumps(item.payload, separators=(",", ":"))},
                        maxlen=TELEMETRY_STREAM_MAXLEN,
                        approximate=True,
                    )
                    self.stats.sent += 1
                    self._recovered()
                    continue
                if self.broker is not None:
                    # The bytes send_task would write, for a fraction of its CPU (workers/internals/celery_wire.py).
                    # Not a repr of the payload (it carries the node token) in the message headers.
                    celery_wire.publish(
                        self.broker,
                        item.task,
                        [item.payload],
                        queue=CONTROL_QUEUE,
                        expires_s=item.expires,
                        argsrepr=f"({item.task})",
                    )
                else:
                    self.app.send_task(
                        item.task,
                        args=[item.payload],
                        queue=CONTROL_QUEUE,
                        expires=item.expires,
                        ignore_result=True,
                        argsrepr=f"({item.task})",
                        kwargsrepr="{}",
                        retry=True,
                        retry_policy={"max_retries": 1, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1},
                    )
            except Exception as exc:  # broker unreachable: keep what matters, drop samples, try again shortly
                self.stats.failures += 1
                if not self._failing:
                    logger.warning("sending to the portal failed (%r); retrying", exc)
                    self._failing = True
                self._requeue(item)
                self._stop.wait(1.0)
                continue
            self._recovered()
            if item.weight:
                self._keep(item)
            self.stats.sent += 1  # after _keep: a sent report counts once it can be replayed

    def _requeue(self, item: _Outgoing, *, always: bool = False) -> None:
        """Put a message back at the head of its queue (only a critical one while the broker is away)."""
        if not (always or item.critical):
            return
        with self._cond:
            (self._telemetry if item.task == "telemetry.ingest" else self._control).appendleft(item)

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            replayed = self.replay()
            logger.info("sending to the portal works again; %d recent job reports sent again", replayed)
            self._broker_id = None  # the next check learns the (new) run_id without replaying twice
            self._broker_checked = 0.0

    # -- replay after an outage ---------------------------------------------------------------------------

    def _keep(self, item: _Outgoing) -> None:
        now = time.monotonic()
        with self._cond:
            self._sent.append((now, item))
            self._sent_weight += item.weight
            while self._sent and (
                self._sent[0][0] < now - self.replay_window_s or self._sent_weight > self.replay_max_weight
            ):
                self._sent_weight -= self._sent.popleft()[1].weight

    def replay(self) -> int:
        """Queue the job reports sent in the last replay_window_s again, ahead of what waits, in their order."""
        now = time.monotonic()
        with self._cond:
            items = [item for at, item in self._sent if at >= now - self.replay_window_s]
            self._sent.clear()
            self._sent_weight = 0
            self._control.extendleft(reversed(items))
            if items:
                self.stats.replays += 1
                self.stats.replayed += len(items)
                self._cond.notify()
        return len(items)

    def _broker_check_due(self) -> bool:
        return self.broker is not None and time.monotonic() - self._broker_checked >= self.broker_check_s

    def _check_broker(self) -> None:
        """Replay when Redis restarted between two sends (its run_id changed) without the link seeing it fail."""
        self._broker_checked = time.monotonic()
        if self._failing or self.broker is None:  # failing: the recovery replays, and learns the new run_id after
            return
        try:
            run_id = str(self.broker.info("server").get("run_id", ""))
        except Exception:  # down: the sends fail too, and recovering replays
            logger.debug("asking the broker for its run_id failed", exc_info=True)
            return
        if self._broker_id is not None and run_id != self._broker_id:
            replayed = self.replay()
            logger.warning("the broker restarted (run_id changed); %d recent job reports sent again", replayed)
        self._broker_id = run_id


_CHECK = _Outgoing("", {}, None, False)  # _next's answer when the broker check is due and nothing waits
