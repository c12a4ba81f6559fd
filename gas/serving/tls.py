"""TLS for the extender: the server-side SSL context and certificate generation.

kube-scheduler talks to the extender over HTTPS and, when configured with a client
certificate, authenticates with it (the only credential it can send). The server context
therefore enforces TLS >= 1.2 with forward-secret AEAD ciphers and, when a CA file is
given, requires and verifies client certificates.

The generation helpers make small private PKIs: a throwaway self-signed certificate for the
demo mode, and a CA plus server/client certificates for tests and ``gas certs``.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Iterable, Sequence
from typing import Literal

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    PrivateKeyTypes,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "ALPN_PROTOCOLS",
    "TLS12_CIPHERS",
    "GeneratedKey",
    "KeyType",
    "ServerSSLContext",
    "TLSConfigError",
    "TLSHandshakeTimeout",
    "issue_certificate",
    "load_certificates",
    "load_private_key",
    "new_ca",
    "new_private_key",
    "self_signed_certificate",
    "self_signed_pem",
    "server_ssl_context",
    "split_hosts",
    "write_pem",
    "write_self_signed",
]

log = logging.getLogger(__name__)

# TLS 1.2 suites only: forward secrecy (ECDHE) and AEAD (GCM, ChaCha20-Poly1305). OpenSSL
# keeps TLS 1.3 suites separately and they are all AEAD, so this string does not touch them.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!PSK:!DSS"

# What a context offers unless told otherwise: HTTP/1.1. `gas serve` adds h2 in front
# (gas.httpserver.http2); Go clients, kube-scheduler included, use HTTP/1.1 when h2 is not
# offered.
ALPN_PROTOCOLS: tuple[str, ...] = ("http/1.1",)

KeyType = Literal["ec", "rsa"]
GeneratedKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

# Certificates start slightly in the past so that a peer whose clock lags a little does
# not reject a certificate issued a moment ago.
_CLOCK_SKEW = datetime.timedelta(minutes=5)


class TLSConfigError(Exception):
    """A certificate, key or CA file cannot be used; the message names the file."""


class TLSHandshakeTimeout(ssl.SSLError):
    """A peer did not complete the TLS handshake in time.

    An ``SSLError`` so that servers which already treat failed handshakes as a client
    error (gunicorn logs one line and closes) treat a stalled one the same way.
    """

    def __str__(self) -> str:
        # SSLError's own __str__ shows a tuple when it was not raised by OpenSSL.
        return str(self.args[0]) if self.args else "TLS handshake timed out"


class ServerSSLContext(ssl.SSLContext):
    """A server ``SSLContext`` whose handshakes are bounded in time.

    A thread-per-connection server does the handshake on a pool thread with a blocking
    socket; a client that sends part of a ClientHello and stalls would hold that thread
    forever, and a handful of them would starve the pool.
    """

    handshake_timeout: float | None = None

    def wrap_socket(
        self,
        sock: socket.socket,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLSocket:
        timeout = self.handshake_timeout
        if timeout is None or not do_handshake_on_connect:
            return super().wrap_socket(
                sock,
                server_side=server_side,
                do_handshake_on_connect=do_handshake_on_connect,
                suppress_ragged_eofs=suppress_ragged_eofs,
                server_hostname=server_hostname,
                session=session,
            )
        previous = sock.gettimeout()
        tls_sock = super().wrap_socket(
            sock,
            server_side=server_side,
            do_handshake_on_connect=False,
            suppress_ragged_eofs=suppress_ragged_eofs,
            server_hostname=server_hostname,
            session=session,
        )
        try:
            # CPython applies the socket timeout to the whole handshake, not per read.
            tls_sock.settimeout(timeout)
            tls_sock.do_handshake()
            tls_sock.settimeout(previous)
        except TimeoutError as exc:
            tls_sock.close()
            raise TLSHandshakeTimeout(f"TLS handshake not completed within {timeout:g} s") from exc
        except BaseException:
            tls_sock.close()
            raise
        return tls_sock


# --------------------------------------------------------------------------------------
# Loading and the server context
# --------------------------------------------------------------------------------------


def _read_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise TLSConfigError(f"{what} {path}: file not found") from None
    except IsADirectoryError:
        raise TLSConfigError(f"{what} {path}: is a directory, not a file") from None
    except OSError as exc:
        raise TLSConfigError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None


def load_certificates(path: str, what: str = "certificate file") -> list[x509.Certificate]:
    """All PEM certificates in ``path``, in file order; ``TLSConfigError`` if none."""
    data = _read_file(path, what)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise TLSConfigError(f"{what} {path}: no valid PEM certificate ({exc})") from None
    if not certs:  # pragma: no cover - cryptography raises instead, kept as a guard
        raise TLSConfigError(f"{what} {path}: contains no PEM certificate")
    return certs


def load_private_key(path: str, what: str = "key file") -> PrivateKeyTypes:
    """The unencrypted PEM private key in ``path``."""
    data = _read_file(path, what)
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        # cryptography signals "this key needs a password" with TypeError.
        raise TLSConfigError(
            f"{what} {path}: the key is encrypted; an unencrypted PEM key is required"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise TLSConfigError(f"{what} {path}: not a usable PEM private key ({exc})") from None


def _public_der(key: PrivateKeyTypes | x509.Certificate) -> bytes:
    public = key.public_key()
    return public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _warn_if_not_current(cert: x509.Certificate, certfile: str) -> None:
    now = datetime.datetime.now(datetime.UTC)
    if cert.not_valid_after_utc <= now:
        log.warning(
            "TLS certificate %s expired at %s; clients will reject it",
            certfile,
            cert.not_valid_after_utc.isoformat(),
        )
    elif cert.not_valid_before_utc > now:
        log.warning(
            "TLS certificate %s is not valid before %s; clients will reject it until then",
            certfile,
            cert.not_valid_before_utc.isoformat(),
        )


def server_ssl_context(
    certfile: str,
    keyfile: str,
    cafile: str | None,
    *,
    handshake_timeout: float | None = None,
    alpn_protocols: Sequence[str] = ALPN_PROTOCOLS,
) -> ServerSSLContext:
    """A TLS server context for the extender.

    TLS 1.2 minimum, TLS 1.2 restricted to ECDHE + AEAD suites, no compression, no
    client-initiated renegotiation, ALPN offering ``alpn_protocols``. With ``cafile``,
    client certificates are required and must chain to a CA in it (mutual TLS); without
    it, no client certificate is requested.

    ``certfile`` may hold the server certificate followed by intermediates. The files are
    parsed before OpenSSL sees them so that errors name the file and the problem; any
    failure raises ``TLSConfigError``.
    """
    certs = load_certificates(certfile, "TLS certificate file")
    key = load_private_key(keyfile, "TLS key file")
    if _public_der(key) != _public_der(certs[0]):
        raise TLSConfigError(
            f"TLS key file {keyfile} does not match the certificate in {certfile} "
            "(the first certificate in the file must be the one the key belongs to)"
        )
    _warn_if_not_current(certs[0], certfile)

    ctx = ServerSSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.handshake_timeout = handshake_timeout
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    # Renegotiation lets a client make the server redo expensive handshakes on one
    # connection; nothing the extender serves needs it.
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    # No session tickets: kube-scheduler's Go client keeps no session cache, so it never
    # resumes, and issuing them (the session, client certificate included, serialized and
    # encrypted twice after each TLS 1.3 handshake) cost a third of a new connection's
    # handshake CPU, and kube-scheduler opens one for every third pod or so.
    ctx.options |= ssl.OP_NO_TICKET
    ctx.num_tickets = 0
    if alpn_protocols:
        ctx.set_alpn_protocols(list(alpn_protocols))
    try:
        ctx.load_cert_chain(certfile=certfile, keyfile=keyfile)
    except (ssl.SSLError, OSError) as exc:
        raise TLSConfigError(
            f"TLS certificate file {certfile} / key file {keyfile}: rejected by OpenSSL: {exc}"
        ) from None

    if cafile is not None:
        load_certificates(cafile, "TLS client CA file")
        try:
            ctx.load_verify_locations(cafile=cafile)
        except (ssl.SSLError, OSError) as exc:
            raise TLSConfigError(
                f"TLS client CA file {cafile}: rejected by OpenSSL: {exc}"
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


# --------------------------------------------------------------------------------------
# Certificate generation
# --------------------------------------------------------------------------------------


def new_private_key(key_type: KeyType = "ec") -> GeneratedKey:
    """A fresh EC P-256 (default) or RSA 2048 private key."""
    if key_type == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"unknown key type {key_type!r}; use 'ec' or 'rsa'")


def _validity(
    days: int,
    not_before: datetime.datetime | None,
    not_after: datetime.datetime | None,
) -> tuple[datetime.datetime, datetime.datetime]:
    now = _utcnow()
    start = _aware(not_before) if not_before is not None else now - _CLOCK_SKEW
    if not_after is not None:
        end = _aware(not_after)
    else:
        end = (start if not_before is not None else now) + datetime.timedelta(days=days)
    if end <= start:
        raise ValueError(f"not_after ({end.isoformat()}) must be later than not_before")
    return start, end


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _aware(moment: datetime.datetime) -> datetime.datetime:
    # A naive datetime is taken as UTC, which is what X.509 times are.
    if moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.UTC)
    return moment.astimezone(datetime.UTC)


def _signature_hash(key: CertificateIssuerPrivateKeyTypes) -> hashes.SHA256 | None:
    # EdDSA-style keys hash internally and must be given no digest.
    if isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | dsa.DSAPrivateKey):
        return hashes.SHA256()
    return None


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _general_names(
    dns_names: Iterable[str],
    ip_addresses: Iterable[str | ipaddress.IPv4Address | ipaddress.IPv6Address],
) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for dns in dns_names:
        if dns and dns.lower() not in seen:
            seen.add(dns.lower())
            names.append(x509.DNSName(dns))
    for ip in ip_addresses:
        addr = ipaddress.ip_address(ip)
        if str(addr) not in seen:
            seen.add(str(addr))
            names.append(x509.IPAddress(addr))
    return names


def split_hosts(hosts: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split host names into (DNS names, IP addresses) for a SubjectAlternativeName."""
    dns: list[str] = []
    ips: list[str] = []
    for host in hosts:
        candidate = host.strip().strip("[]")
        if not candidate:
            continue
        try:
            ips.append(str(ipaddress.ip_address(candidate)))
        except ValueError:
            dns.append(candidate)
    return dns, ips


