#!/usr/bin/env bash
# Make a kubeadm kube-scheduler static pod load gas's scheduler configuration.
#
#   configure-scheduler.sh [--manifest PATH] [--config PATH] [--dir DIR] [--no-copy]
#                          [--backup PATH] [--dry-run] [--revert]
#
# On a control-plane node, as root, after `gas certs` files are in /etc/kubernetes/gas:
#   1. copies the configuration (default: extender-configuration/scheduler-config.yaml next
#      to this script) to DIR/scheduler-config.yaml (DIR: /etc/kubernetes/gas), unless
#      --no-copy, which uses --config where it is;
#   2. edits the manifest (default /etc/kubernetes/manifests/kube-scheduler.yaml): adds
#      --config, drops --kubeconfig when the configuration sets clientConnection.kubeconfig,
#      mounts the configuration and DIR read-only, sets dnsPolicy: ClusterFirstWithHostNet.
# kubelet notices the change and restarts kube-scheduler. The original manifest is saved
# first (default: .kube-scheduler.yaml.gas-backup beside it); --revert puts it back.
# Running it again changes nothing; --dry-run prints the diff and changes nothing.
#
# Needs only bash and python3 with PyYAML: the YAML is edited as data, never with sed.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "configure-scheduler.sh: $PYTHON not found; this script needs python3 with PyYAML" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import yaml' >/dev/null 2>&1; then
    echo "configure-scheduler.sh: PyYAML is missing for $PYTHON; install it (apt-get install" \
        "python3-yaml, dnf install python3-pyyaml, or pip install pyyaml) and run again" >&2
    exit 1
fi
SHIPPED_CONFIG="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/extender-configuration/scheduler-config.yaml"

exec "$PYTHON" - "$SHIPPED_CONFIG" "$@" <<'PYTHON_SCRIPT'
import argparse
import contextlib
import copy
import difflib
import os
import re
import sys
import tempfile

import yaml

PROG = "configure-scheduler.sh"
CONFIG_NAME = "scheduler-config.yaml"
CERT_VOLUME = "gas-certs"
CONFIG_VOLUME = "gas-scheduler-config"
DNS_POLICY = "ClusterFirstWithHostNet"
# The Kubernetes versions whose kube-scheduler loads each configuration apiVersion.
API_VERSIONS = {
    "kubescheduler.config.k8s.io/v1": ((1, 25), None),
    "kubescheduler.config.k8s.io/v1beta3": ((1, 23), (1, 28)),
    "kubescheduler.config.k8s.io/v1beta2": ((1, 22), (1, 27)),
}


class Failure(Exception):
    pass


def note(message):
    print(f"{PROG}: {message}", file=sys.stderr)


def parse_args(shipped, argv):
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Make a kubeadm kube-scheduler static pod load gas's scheduler configuration.",
    )
    parser.add_argument(
        "--manifest",
        default="/etc/kubernetes/manifests/kube-scheduler.yaml",
        help="kube-scheduler static pod manifest (default: %(default)s)",
    )
    parser.add_argument(
        "--config",
        help=f"KubeSchedulerConfiguration to load (default: {shipped})",
    )
    parser.add_argument(
        "--dir",
        default="/etc/kubernetes/gas",
        help="directory on the node for the configuration and certificates (default: %(default)s)",
    )
    parser.add_argument(
        "--no-copy",
        action="store_true",
        help="use --config where it is instead of copying it into --dir",
    )
    parser.add_argument(
        "--backup",
        help="where to keep the original manifest (default: .<name>.gas-backup beside it)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the diff, change nothing")
    parser.add_argument("--revert", action="store_true", help="restore the original manifest")
    args = parser.parse_args(argv)
    args.manifest = os.path.abspath(args.manifest)
    args.dir = os.path.abspath(args.dir)
    if args.backup is None:
        # Hidden on purpose: kubelet runs every non-hidden file in its manifest directory,
        # whatever its extension, so a visible backup would be a second kube-scheduler pod.
        head, tail = os.path.split(args.manifest)
        args.backup = os.path.join(head, f".{tail}.gas-backup")
    args.backup = os.path.abspath(args.backup)
    if args.config is None:
        args.config = shipped if not args.no_copy else os.path.join(args.dir, CONFIG_NAME)
    args.config = os.path.abspath(args.config)
    return args


def read_bytes(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise Failure(f"{what} {path} not found") from None
    except IsADirectoryError:
        raise Failure(f"{what} {path} is a directory") from None
    except OSError as exc:
        raise Failure(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def load_yaml(data, path, what):
    try:
        return yaml.safe_load(data.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise Failure(f"{what} {path} is not valid YAML: {first}") from None


def dump_yaml(obj):
    # kubeadm writes block style, keys as given, sequences not indented under their key:
    # PyYAML's defaults plus no line wrapping reproduce that, so the diff stays small.
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=1 << 16)


def atomic_write(path, data, mode):
    directory = os.path.dirname(path)
    # A hidden temporary name: kubelet ignores dot files in its manifest directory.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def file_mode(path, default):
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return default


def scheduler_container(pod, path):
    if not isinstance(pod, dict) or pod.get("kind") != "Pod":
        raise Failure(f"{path} is not a Pod manifest")
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list) or not containers:
        raise Failure(f"{path} has no containers")
    named = [c for c in containers if isinstance(c, dict) and c.get("name") == "kube-scheduler"]
    if len(named) == 1:
        return spec, named[0]
    if len(containers) == 1 and isinstance(containers[0], dict):
        return spec, containers[0]
    raise Failure(f"{path}: cannot tell which container is kube-scheduler")


def flag_list(container):
    """The list holding kube-scheduler's flags: kubeadm puts them in command."""
    command = container.get("command")
    args = container.get("args")
    if isinstance(args, list) and any(str(a).startswith("--") for a in args):
        return args
    if isinstance(command, list):
        return command
    if isinstance(args, list):
        return args
    container["command"] = ["kube-scheduler"]
    return container["command"]


def find_flag(flags, name):
    """(index, number of items, value) of --name=value or --name value, else None."""
    for index, item in enumerate(flags):
        item = str(item)
        if item.startswith(f"--{name}="):
            return index, 1, item.split("=", 1)[1]
        if item == f"--{name}":
            if index + 1 < len(flags) and not str(flags[index + 1]).startswith("-"):
                return index, 2, str(flags[index + 1])
            return index, 1, ""
    return None


def insert_sorted(items, value, start):
    """Insert keeping kubeadm's alphabetical flag order when the list is in that order."""
    tail = [str(i) for i in items[start:]]
    if tail == sorted(tail):
        position = start
        while position < len(items) and str(items[position]) < value:
            position += 1
        items.insert(position, value)
    else:
        items.append(value)


def set_key_sorted(mapping, key, value):
    """Set a key, placing a new one in alphabetical position if the keys are sorted."""
    if key in mapping:
        mapping[key] = value
        return mapping
    keys = list(mapping)
    if keys != sorted(keys):
        mapping[key] = value
        return mapping
    items = list(mapping.items())
    position = sum(1 for k in keys if k < key)
    items.insert(position, (key, value))
    mapping.clear()
    mapping.update(items)
    return mapping


def put_named(items, entry):
    """Add or replace the entry with the same name; True if anything changed."""
    for index, existing in enumerate(items):
        if isinstance(existing, dict) and existing.get("name") == entry["name"]:
            if existing == entry:
                return False
            items[index] = entry
            return True
    items.append(entry)
    return True


def image_version(container):
    match = re.search(r":v?(\d+)\.(\d+)", str(container.get("image", "")))
    return (int(match.group(1)), int(match.group(2))) if match else None


def covered(path, mounts):
    for mount in mounts:
        target = str(mount.get("mountPath", "")).rstrip("/") if isinstance(mount, dict) else ""
        if target and (path == target or path.startswith(target + "/")):
            return True
    return False


def check_config(config, path, version):
    if not isinstance(config, dict) or config.get("kind") != "KubeSchedulerConfiguration":
        raise Failure(
            f"{path} is not a KubeSchedulerConfiguration (a Policy ConfigMap is loaded with "
            "--policy-configmap on Kubernetes <= 1.22, not with this script)"
        )
    api = config.get("apiVersion")
    if api not in API_VERSIONS:
        raise Failure(f"{path}: unsupported apiVersion {api!r}; use kubescheduler.config.k8s.io/v1")
    first, last = API_VERSIONS[api]
    if version is not None and (version < first or (last is not None and version > last)):
        raise Failure(
            f"{path} is {api}, which kube-scheduler {version[0]}.{version[1]} (from the "
            "manifest's image) does not load; use kubescheduler.config.k8s.io/v1 on 1.25+, "
            "v1beta3 on 1.23-1.24"
        )


def plan(args):
    """The new manifest (as data and text), the list of changes, and warnings."""
    original_bytes = read_bytes(args.manifest, "manifest")
    pod = load_yaml(original_bytes, args.manifest, "manifest")
    scheduler_container(pod, args.manifest)
    new = copy.deepcopy(pod)
    spec, container = scheduler_container(new, args.manifest)
    version = image_version(container)

    if not os.path.exists(args.config):
        raise Failure(f"scheduler configuration {args.config} not found (name it with --config)")
    config_bytes = read_bytes(args.config, "scheduler configuration")
    config = load_yaml(config_bytes, args.config, "scheduler configuration")
    check_config(config, args.config, version)
    config_path = args.config if args.no_copy else os.path.join(args.dir, CONFIG_NAME)

    changes, warnings = [], []
    flags = flag_list(container)
    start = 1 if flags is container.get("command") else 0
    wanted = f"--config={config_path}"
    existing = find_flag(flags, "config")
    if existing is None:
        insert_sorted(flags, wanted, start)
        changes.append(f"added {wanted}")
    elif existing[2] != config_path:
        index, count, old = existing
        del flags[index : index + count]
        insert_sorted(flags, wanted, start)
        changes.append(f"replaced --config={old} with {wanted}")

    connection = config.get("clientConnection")
    kubeconfig = connection.get("kubeconfig") if isinstance(connection, dict) else None
    flag = find_flag(flags, "kubeconfig")
    if kubeconfig:
        if flag is not None:
            index, count, old = flag
            del flags[index : index + count]
            # With --config kube-scheduler ignores --kubeconfig; leaving it suggests it counts.
            changes.append(
                f"removed --kubeconfig={old}: with --config kube-scheduler ignores it and uses "
                f"clientConnection.kubeconfig ({kubeconfig}) from the configuration"
            )
            if old and old != kubeconfig:
                warnings.append(
                    f"the configuration's clientConnection.kubeconfig ({kubeconfig}) differs "
                    f"from the --kubeconfig it replaces ({old})"
                )
    else:
        warnings.append(
            f"{args.config} has no clientConnection.kubeconfig: with --config kube-scheduler "
            "ignores --kubeconfig and falls back to the in-cluster configuration, which this "
            "static pod does not have; set clientConnection.kubeconfig (kubeadm: "
            "/etc/kubernetes/scheduler.conf). --kubeconfig was left in place"
        )

    volumes = spec.setdefault("volumes", [])
    mounts = container.setdefault("volumeMounts", [])
    cert_volume = {"hostPath": {"path": args.dir, "type": "DirectoryOrCreate"}, "name": CERT_VOLUME}
    config_volume = {"hostPath": {"path": config_path, "type": "File"}, "name": CONFIG_VOLUME}
    cert_mount = {"mountPath": args.dir, "name": CERT_VOLUME, "readOnly": True}
    config_mount = {"mountPath": config_path, "name": CONFIG_VOLUME, "readOnly": True}
    if put_named(volumes, cert_volume) | put_named(mounts, cert_mount):
        changes.append(f"mounted {args.dir} read-only (volume {CERT_VOLUME})")
    if put_named(volumes, config_volume) | put_named(mounts, config_mount):
        changes.append(f"mounted {config_path} read-only (volume {CONFIG_VOLUME})")

    if spec.get("dnsPolicy") != DNS_POLICY:
        set_key_sorted(spec, "dnsPolicy", DNS_POLICY)
        changes.append(
            f"set dnsPolicy: {DNS_POLICY}, so this hostNetwork pod resolves the gas Service's "
            "*.svc name"
        )

    if kubeconfig and not covered(str(kubeconfig), mounts):
        warnings.append(f"clientConnection.kubeconfig {kubeconfig} is not mounted into the pod")
    for extender in config.get("extenders") or []:
        tls = extender.get("tlsConfig") if isinstance(extender, dict) else None
        for key in ("caFile", "certFile", "keyFile"):
            path = tls.get(key) if isinstance(tls, dict) else None
            if not path:
                continue
            if not covered(path, mounts):
                warnings.append(f"tlsConfig.{key} {path} is not mounted into the pod")
            elif not os.path.exists(path) and path.startswith(args.dir + "/"):
                warnings.append(
                    f"tlsConfig.{key} {path} does not exist yet: kube-scheduler will not start "
                    "without it (see gas certs)"
                )
    text = original_bytes if new == pod else dump_yaml(new).encode()
    return original_bytes, text, config_bytes, config_path, changes, warnings


def unified(old, new, path):
    return "".join(
        difflib.unified_diff(
            old.decode("utf-8", "replace").splitlines(keepends=True),
            new.decode("utf-8", "replace").splitlines(keepends=True),
            fromfile=f"a{path}",
            tofile=f"b{path}",
        )
    )


def has_gas_changes(data):
    text = data.decode("utf-8", "replace")
    return CERT_VOLUME in text or CONFIG_VOLUME in text


def apply(args):
    original, text, config_bytes, config_path, changes, warnings = plan(args)
    copy_needed = False
    if not args.no_copy:
        try:
            with open(config_path, "rb") as f:
                copy_needed = f.read() != config_bytes
        except OSError:
            copy_needed = True
    for warning in warnings:
        note(f"warning: {warning}")
    if args.dry_run:
        if copy_needed:
            print(f"# would copy {args.config} to {config_path}")
        if text != original:
            sys.stdout.write(unified(original, text, args.manifest))
        if not copy_needed and text == original:
            print(f"# {args.manifest} already loads {config_path}; nothing to change")
        return 0
    if copy_needed:
        try:
            os.makedirs(args.dir, mode=0o700, exist_ok=True)
            atomic_write(config_path, config_bytes, 0o600)
        except OSError as exc:
            raise Failure(f"cannot copy the configuration to {config_path}: {exc.strerror or exc}") from None
        print(f"copied {args.config} to {config_path}")
    if text == original:
        print(f"{args.manifest} already loads {config_path}; nothing to change")
        return 0
    mode = file_mode(args.manifest, 0o600)
    try:
        if not os.path.exists(args.backup) or not has_gas_changes(original):
            atomic_write(args.backup, original, mode)
            print(f"saved the original manifest as {args.backup}")
        else:
            # The manifest already carries gas changes: the existing backup is the original.
            print(f"keeping the existing backup {args.backup}")
        atomic_write(args.manifest, text, mode)
    except OSError as exc:
        raise Failure(f"cannot write {exc.filename or args.manifest}: {exc.strerror or exc}") from None
    print(f"updated {args.manifest}:")
    for change in changes:
        print(f"  - {change}")
    print(
        "kubelet restarts kube-scheduler by itself; watch it with: kubectl -n kube-system get "
        f"pods -l component=kube-scheduler. Undo with: {PROG} --revert --manifest {args.manifest}"
    )
    return 0


def revert(args):
    if not os.path.exists(args.backup):
        raise Failure(f"no backup at {args.backup}: nothing to revert")
    backup = read_bytes(args.backup, "backup")
    try:
        current = read_bytes(args.manifest, "manifest")
    except Failure:
        current = b""
    if args.dry_run:
        if current == backup:
            print(f"# {args.manifest} is already the original; nothing to change")
        else:
            sys.stdout.write(unified(current, backup, args.manifest))
        return 0
    try:
        atomic_write(args.manifest, backup, file_mode(args.backup, 0o600))
        os.unlink(args.backup)
    except OSError as exc:
        raise Failure(f"cannot restore {args.manifest}: {exc.strerror or exc}") from None
    print(f"restored {args.manifest} from {args.backup} (backup removed)")
    if not args.no_copy:
        print(f"{os.path.join(args.dir, CONFIG_NAME)} and the certificates were left in place")
    return 0


def main():
    args = parse_args(sys.argv[1], sys.argv[2:])
    try:
        return revert(args) if args.revert else apply(args)
    except Failure as exc:
        note(str(exc))
        return 1


sys.exit(main())
PYTHON_SCRIPT
