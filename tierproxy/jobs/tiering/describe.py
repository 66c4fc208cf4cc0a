"""What a `tier` pass records so the tier outlives its cluster (`tier.snapshot`): topic facts, partition offsets and
epochs, the committed offsets of the groups that read tiered topics, and every live metadata record."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from protocol.constants import ApiKey
from tierproxy.config.identity import ClientIdentity
from tierproxy.jobs.tiering.cluster import ClusterView, PartitionInfo, PartitionOffsets
from tierproxy.kafka.wireclient import WireClient
from tierproxy.tier.rlmm import RemoteLogMetadataManager
from tierproxy.tier.snapshot import (
    GROUP,
    LISTING,
    PARTITION,
    RESTORED_CONFIGS,
    GroupOffset,
    PartitionFacts,
    TierSnapshot,
    TopicFacts,
    Unread,
)

log = logging.getLogger("tierproxy.tier")
GROUP_AUTHORIZATION_FAILED = 30
UNKNOWN_OPERATIONS, DESCRIBE = -2147483648, 8  # authorized operations not given; AclOperation DESCRIBE's bit
GROUPS_PER_REQUEST = 50  # OffsetFetch of many groups: one answer per 50 groups, so none grows without bound


def group_offsets(view: ClusterView, topics: set[str]) -> tuple[dict[str, list[GroupOffset]], list[Unread]]:
    """The committed offsets on `topics` of every group the cluster lists (ListGroups asks each broker for the
    groups it coordinates; OffsetFetch asks each group's coordinator), and what could not be read, item by item: a
    broker whose ListGroups failed (its groups are not named), a group without a coordinator, one whose OffsetFetch
    failed (at its coordinator, for the group, or for one of its partitions), one the principal may not describe.
    Only whole groups are returned: a group with any unread partition is an unread item, not a partial fact."""
    unread: list[Unread] = []
    if not _may_describe_cluster(view):
        unread.append(Unread(LISTING, "", -1, "tierproxy's principal may not DESCRIBE the cluster, so ListGroups "
                             "names only the groups it may describe: grant DESCRIBE on the groups that read tiered "
                             "topics, or on the cluster"))
    listed, errors = list_groups(list(view.brokers.values()), view.identity, "tierproxy-tier")
    unread += [Unread(LISTING, address, -1, why) for address, why in sorted(errors.items())]
    out: dict[str, list[GroupOffset]] = {}
    coordinators, no_coordinator = _coordinators(view, sorted(listed))
    unread += no_coordinator
    for address, names in coordinators.items():
        try:
            answers = []
            with WireClient(address, client_id="tierproxy-tier", identity=view.identity) as w:
                for i in range(0, len(names), GROUPS_PER_REQUEST):
                    answers += w.request(ApiKey.OFFSET_FETCH, 8, {"groups": [
                        {"group_id": g, "topics": None} for g in names[i:i + GROUPS_PER_REQUEST]],
                        "require_stable": False})["groups"]
        except OSError as exc:
            unread += [Unread(GROUP, g, -1, f"OffsetFetch at its coordinator {address}: {exc}") for g in names]
            continue
        for g in answers:
            why = _group_error(g, topics)
            if why is not None:
                unread.append(Unread(GROUP, g["group_id"], -1, why))
                continue
            offs = [GroupOffset(t["name"], p["partition_index"], p["committed_offset"], p["committed_leader_epoch"],
                                p["metadata"])
                    for t in g["topics"] if t["name"] in topics for p in t["partitions"]
                    if p["committed_offset"] >= 0]
            if offs:
                out[g["group_id"]] = sorted(offs, key=lambda o: (o.topic, o.partition))
    return out, unread


def _group_error(answer: dict[str, Any], topics: set[str]) -> str | None:
    """Why a group's OffsetFetch answer is not whole, or None."""
    if answer["error_code"] == GROUP_AUTHORIZATION_FAILED:
        return "may not describe it (grant DESCRIBE on the group)"
    if answer["error_code"]:
        return f"OffsetFetch error {answer['error_code']}"
    bad = [(t["name"], p["partition_index"], p["error_code"]) for t in answer["topics"] if t["name"] in topics
           for p in t["partitions"] if p["error_code"]]
    return f"OffsetFetch errors {bad[:3]}" if bad else None


def _may_describe_cluster(view: ClusterView) -> bool:
    """Whether the principal holds DESCRIBE on the cluster: Kafka fills DescribeCluster's authorized operations only
    for a principal that may describe the cluster (otherwise the field keeps its "not given" value). A broker that
    answers with an error cannot tell: taken as yes (no warning on a guess)."""
    with WireClient(next(iter(view.brokers.values())), client_id="tierproxy-tier", identity=view.identity) as w:
        resp = w.request(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": True})
    ops = resp["cluster_authorized_operations"]
    return resp["error_code"] != 0 or (ops != UNKNOWN_OPERATIONS and bool(ops & (1 << DESCRIBE)))


def list_groups(addresses: list[str], identity: ClientIdentity | None, client_id: str
                ) -> tuple[dict[str, str], dict[str, str]]:
    """ListGroups at each broker (each names the groups it coordinates): group → state, and address → why, for the
    brokers that answered with an error (COORDINATOR_NOT_AVAILABLE included: its groups are not named) or not at
    all."""
    groups: dict[str, str] = {}
    errors: dict[str, str] = {}
    for address in addresses:
        try:
            with WireClient(address, client_id=client_id, identity=identity) as w:
                resp = w.request(ApiKey.LIST_GROUPS, 4, {"states_filter": []})
        except OSError as exc:
            errors[address] = f"ListGroups: {exc}"
            continue
        if resp["error_code"]:
            errors[address] = f"ListGroups error {resp['error_code']}"
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


def _coordinators(view: ClusterView, groups: list[str]) -> tuple[dict[str, list[str]], list[Unread]]:
    """Coordinator address → its groups, and the groups without one (unread)."""
    if not groups:
        return {}, []
    by_address: dict[str, list[str]] = defaultdict(list)
    unread: list[Unread] = []
    found = find_coordinators(next(iter(view.brokers.values())), groups, view.identity, "tierproxy-tier")
    for group in groups:
        address, error = found.get(group, (None, -1))
        if address is not None:
            by_address[address].append(group)
        else:
            unread.append(Unread(GROUP, group, -1, f"no coordinator (FindCoordinator error {error})"))
    return by_address, unread


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
                  for p in parts if p.leader >= 0 and (o := offsets.get((p.topic, p.partition))) is not None]
    read = {(f.topic, f.partition) for f in partitions}
    unread = [Unread(PARTITION, p.topic, p.partition, "no leader" if p.leader < 0 else
                     f"its leader (node {p.leader}) gave no offsets")
              for p in parts if (p.topic, p.partition) not in read]
    meta_id = next((_b64(p.id_in_cluster) for p in view.partitions if p.topic == metadata_topic), None)
    snap = TierSnapshot(view.cluster_id or "", taken_ms, run_id, metadata_topic, meta_id, topics, partitions)
    try:
        snap.groups, unread_groups = group_offsets(view, set(topics))
    except OSError as exc:  # not even DescribeCluster or FindCoordinator answered: no group is known
        snap.groups, unread_groups = {}, [Unread(LISTING, "", -1, f"group offsets unreadable: {exc}")]
    snap.unread = unread + unread_groups
    if unread_groups:
        snap.groups_unreadable = "; ".join(u.describe() for u in unread_groups[:5]) + (
            f" (and {len(unread_groups) - 5} more)" if len(unread_groups) > 5 else "")
        log.warning("group offsets not fully recorded in the tier snapshot: %s", snap.groups_unreadable)
    if unread:
        log.warning("partition offsets not recorded in the tier snapshot: %s",
                    "; ".join(u.describe() for u in unread[:5]))
    snap.records = rlmm.live_records()
    return snap


def _b64(raw: bytes) -> str:
    from tierproxy.tier.model import uuid_str

    return uuid_str(raw)