def new_ca(
    common_name: str,
    days: int = 3650,
    *,
    key_type: KeyType = "ec",
    path_length: int | None = 0,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> tuple[x509.Certificate, GeneratedKey]:
    """A self-signed CA certificate and its key.

    ``path_length=0`` (the default) lets the CA sign only end-entity certificates.
    """
    key = new_private_key(key_type)
    start, end = _validity(days, not_before, not_after)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, _signature_hash(key))
    )
    return cert, key


def _leaf_key_usage(key: GeneratedKey) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        # Only an RSA key can take part in RSA key transport.
        key_encipherment=isinstance(key, rsa.RSAPrivateKey),
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _extended_key_usage(server: bool, client: bool) -> x509.ExtendedKeyUsage:
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    if not usages:
        raise ValueError("a certificate must be for server or client use (or both)")
    return x509.ExtendedKeyUsage(usages)


def _authority_key_identifier(ca_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key())  # type: ignore[arg-type]
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def issue_certificate(
    ca_cert: x509.Certificate,
    ca_key: CertificateIssuerPrivateKeyTypes,
    common_name: str,
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str | ipaddress.IPv4Address | ipaddress.IPv6Address] = (),
    *,
    server: bool,
    client: bool,
    days: int = 365,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
    key_type: KeyType = "ec",
) -> tuple[x509.Certificate, GeneratedKey]:
    """An end-entity certificate signed by ``ca_key``, and its new key.

    ``server``/``client`` choose the extended key usages (serverAuth, clientAuth). A
    server certificate needs at least one DNS name or IP address. ``not_before`` and
    ``not_after`` override the validity window, e.g. to make an expired certificate.
    """
    if _public_der(ca_key) != _public_der(ca_cert):
        raise ValueError("ca_key does not belong to ca_cert")
    names = _general_names(dns_names, ip_addresses)
    if server and not names:
        raise ValueError("a server certificate needs at least one DNS name or IP address")
    key = new_private_key(key_type)
    start, end = _validity(days, not_before, not_after)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_leaf_key_usage(key), critical=True)
        .add_extension(_extended_key_usage(server, client), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_authority_key_identifier(ca_cert), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, _signature_hash(ca_key)), key


