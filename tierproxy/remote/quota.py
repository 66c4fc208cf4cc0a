"""Remote fetch quotas: bytes served from the tier per second, for the whole process (KIP-956's
`remote.log.manager.fetch.max.bytes.per.second`) and per client id (`remote.fetch.client.max.bytes.per.second`,
tierproxy's own key: the broker's client quotas cannot see bytes it never served). A token bucket each, holding
at most one second of its rate; bytes are debited after they are served, so a bucket may go negative and the
client then waits (throttle_time_ms) until it is back to zero — one backfill cannot starve the others."""

from __future__ import annotations

import time
from collections import OrderedDict

UNLIMITED = -1
MAX_CLIENTS = 10_000  # client ids remembered (least recently used dropped): bounded whatever clients claim


class TokenBucket:
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = rate
        self.at = time.monotonic()

    def _refill(self, now: float) -> None:
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def available(self, now: float) -> float:
        self._refill(now)
        return self.tokens

    def debit(self, n: int, now: float) -> None:
        self._refill(now)
        self.tokens -= n

    def wait_ms(self, now: float) -> int:
        """How long until the bucket is back to zero (0 when it holds tokens)."""
        self._refill(now)
        return 0 if self.tokens > 0 else int(-self.tokens / self.rate * 1000) + 1


class RemoteFetchQuota:
    def __init__(self, process_rate: int = UNLIMITED, client_rate: int = UNLIMITED) -> None:
        self.process = TokenBucket(process_rate) if process_rate > 0 else None
        self.client_rate = client_rate
        self.clients: OrderedDict[str, TokenBucket] = OrderedDict()
        self.throttled = 0  # fetches whose remote part waited for a quota

    def _buckets(self, client_id: str) -> list[TokenBucket]:
        out = [self.process] if self.process is not None else []
        if self.client_rate > 0:
            b = self.clients.get(client_id)
            if b is None:
                b = self.clients[client_id] = TokenBucket(self.client_rate)
                if len(self.clients) > MAX_CLIENTS:
                    self.clients.popitem(last=False)
            self.clients.move_to_end(client_id)
            out.append(b)
        return out

    def allowance(self, client_id: str) -> tuple[int | None, int]:
        """(bytes this client may be served from the tier now — None: no quota —, throttle_time_ms)."""
        buckets = self._buckets(client_id)
        if not buckets:
            return None, 0
        now = time.monotonic()
        allowed = int(max(0.0, min(b.available(now) for b in buckets)))
        wait = max(b.wait_ms(now) for b in buckets)
        if allowed == 0:
            self.throttled += 1
        return allowed, wait

    def served(self, client_id: str, n: int) -> None:
        now = time.monotonic()
        for b in self._buckets(client_id):
            b.debit(n, now)
