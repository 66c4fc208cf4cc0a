"""OAUTHBEARER access tokens from an OAuth 2 token endpoint (client-credentials grant), cached and renewed
before they expire (after `sasl.login.refresh.window.factor` of their lifetime, as Kafka's login refresher).

The request is Kafka's `ClientCredentialsJwtRetriever`'s: POST grant_type=client_credentials[&scope=...] with
HTTP Basic auth of the URL-encoded client id and secret. The lifetime is `expires_in`, else the JWT's `exp`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import urllib.parse

from tierproxy.config.identity.properties import OAuthClient
from tierproxy.config.identity.sasl import AuthenticationFailed


class TokenSource:
    """One client's access token; `token()` blocks (executors, `WireClient`), `atoken()` does not."""

    def __init__(self, client: OAuthClient, timeout: float = 10.0) -> None:
        self.client = client
        self.timeout = timeout
        self._token: str | None = None
        self._renew_at = 0.0
        self._lock = threading.Lock()
        self.fetched = 0  # tokens obtained (renewals show here)

    def token(self) -> str:
        with self._lock:
            if self._token is None or time.time() >= self._renew_at:
                self._token, lifetime = self._fetch()
                self._renew_at = time.time() + lifetime * self.client.refresh_window_factor
                self.fetched += 1
            return self._token

    async def atoken(self) -> str:
        if self._token is not None and time.time() < self._renew_at:
            return self._token
        return await asyncio.to_thread(self.token)

    def _fetch(self) -> tuple[str, float]:
        c = self.client
        what = f"SASL/OAUTHBEARER token for client {c.client_id!r} from {c.token_endpoint}"
        basic = base64.b64encode(f"{urllib.parse.quote(c.client_id, safe='')}:"
                                 f"{urllib.parse.quote(c.client_secret.get_secret_value(), safe='')}".encode())
        form = {"grant_type": "client_credentials", **({"scope": c.scope} if c.scope else {})}
        import httpx  # here: every process that reads client settings imports this module, few ask a token endpoint

        try:
            resp = httpx.post(c.token_endpoint, data=form, timeout=self.timeout,
                              headers={"Authorization": "Basic " + basic.decode(), "Accept": "application/json"})
        except httpx.HTTPError as exc:
            raise AuthenticationFailed(f"{what}: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise AuthenticationFailed(f"{what}: HTTP {resp.status_code} {resp.text[:200]!r}")
        try:
            body = resp.json()
            token = str(body["access_token"])
        except (ValueError, KeyError, TypeError):
            raise AuthenticationFailed(f"{what}: the answer holds no access_token") from None
        lifetime = body.get("expires_in")
        if not isinstance(lifetime, int | float):
            lifetime = _jwt_exp(token) - time.time()
        if lifetime <= 0:
            raise AuthenticationFailed(f"{what}: the token is already expired")
        return token, float(lifetime)


def _jwt_exp(token: str) -> float:
    """The `exp` claim of a JWT (not verified: the broker verifies; we only schedule the renewal)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return time.time() + 300.0


_SOURCES: dict[tuple[str, str, str | None], TokenSource] = {}
_SOURCES_LOCK = threading.Lock()


def token_source(client: OAuthClient) -> TokenSource:
    """The process's one token source for this client (every connection shares its token)."""
    key = (client.token_endpoint, client.client_id, client.scope)
    with _SOURCES_LOCK:
        src = _SOURCES.get(key)
        if src is None:
            src = _SOURCES[key] = TokenSource(client)
        return src
