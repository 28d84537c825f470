"""The portal's REST API v1 as the client talks to it: a bearer token, retries within one time budget, and the
JSON error shape turned into one readable CliError."""

from __future__ import annotations

import re
import time
from typing import Any

import requests

from cli.exits import EXIT_PORTAL_ERROR, EXIT_REFUSED, EXIT_TIMEOUT, EXIT_UNREACHABLE, CliError

TIMEOUT_S = 30.0  # the longest one call to the portal may take, its retries included (--timeout)


class Client:
    """Talks to the portal's REST API v1 with a bearer token; turns the error shape into CliError."""

    def __init__(self, url: str, token: str, timeout: float = TIMEOUT_S) -> None:
        self.base = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json"})
        self.session.headers["User-Agent"] = "gpuportal-cli/1"
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        retries: int = 3,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Retries connection errors, 429 and 5xx (POSTs only with an Idempotency-Key, so never twice), all within
        `timeout` seconds (default: the client's): a portal that accepts connections but never answers is given
        up on then, with a one-line message."""
        idempotent = method in ("GET", "HEAD") or bool(headers and "Idempotency-Key" in headers)
        budget = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        attempt = 0

        def pause(seconds: float) -> bool:
            """Sleep before the next attempt, if the budget leaves time for one."""
            if time.monotonic() + seconds >= deadline:
                return False
            time.sleep(seconds)
            return True

        while True:
            attempt += 1
            left = max(0.1, deadline - time.monotonic())
            try:
                resp = self.session.request(
                    method, f"{self.base}/api/v1{path}", timeout=(left, left), headers=headers, **kwargs
                )
            except requests.Timeout as exc:
                raise CliError(
                    f"{self.base} did not answer within {budget:g} s ({method} {path}); see --timeout", EXIT_TIMEOUT
                ) from exc
            except requests.RequestException as exc:
                if idempotent and attempt <= retries and pause(min(2**attempt, 10)):
                    continue
                raise CliError(f"cannot reach {self.base}: {_reason(exc)}", EXIT_UNREACHABLE) from exc
            in_progress = resp.status_code == 409 and _code(resp) == "idempotency_in_progress"
            if in_progress and attempt <= retries + 5 and pause(1):
                continue
            retry = (resp.status_code == 429 or resp.status_code >= 500) and idempotent and attempt <= retries
            if retry and pause(_retry_after(resp, min(2**attempt, 10))):
                continue
            if resp.status_code >= 400:
                raise CliError(_error_text(resp), EXIT_REFUSED if resp.status_code < 500 else EXIT_PORTAL_ERROR)
            if resp.status_code == 204 or not resp.content:
                return None
            try:
                return resp.json()
            except ValueError as exc:
                raise CliError(f"{self.base} answered {method} {path} with something other than JSON") from exc


def _retry_after(resp: requests.Response, default: float) -> float:
    try:
        return float(resp.headers.get("Retry-After", default))
    except ValueError:
        return default


def _reason(exc: requests.RequestException) -> str:
    """The cause in a few words ("Connection refused"), not urllib3's nested repr."""
    text = str(exc)
    found = re.findall(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if found:
        return str(found[-1]).strip().rstrip(".")
    if "RemoteDisconnected" in text or "Connection aborted" in text:
        return "the connection was closed without an answer"
    return type(exc).__name__


def _code(resp: requests.Response) -> str:
    try:
        return str(resp.json().get("code", ""))
    except ValueError:
        return ""


def _error_text(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return f"HTTP {resp.status_code}: {resp.text[:300]}"
    if not isinstance(body, dict):
        return f"HTTP {resp.status_code}"
    text = f"{body.get('detail') or 'request refused'} ({body.get('code', resp.status_code)})"
    fields = body.get("fields") or {}
    for name, messages in fields.items():
        if isinstance(messages, list):
            text += f"\n  {name}: {'; '.join(str(m) for m in messages)}"
    return text
