#!/usr/bin/env bash
# The whole test suite: lint, format check, type check, then every test.
# Extra arguments go to pytest (e.g. -k bind, -x).
source "$(dirname "$0")/bootstrap.sh"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/pytest "$@"
