"""Where tierproxy's own connections find a partition's leader: Metadata asked on its own listener
(`command.config`'s `bootstrap.servers`, else `bootstrap.servers`) with its own identity, cached briefly.

Own requests (high watermark, last stable offset, log start for remote answers) go to the partition's leader on
that listener, whatever broker the client's connection happens to be relayed to."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from protocol.constants import ApiKey
from tierproxy.config import ProxySettings
from tierproxy.kafka.asyncclient import AsyncWireClient
from tierproxy.kafka.tls import upstream_context

METADATA_VERSION = 12


class OwnLeaders:
    def __init__(self, settings: ProxySettings, ttl: float = 5.0,
                 on_metadata: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        self.settings = settings
        self.ttl = ttl
        self.on_metadata = on_metadata  # sees each answer's topics (their current ids)
        # TLS of the relayed listener applies to our own connections only when they go to that same listener
        self._ssl = None if settings.own_listener_apart else upstream_context(settings)
        self._topics: dict[str, tuple[float, dict[int, str]]] = {}  # topic → (when, partition → leader host:port)
        self._clients: dict[tuple[str, int], AsyncWireClient] = {}  # (host:port, lane) → connection

    def client(self, address: str, lane: int = 0) -> AsyncWireClient:
        """Our connection `lane` to `address` (a broker answers each connection's requests one at a time: requests
        that should be answered together go on different lanes)."""
        c = self._clients.get((address, lane))
        if c is None:
            host, _, port = address.rpartition(":")
            c = self._clients[(address, lane)] = AsyncWireClient(
                host, int(port), client_id="tierproxy-remote", timeout=5, ssl_context=self._ssl,
                identity=self.settings.identity)
        return c

    async def leader(self, topic: str, partition: int, refresh: bool = False) -> str:
        """The leader's host:port on tierproxy's own listener; KeyError if the partition has none."""
        hit = self._topics.get(topic)
        if refresh or hit is None or time.monotonic() - hit[0] > self.ttl or partition not in hit[1]:
            hit = (time.monotonic(), await self._ask(topic))
            self._topics[topic] = hit
        return hit[1][partition]

    def known(self, topic: str, partition: int) -> str | None:
        """The partition's leader as last asked, without asking (None: not known)."""
        hit = self._topics.get(topic)
        return None if hit is None else hit[1].get(partition)

    async def refresh(self, topics: set[str], max_age: float) -> set[str]:
        """Ask Metadata again (one request) for the topics last asked more than `max_age` seconds ago. Returns the
        topics a Metadata answer named without error within `max_age` (their current ids are known that fresh). A
        topic the answer gave an error for is not remembered as asked: the next refresh asks again."""
        now = time.monotonic()
        stale = sorted(t for t in topics if (hit := self._topics.get(t)) is None or now - hit[0] > max_age)
        confirmed = set(topics) - set(stale)
        if stale:
            md = await self._metadata(stale)
            named = {t["name"] for t in md["topics"] if t["error_code"] == 0}
            for t in stale:
                if t in named:
                    self._topics[t] = (time.monotonic(), _leaders(md, t))
                    confirmed.add(t)
                else:
                    self._topics.pop(t, None)
        return confirmed

    def fresh(self, topics: set[str], max_age: float) -> set[str]:
        """The topics a Metadata answer of ours named within `max_age` seconds (what `refresh` returns unasked)."""
        now = time.monotonic()
        return {t for t in topics if (hit := self._topics.get(t)) is not None and now - hit[0] <= max_age}

    async def cluster_id(self) -> str | None:
        """The cluster's id, as a broker names it in a Metadata answer (for no topic)."""
        cluster: str | None = (await self._metadata([]))["cluster_id"]
        return cluster

    async def _ask(self, topic: str) -> dict[int, str]:
        return _leaders(await self._metadata([topic]), topic)

    async def _metadata(self, topics: list[str]) -> dict[str, Any]:
        last: BaseException = OSError("no bootstrap servers")
        for host, port in self.settings.own_bootstrap_list:
            try:
                md = await self.client(f"{host}:{port}").request(ApiKey.METADATA, METADATA_VERSION, {
                    "topics": [{"topic_id": bytes(16), "name": t} for t in topics],
                    "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
                if self.on_metadata is not None:
                    self.on_metadata(md["topics"])
                return md
            except (OSError, TimeoutError, ConnectionError) as exc:
                last = exc
                await self._drop(f"{host}:{port}")
        raise last

    async def _drop(self, address: str) -> None:
        for key in [k for k in self._clients if k[0] == address]:
            await self._clients.pop(key).close()

    async def forget(self, address: str) -> None:
        """A request to `address` failed: reconnect next time and ask Metadata again."""
        self._topics.clear()
        await self._drop(address)

    async def close(self) -> None:
        for address in {a for a, _ in self._clients}:
            await self._drop(address)


def _leaders(md: dict[str, Any], topic: str) -> dict[int, str]:
    brokers = {b["node_id"]: f"{b['host']}:{b['port']}" for b in md["brokers"]}
    out: dict[int, str] = {}
    for t in md["topics"]:
        if t["name"] == topic and t["error_code"] == 0:
            for p in t["partitions"]:
                if p["leader_id"] in brokers:
                    out[p["partition_index"]] = brokers[p["leader_id"]]
    return out
