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
# mypy's cache kept beside the user's other caches: a fresh clone (CI's) checks only what
# differs from the last run (mypy compares each file's hash when its time differs), 36 s -> a few.
.venv/bin/mypy --cache-dir "${GAS_MYPY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gas-mypy}"
exec .venv/bin/pytest -n "${GAS_TEST_WORKERS:-2}" --dist loadfile "$@"
