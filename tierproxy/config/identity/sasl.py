"""The SASL conversation of tierproxy's own connections, sans-IO: a generator yields the requests to send
(SaslHandshake v1, then SaslAuthenticate v2 frames) and is sent each decoded response.

    PLAIN          authzid NUL username NUL password                      (RFC 4616), one round
    SCRAM-SHA-*    client-first / server-first / client-final / server-final   (RFC 5802, via `scramp`)
    OAUTHBEARER    "n,," 0x01 "auth=Bearer <token>" 0x01 0x01                   (RFC 7628), one round

Both wire clients (`WireClient`, `AsyncWireClient`) drive it; neither knows a mechanism.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from protocol.constants import ApiKey
from tierproxy.config.identity.properties import ClientIdentity

Request = tuple[int, int, dict[str, Any]]
Conversation = Generator[Request, dict[str, Any], None]
HANDSHAKE_VERSION = 1  # v0 means unframed tokens
AUTHENTICATE_VERSION = 2


class AuthenticationFailed(ConnectionError):
    """The broker refused tierproxy's own identity; the message names the mechanism and the principal."""


def conversation(identity: ClientIdentity, token: Callable[[], str] | None = None) -> Conversation:
    """Authenticate one connection as `identity` (`token` gives an OAUTHBEARER access token)."""
    mechanism = identity.mechanism
    assert mechanism is not None
    what = f"SASL/{mechanism} as {identity.principal_hint}"
    resp = yield ApiKey.SASL_HANDSHAKE, HANDSHAKE_VERSION, {"mechanism": mechanism}
    if resp["error_code"] != 0:
        raise AuthenticationFailed(f"{what}: the broker does not enable {mechanism} on this listener "
                                   f"(it enables {', '.join(resp['mechanisms']) or 'none'})")
    steps = _steps(identity, token)
    message = next(steps)
    while True:
        resp = yield ApiKey.SASL_AUTHENTICATE, AUTHENTICATE_VERSION, {"auth_bytes": message}
        if resp["error_code"] != 0:
            raise AuthenticationFailed(f"{what} failed: {resp['error_message'] or 'error ' + str(resp['error_code'])}")
        try:
            message = steps.send(bytes(resp["auth_bytes"]))
        except StopIteration:
            return


def _steps(identity: ClientIdentity, token: Callable[[], str] | None) -> Generator[bytes, bytes, None]:
    mechanism = identity.mechanism
    if mechanism == "PLAIN":
        assert identity.username is not None and identity.password is not None
        yield b"\0" + identity.username.encode() + b"\0" + identity.password.get_secret_value().encode()
    elif mechanism is not None and mechanism.startswith("SCRAM-"):
        from scramp import ScramClient, ScramException

        assert identity.username is not None and identity.password is not None
        client = ScramClient([mechanism], identity.username, identity.password.get_secret_value())
        server_first = yield client.get_client_first().encode()
        try:
            client.set_server_first(server_first.decode())
            server_final = yield client.get_client_final().encode()
            client.set_server_final(server_final.decode())
        except ScramException as exc:
            raise AuthenticationFailed(f"SASL/{mechanism} as {identity.principal_hint}: the broker's answer "
                                       f"did not verify ({exc})") from None
    elif mechanism == "OAUTHBEARER":
        if token is None:
            raise AuthenticationFailed("SASL/OAUTHBEARER: no token source")
        answer = yield b"n,,\x01auth=Bearer " + token().encode() + b"\x01\x01"
        if answer:  # an error challenge (RFC 7628 3.2.2): the broker expects a lone 0x01 before failing
            yield b"\x01"
    else:
        raise AuthenticationFailed(f"SASL mechanism {mechanism} is not supported")
