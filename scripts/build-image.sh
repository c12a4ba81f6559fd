#!/usr/bin/env bash
# Build gas's container image, gas:<version> (the version of gas/__init__.py), into the local
# store of docker, podman or buildah, whichever is installed and works (GAS_IMAGE_TOOL picks
# one).
#
#   scripts/build-image.sh [--base auto|registry|local] [--refresh] [--tag NAME:TAG]
#   scripts/build-image.sh --print-tag     # the tag it would build, gas:<version>
#
# Two ways to the same image (docs/image.md):
# - registry: `build .` with the Dockerfile, on python:3.11-slim from a registry.
# - local: no registry needed. A Debian bookworm root filesystem made by mmdebstrap (python3,
#   libudev1, libstdc++6, ca-certificates; no apt, no pip, no documentation), gas and its
#   dependencies installed from wheels built on this machine into the virtualenv /opt/gas,
#   configured as the Dockerfile's image is (user 10001, entry point gas, command serve).
#   It needs only the Debian mirror and PyPI, and runs nothing inside a container.
# `auto` (the default) takes the registry way when python:3.11-slim is in the store or can
# be pulled, the local way otherwise.
#
# The root filesystem and the dependencies' wheels are kept in GAS_IMAGE_CACHE
# (~/.cache/gas-image), named by a hash of what made them; --refresh makes both again (for
# the Debian security updates and the dependencies' releases since: a release build should).
#
# Exit status: 0 built; 3 this machine cannot build it (no working tool, no mmdebstrap and no
# registry), said on stderr; anything else, the build failed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE_IMAGE=python:3.11-slim
SUITE=bookworm
MIRROR="${GAS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${GAS_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
PACKAGES=python3,libudev1,libstdc++6,ca-certificates
CACHE="${GAS_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gas-image}"
PYTHON="${PYTHON:-python3}"

base_mode=auto
refresh=0
print_tag=0
tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base_mode="$2"; shift 2 ;;
    --base=*) base_mode="${1#--base=}"; shift ;;
    --refresh) refresh=1; shift ;;
    --print-tag) print_tag=1; shift ;;
    --tag) tag="$2"; shift 2 ;;
    --tag=*) tag="${1#--tag=}"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$base_mode" in auto|registry|local) ;; *)
  echo "build-image: --base is auto, registry or local, not $base_mode" >&2; exit 2 ;;
esac

say() { echo "build-image: $*" >&2; }
cannot() { say "$*"; exit 3; }

# The one place the version is set: gas/__init__.py (setup.py reads it too).
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' gas/__init__.py)"
[ -n "$version" ] || { say "no __version__ in gas/__init__.py"; exit 1; }
tag="${tag:-gas:$version}"
if [ "$print_tag" = 1 ]; then
  echo "$tag"
  exit 0
fi

# --------------------------------------------------------------------------- the tool
# docker answers `--version` without a daemon; only `docker info` says it can build.
tool="${GAS_IMAGE_TOOL:-}"
if [ -z "$tool" ]; then
  if command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; then
    tool=docker
  elif command -v podman >/dev/null; then
    tool=podman
  elif command -v buildah >/dev/null; then
    tool=buildah
  else
    cannot "no container tool: install docker (with its daemon running), podman or buildah"
  fi
fi
command -v "$tool" >/dev/null || cannot "GAS_IMAGE_TOOL=$tool is not installed"

image_exists() {
  case "$tool" in
    docker) docker image inspect "$1" >/dev/null 2>&1 ;;
    podman) podman image exists "$1" ;;
    buildah) buildah inspect --type image "$1" >/dev/null 2>&1 ;;
  esac
}
image_id() {
  case "$tool" in
    docker) docker image inspect --format '{{.Id}}' "$1" 2>/dev/null || true ;;
    podman) podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true ;;
    buildah) buildah inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null || true ;;
  esac
}
build() { # build CONTEXT CONTAINERFILE
  case "$tool" in
    docker) docker build --tag "$tag" --file "$2" "$1" ;;
    # No intermediate image per instruction left in the store at each build.
    podman) podman build --layers=false --tag "$tag" --file "$2" "$1" ;;
    buildah) buildah build --tag "$tag" --file "$2" "$1" ;;
  esac
}

if [ "$base_mode" = auto ]; then
  base_mode=local
  if image_exists "$BASE_IMAGE" || timeout 300 "$tool" pull --quiet "$BASE_IMAGE" >/dev/null 2>&1; then
    base_mode=registry
  fi
  say "$BASE_IMAGE is $([ "$base_mode" = registry ] || echo "not ")available: the $base_mode way"
fi

old_id="$(image_id "$tag")"
start=$SECONDS

if [ "$base_mode" = registry ]; then
  say "building $tag from the Dockerfile with $tool"
  build . Dockerfile
