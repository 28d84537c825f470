"""Production settings pass `manage.py check --deploy` with no warnings; demo data is refused there."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

PROD_ENV = {
    "PORTAL_PRODUCTION": "1",
    "SECRET_KEY": "k" * 20 + "Zq8#p2Lr0v!WmX5tYb7Nc9Hd3Jf6Gs1Ke4Ua",
    "ALLOWED_HOSTS": "gpu.example.org",
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **PROD_ENV}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_is_clean():
    result = _run("check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_demo_data():
    result = _run("load_demo")
    assert result.returncode != 0
    assert "refused" in result.stderr


def test_production_needs_a_secret_key():
    env = {**os.environ, "PORTAL_PRODUCTION": "1", "ALLOWED_HOSTS": "x"}
    env.pop("SECRET_KEY", None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr
