"""The image deploy/ runs, built by scripts/build-image.sh and run as the manifests run it:
the extender as uid 10001, the node agent as root with no capabilities, both on a read-only
root filesystem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import requests

from gas import __version__
from tests.image.conftest import EXTENDER, NODE_AGENT, Engine
from tests.support.apiserver import ApiServerDouble
from tests.support.fakesysfs import GIB, FakeCard, write_sysfs
from tests.support.gasproc import free_port, make_tls_files
from tests.support.kubelet import KubeletDouble
from tests.support.nodeproc import short_dir
from tests.support.objects import container, gpu_node, gpu_pod
from tests.support.polling import wait_for

# The first test to ask for the image builds it (about 4 minutes on a cold cache, under one
# with the base and the wheels kept); every test after it only runs containers.
pytestmark = [pytest.mark.image, pytest.mark.timeout(900)]

# The largest the image may grow before someone looks at why (docs/image.md gives its size).
MAX_IMAGE_BYTES = 330 * 1000**2

# One card with 6Gi: demo-1card and demo-2cards fit it, demo-cpu-only does not.
GPU_POD = gpu_pod("pod", container(i915="1", memory_max="6Gi"))


def test_help_and_version_as_the_extender_runs(engine: Engine, image: str) -> None:
    helped = engine.run(image, ["--help"], (*EXTENDER, "--network=none"))
    for command in ("serve", "node", "label-node", "certs", "inspect"):
        assert command in helped.stdout
    version = engine.run(image, ["--version"], (*EXTENDER, "--network=none"))
    assert version.stdout.strip() == f"gas {__version__}"


def test_serve_demo_answers_a_filter_over_mutual_tls(
    engine: Engine, image: str, tmp_path: Path
) -> None:
    """The extender's container as deploy/ has it: its TLS Secret mounted read-only at
    /etc/gas/tls (world-readable files, a Secret volume's default mode), an emptyDir at /tmp,
    probes on the plain-HTTP health port; a scheduler on the host filters through it."""
    made = make_tls_files(tmp_path)
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o755)
    for source, name in ((made.server_cert, "tls.crt"), (made.server_key, "tls.key")):
        shutil.copy(source, secret / name)
    shutil.copy(made.ca, secret / "ca.crt")
    for file in secret.iterdir():
        file.chmod(0o644)
    secret.chmod(0o755)
    port, health = free_port(), free_port()
    args = [
        "serve",
        "--demo",
        # Published ports reach the container's own address, not its loopback.
        "--host=0.0.0.0",
        "--cert=/etc/gas/tls/tls.crt",
        "--key=/etc/gas/tls/tls.key",
        "--cacert=/etc/gas/tls/ca.crt",
        "--healthPort=9002",
    ]
    options = (
        *EXTENDER,
        f"--volume={secret}:/etc/gas/tls:ro",
        f"--publish=127.0.0.1:{port}:9001",
        f"--publish=127.0.0.1:{health}:9002",
    )
    with engine.started(image, args, options) as name:

        def ready() -> bool:
            try:
                return requests.get(f"http://127.0.0.1:{health}/readyz", timeout=2).ok
            except requests.RequestException:
                return False

        try:
            wait_for(ready, timeout=60, what="the container's /readyz")
        except TimeoutError:
            pytest.fail(f"gas serve in the container never became ready:\n{engine.logs(name)}")
        url = f"https://127.0.0.1:{port}/scheduler/filter"
        body = {"Pod": GPU_POD, "NodeNames": ["demo-1card", "demo-2cards", "demo-cpu-only"]}
        reply = requests.post(
            url,
            json=body,
            cert=(made.client_cert, made.client_key),
            verify=made.ca,
            timeout=10,
        )
        assert reply.status_code == 200, reply.text
        answer = reply.json()
        assert answer["NodeNames"] == ["demo-1card", "demo-2cards"]
        assert "demo-cpu-only" in answer["FailedAndUnresolvableNodes"]
        # Mutual TLS: without a client certificate there is no answer at all.
        with pytest.raises(requests.exceptions.SSLError):
            requests.post(url, json=body, verify=made.ca, timeout=10)


def test_node_help_as_root_without_capabilities(engine: Engine, image: str) -> None:
    helped = engine.run(image, ["node", "--help"], (*NODE_AGENT, "--network=none"))
    for flag in ("--device-plugin-dir", "--sysfs-root", "--numa", "--metrics-port"):
        assert flag in helped.stdout


def test_webhook_help(engine: Engine, image: str) -> None:
    helped = engine.run(image, ["--help"], (*EXTENDER, "--network=none"))
    if "webhook" not in helped.stdout:
        pytest.skip("this gas has no webhook command")
    webhook = engine.run(image, ["webhook", "--help"], (*EXTENDER, "--network=none"))
    assert "--schedulerName" in webhook.stdout


def _fake_sysfs(tmp_path: Path) -> Path:
    cards = [FakeCard(0), FakeCard(1, driver="xe", tiles=2, numa=1)]
    sysfs = write_sysfs(tmp_path / "sys", cards)
    # The container engine mounts its cgroup file system under /sys.
    (sysfs / "fs" / "cgroup").mkdir(parents=True)
    return sysfs


def test_cards_found_in_a_sysfs_tree_mounted_where_the_node_agent_has_it(
    engine: Engine, image: str, tmp_path: Path
) -> None:
    """The node agent's discovery (`gas node --sysfs-root`) in the image, as root with no
    capabilities, over a fake sysfs mounted read-only at /sys as the DaemonSet mounts the
    host's."""
    sysfs = _fake_sysfs(tmp_path)
    options = (*NODE_AGENT, "--network=none", f"--volume={sysfs}:/sys:ro")
    # Discovery as `gas node` sets it up from its own flags (it has no listing of its own).
    program = (
        "import json\n"
        "from gas.cli import build_parser\n"
        "from gas.host.discovery import discoverer\n"
        "args = build_parser().parse_args(['node', '--sysfs-root=/sys'])\n"
        "print(json.dumps([[c.name, c.driver, c.render_node, c.tiles, c.memory, c.numa_node,"
        " c.pci_address] for c in discoverer(args)()]))\n"
    )
    found = engine.run(image, ["-c", program], (*options, "--entrypoint=python"))
    assert json.loads(found.stdout) == [
        ["card0", "i915", "renderD128", 1, 16 * GIB, 0, "0000:03:00.0"],
        ["card1", "xe", "renderD129", 2, 32 * GIB, 1, "0000:04:00.0"],
    ]
    labels = engine.run(image, ["label-node", "--dry-run", "--numa", "--sysfs-root=/sys"], options)
    assert json.loads(labels.stdout) == {
        "gpu.intel.com/cards": "card0.card1",
        "gpu.intel.com/gpu-numbers": "0.1",
        "gpu.intel.com/numa-gpu-map": "0-0_1-1",
    }


def test_udev_discovery_loads_libudev_in_the_image(
    engine: Engine, image: str, tmp_path: Path
) -> None:
    """Without --sysfs-root, discovery asks udev: pyudev must find libudev in the image (a
    missing one is an error with the install hint). udev lists only devices it knows, so the
    fake tree's cards are not among them: what counts here is a clean pass."""
    sysfs = _fake_sysfs(tmp_path)
    options = (*NODE_AGENT, "--network=none", f"--volume={sysfs}:/sys:ro")
    result = engine.run(image, ["label-node", "--dry-run"], options, check=False)
    assert result.returncode == 0, result.stderr
    assert "libudev" not in result.stderr
    assert json.loads(result.stdout) == {}


def test_every_gas_module_imports_in_the_image(engine: Engine, image: str) -> None:
    """scripts/image-prune.sh takes parts of the dependencies out; nothing gas imports."""
    program = (
        "import importlib, pkgutil, gas\n"
        "names = [m.name for m in pkgutil.walk_packages(gas.__path__, 'gas.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    result = engine.run(
        image, ["-c", program], (*EXTENDER, "--network=none", "--entrypoint=python")
    )
    assert int(result.stdout) > 50


def test_image_holds_no_compilers_caches_or_test_tools(engine: Engine, image: str) -> None:
    script = r"""
    for tool in gcc cc c++ make ld pip pip3 pytest apt-get; do
      command -v "$tool" >/dev/null && echo "program: $tool"
    done
    for module in pip setuptools pytest hypothesis mypy ruff grpc_tools; do
      python -c "import $module" 2>/dev/null && echo "module: $module"
    done
    for dir in /root/.cache /home/gas/.cache /var/lib/apt/lists /var/cache/apt/archives \
               /usr/share/doc /usr/share/man; do
      [ -d "$dir" ] && find "$dir" -type f ! -name copyright ! -name lock | head -1 | \
        sed "s|^|file: |"
    done
    find /opt/gas -type d \( -name tests -o -name f2py \) | sed 's|^|test dir: |'
    find / -xdev -type f -name '*.so*' 2>/dev/null | while read -r lib; do
      ldd "$lib" 2>/dev/null | grep -q 'not found' && echo "unresolved: $lib"
    done
    command -v gas
    """
    result = engine.run(
        image, ["-c", script], (*EXTENDER, "--network=none", "--entrypoint=sh"), timeout=120
    )
    assert result.stdout.split() == ["/opt/gas/bin/gas"], result.stdout


def test_image_size(engine: Engine, image: str) -> None:
    size = int(engine("image", "inspect", "--format", "{{.Size}}", image).stdout)
    assert size < MAX_IMAGE_BYTES, f"{image} is {size / 1000**2:.0f} MB"


def test_node_agent_registers_with_the_kubelet_from_the_image(
    engine: Engine, image: str, apiserver: ApiServerDouble, tmp_path: Path
) -> None:
    """`gas node` in the image as the DaemonSet runs it (root without capabilities, read-only
    root, the kubelet's device-plugins folder mounted read-write and its pod-resources folder
    read-only): it creates its socket beside the kubelet's, registers both resources and
    labels the node. A kubelet double on this machine, the API-server double behind it."""
    node = "image-node"
    apiserver.add_node(gpu_node(node, "", i915="0", xe="0"))
    # Unix socket paths must be short.
    root = short_dir("gas-image-")
    sysfs = _fake_sysfs(root)
    kubelet = KubeletDouble(apiserver, node, root / "k").start()
    try:
        kubeconfig = root / "kubeconfig"
        apiserver.write_kubeconfig(kubeconfig)
        kubeconfig.chmod(0o644)
        options = (
            *NODE_AGENT,
            # The API-server double listens on this machine's loopback.
            "--network=host",
            f"--volume={kubelet.plugin_dir}:/var/lib/kubelet/device-plugins",
            f"--volume={kubelet.pod_resources_socket.parent}:/var/lib/kubelet/pod-resources:ro",
            f"--volume={sysfs}:/sys:ro",
            f"--volume={kubeconfig}:/etc/gas/kubeconfig:ro",
        )
        args = [
            "node",
            "--numa",
            f"--node-name={node}",
            "--kubeconfig=/etc/gas/kubeconfig",
            "--sysfs-root=/sys",
            "--metrics-port=0",
        ]
        with engine.started(image, args, options) as name:
            try:
                kubelet.wait_registered("gpu.intel.com/i915", 10, timeout=60)
                kubelet.wait_registered("gpu.intel.com/xe", 10, timeout=30)
            except TimeoutError:
                pytest.fail(f"gas node in the container did not register:\n{engine.logs(name)}")

            def labelled() -> bool:
                found = apiserver.get_node(node) or {}
                labels = found.get("metadata", {}).get("labels", {})
                return bool(labels.get("gpu.intel.com/gpu-numbers") == "0.1")

            wait_for(labelled, timeout=30, what="the node's gpu-numbers label")
    finally:
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
