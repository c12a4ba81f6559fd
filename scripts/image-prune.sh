#!/bin/sh
# Removes from gas's virtualenv (the argument, /opt/gas in the image) what gas never runs, to
# keep the image small: the kubernetes client's asyncio copy (gas uses the synchronous
# client), numpy's Fortran and distutils build tools, the packages' own test suites, and the
# dependencies' command-line scripts. Run by the Dockerfile and scripts/build-image.sh alike;
# tests/image checks that every gas module still imports in the image.
set -eu
venv="$1"
site="$venv/lib/python3.11/site-packages"
[ -d "$site/gas" ] || { echo "image-prune: no gas in $site" >&2; exit 1; }
rm -rf "$site/kubernetes/aio" "$site/numpy/f2py" "$site/numpy/distutils" "$site/numpy/_pyinstaller"
find "$site" -depth -type d -name tests -exec rm -rf {} +
for script in "$venv"/bin/*; do
  case "${script##*/}" in
    gas|kubectl-gas|python|python3|python3.11) ;;
    *) rm -f "$script" ;;
  esac
done
