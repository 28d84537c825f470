"""What the agent remembers across restarts: the GPU holds the portal sent (`agent.hold_gpus`).

A hold says "this GPU belongs to team T under reservation R until U". The job runtime (workers/agent_jobs.py)
reads them to refuse or tag work; the agent keeps them in memory and in a small JSON file written atomically
(write to a temporary file, fsync, rename), so a restarted agent knows them before the portal resends.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MAX_HOLDS = 10_000


@dataclass(frozen=True)
class Hold:
    """One GPU held for a team under a reservation until `until` (UTC)."""

    gpu_uuid: str
    team: str
    reservation_id: int
    until: datetime

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["until"] = self.until.isoformat()
        return d


def parse_hold(raw: Any) -> Hold:
    """A hold from its JSON form; ValueError says what is wrong."""
    if not isinstance(raw, dict):
        raise ValueError("a hold is an object")
    uuid, team, rid, until = raw.get("gpu_uuid"), raw.get("team"), raw.get("reservation_id"), raw.get("until")
    if not isinstance(uuid, str) or not 0 < len(uuid) <= 96:
        raise ValueError("gpu_uuid must be a string of 1-96 characters")
    if not isinstance(team, str) or not 0 < len(team) <= 100:
        raise ValueError("team must be a string of 1-100 characters")
    if not isinstance(rid, int) or isinstance(rid, bool) or rid < 0:
        raise ValueError("reservation_id must be a non-negative integer")
    if not isinstance(until, str):
        raise ValueError("until must be an ISO 8601 string")
    when = datetime.fromisoformat(until.replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError("until must carry a UTC offset")
    return Hold(gpu_uuid=uuid, team=team, reservation_id=rid, until=when.astimezone(UTC))


class HoldStore:
    """Thread-safe set of holds keyed by (gpu_uuid, reservation_id), mirrored to `path` when given."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._holds: dict[tuple[str, int], Hold] = {}
        if path is not None and path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            for raw in doc.get("holds", []):
                hold = parse_hold(raw)
                self._holds[(hold.gpu_uuid, hold.reservation_id)] = hold
        except (OSError, ValueError, AttributeError) as exc:
            logger.warning("ignoring unreadable hold state %s: %s", path, exc)

    def apply(self, holds: list[Hold], *, replace: bool = False, now: datetime | None = None) -> int:
        """Add or update holds (all of them instead of the current set when `replace`); drop expired ones.
        Returns how many holds are active afterwards."""
        now = now or datetime.now(UTC)
        with self._lock:
            current = {} if replace else dict(self._holds)
            for hold in holds:
                current[(hold.gpu_uuid, hold.reservation_id)] = hold
            current = {k: h for k, h in current.items() if h.until > now}
            if len(current) > MAX_HOLDS:
                raise ValueError(f"more than {MAX_HOLDS} holds")
            self._holds = current
            self._save()
            return len(current)

    def active(self, *, now: datetime | None = None) -> list[Hold]:
        now = now or datetime.now(UTC)
        with self._lock:
            return sorted((h for h in self._holds.values() if h.until > now), key=lambda h: (h.gpu_uuid, h.until))

    def for_gpu(self, gpu_uuid: str, *, now: datetime | None = None) -> list[Hold]:
        return [h for h in self.active(now=now) if h.gpu_uuid == gpu_uuid]

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"holds": [h.to_json() for h in self._holds.values()]}
        fd, tmp = tempfile.mkstemp(prefix=".holds-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(doc, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
