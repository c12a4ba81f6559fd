"""gas.serving.tls and gas.serving.server against real sockets, real OpenSSL and a real gunicorn.

Certificates are generated into a temporary directory at test time. Servers run
``tests/support/tls_app.py`` (a trivial Flask app under ``gas.serving.server.serve``) in their own
process session and are always stopped in fixture teardown.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

import gas.serving.server
from gas.httpserver.limits import Limits
from gas.serving import tls
from gas.serving.server import ServerSettings, build_options, serve
from tests.support import tlsprobe
from tests.support.gasproc import child_pids
from tests.support.tlsprobe import local_handshake, permissive_server_context

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 20.0
THREADS = 8
HANDSHAKE_TIMEOUT = 1.0

pytestmark = pytest.mark.timeout(90)


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


HAS_IPV6 = _ipv6_loopback()


# ----------------------------------------------------------------------------------------
# Certificates
# ----------------------------------------------------------------------------------------


class Pair(NamedTuple):
    cert: str
    key: str


def permissive(pair: Pair) -> ssl.SSLContext:
    return permissive_server_context(pair.cert, pair.key)


@dataclass(frozen=True)
class PKI:
    directory: Path
    ca: str
    server_ec: Pair
    server_rsa: Pair
    client: Pair
    client_other_ca: Pair
    client_expired: Pair
    client_without_client_auth: Pair


def _write_pair(directory: Path, name: str, cert: x509.Certificate, key: Any) -> Pair:
    pair = Pair(str(directory / f"{name}.crt"), str(directory / f"{name}.key"))
    tls.write_pem(pair.cert, cert)
    tls.write_pem(pair.key, key, private=True)
    return pair


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    d = tmp_path_factory.mktemp("pki")
    ca, ca_key = tls.new_ca("gas-test-ca")
    other_ca, other_key = tls.new_ca("some-other-ca")
    tls.write_pem(d / "ca.crt", ca)
    names = (["localhost"], ["127.0.0.1", "::1"])
    now = datetime.datetime.now(datetime.UTC)
    return PKI(
        directory=d,
        ca=str(d / "ca.crt"),
        server_ec=_write_pair(
            d,
            "server-ec",
            *tls.issue_certificate(ca, ca_key, "gas", *names, server=True, client=False),
        ),
        server_rsa=_write_pair(
            d,
            "server-rsa",
            *tls.issue_certificate(
                ca, ca_key, "gas", *names, server=True, client=False, key_type="rsa"
            ),
        ),
        client=_write_pair(
            d,
            "client",
            *tls.issue_certificate(ca, ca_key, "kube-scheduler", server=False, client=True),
        ),
        client_other_ca=_write_pair(
            d,
            "client-other-ca",
            *tls.issue_certificate(
                other_ca, other_key, "kube-scheduler", server=False, client=True
            ),
        ),
        client_expired=_write_pair(
            d,
            "client-expired",
            *tls.issue_certificate(
                ca,
                ca_key,
                "kube-scheduler",
                server=False,
                client=True,
                not_before=now - datetime.timedelta(days=30),
                not_after=now - datetime.timedelta(days=1),
            ),
        ),
        client_without_client_auth=_write_pair(
            d,
            "client-server-eku",
            *tls.issue_certificate(
                ca, ca_key, "kube-scheduler", ["localhost"], server=True, client=False
            ),
        ),
    )


# ----------------------------------------------------------------------------------------
# Servers
# ----------------------------------------------------------------------------------------


def free_port(family: socket.AddressFamily = socket.AF_INET) -> int:
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    scheme: str
    log_path: Path
    requests_kwargs: dict[str, Any] = field(default_factory=dict)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        # "Connection: close": an idle kept-alive connection would make every server stop
        # linger (gunicorn keeps those open for 2 s after SIGTERM).
        return {
            "timeout": 10,
            "headers": {"Connection": "close"},
            **self.requests_kwargs,
            **kwargs,
        }

    def get(self, path: str = "/healthz", **kwargs: Any) -> requests.Response:
        return requests.get(self.url(path), **self._kwargs(kwargs))

    def post(self, path: str, body: dict[str, Any], **kwargs: Any) -> requests.Response:
        return requests.post(self.url(path), json=body, **self._kwargs(kwargs))

    def wait_ready(self) -> dict[str, Any]:
        deadline = time.monotonic() + READY_TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                reply = self.get(timeout=2)
                if reply.status_code == 200:
                    body: dict[str, Any] = reply.json()
                    return body
            except requests.RequestException as exc:
                last = exc
            time.sleep(0.05)
        pytest.fail(f"server not ready after {READY_TIMEOUT} s ({last}):\n{self.log()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        # The worker is in the master's session; make sure nothing of it outlives the test.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)


class Launcher:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.servers: list[Server] = []

    def start(
        self,
        *args: str,
        tls_pair: Pair | None = None,
        ca: str | None = None,
        client: Pair | None = None,
        verify: str | None = None,
        host: str = "127.0.0.1",
        wait: bool = True,
    ) -> Server:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        port = free_port(family)
        log_path = self.directory / f"server-{len(self.servers)}-{port}.log"
        command = [
            sys.executable,
            "-m",
            "tests.support.tls_app",
            "--host",
            host,
            "--port",
            str(port),
            "--threads",
            str(THREADS),
            "--handshake-timeout",
            str(HANDSHAKE_TIMEOUT),
            *args,
        ]
        kwargs: dict[str, Any] = {}
        if tls_pair is None:
            command.append("--unsafe")
            scheme = "http"
        else:
            command += ["--cert", tls_pair.cert, "--key", tls_pair.key]
            scheme = "https"
            kwargs["verify"] = verify or ca
        if ca is not None:
            command += ["--ca", ca]
        if client is not None:
            kwargs["cert"] = (client.cert, client.key)
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                command,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        server = Server(proc, port, scheme, log_path, kwargs)
        self.servers.append(server)
        if wait:
            server.wait_ready()
        return server

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture(scope="module")
def module_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path_factory.mktemp("servers"))
    yield launcher
    launcher.stop_all()


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture(scope="module")
def https_server(module_launcher: Launcher, pki: PKI) -> Server:
    """HTTPS, no client CA (no client certificate requested), RSA server key."""
    return module_launcher.start(tls_pair=pki.server_rsa, verify=pki.ca)


@pytest.fixture(scope="module")
def mtls_server(module_launcher: Launcher, pki: PKI) -> Server:
    """HTTPS with client certificates required (mutual TLS), EC server key."""
    return module_launcher.start(tls_pair=pki.server_ec, ca=pki.ca, client=pki.client)


# ----------------------------------------------------------------------------------------
# Raw TLS clients
# ----------------------------------------------------------------------------------------


def client_context(
    ca: str | None = None, client: Pair | None = None, **options: Any
) -> ssl.SSLContext:
    """`tlsprobe.client_context` offering h2 and HTTP/1.1 by ALPN, as an HTTP client does."""
    return tlsprobe.client_context(ca, client, alpn=("h2", "http/1.1"), **options)


@dataclass
class Attempt:
    ok: bool
    detail: str
    reply: bytes = b""
    version: str | None = None
    cipher: str | None = None
    alpn: str | None = None
    peer_serial: int | None = None


def attempt(port: int, ctx: ssl.SSLContext, host: str = "127.0.0.1") -> Attempt:
    """Handshake, send GET /healthz, read the reply; report whether HTTP got through.

    With TLS 1.3 the server checks the client certificate after the client considers the
    handshake done, so a refusal can also show up as an alert on the first read.
    """
    raw = socket.create_connection((host, port), timeout=10)
    try:
        try:
            conn = ctx.wrap_socket(raw, server_hostname="localhost")
        except (ssl.SSLError, OSError) as exc:
            return Attempt(False, f"handshake: {exc!r}")
        with conn:
            info = Attempt(
                False,
                "",
                version=conn.version(),
                cipher=(conn.cipher() or ("",))[0],
                alpn=conn.selected_alpn_protocol(),
            )
            der = conn.getpeercert(binary_form=True)
            if der:
                info.peer_serial = x509.load_der_x509_certificate(der).serial_number
            try:
                conn.sendall(
                    b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
                )
                chunks = []
                while True:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
            except (ssl.SSLError, OSError) as exc:
                info.detail = f"after handshake: {exc!r}"
                return info
            info.reply = b"".join(chunks)
            info.ok = info.reply.startswith(b"HTTP/1.1 200")
            info.detail = info.reply[:60].decode("latin1") or "EOF without reply"
            return info
    finally:
        raw.close()


def worker_threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads: line")


# ----------------------------------------------------------------------------------------
# gas.serving.tls: generation and loading (in-process)
# ----------------------------------------------------------------------------------------


def _ext(cert: x509.Certificate, cls: Any) -> Any:
    return cert.extensions.get_extension_for_class(cls)


def test_generated_certificates_carry_the_expected_extensions() -> None:
    ca, ca_key = tls.new_ca("test-ca", days=30)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    assert isinstance(ca_key.curve, ec.SECP256R1)
    bc = _ext(ca, x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    assert _ext(ca, x509.KeyUsage).value.key_cert_sign
    ca_ski = _ext(ca, x509.SubjectKeyIdentifier).value.digest
    assert _ext(ca, x509.AuthorityKeyIdentifier).value.key_identifier == ca_ski

    cert, key = tls.issue_certificate(
        ca, ca_key, "srv", ["localhost", "gas.cluster.kube-system.svc"], ["127.0.0.1", "::1"],
        server=True, client=True, key_type="rsa",
    )  # fmt: skip
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 2048
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA256)
    assert cert.issuer == ca.subject
    assert not _ext(cert, x509.BasicConstraints).value.ca
    usage = _ext(cert, x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature and usage.value.key_encipherment
    assert not usage.value.key_cert_sign
    assert set(_ext(cert, x509.ExtendedKeyUsage).value) == {
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    }
    san = _ext(cert, x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "gas.cluster.kube-system.svc"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert _ext(cert, x509.AuthorityKeyIdentifier).value.key_identifier == ca_ski
    ski = _ext(cert, x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert.verify_directly_issued_by(ca)

    client_cert, _ = tls.issue_certificate(ca, ca_key, "kube-scheduler", server=False, client=True)
    assert list(_ext(client_cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]

    past = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    expired, _ = tls.issue_certificate(
        ca, ca_key, "old", server=False, client=True,
        not_before=past, not_after=past + datetime.timedelta(days=1),
    )  # fmt: skip
    assert expired.not_valid_after_utc == past + datetime.timedelta(days=1)

    with pytest.raises(ValueError, match="server or client"):
        tls.issue_certificate(ca, ca_key, "x", ["x"], server=False, client=False)
    with pytest.raises(ValueError, match="DNS name or IP"):
        tls.issue_certificate(ca, ca_key, "x", server=True, client=False)
    with pytest.raises(ValueError, match="later than"):
        tls.issue_certificate(
            ca, ca_key, "x", server=False, client=True, not_before=past, not_after=past
        )
    other, _ = tls.new_ca("other")
    with pytest.raises(ValueError, match="does not belong"):
        tls.issue_certificate(other, ca_key, "x", server=False, client=True)


def test_write_pem_is_atomic_and_keys_are_private(tmp_path: Path) -> None:
    ca, ca_key = tls.new_ca("test-ca")
    tls.write_pem(tmp_path / "ca.crt", ca)
    tls.write_pem(tmp_path / "ca.key", ca_key)  # a key is private even without private=True
    assert stat.S_IMODE(os.stat(tmp_path / "ca.crt").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "ca.key").st_mode) == 0o600
    tls.write_pem(tmp_path / "secret.crt", ca, private=True)
    assert stat.S_IMODE(os.stat(tmp_path / "secret.crt").st_mode) == 0o600

    before = os.stat(tmp_path / "ca.crt").st_ino
    second, _ = tls.new_ca("second-ca")
    tls.write_pem(tmp_path / "ca.crt", [second, ca])  # a chain, replacing the file
    assert os.stat(tmp_path / "ca.crt").st_ino != before  # renamed into place, not rewritten
    loaded = tls.load_certificates(str(tmp_path / "ca.crt"))
    assert [c.subject for c in loaded] == [second.subject, ca.subject]
    key = tls.load_private_key(str(tmp_path / "ca.key"))
    assert key.public_key() == ca_key.public_key()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "ca.key", "secret.crt"]


def test_write_self_signed_names_localhost_and_is_usable(tmp_path: Path) -> None:
    certfile, keyfile = tls.write_self_signed(tmp_path / "demo", ["gas.example", "10.1.2.3"])
    assert stat.S_IMODE(os.stat(keyfile).st_mode) == 0o600
    cert = tls.load_certificates(certfile)[0]
    san = _ext(cert, x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "gas.example"}
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "::1",
        "10.1.2.3",
    }
    assert cert.issuer == cert.subject
    # A client can pin the certificate itself as its trust anchor.
    server_ctx = tls.server_ssl_context(certfile, keyfile, None)
    version, _ = local_handshake(server_ctx, client_context(ca=certfile))
    assert version in {"TLSv1.2", "TLSv1.3"}


def test_server_context_policy(pki: PKI) -> None:
    ctx = tls.server_ssl_context(pki.server_ec.cert, pki.server_ec.key, None)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE
    assert ctx.options & ssl.OP_NO_COMPRESSION
    tls12 = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert tls12
    for name in tls12:
        assert name.startswith("ECDHE-"), name
        assert "GCM" in name or "CHACHA20" in name, name

    mtls = tls.server_ssl_context(pki.server_ec.cert, pki.server_ec.key, pki.ca)
    assert mtls.verify_mode == ssl.CERT_REQUIRED


def _session_after_handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> Any:
    """The client's session once the server has answered a byte (TLS 1.3 tickets come
    after the handshake, before the answer)."""
    server_end, client_end = socket.socketpair()
    for end in (server_end, client_end):
        end.settimeout(5)

    def serve_one() -> None:
        with server_ctx.wrap_socket(server_end, server_side=True) as conn:
            conn.sendall(conn.recv(1))

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    try:
        with client_ctx.wrap_socket(client_end, server_hostname="localhost") as conn:
            conn.sendall(b"x")
            assert conn.recv(1) == b"x"
            return conn.session
    finally:
        thread.join(5)
        server_end.close()
        client_end.close()


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_server_issues_no_session_tickets(pki: PKI, version: ssl.TLSVersion) -> None:
    # No client of the extender resumes a session; a ticket would only cost the handshake.
    client = client_context(pki.ca, pki.client, maximum=version)
    client.minimum_version = version
    stock = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    stock.load_cert_chain(pki.server_ec.cert, pki.server_ec.key)
    assert _session_after_handshake(stock, client).has_ticket
    mtls = tls.server_ssl_context(pki.server_ec.cert, pki.server_ec.key, pki.ca)
    session = _session_after_handshake(mtls, client)
    assert session is None or not session.has_ticket


def test_server_context_errors_name_the_file(pki: PKI, tmp_path: Path) -> None:
    cert, key = pki.server_ec.cert, pki.server_ec.key
    missing = str(tmp_path / "missing.crt")
    with pytest.raises(tls.TLSConfigError, match=f"{missing}: file not found"):
        tls.server_ssl_context(missing, key, None)
    with pytest.raises(tls.TLSConfigError, match=r"key file .*missing\.key: file not found"):
        tls.server_ssl_context(cert, str(tmp_path / "missing.key"), None)
    with pytest.raises(tls.TLSConfigError, match=r"client CA file .*missing-ca\.crt"):
        tls.server_ssl_context(cert, key, str(tmp_path / "missing-ca.crt"))
    with pytest.raises(tls.TLSConfigError, match="is a directory"):
        tls.server_ssl_context(str(tmp_path), key, None)
    with pytest.raises(tls.TLSConfigError, match="does not match the certificate"):
        tls.server_ssl_context(cert, pki.server_rsa.key, None)
    with pytest.raises(tls.TLSConfigError, match="not a usable PEM private key"):
        tls.server_ssl_context(cert, cert, None)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(tls.TLSConfigError, match=f"{garbage}: no valid PEM certificate"):
        tls.server_ssl_context(str(garbage), key, None)
    with pytest.raises(tls.TLSConfigError, match=r"client CA file .*garbage\.pem"):
        tls.server_ssl_context(cert, key, str(garbage))

    encrypted = tmp_path / "encrypted.key"
    private = tls.load_private_key(key)
    encrypted.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(tls.TLSConfigError, match="encrypted"):
        tls.server_ssl_context(cert, str(encrypted), None)

    if os.geteuid() != 0:  # root reads files whatever their mode
        unreadable = tmp_path / "unreadable.key"
        unreadable.write_bytes(Path(key).read_bytes())
        unreadable.chmod(0)
        with pytest.raises(tls.TLSConfigError, match="cannot read"):
            tls.server_ssl_context(cert, str(unreadable), None)


def test_serve_options_and_refusals_before_listening(pki: PKI) -> None:
    def factory() -> Any:
        raise AssertionError("the app must not be built in the calling process")

    with pytest.raises(tls.TLSConfigError, match="unsafe"):
        serve(factory, ServerSettings(port=free_port()))
    with pytest.raises(tls.TLSConfigError, match="keyfile is not set"):
        serve(factory, ServerSettings(port=free_port(), certfile=pki.server_ec.cert))
    with pytest.raises(tls.TLSConfigError, match="does not match"):
        serve(factory, ServerSettings(certfile=pki.server_ec.cert, keyfile=pki.server_rsa.key))
    with pytest.raises(ValueError, match="threads"):
        serve(factory, ServerSettings(unsafe=True, threads=0))

    options = build_options(
        ServerSettings(certfile=pki.server_ec.cert, keyfile=pki.server_ec.key, cafile=pki.ca)
    )
    assert options["workers"] == 1
    assert options["worker_class"] == "gas.serving.server.LoopWorker"
    assert options["preload_app"] is False
    assert options["bind"] == ["0.0.0.0:9001"]
    assert options["accesslog"] is None
    plain = build_options(ServerSettings(unsafe=True, host="::", port=8080))
    assert plain["bind"] == ["[::]:8080"]
    assert "certfile" not in plain
    with pytest.raises(ValueError, match="max_connections"):
        serve(factory, ServerSettings(unsafe=True, limits=Limits(max_connections=0)))
    assert build_options(ServerSettings(unsafe=True, host="[::1]"))["bind"] == ["[::1]:9001"]


# ----------------------------------------------------------------------------------------
# Real gunicorn: TLS
# ----------------------------------------------------------------------------------------


def test_https_without_client_ca(https_server: Server, pki: PKI) -> None:
    reply = https_server.get()
    assert reply.status_code == 200
    assert reply.json()["scheme"] == "https"

    result = attempt(https_server.port, client_context(pki.ca))
    assert result.ok, result.detail
    assert result.alpn == "http/1.1"  # h2 offered too; the server picks HTTP/1.1
    assert result.version == "TLSv1.3"

    tls12 = attempt(https_server.port, client_context(pki.ca, maximum=ssl.TLSVersion.TLSv1_2))
    assert tls12.ok, tls12.detail
    assert tls12.version == "TLSv1.2"
    assert tls12.cipher is not None and tls12.cipher.startswith("ECDHE-RSA-")

    with pytest.raises(requests.exceptions.SSLError):
        requests.get(https_server.url("/healthz"), timeout=5)  # not trusted by default


def test_mtls_accepts_a_client_certificate_from_the_ca(mtls_server: Server, pki: PKI) -> None:
    reply = mtls_server.get()
    assert reply.status_code == 200
    for maximum in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        result = attempt(mtls_server.port, client_context(pki.ca, pki.client, maximum=maximum))
        assert result.ok, result.detail


@pytest.mark.parametrize("maximum", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
@pytest.mark.parametrize("which", ["no certificate", "other CA", "expired", "no clientAuth usage"])
def test_mtls_refuses_bad_client_certificates(
    mtls_server: Server, pki: PKI, which: str, maximum: ssl.TLSVersion
) -> None:
    client = {
        "no certificate": None,
        "other CA": pki.client_other_ca,
        "expired": pki.client_expired,
        "no clientAuth usage": pki.client_without_client_auth,
    }[which]
    result = attempt(mtls_server.port, client_context(pki.ca, client, maximum=maximum))
    assert not result.ok, result.detail
    assert b"HTTP/" not in result.reply
    if maximum == ssl.TLSVersion.TLSv1_2:
        # TLS 1.2 verifies the client certificate inside the handshake itself.
        assert result.detail.startswith("handshake:"), result.detail


@pytest.mark.parametrize("version", ["TLSv1", "TLSv1_1"])
def test_old_tls_versions_are_refused(https_server: Server, pki: PKI, version: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tls_version = getattr(ssl.TLSVersion, version)
    try:
        # SECLEVEL=0 because distributions build OpenSSL to refuse TLS < 1.2 at level >= 1.
        ctx = client_context(minimum=tls_version, maximum=tls_version, ciphers="ALL:@SECLEVEL=0")
    except (ssl.SSLError, ValueError) as exc:
        pytest.skip(f"local OpenSSL cannot build a {version} client: {exc}")
    try:
        # The control: the same client works against a server that allows old versions.
        negotiated, _ = local_handshake(permissive(pki.server_rsa), ctx)
    except (ssl.SSLError, OSError) as exc:
        pytest.skip(f"local OpenSSL cannot do a {version} handshake at all: {exc!r}")
    assert negotiated == version.replace("_", ".")

    result = attempt(https_server.port, ctx)
    assert not result.ok
    assert result.detail.startswith("handshake:"), result.detail


@pytest.mark.parametrize(
    "cipher",
    [
        "AES128-GCM-SHA256",  # RSA key transport: no forward secrecy
        "ECDHE-RSA-AES128-SHA",  # CBC with SHA-1
        "ECDHE-RSA-AES256-SHA384",  # CBC
    ],
)
def test_weak_tls12_ciphers_are_refused(https_server: Server, pki: PKI, cipher: str) -> None:
    ctx = client_context(maximum=ssl.TLSVersion.TLSv1_2, ciphers=f"{cipher}:@SECLEVEL=0")
    try:
        _, negotiated = local_handshake(permissive(pki.server_rsa), ctx)
    except (ssl.SSLError, OSError) as exc:
        pytest.skip(f"local OpenSSL cannot negotiate {cipher} at all: {exc!r}")
    assert negotiated == cipher

    result = attempt(https_server.port, ctx)
    assert not result.ok
    assert result.detail.startswith("handshake:"), result.detail


def test_worker_survives_refused_handshakes_without_leaking_threads(
    https_server: Server, pki: PKI
) -> None:
    before = https_server.get().json()
    worker = before["pid"]

    def plain_http() -> None:
        with socket.create_connection(("127.0.0.1", https_server.port), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            with contextlib.suppress(OSError):  # closed or reset: both fine
                assert not s.recv(100).startswith(b"HTTP/1.1 200")

    def garbage() -> None:
        with socket.create_connection(("127.0.0.1", https_server.port), timeout=5) as s:
            s.sendall(os.urandom(512))
            with contextlib.suppress(OSError):
                s.recv(100)

    def connect_and_close() -> None:
        socket.create_connection(("127.0.0.1", https_server.port), timeout=5).close()

    weak = client_context(maximum=ssl.TLSVersion.TLSv1_2, ciphers="AES128-SHA:@SECLEVEL=0")
    untrusted = client_context(ca=pki.client.cert)  # wrong trust anchor: the client aborts

    def bad_tls(ctx: ssl.SSLContext) -> Callable[[], None]:
        def run() -> None:
            result = attempt(https_server.port, ctx)
            assert not result.ok, result.detail

        return run

    abusers = [plain_http, garbage, connect_and_close, bad_tls(weak), bad_tls(untrusted)]
    with ThreadPoolExecutor(max_workers=10) as pool:
        for future in [pool.submit(abuse) for abuse in abusers * 8]:
            future.result()

    after = https_server.get()
    assert after.status_code == 200
    assert after.json()["pid"] == worker
    # The pool threads plus the main and the app's background thread; nothing more.
    assert worker_threads(worker) <= THREADS + 2
    assert https_server.proc.poll() is None


def test_stalled_handshakes_are_cut_off(https_server: Server, pki: PKI) -> None:
    # More stalled clients than threads: without a handshake timeout they would hold every
    # thread forever and the real request below would never be served.
    stalled = []
    for _ in range(THREADS + 2):
        s = socket.create_connection(("127.0.0.1", https_server.port), timeout=10)
        s.sendall(b"\x16\x03\x01")  # the start of a TLS record, then nothing
        stalled.append(s)
    try:
        result = attempt(https_server.port, client_context(pki.ca))
        assert result.ok, result.detail
        for s in stalled:
            assert s.recv(100) == b""  # closed by the server, not left hanging
    finally:
        for s in stalled:
            s.close()
    closed = r"closed connection from 127\.0\.0\.1:\d+: handshake_timeout"
    assert re.search(closed, https_server.log())


# ----------------------------------------------------------------------------------------
# Real gunicorn: process model, concurrency, plain HTTP, shutdown, reload
# ----------------------------------------------------------------------------------------


def test_one_worker_process_builds_and_runs_the_app(https_server: Server) -> None:
    first = https_server.get().json()
    second = https_server.get().json()
    master = https_server.proc.pid
    worker = first["pid"]
    assert second["pid"] == worker
    assert worker != master and first["ppid"] == master
    assert first["factory_pid"] == worker  # app_factory ran in the worker ...
    assert first["background_pid"] == worker  # ... and so does its background thread
    assert child_pids(master) == [worker]


def test_concurrent_requests_overlap_on_the_worker_threads(https_server: Server) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        replies = list(
            pool.map(lambda i: https_server.post("/echo", {"sleep": 0.5, "i": i}), range(4))
        )
    bodies = [r.json() for r in replies]
    assert all(r.status_code == 200 for r in replies)
    assert len({b["pid"] for b in bodies}) == 1
    assert len({b["thread"] for b in bodies}) == 4
    # Every request started before any of them ended: they were all in flight together.
    assert max(b["start"] for b in bodies) < min(b["end"] for b in bodies)


class RawClient:
    """One kept-alive TLS connection written and read by hand, so that requests can follow
    each other at once, come together in one write, or after a pause."""

    def __init__(self, port: int, ca: str) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        context = tlsprobe.client_context(ca, None, alpn=("http/1.1",))
        self.sock = context.wrap_socket(raw, server_hostname="localhost")
        self.reader = self.sock.makefile("rb")

    @staticmethod
    def request(i: int, sleep: float = 0.0) -> bytes:
        body = b'{"i": %d, "sleep": %g}' % (i, sleep)
        head = b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        return head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)

    def reply(self) -> dict[str, Any]:
        status = self.reader.readline()
        assert status.startswith(b"HTTP/1.1 200"), status
        length = 0
        while (line := self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return cast(dict[str, Any], json.loads(self.reader.read(length)))

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def test_requests_on_one_connection_are_answered_in_order_however_they_follow(
    https_server: Server, pki: PKI
) -> None:
    client = RawClient(https_server.port, pki.ca)
    try:
        served = []
        for i in range(5):  # each sent as soon as the last is answered
            client.sock.sendall(client.request(i))
            served.append(client.reply()["body"]["i"])
        # Several in one write: answered one after another, in order.
        client.sock.sendall(b"".join(client.request(i) for i in range(5, 10)))
        replies = [client.reply() for _ in range(5, 10)]
        served += [reply["body"]["i"] for reply in replies]
        time.sleep(0.2)
        client.sock.sendall(client.request(10))
        served.append(client.reply()["body"]["i"])
        client.sock.sendall(client.request(11)[:20])  # a request cut in two
        time.sleep(0.05)
        client.sock.sendall(client.request(11)[20:])
        served.append(client.reply()["body"]["i"])
    finally:
        client.close()
    assert served == list(range(12))
    assert "Traceback" not in https_server.log()


def test_a_connection_answered_in_a_row_does_not_hold_up_another(
    launcher: Launcher, pki: PKI
) -> None:
    # One thread, and a connection whose next request is always in already (sent all in
    # one write): the thread answers it in a row only while no other connection waits.
    server = launcher.start("--threads", "1", tls_pair=pki.server_rsa, verify=pki.ca)
    busy = RawClient(server.port, pki.ca)
    other = RawClient(server.port, pki.ca)
    count = 100  # 20 ms each: 2 s in a row
    busy.sock.sendall(b"".join(busy.request(i, sleep=0.02) for i in range(count)))
    answered: list[int] = []
    other_after: list[int] = []

    def ask_other() -> None:
        other.sock.sendall(other.request(-1))
        assert other.reply()["body"]["i"] == -1
        other_after.append(len(answered))

    asker = threading.Thread(target=ask_other)
    try:
        for i in range(count):
            answered.append(busy.reply()["body"]["i"])
            if i == 0:
                asker.start()
        asker.join(30)
    finally:
        busy.close()
        other.close()
    assert answered == list(range(count))
    # The other connection's request came in after the first answer; it waited for the
    # one request being answered, maybe the next, not for the whole row.
    assert other_after and other_after[0] <= 5


def test_unsafe_serves_plain_http(module_launcher: Launcher, pki: PKI) -> None:
    host = "::" if HAS_IPV6 else "127.0.0.1"
    server = module_launcher.start(host=host)
    reply = server.get()
    assert reply.status_code == 200 and reply.json()["scheme"] == "http"
    if HAS_IPV6:
        assert requests.get(server.url("/healthz", host="[::1]"), timeout=5).status_code == 200
    result = attempt(server.port, client_context(pki.ca))
    assert not result.ok and result.detail.startswith("handshake:")


def test_sigterm_lets_the_in_flight_request_finish(
    launcher: Launcher, pki: PKI, tmp_path: Path
) -> None:
    marker = tmp_path / "worker-exit"
    server = launcher.start("--exit-marker", str(marker), tls_pair=pki.server_ec, verify=pki.ca)
    worker = server.get().json()["pid"]
    with ThreadPoolExecutor(max_workers=1) as pool:
        slow = pool.submit(server.post, "/echo", {"sleep": 1.5}, headers={"Connection": "close"})
        deadline = time.monotonic() + 10
        while server.get().json()["in_flight"] < 1:
            assert time.monotonic() < deadline, "the slow request never started"
            time.sleep(0.02)
        signalled = time.time()
        server.proc.send_signal(signal.SIGTERM)
        reply = slow.result(timeout=15)
    assert reply.status_code == 200
    body = reply.json()
    assert body["start"] < signalled < body["end"]  # SIGTERM came while it was in flight
    assert body["end"] - body["start"] >= 1.5
    assert server.proc.wait(timeout=15) == 0, server.log()
    assert marker.read_text() == str(worker)  # on_worker_exit ran in the worker


def test_certificate_files_are_reloaded_when_they_change(
    launcher: Launcher, pki: PKI, tmp_path: Path
) -> None:
    pair = Pair(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    ca, ca_key = tls.new_ca("rotating-ca")
    first, first_key = tls.issue_certificate(
        ca, ca_key, "gas", ["localhost"], ["127.0.0.1"], server=True, client=False
    )
    tls.write_pem(pair.key, first_key)
    tls.write_pem(pair.cert, first)
    tls.write_pem(tmp_path / "ca.crt", ca)
    server = launcher.start(tls_pair=pair, verify=str(tmp_path / "ca.crt"))
    ctx = client_context(str(tmp_path / "ca.crt"))
    assert attempt(server.port, ctx).peer_serial == first.serial_number

    second, second_key = tls.issue_certificate(
        ca, ca_key, "gas", ["localhost"], ["127.0.0.1"], server=True, client=False
    )
    # Key first, then certificate, as a rotation would: for a moment they do not match.
    tls.write_pem(pair.key, second_key)
    tls.write_pem(pair.cert, second)
    deadline = time.monotonic() + 10
    while True:
        result = attempt(server.port, ctx)
        assert result.ok, result.detail
        if result.peer_serial == second.serial_number:
            break
        assert time.monotonic() < deadline, f"certificate not reloaded:\n{server.log()}"
        time.sleep(0.2)


def test_reloading_context_keeps_serving_through_a_bad_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(gas.serving.server, "_RELOAD_CHECK_INTERVAL", 0.0)
    ca, ca_key = tls.new_ca("rotating-ca")
    certfile, keyfile = str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")
    first, first_key = tls.issue_certificate(
        ca, ca_key, "gas", ["localhost"], server=True, client=False
    )
    tls.write_pem(keyfile, first_key)
    tls.write_pem(certfile, first)
    hook = gas.serving.server._ReloadingContext(certfile, keyfile, None)
    original = hook()
    assert hook() is original  # cached, not rebuilt

    second, second_key = tls.issue_certificate(
        ca, ca_key, "gas", ["localhost"], server=True, client=False
    )
    tls.write_pem(keyfile, second_key)  # half-rotated: the key no longer matches
    with caplog.at_level("ERROR", logger="gas.serving.server"):
        assert hook() is original
    assert "cannot be loaded" in caplog.text and "does not match" in caplog.text

    tls.write_pem(certfile, second)
    rotated = hook()
    assert rotated is not original
    os.unlink(keyfile)  # gone mid-rotation: keep serving with what we have
    assert hook() is rotated


def test_the_worker_is_replaced_but_never_duplicated(launcher: Launcher) -> None:
    server = launcher.start()
    master = server.proc.pid

    def wait_for_new_worker(old: int) -> dict[str, Any]:
        # Samples the master's children all along: there must never be two.
        deadline = time.monotonic() + 15
        while True:
            assert len(child_pids(master)) <= 1, "two workers at once"
            try:
                current: dict[str, Any] = server.get(timeout=2).json()
                if current["pid"] != old:
                    return current
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.01)

    first = server.get().json()
    os.kill(first["pid"], signal.SIGABRT)  # what the master sends a worker that hangs
    second = wait_for_new_worker(first["pid"])
    assert second["ppid"] == master
    assert second["factory_pid"] == second["pid"]  # the app was built again
    log = server.log()
    assert f"worker {first['pid']} aborted" in log and "thread stacks" in log

    os.kill(master, signal.SIGHUP)  # stock gunicorn would start a second worker first
    third = wait_for_new_worker(second["pid"])
    assert third["ppid"] == master

    for sig in (signal.SIGTTIN, signal.SIGUSR2):  # stock gunicorn: one more worker/master
        os.kill(master, sig)
    deadline = time.monotonic() + 5
    while "SIGUSR2 ignored" not in server.log():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
    time.sleep(0.3)  # a wrongly spawned worker would show up by now
    assert "SIGTTIN ignored" in server.log()
    assert child_pids(master) == [third["pid"]]
    assert server.get().json()["pid"] == third["pid"]


def test_app_factory_failure_stops_the_server(launcher: Launcher) -> None:
    server = launcher.start("--fail-in-factory", wait=False)
    assert server.proc.wait(timeout=20) == 3, server.log()  # gunicorn: worker failed to boot
    assert "app factory failed on purpose" in server.log()


def test_sigint_quits_at_once_even_while_connections_come_and_go(launcher: Launcher) -> None:
    """Quick shutdown must not deadlock the worker (stock gthread can, when the signal
    lands while a connection is handed to the thread pool)."""
    for _ in range(3):
        server = launcher.start()
        stop = threading.Event()

        def churn(port: int = server.port, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), timeout=1),
                ):
                    pass

        threads = [threading.Thread(target=churn) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        server.proc.send_signal(signal.SIGINT)
        try:
            # A deadlocked worker is only reaped after the 20 s graceful timeout.
            assert server.proc.wait(timeout=8) is not None, server.log()
        finally:
            stop.set()
            for thread in threads:
                thread.join()