else
  command -v mmdebstrap >/dev/null ||
    cannot "no registry serves $BASE_IMAGE and mmdebstrap is not installed to make the base"
  "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || cannot "$PYTHON cannot make a virtualenv with pip"
  # The wheels pip picks are those of the Python that runs it: it must be the image's 3.11.
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
    cannot "the local way needs Python 3.11 to build the wheels (set PYTHON=python3.11)"
  mkdir -p "$CACHE"
  # One build at a time fills the cache (two test sessions may start together).
  exec 9>"$CACHE/.lock"
  flock 9
  work="$(mktemp -d "${TMPDIR:-/tmp}/gas-image.XXXXXX")"
  trap 'rm -rf "$work"' EXIT

  # ------------------------------------------------------------------------- the base
  # What goes into the base, hashed: a change to any of it makes a new one.
  mm_args=(
    --variant=essential --include="$PACKAGES" --skip=output/dev
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*'
    # The image's user, as the Dockerfile's useradd makes it (no useradd in this variant).
    --customize-hook='echo "gas:x:10001:" >>"$1/etc/group"'
    --customize-hook='echo "gas:x:10001:10001::/home/gas:/bin/sh" >>"$1/etc/passwd"'
    --customize-hook='echo "gas:!:20000:0:99999:7:::" >>"$1/etc/shadow"'
    # The virtualenv made by the image's own python3; gas's wheels go into it later.
    --customize-hook='chroot "$1" python3 -m venv --without-pip /opt/gas'
    --customize-hook='rm -rf "$1"/opt/gas/bin/[Aa]ctivate* "$1"/opt/gas/include'
    --customize-hook='rm -rf "$1"/var/cache/debconf/*-old "$1"/var/log/* "$1"/var/lib/apt/lists/*'
  )
  sources=(
    "deb $MIRROR $SUITE main"
    "deb $MIRROR $SUITE-updates main"
    "deb $SECURITY_MIRROR $SUITE-security main"
  )
  base_key="$(printf '%s\n' "$SUITE" "${mm_args[@]}" "${sources[@]}" | sha256sum | cut -c1-16)"
  base_tar="$CACHE/base-$SUITE-$base_key.tar"
  base_image="localhost/gas-base:$SUITE-$base_key"
  if [ "$refresh" = 1 ]; then
    rm -f "$base_tar"
  fi
  if [ ! -f "$base_tar" ]; then
    say "making the Debian $SUITE base with mmdebstrap ($base_tar)"
    mmdebstrap --quiet "${mm_args[@]}" "$SUITE" "$work/base.tar" "${sources[@]}"
    mv "$work/base.tar" "$base_tar"
    # A base of the same name made before stays under the images built on it, nameless.
    reimport=1
  fi
  if [ "${reimport:-0}" = 1 ] || ! image_exists "$base_image"; then
    say "importing the base as $base_image"
    case "$tool" in
      docker|podman) "$tool" import "$base_tar" "$base_image" >/dev/null ;;
      buildah)
        ctr="$(buildah from scratch)"
        buildah add --quiet "$ctr" "$base_tar" / >/dev/null
        buildah commit --quiet --rm "$ctr" "$base_image" >/dev/null ;;
    esac
  fi

  # ------------------------------------------------------------------------- the wheels
  # pip in a virtualenv of its own: the host Python's other packages are not in its way.
  pip_env="$CACHE/pip-$("$PYTHON" -c 'import sys; print(sys.implementation.cache_tag)')"
  if [ ! -x "$pip_env/bin/python" ]; then
    "$PYTHON" -m venv "$pip_env"
  fi
  pip=("$pip_env/bin/python" -m pip --disable-pip-version-check)
  # From a copy of what the Dockerfile copies: setuptools leaves build/ beside setup.py, whose
  # stale modules would go into the wheel, and no __pycache__ comes along.
  mkdir "$work/src"
  cp setup.py README.md "$work/src/"
  tar -cf - --exclude=__pycache__ gas | tar -xf - -C "$work/src"

  # Dependencies from PyPI, kept per setup.py and host Python (its tags pick the wheels);
  # gas's own wheel is made afresh each time.
  py_tag="$("$PYTHON" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())')"
  wheel_key="$( (cat setup.py; echo "$py_tag") | sha256sum | cut -c1-16)"
  deps="$CACHE/wheels-$wheel_key"
  if [ "$refresh" = 1 ] || [ ! -f "$deps/.complete" ]; then
    say "building the dependencies' wheels ($deps)"
    rm -rf "$deps"
    "${pip[@]}" wheel --quiet --wheel-dir "$deps" "$work/src[labeler,node]"
    rm -f "$deps"/gas_gpu_sharing-*.whl
    touch "$deps/.complete"
  fi
  "${pip[@]}" wheel --quiet --no-deps --wheel-dir "$work/gas" "$work/src"

  # ------------------------------------------------------------------------- /opt/gas
  venv="$work/context/opt/gas"
  # Only these wheels (no configured index or find-links).
  env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL PIP_CONFIG_FILE=/dev/null \
    "${pip[@]}" install --quiet --no-index --ignore-installed --no-warn-script-location \
    --root-user-action=ignore --find-links "$deps" --find-links "$work/gas" --prefix "$venv" \
    "gas-gpu-sharing[labeler,node]==$version"
  [ -d "$venv/lib/python3.11/site-packages/gas" ] ||
    { say "pip did not install into $venv/lib/python3.11/site-packages"; exit 1; }
  # The scripts name the python that installed them; in the image it is the virtualenv's.
  for script in "$venv"/bin/*; do
    sed -i '1s|^#!.*python.*$|#!/opt/gas/bin/python|' "$script"
  done
  sh scripts/image-prune.sh "$venv"

  cat >"$work/Containerfile" <<EOF
# Made by scripts/build-image.sh: the Dockerfile's final image, on a base made locally.
FROM $base_image
COPY opt/gas /opt/gas
USER 10001:10001
ENV PATH=/opt/gas/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
EXPOSE 9001
ENTRYPOINT ["gas"]
CMD ["serve"]
EOF
  say "building $tag on $base_image with $tool"
  build "$work/context" "$work/Containerfile" >"$work/build.log" 2>&1 ||
    { cat "$work/build.log" >&2; exit 1; }
fi

new_id="$(image_id "$tag")"
# The previous build of this tag, now nameless, would pile up with every build.
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
  "$tool" rmi "$old_id" >/dev/null 2>&1 || true
fi
say "built $tag ($new_id) in $((SECONDS - start)) s"
