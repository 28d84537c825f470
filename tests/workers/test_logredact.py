"""What the log filter masks (workers/logredact.py): every kind of secret the portal issues, in any record of a
process that installed it, and nothing else."""

from __future__ import annotations

import io
import logging

import pytest

from workers.logredact import mask_handlers, redact

SECRETS = [
    "gpp_AbCdEf0123_" + "x" * 43,  # personal API token (apps/accounts/tokens.py)
    "gpn_AbCdEf0123_" + "y" * 43,  # node token
    "gpb_AbCdEf0123_" + "z" * 43,  # Slurm bridge token (apps/pools/services.py)
    "whsec_" + "Q2xY+/9a" * 5 + "ab==",  # webhook signing secret (apps/events/secrets.py)
]


@pytest.mark.parametrize("secret", SECRETS)
def test_each_kind_of_secret_is_masked(secret: str) -> None:
    out = redact(f"sent {secret} to the portal")
    assert secret not in out
    assert out == f"sent {secret.split('_')[0]}_[redacted] to the portal"


def test_authorization_headers_are_masked_whatever_the_token() -> None:
    out = redact("{'Authorization': 'Bearer s3cr3t-opaque'} and authorization: Node n0de-s3cr3t")
    assert "s3cr3t" not in out
    assert out.count("[redacted]") == 2


def test_ordinary_text_is_left_alone() -> None:
    text = "job 42 on gpu GPU-1a2b (gpp_ prefix shown in the settings page; whsec_ short)"
    assert redact(text) == text


def test_mask_handlers_covers_records_passed_up_from_child_loggers() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    parent = logging.getLogger("logredact-test")
    parent.addHandler(handler)
    parent.setLevel(logging.INFO)
    try:
        mask_handlers(parent)
        mask_handlers(parent)  # idempotent: one filter per handler
        assert len(handler.filters) == 1
        logging.getLogger("logredact-test.child").info("token %s", SECRETS[2])
        assert SECRETS[2] not in stream.getvalue() and "gpb_[redacted]" in stream.getvalue()
    finally:
        parent.removeHandler(handler)
