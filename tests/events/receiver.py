"""A webhook receiver on 127.0.0.1 that verifies every request with the `standardwebhooks` reference library and
misbehaves on purpose: the first attempt of each message gets a 500, the second attempt of every third message
is held past the sender's timeout, and `hold_next()` holds the next request until `release()` (to kill the sender
while a delivery is in flight)."""

from __future__ import annotations

import json
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass(frozen=True)
class Received:
    webhook_id: str
    event: dict[str, Any]
    attempt: int
    answered: int


class Receiver:
    def __init__(self, *, slow_s: float = 0.0) -> None:
        self.secret = ""
        self.slow_s = slow_s
        self.received: list[Received] = []
        self.rejected: list[str] = []
        self.lock = threading.Lock()
        self._attempts: dict[str, int] = {}
        self._hold = threading.Event()
        self.holding = threading.Event()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                status = receiver.handle(body, {k.lower(): v for k, v in self.headers.items()})
                try:
                    self.send_response(status)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender gave up (timeout) or died

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def hold_next(self) -> None:
        self._release.clear()
        self.holding.clear()
        self._hold.set()

    def release(self) -> None:
        self._release.set()

    def handle(self, body: bytes, headers: dict[str, str]) -> int:
        try:
            Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError as exc:
            with self.lock:
                self.rejected.append(f"{headers.get('webhook-id')}: {exc}")
            return 400
        msg_id = headers["webhook-id"]
        with self.lock:
            attempt = self._attempts[msg_id] = self._attempts.get(msg_id, 0) + 1
            held = self._hold.is_set()
            self._hold.clear()
        if held:
            self.holding.set()
            self._release.wait(60)
            answer = 500
        elif attempt == 1:
            answer = 500
        elif attempt == 2 and zlib.crc32(msg_id.encode()) % 3 == 0 and self.slow_s:
            time.sleep(self.slow_s)  # past the sender's timeout: it records a failure and tries again
            answer = 200
        else:
            answer = 200
        with self.lock:
            self.received.append(Received(msg_id, json.loads(body), attempt, answer))
        return answer

    def stop(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
