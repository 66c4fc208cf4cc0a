"""TLS contexts for the client listener and the upstream brokers."""

from __future__ import annotations

import ssl

from tierproxy.config import ProxySettings


def listener_context(s: ProxySettings) -> ssl.SSLContext | None:
    """Server-side TLS for clients, or None for plaintext; with ssl.cafile, client certificates are required."""
    if s.ssl_certfile is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(s.ssl_certfile), str(s.ssl_keyfile) if s.ssl_keyfile else None)
    if s.ssl_cafile is not None:
        ctx.load_verify_locations(str(s.ssl_cafile))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def upstream_context(s: ProxySettings) -> ssl.SSLContext | None:
    """Client-side TLS toward the brokers for relayed client connections, or None for plaintext.

    On when `upstream.ssl.enabled` or when tierproxy's own identity (`--command-config`) uses SSL / SASL_SSL on
    the same listener:
    then its truststore and host name check apply, but never its keystore (a relayed client must not reach the
    broker with tierproxy's certificate); `upstream.ssl.*` files, when given, win."""
    identity = s.identity
    # with its own listener apart (command config bootstrap.servers), the identity says nothing of the relayed one
    own_tls = identity is not None and identity.tls and not s.own_listener_apart
    if not s.upstream_ssl_enabled and not own_tls:
        return None
    if s.upstream_ssl_cafile is None and own_tls:
        assert identity is not None
        ctx = identity.ssl_context(with_client_cert=False)
        assert ctx is not None
    else:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                         cafile=str(s.upstream_ssl_cafile) if s.upstream_ssl_cafile else None)
    ctx.check_hostname = s.upstream_ssl_check_hostname
    if s.upstream_ssl_certfile is not None:
        ctx.load_cert_chain(str(s.upstream_ssl_certfile),
                            str(s.upstream_ssl_keyfile) if s.upstream_ssl_keyfile else None)
    return ctx
