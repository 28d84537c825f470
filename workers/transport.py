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

logger = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
CONTROL_QUEUE = "control"
COMMAND_VERSION = 1
COMMAND_MAX_AGE_S = 600.0
TELEMETRY_EXPIRES_S = 10.0
TELEMETRY_BACKLOG = 5  # telemetry messages kept while the broker is unreachable
TELEMETRY_STREAM = "fleet:ingest"  # apps.telemetry.keys.INGEST_STREAM
TELEMETRY_STREAM_MAXLEN = 20_000


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
    """A redis-py client for the telemetry stream, on the broker's Redis."""
    import redis

    return redis.Redis.from_url(redis_url_for(broker_url), socket_connect_timeout=5, socket_timeout=5)


def make_celery(broker_url: str, node: str) -> Celery:
    """The agent's own Celery app: same broker as the portal, JSON only, no result backend."""
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
        broker_transport_options={"socket_timeout": 10, "socket_connect_timeout": 5, "visibility_timeout": 3600},
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


@dataclass
class _Outgoing:
    task: str
    payload: dict[str, Any]
    expires: float | None
    critical: bool


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
    ) -> None:
        self.app = app
        self.stream = stream  # a redis-py client: telemetry goes to the stream; None: as Celery tasks
        self.node = node
        self.token = token
        self.stats = LinkStats()
        self._telemetry: collections.deque[_Outgoing] = collections.deque(maxlen=telemetry_backlog)
        self._control: collections.deque[_Outgoing] = collections.deque()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def envelope(self, **body: Any) -> dict[str, Any]:
        return {"node": self.node, "token": self.token, "ts": round(time.time(), 3), **body}

    def send(self, task: str, body: dict[str, Any], *, expires: float | None = None, critical: bool = True) -> None:
        """Queue a control message (`critical`: kept until sent; else dropped after one failed attempt)."""
        item = _Outgoing(task, self.envelope(**body), expires, critical)
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
            return self._control.popleft() if self._control else self._telemetry.popleft()

    def _run(self) -> None:
        while not self._stop.is_set():
            item = self._next()
            if item is None:
                return
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
                self.app.send_task(
                    item.task,
                    args=[item.payload],
                    queue=CONTROL_QUEUE,
                    expires=item.expires,
                    ignore_result=True,
                    retry=True,
                    retry_policy={"max_retries": 1, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1},
                )
            except Exception as exc:  # broker unreachable: keep what matters, drop samples, try again shortly
                self.stats.failures += 1
                if not self._failing:
                    logger.warning("sending to the portal failed (%r); retrying", exc)
                    self._failing = True
                if item.critical:
                    with self._cond:
                        self._control.appendleft(item)
                self._stop.wait(1.0)
                continue
            self._recovered()
            self.stats.sent += 1

    def _recovered(self) -> None:
        if self._failing:
            logger.info("sending to the portal works again")
            self._failing = False
