"""Committing the recorded group offsets into the new cluster unchanged (offset, leader epoch, metadata).

A restored partition keeps its offsets, so a group's committed offsets mean the same records as before: they are
committed as they were (OffsetCommit with no generation, as an admin commits for an empty group). A group that is
already active in the new cluster is left alone and listed: its members own their positions now.

Each (group, topic, partition) is committed once: a staged restore (`--topics t1`, later `--topics t2`) commits a
group's t2 offsets in the later stage. What the new cluster already holds for one is its own (an earlier run
committed it and was stopped before saving so, or the group's consumers moved on since): kept, never rewound.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from protocol.constants import ApiKey
from tierproxy.config.identity import ClientIdentity
from tierproxy.jobs.tiering.describe import find_coordinators, list_groups
from tierproxy.kafka.wireclient import WireClient
from tierproxy.tier.snapshot import GroupOffset

log = logging.getLogger("tierproxy.jobs.restore")
IDLE_STATES = {"Empty", "Dead", ""}
COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR = 14, 15, 16
RETRIABLE = {COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR}


Key = tuple[str, str, int]  # (group, topic, partition)


def key_name(key: Key) -> str:
    """How a restore's state names a committed (group, topic, partition)."""
    return f"{key[0]}/{key[1]}/{key[2]}"


@dataclass
class GroupsResult:
    committed: list[str] = field(default_factory=list)  # groups with offsets committed by this run
    kept: list[str] = field(default_factory=list)  # (group/topic/partition) the new cluster already held: kept
    active: list[str] = field(default_factory=list)  # already active in the new cluster: left alone
    failed: dict[str, str] = field(default_factory=dict)  # group → why (an ACL, a coordinator error)


def active_groups(brokers: list[str], identity: ClientIdentity | None) -> set[str]:
    """Groups with members in the new cluster (ListGroups at each broker)."""
    groups, _ = list_groups(brokers, identity, "tierproxy-restore")
    return {g for g, state in groups.items() if state not in IDLE_STATES}


def commit_groups(bootstrap: str, brokers: list[str], groups: dict[str, list[GroupOffset]], topics: set[str],
                  identity: ClientIdentity | None, done: Collection[Key] = (),
                  saved: Callable[[list[Key]], None] = lambda keys: None) -> GroupsResult:
    """Commit each group's recorded offsets on `topics` (the restored ones), except the (group, topic, partition)s
    in `done` (committed by an earlier run of this restore: their members may have moved on since). `saved` is
    called after each group with the keys now done, before the next group is touched."""
    result = GroupsResult()
    busy = active_groups(brokers, identity)
    wanted = {g: [o for o in offs if o.topic in topics and (g, o.topic, o.partition) not in done]
              for g, offs in groups.items()}
    for g in sorted(g for g, offs in wanted.items() if offs):
        if g in busy:
            result.active.append(g)
            log.warning("group %s is active in the new cluster: its recorded offsets are not committed", g)
            continue
        why, kept = _commit_one(bootstrap, g, wanted[g], identity)
        if why is not None:
            result.failed[g] = why
            continue
        result.kept += [key_name(k) for k in kept]
        if len(kept) < len(wanted[g]):
            result.committed.append(g)
        saved([(g, o.topic, o.partition) for o in wanted[g]])
    return result


def _commit_one(bootstrap: str, group: str, offsets: list[GroupOffset], identity: ClientIdentity | None
                ) -> tuple[str | None, list[Key]]:
    """(why the group's offsets could not be committed or None, the keys the new cluster already held and kept).
    A new cluster's coordinators move and load while its offsets topic settles: those answers are retried (bounded,
    with backoff) at the coordinator found again."""
    delay, why = 0.1, ""
    for _ in range(12):
        try:
            coordinator = _coordinator(bootstrap, group, identity)
            with WireClient(coordinator, client_id="tierproxy-restore", identity=identity) as w:
                held, error = _held(w, group, offsets)
                if error in RETRIABLE:
                    why = f"OffsetFetch error {error}"
                    time.sleep(delay)
                    delay = min(delay * 2, 3.0)
                    continue
                if error:
                    return f"OffsetFetch error {error}", []
                todo = [o for o in offsets if (o.topic, o.partition) not in held]
                resp = w.request(ApiKey.OFFSET_COMMIT, 8, _commit(group, todo)) if todo else {"topics": []}
        except OSError as exc:
            return str(exc), []
        errors = {(t["name"], p["partition_index"]): p["error_code"] for t in resp["topics"]
                  for p in t["partitions"] if p["error_code"]}
        if not errors:
            return None, [(group, t, p) for t, p in sorted(held)]
        why = f"OffsetCommit errors {sorted(errors.items())[:5]}"
        if not set(errors.values()) <= RETRIABLE:
            return why, []
        time.sleep(delay)
        delay = min(delay * 2, 3.0)
    return why, []


def _held(w: WireClient, group: str, offsets: list[GroupOffset]) -> tuple[set[tuple[str, int]], int]:
    """The (topic, partition)s of `offsets` the group already has a committed offset for in the new cluster, and
    the group's OffsetFetch error code."""
    topics = sorted({o.topic for o in offsets})
    resp = w.request(ApiKey.OFFSET_FETCH, 8, {"groups": [{"group_id": group, "topics": [
        {"name": t, "partition_indexes": sorted(o.partition for o in offsets if o.topic == t)} for t in topics]}],
        "require_stable": False})
    (answer,) = resp["groups"]
    if answer["error_code"]:
        return set(), int(answer["error_code"])
    bad = {p["error_code"] for t in answer["topics"] for p in t["partitions"] if p["error_code"]}
    if bad:
        return set(), min(bad)
    return {(t["name"], p["partition_index"]) for t in answer["topics"] for p in t["partitions"]
            if p["committed_offset"] >= 0}, 0


def _commit(group: str, offsets: list[GroupOffset]) -> dict[str, object]:
    by_topic: dict[str, list[GroupOffset]] = defaultdict(list)
    for o in offsets:
        by_topic[o.topic].append(o)
    return {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": t, "partitions": [
                {"partition_index": o.partition, "committed_offset": o.offset,
                 "committed_leader_epoch": o.leader_epoch, "committed_metadata": o.metadata}
                for o in sorted(offs, key=lambda o: o.partition)]} for t, offs in sorted(by_topic.items())]}


def _coordinator(bootstrap: str, group: str, identity: ClientIdentity | None) -> str:
    """The group's coordinator; a new cluster creates its offsets topic on the first ask: asked again meanwhile."""
    delay, error = 0.1, 0
    for _ in range(12):
        address, error = find_coordinators(bootstrap, [group], identity, "tierproxy-restore")[group]
        if address is not None:
            return address
        if error not in RETRIABLE:
            break
        time.sleep(delay)
        delay = min(delay * 2, 3.0)
    raise OSError(f"no coordinator for group {group}: error {error}")
