from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.support import helmtools, realk8s
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles, make_tls_files
from tests.support.scheduler import SchedulerEmulator


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        nargs="?",
        type=int,
        const=50_000,
        default=None,
        metavar="N",
        help="run the randomised reliability workload for N operations (50000; env GAS_SOAK=N)",
    )


_KINDS = ("unit", "integration")

SOAK_SECONDS_PER_OPERATION = 0.1
"""Time a soak test gets per operation, on top of the per-test timeout: an operation takes
about 30 ms on this project's 2-core machines (docs/development.md), the rest is room for
a loaded machine."""


def soak_size(config: pytest.Config) -> int:
    """Operations asked for by `--soak [N]` or GAS_SOAK=N; 0 when not asked for."""
    value = config.getoption("--soak")
    if value is None:
        value = int(os.environ.get("GAS_SOAK") or 0)
    return int(value)


def _timeout_of(item: pytest.Item) -> float:
    """The per-test timeout pytest-timeout would give the item, as it works it out: the
    item's own marker, else --timeout, else PYTEST_TIMEOUT, else the ini file; 0 is none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    for value in (
        item.config.getoption("timeout", None),
        os.environ.get("PYTEST_TIMEOUT"),
        item.config.getini("timeout"),
    ):
        if value not in (None, ""):
            return float(value)
    return 0.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The folder says the kind: `-m unit` is the quick loop (pure, in-process, seconds).
    for item in items:
        kind = next(
            (k for k in _KINDS if f"{os.sep}tests{os.sep}{k}{os.sep}" in str(item.path)), None
        )
        if kind is not None:
            item.add_marker(kind)
    # A soak runs its asked size: its timeout grows with it (none stays none).
    operations = soak_size(config)
    for item in items:
        if operations and "soak_operations" in getattr(item, "fixturenames", ()):
            base = _timeout_of(item)
            if base > 0:
                item.add_marker(pytest.mark.timeout(base + operations * SOAK_SECONDS_PER_OPERATION))


@pytest.fixture
def soak_operations(request: pytest.FixtureRequest) -> int:
    """Operations for a soak run of the randomised workload; 0 when not asked for."""
    return soak_size(request.config)


@pytest.fixture(scope="module", params=realk8s.VERSIONS, ids=lambda v: f"k8s-{v}")
def k8s(request: pytest.FixtureRequest) -> realk8s.Release:
    """A Kubernetes version whose real binaries a test runs on: every such test runs once
    per version, and skips one whose folder is absent (a clone without ../shared). CI has
    every version and must run them all, so there an absent one fails."""
    version: str = request.param
    reason = realk8s.missing(version)
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run Kubernetes {version}: {reason}")
        pytest.skip(reason)
    return realk8s.release(version)


def _tool_unavailable(what: str, reason: str) -> NoReturn:
    """Skip a test whose tool cannot be had, saying why; CI prefetches every tool
    (.ci/run), so there it fails instead."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must have {what}: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module", params=helmtools.HELM_MAJORS, ids=lambda m: f"helm-{m}")
def helm(request: pytest.FixtureRequest) -> Path:
    """The real helm binary of each major (3, 4), from its PyPI wheel
    (tests/support/helmtools.py): every such test runs once per major, and skips one that
    cannot be fetched (PyPI unreachable); on CI it fails."""
    major: int = request.param
    reason = helmtools.missing_reason(major)
    if reason is not None:
        _tool_unavailable(f"helm {major}", reason)
    return helmtools.helm(major)


@pytest.fixture(scope="session")
def newest_kubectl() -> Path:
    """The real kubectl v1.37.1, from the same PyPI wheel as helm 4; skipped (failed on CI)
    when it cannot be fetched."""
    reason = helmtools.kubectl_missing_reason()
    if reason is not None:
        _tool_unavailable(f"kubectl {helmtools.KUBECTL_VERSION}", reason)
    return helmtools.kubectl_newest()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def start_gas(tmp_path: Path) -> Iterator[Callable[..., GasProcess]]:
    """Start `gas serve` processes; all are stopped when the test ends."""
    started: list[GasProcess] = []

    def start(args: list[str], tls: TLSFiles | None = None, port: int | None = None) -> GasProcess:
        process = GasProcess(args, tmp_path / f"gas-{len(started)}.log", tls, port)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[ApiServerDouble]:
    with ApiServerDouble() as double:
        yield double


@pytest.fixture
def kubeconfig(apiserver: ApiServerDouble, tmp_path: Path) -> str:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def core_v1(kubeconfig: str) -> Iterator[Any]:
    """The generated client's CoreV1Api on the API-server double, to compare it with."""
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=kubeconfig)
    try:
        yield client.CoreV1Api(api_client)
    finally:
        api_client.close()


@pytest.fixture
def gas(start_gas: Callable[..., GasProcess], kubeconfig: str, tls_files: TLSFiles) -> GasProcess:
    """gas over HTTPS with mutual TLS, against the API-server double, synced."""
    process = start_gas(["--kubeConfig", kubeconfig], tls=tls_files)
    process.wait_ready()
    return process


@pytest.fixture
def emulators(
    apiserver: ApiServerDouble, tls_files: TLSFiles
) -> Iterator[Callable[..., SchedulerEmulator]]:
    """kube-scheduler emulators talking to a given gas over mutual TLS; closed at the end.
    `make(gas, seed=None, **options)`: the seed defaults to the emulator's number."""
    made: list[SchedulerEmulator] = []

    def make(gas: GasProcess, seed: int | None = None, **options: Any) -> SchedulerEmulator:
        emulator = SchedulerEmulator(
            apiserver,
            gas.url,
            cert=(tls_files.client_cert, tls_files.client_key),
            verify=tls_files.ca,
            seed=len(made) if seed is None else seed,
            **options,
        )
        made.append(emulator)
        return emulator

    yield make
    for emulator in made:
        emulator.close()
