# GPU Portal: `make run` runs the whole portal on this machine; `make test` runs the test suite.
# Both set up what they need first (virtualenv, pinned packages, front-end build); later runs reuse it.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: run test setup lint typecheck migrations-check pytest system-deps bench clean
.DEFAULT_GOAL := run

$(VENV)/.installed: requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "GPU Portal needs Python 3.11 (found %s)" % sys.version.split()[0]'
	@scripts/ensure-system-packages.sh --build
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

frontend/node_modules/.package-lock.json: frontend/package-lock.json
	cd frontend && npm ci --no-audit --no-fund --loglevel=error

FRONTEND_SRC := $(shell find frontend/src -type f 2>/dev/null) frontend/build.mjs
frontend/dist/.built: frontend/node_modules/.package-lock.json $(FRONTEND_SRC)
	cd frontend && npm run --silent build
	touch $@

setup: $(VENV)/.installed frontend/dist/.built

run: setup
	$(PY) -m portal.launcher --port $(PORT)

# System packages the integration tests use (dockerd, busybox for the test image, chromium for browser tests).
system-deps:
	@scripts/ensure-system-packages.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy portal apps workers cli

migrations-check: setup
	$(PY) manage.py makemigrations --check --dry-run

pytest: setup
	$(PY) scripts/with_services.py $(VENV)/bin/pytest $(PYTEST_ARGS)

test: setup system-deps lint typecheck migrations-check pytest

bench: setup
	@echo "Benchmarks are in bench/ (see docs/benchmarks.md); run each alone on a quiet machine."

clean:
	rm -rf $(VENV) frontend/node_modules frontend/dist var
