"""The identity as the client libraries take it: aiokafka's keyword arguments (metadata topic clients)."""

from __future__ import annotations

from typing import Any

from aiokafka.abc import AbstractTokenProvider

from tierproxy.config.identity.oauth import TokenSource, token_source
from tierproxy.config.identity.properties import ClientIdentity


class AiokafkaTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    def __init__(self, source: TokenSource) -> None:
        self.source = source

    async def token(self) -> str:
        return await self.source.atoken()


def aiokafka_options(identity: ClientIdentity | None) -> dict[str, Any]:
    """security_protocol, sasl_* and ssl_context for AIOKafkaProducer / Consumer / AdminClient."""
    if identity is None or identity.security_protocol == "PLAINTEXT":
        return {}
    opts: dict[str, Any] = {"security_protocol": identity.security_protocol}
    if identity.tls:
        opts["ssl_context"] = identity.ssl_context()
    if identity.sasl:
        opts["sasl_mechanism"] = identity.mechanism
        if identity.oauth is not None:
            opts["sasl_oauth_token_provider"] = AiokafkaTokenProvider(token_source(identity.oauth))
        else:
            assert identity.password is not None
            opts["sasl_plain_username"] = identity.username
            opts["sasl_plain_password"] = identity.password.get_secret_value()
    if identity.client_id:
        opts["client_id"] = identity.client_id
    return opts


def token_getter(identity: ClientIdentity) -> Any:
    """A blocking `() -> token` for the SASL conversation, or None when the mechanism needs none."""
    return token_source(identity.oauth).token if identity.oauth is not None else None
