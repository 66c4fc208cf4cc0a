"""Committing the recorded group offsets into the new cluster unchanged (offset, leader epoch, metadata).

A restored partition keeps its offsets, so a group's committed offsets mean the same records as before: they are
committed as they were (OffsetCommit with no generation, as an admin commits for an empty group). A group that is
already active in the new cluster is left alone and listed: its members own their positions now.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
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


@dataclass
class GroupsResult:
    committed: list[str] = field(default_factory=list)
    active: list[str] = field(default_factory=list)  # already active in the new cluster: left alone
    failed: dict[str, str] = field(default_factory=dict)  # group → why (an ACL, a coordinator error)


def active_groups(brokers: list[str], identity: ClientIdentity | None) -> set[str]:
    """Groups with members in the new cluster (ListGroups at each broker)."""
    groups, _ = list_groups(brokers, identity, "tierproxy-restore")
    return {g for g, state in groups.items() if state not in IDLE_STATES}


def commit_groups(bootstrap: str, brokers: list[str], groups: dict[str, list[GroupOffset]], topics: set[str],
                  identity: ClientIdentity | None, done: set[str] = frozenset()) -> GroupsResult:  # type: ignore[assignment]
    """Commit each group's recorded offsets on `topics` (the restored ones), except the groups in `done` (committed
    by an earlier run of this restore: their members may have moved on since)."""
    result = GroupsResult()
    busy = active_groups(brokers, identity)
    wanted = {g: [o for o in offs if o.topic in topics] for g, offs in groups.items() if g not in done}
    wanted = {g: offs for g, offs in wanted.items() if offs}
    for g in sorted(wanted):
        if g in busy:
            result.active.append(g)
            log.warning("group %s is active in the new cluster: its recorded offsets are not committed", g)
            continue
        why = _commit_one(bootstrap, g, wanted[g], identity)
        if why is None:
            result.committed.append(g)
        else:
            result.failed[g] = why
    return result


def _commit_one(bootstrap: str, group: str, offsets: list[GroupOffset], identity: ClientIdentity | None
                ) -> str | None:
    """Why the group's offsets could not be committed, or None. A new cluster's coordinators move and load while
    its offsets topic settles: those answers are retried (bounded, with backoff) at the coordinator found again."""
    delay, why = 0.1, ""
    for _ in range(12):
        try:
            coordinator = _coordinator(bootstrap, group, identity)
            with WireClient(coordinator, client_id="tierproxy-restore", identity=identity) as w:
                resp = w.request(ApiKey.OFFSET_COMMIT, 8, _commit(group, offsets))
        except OSError as exc:
            return str(exc)
        errors = {(t["name"], p["partition_index"]): p["error_code"] for t in resp["topics"]
                  for p in t["partitions"] if p["error_code"]}
        if not errors:
            return None
        why = f"OffsetCommit errors {sorted(errors.items())[:5]}"
        if not set(errors.values()) <= RETRIABLE:
            return why
        time.sleep(delay)
        delay = min(delay * 2, 3.0)
    return why


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
