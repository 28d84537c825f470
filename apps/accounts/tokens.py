"""Token format and hashing. `gpp_<prefix>_<secret>`: the prefix finds the row, the SHA-256 of the whole
token proves it. Tokens are 256-bit random, so a fast hash is enough (no password-style stretching needed)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

PERSONAL_PREFIX = "gpp"


def generate(kind: str = PERSONAL_PREFIX) -> tuple[str, str, str]:
    """Returns (plaintext, prefix, digest)."""
    prefix = secrets.token_hex(5)
    plaintext = f"{kind}_{prefix}_{secrets.token_urlsafe(32)}"
    return plaintext, prefix, digest_of(plaintext)


def digest_of(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def split(plaintext: str) -> tuple[str, str] | None:
    """(kind, prefix) of a well-formed token, else None."""
    parts = plaintext.split("_", 2)
    if len(parts) != 3 or not parts[0] or len(parts[1]) != 10 or len(parts[2]) < 20:
        return None
    return parts[0], parts[1]


def matches(plaintext: str, digest: str) -> bool:
    return hmac.compare_digest(digest_of(plaintext), digest)
