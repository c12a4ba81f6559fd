"""Transport security and secrets at the `gas serve` level (tests/test_tls_serving.py
covers the TLS policy on a test app): wrong-CA and expired client certificates, TLS 1.0/1.1
and weak TLS 1.2 cipher suites refused by a real `gas serve`, its certificate rotated
without a restart; tokens and keys never in gas's output."""

from __future__ import annotations

import datetime
import http.client
import os
import shutil
import socket
import ssl
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gas.serving import tls
from tests.support.apiserver import ApiServerDouble
from tests.support.gasproc import GasProcess, TLSFiles, child_pids, make_tls_files
from tests.support.objects import gpu_node, gpu_pod
from tests.support.polling import wait_for
from tests.support.promtext import total
from tests.support.tlsprobe import client_context, local_handshake, permissive_server_context

TOKEN = "gas-secret-token-3f9c1e7a0b5d4c2e8f61"

# TLS 1.2 suites outside gas's policy (ECDHE key exchange + AEAD only), with what is wrong
# with each. OpenSSL 3 no longer builds RC4, 3DES or export suites into its default
# provider; they stay listed so that an OpenSSL that still offers them is tested too.
# What the permissive control server accepts: every suite, NULL ones included.
PERMISSIVE = "ALL:eNULL:@SECLEVEL=0"

WEAK_TLS12_SUITES = {
    "RC4-SHA": "RC4",
    "DES-CBC3-SHA": "3DES",
    "EXP-RC4-MD5": "export grade",
    "NULL-SHA256": "no encryption",
    "ECDHE-RSA-NULL-SHA": "no encryption",
    "AECDH-AES128-SHA": "anonymous: the server is not authenticated",
    "AES128-GCM-SHA256": "RSA key transport: no forward secrecy",
    "AES256-SHA": "RSA key transport and CBC",
    "ECDHE-RSA-AES128-SHA": "CBC with SHA-1",
    "ECDHE-RSA-AES256-SHA384": "CBC",
}


def _client_pair(
    directory: Path, name: str, ca_cert: Any, ca_key: Any, **options: Any
) -> tuple[str, str]:
    """A client certificate and key from ``ca_cert``; ``options`` go to issue_certificate."""
    cert, key = tls.issue_certificate(ca_cert, ca_key, name, server=False, client=True, **options)
    cert_path, key_path = str(directory / f"{name}.crt"), str(directory / f"{name}.key")
    tls.write_pem(cert_path, cert)
    tls.write_pem(key_path, key, private=True)
    return cert_path, key_path


def _client_context(
    files: TLSFiles,
    *,
    verify: bool = True,
    minimum: ssl.TLSVersion | None = None,
    maximum: ssl.TLSVersion | None = None,
    ciphers: str | None = None,
) -> ssl.SSLContext:
    """A client presenting the CA-signed client certificate, as kube-scheduler does. A weak
    client (`verify=False`) need not check the server either: only what gas accepts matters."""
    return client_context(
        files.ca if verify else None,
        (files.client_cert, files.client_key),
        minimum=minimum,
        maximum=maximum,
        ciphers=ciphers,
    )


