"""LOG_LEVEL governs Django's own loggers too: a refused request (4xx) is a warning from `django.request`, which
went to stderr even with LOG_LEVEL=ERROR (Django's default configuration gave "django" level INFO, and the root's
level does not filter records that propagate to its handler), and was printed twice with DEBUG on.

Each case runs in a fresh interpreter: logging is configured once, at start-up, from the environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

# A real 4xx through the test client: Django logs "Not Found: /api/v1/nope/" as a warning of django.request.
SCRIPT = """
import django
django.setup()
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
response = Client().get("/api/v1/nope/")
print("STATUS", response.status_code, flush=True)
"""


def _run(**env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings", **env}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, env=full, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("debug", ["0", "1"])
def test_error_level_silences_4xx_warnings(debug: str) -> None:
    result = _run(LOG_LEVEL="ERROR", DEBUG=debug)
    assert "STATUS 404" in result.stdout, result.stdout + result.stderr
    assert "Not Found" not in result.stderr, result.stderr


@pytest.mark.parametrize("debug", ["0", "1"])
def test_default_level_logs_4xx_once(debug: str) -> None:
    result = _run(LOG_LEVEL="INFO", DEBUG=debug)
    assert "STATUS 404" in result.stdout, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if "Not Found: /api/v1/nope/" in line]
    assert len(lines) == 1, result.stderr
    assert "WARNING django.request" in lines[0]
