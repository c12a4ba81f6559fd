#!/usr/bin/env bash
# The extender on the built-in demo cluster, HTTPS on https://127.0.0.1:9001 with a
# throwaway self-signed certificate. Extra arguments go to `gas serve`.
source "$(dirname "$0")/bootstrap.sh"
exec .venv/bin/gas serve --demo "$@"
