"""What guards the admin port: bounded request bodies (the port shares the process, and its memory, with the
Kafka path) and the status page's login cookie, derived from the token."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

COOKIE = "tierproxy_admin_session"  # the status page's login: derived from admin.token (HttpOnly, SameSite=Strict)
MAX_BODY_BYTES = 64 << 10  # the largest request body read (a login form, an empty POST): 413 beyond


class BoundedBodies:
    """ASGI middleware: a request body larger than `limit` is answered 413 without being read whole (a declared
    Content-Length at once; a chunked body once its bytes pass the limit), so no request holds more than `limit`
    bytes of the process's memory."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(send)
            return
        body, more = b"", True
        while more:  # at most `limit` + one chunk held
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                await self._too_large(send)
                return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())

        await self.app(scope, replay, send)

    async def _too_large(self, send: Any) -> None:
        payload = json.dumps({"error": f"request body over {self.limit} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


def session_value(token: str) -> str:
    """The status page's cookie: derived from the token (a stolen cookie does not give the bearer token)."""
    return hmac.new(token.encode(), b"tierproxy admin session v1", hashlib.sha256).hexdigest()
