"""One Redis setting, spelled for each client.

Celery (kombu) and channels-redis spell a unix socket differently (`redis+socket:///path` vs `unix:///path`),
and redis-py's `from_url` wants `unix:///path`. Everything derives from the single `REDIS_URL` so they never
point at different servers.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlparse


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is: either a unix socket path or host/port, plus the database number and password."""

    socket_path: str | None
    host: str
    port: int
    db: int
    password: str | None
    tls: bool

    @classmethod
    def parse(cls, url: str) -> RedisTarget:
        parsed = urlparse(url)
        scheme = parsed.scheme
        query = parse_qs(parsed.query)
        db = int(query.get("db", ["0"])[0])
        if scheme in {"unix", "redis+socket", "socket"}:
            return cls(parsed.path, "", 0, db, parsed.password, False)
        if scheme not in {"redis", "rediss"}:
            raise ValueError(f"REDIS_URL must be redis://, rediss:// or unix://, got {url!r}")
        path_db = parsed.path.lstrip("/")
        if path_db:
            db = int(path_db)
        return cls(None, parsed.hostname or "127.0.0.1", parsed.port or 6379, db, parsed.password, scheme == "rediss")

    def _auth(self) -> str:
        return f":{self.password}@" if self.password else ""

    @property
    def redis_py_url(self) -> str:
        """For redis-py (`Redis.from_url`) and Django's RedisCache."""
        if self.socket_path:
            return f"unix://{self._auth()}{self.socket_path}?db={self.db}"
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{self._auth()}{self.host}:{self.port}/{self.db}"

    @property
    def celery_url(self) -> str:
        """For Celery's broker and result backend (kombu's spelling of a unix socket)."""
        if self.socket_path:
            return f"redis+socket://{self._auth()}{self.socket_path}?virtual_host={self.db}"
        return self.redis_py_url

    @property
    def channels_host(self) -> dict[str, object]:
        """For channels-redis's `hosts` entry (redis-py connection kwargs)."""
        if self.socket_path:
            return {"address": f"unix://{self.socket_path}?db={self.db}"}
        return {"address": self.redis_py_url}