def _handshake_refused(port: int, ctx: ssl.SSLContext) -> bool:
    """Whether gas refuses a TLS handshake from ``ctx`` (the handshake itself fails). For
    TLS 1.2 and older clients, whose handshake cannot end before the server's does."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            ctx.wrap_socket(raw, server_hostname="localhost").close()
        except (ssl.SSLError, ConnectionResetError):
            return True
    return False


def _wait_for_log(gas: GasProcess, text: str, count: int, what: str) -> None:
    """gas writes its log asynchronously: wait until ``text`` occurs ``count`` times."""
    try:
        wait_for(lambda: gas.log().count(text) >= count, timeout=10, what=what)
    except TimeoutError:
        pytest.fail(f"{what}: {text!r} not logged {count} times:\n{gas.log()}")


def _refused_handshakes(gas: GasProcess) -> float:
    text = gas.session.get(gas.url + "/metrics", timeout=5).text
    return total(text, "gas_connections_closed_total", reason="handshake_failed")


def _wait_for_refusals(gas: GasProcess, text: str, count: float, what: str) -> None:
    """Each refused handshake is counted, and its reason logged (at most once a second
    for each reason: docs/serving.md)."""
    try:
        wait_for(lambda: _refused_handshakes(gas) >= count, timeout=10, what=what)
    except TimeoutError:
        pytest.fail(f"{what}: {count} handshakes not counted refused:\n{gas.log()}")
    _wait_for_log(gas, text, 1, what)


@pytest.fixture(scope="module")
def rsa_gas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GasProcess]:
    """`gas serve --demo` with mutual TLS and an RSA server key, which every TLS 1.2 key
    exchange can use (RSA key transport included), so a refusal is always the cipher
    policy and never a certificate that does not fit the suite."""
    directory = tmp_path_factory.mktemp("rsa-gas")
    process = GasProcess(["--demo"], directory / "gas.log", make_tls_files(directory, "rsa"))
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def _tls_files(gas: GasProcess) -> TLSFiles:
    assert gas.tls is not None
    return gas.tls


def test_gas_serve_refuses_foreign_and_expired_client_certificates(
    start_gas: Callable[..., GasProcess], tmp_path: Path
) -> None:
    ca_cert, ca_key = tls.new_ca("gas-security-ca")
    server_cert, server_key = tls.issue_certificate(
        ca_cert, ca_key, "gas", ["localhost"], ["127.0.0.1"], server=True, client=False
    )
    tls.write_pem(tmp_path / "ca.crt", ca_cert)
    tls.write_pem(tmp_path / "server.crt", server_cert)
    tls.write_pem(tmp_path / "server.key", server_key, private=True)
    good = _client_pair(tmp_path, "good", ca_cert, ca_key)
    files = TLSFiles(
        str(tmp_path / "ca.crt"),
        str(tmp_path / "server.crt"),
        str(tmp_path / "server.key"),
        *good,
    )
    gas = start_gas(["--demo"], tls=files)
    gas.wait_ready()
    other_ca, other_key = tls.new_ca("someone-else")
    foreign = _client_pair(tmp_path, "foreign", other_ca, other_key)
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
    expired = _client_pair(
        tmp_path,
        "expired",
        ca_cert,
        ca_key,
        not_before=past,
        not_after=past + datetime.timedelta(days=1),
    )
    with requests.Session() as session:
        session.trust_env = False  # REQUESTS_CA_BUNDLE and proxies stay out of it
        for cert in (foreign, expired):
            with pytest.raises(requests.exceptions.SSLError):
                session.get(gas.url + "/healthz", verify=files.ca, cert=cert, timeout=5)
        with pytest.raises(requests.exceptions.SSLError):
            session.get(gas.url + "/healthz", verify=files.ca, timeout=5)
        assert session.get(gas.url + "/healthz", verify=files.ca, cert=good, timeout=5).ok
    # Each refused by gas in its own handshake, for the right reason.
    for reason in (
        "certificate verify failed: unable to get local issuer certificate",
        "certificate verify failed: certificate has expired",
        "peer did not return a certificate",
    ):
        _wait_for_log(gas, reason, 1, "gas refusing a client certificate")


@pytest.mark.parametrize("version", ["TLSv1", "TLSv1_1"])
def test_gas_serve_refuses_tls_below_1_2(rsa_gas: GasProcess, version: str) -> None:
    files = _tls_files(rsa_gas)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tls_version = getattr(ssl.TLSVersion, version)
    # SECLEVEL=0: at level 1 and above OpenSSL 3 refuses to offer TLS < 1.2 at all, and a
    # client failing on its own before sending a ClientHello would prove nothing.
    try:
        ctx = _client_context(
            files,
            verify=False,
            minimum=tls_version,
            maximum=tls_version,
            ciphers="ALL:@SECLEVEL=0",
        )
        control = permissive_server_context(files.server_cert, files.server_key, PERMISSIVE)
        negotiated, _ = local_handshake(control, ctx)
    except (ssl.SSLError, ValueError, OSError) as exc:
        pytest.skip(f"local {ssl.OPENSSL_VERSION} cannot do a {version} handshake: {exc!r}")
    assert negotiated == version.replace("_", ".")

    before = _refused_handshakes(rsa_gas)
    assert _handshake_refused(rsa_gas.port, ctx)
    _wait_for_refusals(rsa_gas, "unsupported protocol", before + 1, f"gas refusing {version}")
    assert rsa_gas.session.get(rsa_gas.url + "/healthz", timeout=5).ok


def test_gas_serve_refuses_weak_tls12_cipher_suites(rsa_gas: GasProcess) -> None:
    files = _tls_files(rsa_gas)
    control_server = permissive_server_context(files.server_cert, files.server_key, PERMISSIVE)
    offered: dict[str, ssl.SSLContext] = {}
    unavailable: dict[str, str] = {}
    for suite in WEAK_TLS12_SUITES:
        try:
            ctx = _client_context(
                files,
                verify=False,
                maximum=ssl.TLSVersion.TLSv1_2,
                ciphers=f"{suite}:@SECLEVEL=0",
            )
            negotiated = local_handshake(control_server, ctx)
        except (ssl.SSLError, OSError) as exc:
            unavailable[suite] = repr(exc)
            continue
        assert negotiated == ("TLSv1.2", suite)  # the client offers this suite and only it
        offered[suite] = ctx
    if not offered:
        pytest.skip(
            f"local {ssl.OPENSSL_VERSION} cannot negotiate any weak TLS 1.2 suite, even at "
            f"SECLEVEL=0: {unavailable}"
        )

    before = _refused_handshakes(rsa_gas)
    accepted = {
        suite: WEAK_TLS12_SUITES[suite]
        for suite, ctx in offered.items()
        if not _handshake_refused(rsa_gas.port, ctx)
    }
    assert accepted == {}, f"gas accepted weak suites: {accepted}"
    # Refused by gas's cipher policy, not for any other reason.
    _wait_for_refusals(
        rsa_gas, "no shared cipher", before + len(offered), f"gas refusing {sorted(offered)}"
    )

    # Ordinary clients still get in: TLS 1.3, and TLS 1.2 with its default suites.
    for maximum, expected in (
        (ssl.TLSVersion.MAXIMUM_SUPPORTED, "TLSv1.3"),
        (ssl.TLSVersion.TLSv1_2, "TLSv1.2"),
    ):
        conn = http.client.HTTPSConnection(
            "127.0.0.1", rsa_gas.port, context=_client_context(files, maximum=maximum), timeout=5
        )
        try:
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
            assert isinstance(conn.sock, ssl.SSLSocket)
            assert conn.sock.version() == expected
            cipher = conn.sock.cipher()
            assert cipher is not None
            if expected == "TLSv1.2":
                assert cipher[0].startswith("ECDHE-RSA-"), cipher
                assert "GCM" in cipher[0] or "CHACHA20" in cipher[0], cipher
        finally:
            conn.close()
    assert rsa_gas.process.poll() is None


class _SecretVolume:
    """A directory laid out as the kubelet lays out a mounted Secret: ``tls.crt`` is a
    symlink to ``..data/tls.crt`` and ``..data`` a symlink to a timestamped directory. An
    update writes a new timestamped directory and renames a new ``..data`` link over the
    old one, so both files change in one atomic step."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._generation = 0
        root.mkdir()

    def path(self, name: str) -> str:
        return str(self.root / name)

    def publish(self, files: dict[str, bytes]) -> None:
        self._generation += 1
        target = self.root / f"..2024_01_01_00_00_{self._generation:02d}"
        target.mkdir()
        for name, data in files.items():
            (target / name).write_bytes(data)
        data_link = self.root / "..data"
        previous = os.readlink(data_link) if data_link.is_symlink() else None
        os.symlink(target.name, self.root / "..data_tmp")
        os.replace(self.root / "..data_tmp", data_link)
        for name in files:
            if not (self.root / name).is_symlink():
                os.symlink(f"..data/{name}", self.root / name)
        if previous is not None:
            shutil.rmtree(self.root / previous)


