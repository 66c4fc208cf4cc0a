"""A small OAuth 2 authorization server on loopback for the OAUTHBEARER tests: a JWKS endpoint the broker
validates against and a client-credentials token endpoint issuing RS256 JWTs (`sub` = the client id)."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

AUDIENCE = "kafka"
KID = "tierproxy-test"


@dataclass
class OAuthServer:
    url: str
    clients: dict[str, str]  # client id → secret
    lifetime_s: int = 3600
    issued: list[str] = field(default_factory=list)  # client ids, one per token issued

    @property
    def jwks_url(self) -> str:
        return self.url + "/jwks"

    @property
    def token_url(self) -> str:
        return self.url + "/token"


@contextmanager
def oauth_server(clients: dict[str, str], lifetime_s: int = 3600) -> Iterator[OAuthServer]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": KID, "alg": "RS256", "use": "sig"})
    state: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/jwks":
                self._send(200, {"keys": [jwk]})
            else:
                self._send(404, {"error": "not_found"})

        def do_POST(self) -> None:
            srv: OAuthServer = state["server"]
            form = urllib.parse.parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
            auth = self.headers.get("Authorization", "")
            try:
                cid, _, secret = base64.b64decode(auth.removeprefix("Basic ")).decode().partition(":")
                cid, secret = urllib.parse.unquote(cid), urllib.parse.unquote(secret)
            except ValueError:
                cid, secret = "", ""
            if self.path != "/token" or form.get("grant_type") != ["client_credentials"]:
                self._send(400, {"error": "unsupported_grant_type"})
                return
            if srv.clients.get(cid) != secret:
                self._send(401, {"error": "invalid_client"})
                return
            now = int(time.time())
            token = jwt.encode({"sub": cid, "aud": AUDIENCE, "iss": srv.url, "iat": now, "exp": now + srv.lifetime_s,
                                "scope": form.get("scope", [""])[0]}, key, algorithm="RS256", headers={"kid": KID})
            srv.issued.append(cid)
            self._send(200, {"access_token": token, "token_type": "Bearer", "expires_in": srv.lifetime_s})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server = OAuthServer(f"http://127.0.0.1:{httpd.server_address[1]}", dict(clients), lifetime_s)
    state["server"] = server
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
