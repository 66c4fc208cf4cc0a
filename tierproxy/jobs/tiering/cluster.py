"""What the driver asks the cluster: topics with ids and leaders, offsets per partition, topic configs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from protocol.constants import ApiKey, ErrorCode
from protocol.requests import PARTITION_BOUNDS, list_offsets_request, listed_offsets
from tierproxy.config.identity import ClientIdentity
from tierproxy.config.identity.clients import aiokafka_options
from tierproxy.kafka.wireclient import WireClient

log = logging.getLogger("tierproxy.tier")


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    topic_id: bytes  # the id the tier keeps the history under (a restored topic's: the lost cluster's, `mounted`)
    partition: int
    leader: int
    leader_epoch: int
    replicas: int = 1
    cluster_topic_id: bytes = b""  # the cluster's own id when it differs from `topic_id` (a restored topic)

    @property
    def id_in_cluster(self) -> bytes:
        """The id to name the topic by in requests to the cluster (Fetch v13+, Metadata by id)."""
        return self.cluster_topic_id or self.topic_id


@dataclass(frozen=True)
class PartitionOffsets:
    log_start: int
    last_stable: int
    high_watermark: int


@dataclass
class ClusterView:
    brokers: dict[int, str]  # node id → host:port
    partitions: list[PartitionInfo]
    internal: set[str]
    identity: ClientIdentity | None = field(default=None, repr=False)  # how to connect to `brokers`
    cluster_id: str | None = None

    def leader_address(self, p: PartitionInfo) -> str:
        return self.brokers[p.leader]


def describe_cluster(bootstrap: str, identity: ClientIdentity | None = None) -> ClusterView:
    with WireClient(bootstrap, client_id="tierproxy-tier", identity=identity) as w:
        md = w.request(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                      "include_topic_authorized_operations": False})
    brokers = {b["node_id"]: f"{b['host']}:{b['port']}" for b in md["brokers"]}
    parts, internal = [], set()
    for t in md["topics"]:
        if t["error_code"] != 0:
            continue
        if t["is_internal"]:
            internal.add(t["name"])
        for p in t["partitions"]:
            parts.append(PartitionInfo(t["name"], bytes(t["topic_id"]), p["partition_index"], p["leader_id"],
                                       p["leader_epoch"], len(p["replica_nodes"])))
    return ClusterView(brokers, sorted(parts, key=lambda p: (p.topic, p.partition)), internal, identity,
                       md["cluster_id"])


def mounted(view: ClusterView, aliases: dict[bytes, bytes]) -> ClusterView:
    """`view` with each restored topic named by the id its history is kept under (`aliases`: the cluster's id →
    the tier's, `tier.cache.MetadataCache.aliases`); the cluster's own id stays in `cluster_topic_id`."""
    if not aliases:
        return view
    parts = [replace(p, topic_id=aliases[p.topic_id], cluster_topic_id=p.topic_id) if p.topic_id in aliases else p
             for p in view.partitions]
    return replace(view, partitions=parts)


def deleted_topic_ids(bootstrap: str, topic_ids: set[bytes], identity: ClientIdentity | None = None) -> set[bytes]:
    """The ids among `topic_ids` the cluster says do not exist: a Metadata request naming each id answers
    UNKNOWN_TOPIC_ID for it. Not a missing entry, nor TOPIC_AUTHORIZATION_FAILED (Kafka answers that for an id
    the principal may not describe), nor any other error: those are no proof, and the topic is kept."""
    if not topic_ids:
        return set()
    ids = sorted(topic_ids)
    with WireClient(bootstrap, client_id="tierproxy-tier", identity=identity) as w:
        md = w.request(ApiKey.METADATA, 12, {"topics": [{"topic_id": i, "name": None} for i in ids],
                                             "allow_auto_topic_creation": False,
                                             "include_topic_authorized_operations": False})
    return {bytes(t["topic_id"]) for t in md["topics"]
            if t["error_code"] == ErrorCode.UNKNOWN_TOPIC_ID and bytes(t["topic_id"]) in topic_ids}


def list_offsets(view: ClusterView, parts: list[PartitionInfo]) -> dict[tuple[str, int], PartitionOffsets]:
    """Log start, last stable offset and high watermark of each partition, asked of its leader."""
    by_leader: dict[int, list[PartitionInfo]] = defaultdict(list)
    for p in parts:
        if p.leader >= 0:
            by_leader[p.leader].append(p)
    out: dict[tuple[str, int], PartitionOffsets] = {}
    for leader, ps in by_leader.items():
        got = {}
        try:
            with WireClient(view.brokers[leader], client_id="tierproxy-tier", identity=view.identity) as w:
                for name, isolation, spec in PARTITION_BOUNDS:
                    asked: dict[str, dict[int, int]] = defaultdict(dict)
                    for p in ps:
                        asked[p.topic][p.partition] = spec
                    got[name] = listed_offsets(w.request(ApiKey.LIST_OFFSETS, 7,
                                                         list_offsets_request(asked, isolation=isolation)))
        except (OSError, KeyError) as exc:  # a leader that died since the view was taken: next pass asks again
            log.warning("offsets of %d partitions led by node %d unavailable: %s", len(ps), leader, exc)
            continue
        for p in ps:
            key = (p.topic, p.partition)
            if all(key in g for g in got.values()):
                out[key] = PartitionOffsets(**{name: g[key] for name, g in got.items()})
    return out


@contextlib.asynccontextmanager
async def admin_client(bootstrap: str, identity: ClientIdentity | None = None) -> AsyncIterator[Any]:
    """An aiokafka admin client under tierproxy's own identity, started, and closed on leaving."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **aiokafka_options(identity))
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


def topic_configs(bootstrap: str, topics: list[str], identity: ClientIdentity | None = None
                  ) -> dict[str, dict[str, str]]:
    """Each topic's effective configs (cleanup.policy, retention.ms, retention.bytes...)."""
    async def run() -> dict[str, dict[str, str]]:
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        async with admin_client(bootstrap, identity) as admin:
            out: dict[str, dict[str, str]] = {}
            for i in range(0, len(topics), 100):
                resources = [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics[i:i + 100]]
                for resp in await admin.describe_configs(resources):
                    for res in _resources(resp):
                        out[res[0]] = {c[0]: c[1] for c in res[1] if c[1] is not None}
            return out

    return asyncio.run(run())


def _resources(resp: Any) -> list[tuple[str, list[tuple[str, str | None]]]]:
    out = []
    for r in resp.resources:
        # (error_code, error_message, resource_type, resource_name, config_entries)
        name, entries = r[3], r[4]
        out.append((name, [(e[0], e[1]) for e in entries]))
    return out