def _server_pem(ca_cert: x509.Certificate, ca_key: Any) -> tuple[x509.Certificate, bytes, bytes]:
    cert, key = tls.issue_certificate(
        ca_cert, ca_key, "gas", ["localhost"], ["127.0.0.1"], server=True, client=False
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert, cert.public_bytes(serialization.Encoding.PEM), key_pem


def _overwrite_in_place(path: str, data: bytes) -> None:
    # Truncate and rewrite the same inode, as `cat new > tls.crt` or an editor would.
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)


def _served_certificate(port: int, ctx: ssl.SSLContext) -> x509.Certificate:
    """The certificate a new connection to gas sees; the request on it must succeed."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    try:
        conn.connect()
        assert isinstance(conn.sock, ssl.SSLSocket)
        der = conn.sock.getpeercert(binary_form=True)
        conn.request("GET", "/healthz", headers={"Connection": "close"})
        response = conn.getresponse()
        assert response.status == 200, response.read()
        response.read()
    finally:
        conn.close()
    assert der is not None
    return x509.load_der_x509_certificate(der)


class _KeepAlive:
    """One HTTP/1.1 connection kept open across rotations, as kube-scheduler keeps its own."""

    def __init__(self, port: int, ctx: ssl.SSLContext) -> None:
        self.conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
        self.conn.connect()
        assert isinstance(self.conn.sock, ssl.SSLSocket)
        self.sock = self.conn.sock
        self.local = self.sock.getsockname()
        der = self.sock.getpeercert(binary_form=True)
        assert der is not None
        self.serial = x509.load_der_x509_certificate(der).serial_number

    def get(self) -> None:
        """GET /healthz on the same TLS connection (http.client would reconnect silently if
        the server had closed it: the socket check below catches that)."""
        self.conn.request("GET", "/healthz")
        response = self.conn.getresponse()
        assert response.status == 200
        response.read()
        assert not response.will_close
        assert self.conn.sock is self.sock and self.sock.getsockname() == self.local
        der = self.sock.getpeercert(binary_form=True)
        assert der is not None
        assert x509.load_der_x509_certificate(der).serial_number == self.serial

    def close(self) -> None:
        self.conn.close()


def test_gas_serve_reloads_its_rotated_certificate_without_a_restart(
    start_gas: Callable[..., GasProcess], tmp_path: Path
) -> None:
    """Rotation as the kubelet does it (atomic ..data swap), a half-written file (ignored,
    logged, the old certificate kept), an in-place overwrite and an operator's `mv`: each
    is served to new connections within gas's reload interval, by the same processes,
    while a kept-alive connection goes on working with the certificate it started with."""
    ca_cert, ca_key = tls.new_ca("rotating-ca")
    tls.write_pem(tmp_path / "ca.crt", ca_cert)
    client_cert, client_key = _client_pair(tmp_path, "client", ca_cert, ca_key)
    volume = _SecretVolume(tmp_path / "secret")
    first, cert_pem, key_pem = _server_pem(ca_cert, ca_key)
    volume.publish({"tls.crt": cert_pem, "tls.key": key_pem})
    files = TLSFiles(
        str(tmp_path / "ca.crt"),
        volume.path("tls.crt"),
        volume.path("tls.key"),
        client_cert,
        client_key,
    )
    gas = start_gas(["--demo"], tls=files)
    gas.wait_ready()
    master = gas.process.pid
    workers = sorted(child_pids(master))
    assert len(workers) == 1, workers
    ctx = _client_context(files)

    def wait_until_served(cert: x509.Certificate, what: str) -> None:
        # Every connection on the way must succeed: a rotation never interrupts serving.
        def served() -> bool:
            return _served_certificate(gas.port, ctx).serial_number == cert.serial_number

        try:
            wait_for(served, timeout=15, what=what)
        except TimeoutError:
            pytest.fail(f"{what}: new connections still see the old certificate:\n{gas.log()}")

    assert _served_certificate(gas.port, ctx).serial_number == first.serial_number
    kept = _KeepAlive(gas.port, ctx)
    try:
        kept.get()

        # 1. The kubelet's atomic swap of a mounted Secret: both files change at once.
        second, cert_pem, key_pem = _server_pem(ca_cert, ca_key)
        volume.publish({"tls.crt": cert_pem, "tls.key": key_pem})
        wait_until_served(second, "kubelet-style Secret update")
        kept.get()

        # 2. A half-written certificate: not loadable, so gas keeps the one it has.
        third, cert_pem, key_pem = _server_pem(ca_cert, ca_key)
        _overwrite_in_place(files.server_cert, cert_pem[: len(cert_pem) // 2])
        reload_error = "TLS files changed but cannot be loaded"

        def refused_garbage() -> bool:
            assert _served_certificate(gas.port, ctx).serial_number == second.serial_number
            return reload_error in gas.log()

        try:
            wait_for(refused_garbage, timeout=15, what="the half-written certificate noticed")
        except TimeoutError:
            pytest.fail(f"no reload error for a half-written certificate:\n{gas.log()}")
        assert files.server_cert in gas.log().split(reload_error, 1)[1].splitlines()[0]
        assert _served_certificate(gas.port, ctx).serial_number == second.serial_number

        # 3. The same files overwritten in place, key first: for a moment they do not match.
        _overwrite_in_place(files.server_key, key_pem)
        _overwrite_in_place(files.server_cert, cert_pem)
        wait_until_served(third, "in-place overwrite")

        # 4. An operator's atomic rename of each file (tls.write_pem: temporary file, then
        # rename over the path), key first again.
        fourth, fourth_key = tls.issue_certificate(
            ca_cert, ca_key, "gas", ["localhost"], ["127.0.0.1"], server=True, client=False
        )
        tls.write_pem(files.server_key, fourth_key)
        tls.write_pem(files.server_cert, fourth)
        wait_until_served(fourth, "rename over the files")

        kept.get()  # still the first connection, still the first certificate
    finally:
        kept.close()
    assert gas.process.poll() is None
    assert sorted(child_pids(master)) == workers  # neither restarted nor replaced
    assert gas.log().count("Booting worker") == 1


def test_tokens_keys_and_bodies_never_reach_the_log(
    start_gas: Callable[..., GasProcess], tls_files: TLSFiles, tmp_path: Path
) -> None:
    key_material = Path(tls_files.client_key).read_text()
    key_body = "".join(key_material.strip().splitlines()[1:-1])
    with ApiServerDouble() as api:
        api.add_node(gpu_node("n1", "0.1", i915="2"))
        kubeconfig = tmp_path / "kubeconfig"
        text = Path(api.write_kubeconfig(kubeconfig)).read_text()
        text = text.replace(
            "    token: dummy-token\n",
            f"    token: {TOKEN}\n"
            f"    client-certificate: {tls_files.client_cert}\n"
            f"    client-key: {tls_files.client_key}\n",
        )
        kubeconfig.write_text(text)
        gas = start_gas(["--kubeConfig", str(kubeconfig), "--v", "5"], tls=tls_files)
        gas.wait_ready()
        pod = api.add_pod(gpu_pod("p"))
        secret_header = f"Bearer {TOKEN}-request"
        gas.post(
            "/scheduler/filter", {"Pod": pod, "NodeNames": ["n1"]}, Authorization=secret_header
        )
        gas.post(
            "/scheduler/bind",
            {
                "PodName": "p",
                "PodNamespace": "default",
                "PodUID": pod["metadata"]["uid"],
                "Node": "n1",
            },
            Authorization=secret_header,
        )
        gas.post("/scheduler/filter", {"Pod": 1}, Authorization=secret_header)
        gas.post(
            "/scheduler/bind", {"PodName": "x", "PodNamespace": "x", "PodUID": "u", "Node": "n"}
        )
        output = gas.log()
    assert TOKEN not in output
    assert "Bearer" not in output
    assert key_body[:40] not in output and "PRIVATE KEY" not in output
    assert "DEBUG" in output  # --v 5 really was verbose
