"""What the driver asks the cluster: topics with ids and leaders, offsets per partition, topic configs."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tierproxy.wireclient import WireClient

METADATA, LIST_OFFSETS = 3, 2
EARLIEST, LATEST = -2, -1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    topic_id: bytes
    partition: int
    leader: int
    leader_epoch: int


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

    def leader_address(self, p: PartitionInfo) -> str:
        return self.brokers[p.leader]


def describe_cluster(bootstrap: str) -> ClusterView:
    with WireClient(bootstrap, client_id="tierproxy-tier") as w:
        md = w.request(METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                      "include_topic_authorized_operations": False})
    brokers = {b["node_id"]: f"{b['host']}:{b['port']}" for b in md["brokers"]}
    parts, internal = [], set()
    for t in md["topics"]:
        if t["error_code"] != 0:
            continue
        if t["is_internal"]:
            internal.add(t["name"])
        for p in t["partitions"]:
            parts.append(PartitionInfo(t["name"], t["topic_id"], p["partition_index"], p["leader_id"],
                                       p["leader_epoch"]))
    return ClusterView(brokers, sorted(parts, key=lambda p: (p.topic, p.partition)), internal)


def list_offsets(view: ClusterView, parts: list[PartitionInfo]) -> dict[tuple[str, int], PartitionOffsets]:
    """Log start, last stable offset and high watermark of each partition, asked of its leader."""
    by_leader: dict[int, list[PartitionInfo]] = defaultdict(list)
    for p in parts:
        if p.leader >= 0:
            by_leader[p.leader].append(p)
    out: dict[tuple[str, int], PartitionOffsets] = {}
    for leader, ps in by_leader.items():
        with WireClient(view.brokers[leader], client_id="tierproxy-tier") as w:
            got: dict[tuple[int, int], dict[tuple[str, int], int]] = {}
            for isolation, ts in ((READ_UNCOMMITTED, EARLIEST), (READ_COMMITTED, LATEST), (READ_UNCOMMITTED, LATEST)):
                topics: dict[str, list[dict[str, int]]] = defaultdict(list)
                for p in ps:
                    topics[p.topic].append({"partition_index": p.partition, "current_leader_epoch": -1,
                                            "timestamp": ts})
                resp = w.request(LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": isolation, "topics": [
                    {"name": t, "partitions": v} for t, v in topics.items()]})
                got[(isolation, ts)] = {(t["name"], x["partition_index"]): x["offset"]
                                        for t in resp["topics"] for x in t["partitions"] if x["error_code"] == 0}
        for p in ps:
            key = (p.topic, p.partition)
            if all(key in g for g in got.values()):
                out[key] = PartitionOffsets(got[(READ_UNCOMMITTED, EARLIEST)][key], got[(READ_COMMITTED, LATEST)][key],
                                            got[(READ_UNCOMMITTED, LATEST)][key])
    return out


def topic_configs(bootstrap: str, topics: list[str]) -> dict[str, dict[str, str]]:
    """Each topic's effective configs (cleanup.policy, retention.ms, retention.bytes...)."""
    async def run() -> dict[str, dict[str, str]]:
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            out: dict[str, dict[str, str]] = {}
            for i in range(0, len(topics), 100):
                resources = [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics[i:i + 100]]
                for resp in await admin.describe_configs(resources):
                    for res in _resources(resp):
                        out[res[0]] = {c[0]: c[1] for c in res[1] if c[1] is not None}
            return out
        finally:
            await admin.close()

    return asyncio.run(run())


def _resources(resp: Any) -> list[tuple[str, list[tuple[str, str | None]]]]:
    out = []
    for r in resp.resources:
        # (error_code, error_message, resource_type, resource_name, config_entries)
        name, entries = r[3], r[4]
        out.append((name, [(e[0], e[1]) for e in entries]))
    return out