def self_signed_certificate(
    common_name: str,
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str | ipaddress.IPv4Address | ipaddress.IPv6Address] = (),
    *,
    days: int = 365,
    key_type: KeyType = "ec",
) -> tuple[x509.Certificate, GeneratedKey]:
    """A self-signed server certificate that a client can also pin as its own CA.

    It is marked as a CA (path length 0, keyCertSign) because OpenSSL, unlike Go, does not
    accept a self-signed end-entity certificate as a trust anchor.
    """
    names = _general_names(dns_names, ip_addresses)
    if not names:
        raise ValueError("a server certificate needs at least one DNS name or IP address")
    key = new_private_key(key_type)
    start, end = _validity(days, None, None)
    public = key.public_key()
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=isinstance(key, rsa.RSAPrivateKey),
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, _signature_hash(key))
    )
    return cert, key


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------


def _pem_bytes(obj: x509.Certificate | Sequence[x509.Certificate] | PrivateKeyTypes) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    if isinstance(obj, Sequence):
        return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in obj)
    return obj.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_pem(
    path: str | os.PathLike[str],
    obj: x509.Certificate | Sequence[x509.Certificate] | PrivateKeyTypes,
    private: bool = False,
) -> None:
    """Write a certificate, a chain (leaf first) or an unencrypted key as PEM.

    The file is replaced atomically (temporary file in the same directory, then rename), so
    a server reloading it never sees half a file. Keys are always written with mode 0600,
    whatever ``private`` says; ``private=True`` makes a certificate 0600 too.
    """
    data = _pem_bytes(obj)
    is_key = not isinstance(obj, x509.Certificate | Sequence)
    mode = 0o600 if (private or is_key) else 0o644
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    # mkstemp creates the file 0600, so a key is never readable by others, not even briefly.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: str) -> None:
    # Makes the rename durable; not every filesystem allows fsync on a directory.
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def write_self_signed(
    directory: str | os.PathLike[str],
    hostnames: Iterable[str] = (),
    *,
    days: int = 365,
    key_type: KeyType = "ec",
) -> tuple[str, str]:
    """Write a throwaway self-signed server certificate and key; return their paths.

    The names cover ``localhost``, ``127.0.0.1``, ``::1`` and ``hostnames`` (DNS names or IP
    addresses). The files are ``tls.crt`` and ``tls.key`` in ``directory``, which is
    created (mode 0700) if missing.
    """
    target = os.fspath(directory)
    os.makedirs(target, mode=0o700, exist_ok=True)
    cert, key = _throwaway(hostnames, days, key_type)
    certfile = os.path.join(target, "tls.crt")
    keyfile = os.path.join(target, "tls.key")
    write_pem(keyfile, key, private=True)
    write_pem(certfile, cert)
    return certfile, keyfile


def self_signed_pem(
    hostnames: Iterable[str] = (), *, days: int = 365, key_type: KeyType = "ec"
) -> tuple[bytes, bytes]:
    """A throwaway self-signed server certificate and its key, as PEM, for the names of
    ``write_self_signed``, for a caller that keeps them out of the file system."""
    cert, key = _throwaway(hostnames, days, key_type)
    return _pem_bytes(cert), _pem_bytes(key)


def _throwaway(
    hostnames: Iterable[str], days: int, key_type: KeyType
) -> tuple[x509.Certificate, GeneratedKey]:
    extra = list(hostnames)
    dns, ips = split_hosts(["localhost", "127.0.0.1", "::1", *extra])
    common_name = next(iter(split_hosts(extra)[0]), "localhost")
    return self_signed_certificate(common_name, dns, ips, days=days, key_type=key_type)
