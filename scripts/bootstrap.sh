# Sourced by the other scripts: a project-local virtualenv with gas and its test tools.
# Needs only Python 3.11+ and pip; installs nothing outside .venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.gas-installed
if [ ! -f "$stamp" ] || [ setup.py -nt "$stamp" ] || [ scripts/bootstrap.sh -nt "$stamp" ]; then
  # The distribution was named gas before it took a name of its own (PyPI's gas is another
  # project): a virtualenv made then drops it, so that one distribution owns the package.
  if .venv/bin/python -m pip show --quiet gas >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall --quiet --yes gas
  fi
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,labeler,node]'
  touch "$stamp"
fi
