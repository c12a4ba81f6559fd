#!/usr/bin/env bash
# The whole test suite: lint, format check, type check, then every test.
# Extra arguments go to pytest (e.g. -k bind, -x). Test files run on GAS_TEST_WORKERS
# workers (default 2, one per core of the project's machines; 0 runs them in this process):
# most tests wait on processes and sockets, so two workers halve the suite's time. A file
# stays on one worker, so its module fixtures (one control plane per Kubernetes version, the
# one real node) start once.
source "$(dirname "$0")/bootstrap.sh"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/pytest -n "${GAS_TEST_WORKERS:-2}" --dist loadfile "$@"
