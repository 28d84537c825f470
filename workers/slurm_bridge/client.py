"""The bridge's side of the portal's bridge endpoints (apps/pools/api): JSON over HTTP with the pool's token."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class PortalUnavailable(RuntimeError):
    """The portal did not answer (or answered 5xx): try again on the next poll."""


class PortalRefused(RuntimeError):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('detail', body)}")
        self.status = status
        self.body = body


class PortalClient:
    def __init__(self, *, url: str, pool: str, token: str, timeout_s: float = 30) -> None:
        self.base = f"{url.rstrip('/')}/api/v1/pools/{pool}/bridge"
        self.token = token
        self.timeout_s = timeout_s

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if not self.base.startswith(("http://", "https://")):
            raise PortalUnavailable(f"not an http(s) URL: {self.base}")
        request = urllib.request.Request(  # noqa: S310 - http(s) checked above
            f"{self.base}/{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:  # noqa: S310 - the portal's URL
                return dict(json.loads(resp.read() or b"{}"))
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read() or b"{}")
            except ValueError:
                detail = {}
            if exc.code >= 500:
                raise PortalUnavailable(f"{exc.code}: {detail}") from exc
            raise PortalRefused(exc.code, detail if isinstance(detail, dict) else {}) from exc
        except (OSError, ValueError) as exc:
            raise PortalUnavailable(str(exc)) from exc

    def poll(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.post("poll/", body)

    def submitted(self, job_id: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.post(f"jobs/{job_id}/submitted/", body)

    def report(self, job_id: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.post(f"jobs/{job_id}/report/", body)

    def logs(self, job_id: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.post(f"jobs/{job_id}/logs/", body)
