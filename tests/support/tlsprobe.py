"""In-process TLS handshakes for the transport tests: the controls that show a refusal by
gas is its policy and not a client the local OpenSSL cannot run at all."""

from __future__ import annotations

import socket
import ssl
import threading
import warnings
from collections.abc import Sequence


def permissive_server_context(
    certfile: str, keyfile: str, ciphers: str = "ALL:@SECLEVEL=0"
) -> ssl.SSLContext:
    """A server accepting every protocol version and the given suites that the local
    OpenSSL can do."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    ctx.set_ciphers(ciphers)
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


def client_context(
    ca: str | None = None,
    cert_chain: tuple[str, str] | None = None,
    *,
    minimum: ssl.TLSVersion | None = None,
    maximum: ssl.TLSVersion | None = None,
    ciphers: str | None = None,
    alpn: Sequence[str] = (),
) -> ssl.SSLContext:
    """A raw TLS client: trusting `ca` (None: checking nothing, for a client whose only
    question is what the server accepts), presenting `cert_chain` (certificate, key) when
    given, offering the protocol versions, suites and ALPN protocols given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca is None:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.load_verify_locations(ca)
    if cert_chain is not None:
        ctx.load_cert_chain(*cert_chain)
    with warnings.catch_warnings():
        # TLSVersion.TLSv1 and TLSv1_1 are deprecated; offering them is the point here.
        warnings.simplefilter("ignore", DeprecationWarning)
        if minimum is not None:
            ctx.minimum_version = minimum
        if maximum is not None:
            ctx.maximum_version = maximum
    if ciphers is not None:
        ctx.set_ciphers(ciphers)
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


def local_handshake(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> tuple[str | None, str | None]:
    """(version, cipher) of a handshake between two in-process contexts over a socket
    pair; raises what either side raised."""
    server_end, client_end = socket.socketpair()
    server_end.settimeout(5)
    client_end.settimeout(5)
    errors: list[BaseException] = []

    def serve_one() -> None:
        try:
            with server_ctx.wrap_socket(server_end, server_side=True) as conn:
                conn.recv(1)
        except OSError as exc:  # ssl.SSLError included
            errors.append(exc)

    thread = threading.Thread(target=serve_one, daemon=True)
    thread.start()
    try:
        with client_ctx.wrap_socket(client_end, server_hostname="localhost") as conn:
            cipher = conn.cipher()
            result = (conn.version(), cipher[0] if cipher else None)
            conn.sendall(b"x")
    finally:
        thread.join(5)
        server_end.close()
        client_end.close()
    if errors:
        raise errors[0]
    return result
