"""In-process TLS handshakes for the transport tests: the controls that show a refusal by
gas is its policy and not a client the local OpenSSL cannot run at all."""

from __future__ import annotations

import socket
import ssl
import threading
import warnings


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
