"""Webhook signing secrets: made, encrypted at rest and read back for signing.

The portal must sign with the secret, so it cannot keep only a hash; it keeps it encrypted with a key derived
from SECRET_KEY, so a database dump alone does not reveal it. Changing SECRET_KEY means rotating every secret."""

from __future__ import annotations

import base64
import hashlib
import secrets

from cryptography.fernet import Fernet
from django.conf import settings

PREFIX = "whsec_"


def _fernet() -> Fernet:
    digest = hashlib.sha256(b"portal.events.webhook-secret:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def new_secret() -> str:
    """A fresh `whsec_` secret: 32 random bytes, base64, as Standard Webhooks specifies."""
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def encrypt(secret: str) -> str:
    return _fernet().encrypt(secret.encode()).decode()


def decrypt(token: str) -> str:
    return _fernet().decrypt(token.encode()).decode()
