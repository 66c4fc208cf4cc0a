"""What a `tier` pass records so the tier outlives its cluster (`tier.snapshot`): topic facts, partition offsets and
epochs, the committed offsets of the groups that read tiered topics, and every live metadata record."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from protocol.constants import ApiKey, ErrorCode
from tierproxy.config.identity import ClientIdentity
from tierproxy.jobs.tiering.cluster import ClusterView, PartitionInfo, PartitionOffsets
from tierproxy.kafka.wireclient import WireClient
from tierproxy.tier.rlmm import RemoteLogMetadataManager
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.snapshot import RESTORED_CONFIGS, GroupOffset, PartitionFacts, TierSnapshot, TopicFacts, write

log = logging.getLogger("tierproxy.tier")
GROUP_AUTHORIZATION_FAILED = 30
UNKNOWN_OPERATIONS, DESCRIBE = -2147483648, 8  # authorized operations not given; AclOperation DESCRIBE's bit
GROUPS_PER_REQUEST = 50  # OffsetFetch of many groups: one answer per 50 groups, so none grows without bound


class GroupsUnreadable(RuntimeError):
    """The principal may not describe some groups (the DESCRIBE ACL on groups): their offsets are not recorded;
    `partial` holds the offsets of the groups that could be read."""

    def __init__(self, message: str, partial: dict[str, list[GroupOffset]] | None = None) -> None:
        super().__init__(message)
        self.partial = partial or {}


def group_offsets(view: ClusterView, topics: set[str]) -> dict[str, list[GroupOffset]]:
    """The committed offsets on `topics` of every group the cluster lists (ListGroups asks each broker for the
    groups it coordinates; OffsetFetch asks each group's coordinator). Raises GroupsUnreadable naming the groups
    whose offsets the principal may not read (the others are returned through the exception's `partial`)."""
    whole = _may_describe_cluster(view)
    listed, errors = list_groups(list(view.brokers.values()), view.identity, "tierproxy-tier")
    failed = {a: e for a, e in errors.items() if e != ErrorCode.COORDINATOR_NOT_AVAILABLE}
    if failed:
        address, error = next(iter(failed.items()))
        raise GroupsUnreadable(f"ListGroups answered error {error} at {address}")
    groups = set(listed)
    out: dict[str, list[GroupOffset]] = {}
    refused: list[str] = []
    answers = []
    for address, names in _coordinators(view, sorted(groups)).items():
        with WireClient(address, client_id="tierproxy-tier", identity=view.identity) as w:
            for i in range(0, len(names), GROUPS_PER_REQUEST):
                answers += w.request(ApiKey.OFFSET_FETCH, 8, {"groups": [
                    {"group_id": g, "topics": None} for g in names[i:i + GROUPS_PER_REQUEST]],
                    "require_stable": False})["groups"]
    for g in answers:
        if g["error_code"] == GROUP_AUTHORIZATION_FAILED:
            refused.append(g["group_id"])
            continue
        offs = [GroupOffset(t["name"], p["partition_index"], p["committed_offset"], p["committed_leader_epoch"],
                            p["metadata"])
                for t in g["topics"] if t["name"] in topics for p in t["partitions"]
                if p["error_code"] == 0 and p["committed_offset"] >= 0]
        if offs:
            out[g["group_id"]] = sorted(offs, key=lambda o: (o.topic, o.partition))
    if refused:
        raise GroupsUnreadable(f"may not describe groups {', '.join(sorted(refused))} (grant DESCRIBE on them)", out)
    if not whole:
        raise GroupsUnreadable("tierproxy's principal may not DESCRIBE the cluster, so ListGroups names only the "
                               f"groups it may describe ({len(out)} with offsets on tiered topics recorded): grant "
                               "DESCRIBE on the groups that read tiered topics, or on the cluster", out)
    return out


def _may_describe_cluster(view: ClusterView) -> bool:
    """Whether the principal holds DESCRIBE on the cluster: Kafka fills DescribeCluster's authorized operations only
    for a principal that may describe the cluster (otherwise the field keeps its "not given" value). A broker that
    answers with an error cannot tell: taken as yes (no warning on a guess)."""
    with WireClient(next(iter(view.brokers.values())), client_id="tierproxy-tier", identity=view.identity) as w:
        resp = w.request(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": True})
    ops = resp["cluster_authorized_operations"]
    return resp["error_code"] != 0 or (ops != UNKNOWN_OPERATIONS and bool(ops & (1 << DESCRIBE)))


def list_groups(addresses: list[str], identity: ClientIdentity | None, client_id: str
                ) -> tuple[dict[str, str], dict[str, int]]:
    """ListGroups at each broker (each names the groups it coordinates): group → state, and address → error code
    of the brokers that answered with one."""
    groups: dict[str, str] = {}
    errors: dict[str, int] = {}
    for address in addresses:
        with WireClient(address, client_id=client_id, identity=identity) as w:
            resp = w.request(ApiKey.LIST_GROUPS, 4, {"states_filter": []})
        if resp["error_code"]:
            errors[address] = resp["error_code"]
        groups.update({g["group_id"]: g["group_state"] for g in resp["groups"]})
    return groups, errors


def find_coordinators(address: str, groups: list[str], identity: ClientIdentity | None, client_id: str
                      ) -> dict[str, tuple[str | None, int]]:
    """FindCoordinator v4 (100 groups a request): group → (its coordinator's HOST:PORT or None, error code)."""
    out: dict[str, tuple[str | None, int]] = {}
    with WireClient(address, client_id=client_id, identity=identity) as w:
        for i in range(0, len(groups), 100):
            resp = w.request(ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": groups[i:i + 100]})
            out.update({c["key"]: (f"{c['host']}:{c['port']}" if c["error_code"] == 0 else None, c["error_code"])
                        for c in resp["coordinators"]})
    return out


def _coordinators(view: ClusterView, groups: list[str]) -> dict[str, list[str]]:
    if not groups:
        return {}
    by_address: dict[str, list[str]] = defaultdict(list)
    found = find_coordinators(next(iter(view.brokers.values())), groups, view.identity, "tierproxy-tier")
    for group, (address, error) in found.items():
        if address is not None:
            by_address[address].append(group)
        else:
            log.warning("group %s has no coordinator now (error %d): its offsets are not in this snapshot", group,
                        error)
    return by_address


def build_snapshot(run_id: str, taken_ms: int, view: ClusterView, parts: list[PartitionInfo],
                   configs: dict[str, dict[str, str]], offsets: dict[tuple[str, int], PartitionOffsets],
                   rlmm: RemoteLogMetadataManager, metadata_topic: str | None) -> TierSnapshot:
    """The snapshot of one pass: the tiered topics (`parts`) as the cluster describes them now."""
    by_topic: dict[str, list[PartitionInfo]] = defaultdict(list)
    for p in parts:
        by_topic[p.topic].append(p)
    topics = {name: TopicFacts(name, _b64(ps[0].topic_id), _b64(ps[0].id_in_cluster), len(ps),
                               max(p.replicas for p in ps),
                               {k: v for k, v in configs.get(name, {}).items() if k in RESTORED_CONFIGS})
              for name, ps in by_topic.items()}
    partitions = [PartitionFacts(p.topic, p.partition, o.high_watermark, o.log_start, p.leader_epoch)
                  for p in parts if (o := offsets.get((p.topic, p.partition))) is not None]
    meta_id = next((_b64(p.id_in_cluster) for p in view.partitions if p.topic == metadata_topic), None)
    snap = TierSnapshot(view.cluster_id or "", taken_ms, run_id, metadata_topic, meta_id, topics, partitions)
    try:
        snap.groups = group_offsets(view, set(topics))
    except (GroupsUnreadable, OSError) as exc:
        snap.groups = exc.partial if isinstance(exc, GroupsUnreadable) else {}
        snap.groups_unreadable = str(exc)
        log.warning("group offsets not fully recorded in the tier snapshot: %s", exc)
    snap.records = rlmm.live_records()
    return snap


def _b64(raw: bytes) -> str:
    from tierproxy.tier.model import uuid_str

    return uuid_str(raw)


def write_snapshot(rsm: RemoteStorageManager, snap: TierSnapshot, loop: asyncio.AbstractEventLoop) -> str:
    return asyncio.run_coroutine_threadsafe(write(rsm.store, rsm.prefix, snap), loop).result()
