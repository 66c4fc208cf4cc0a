"""Raising a new partition's leader epoch above the history's, through the protocol alone.

Each leader change bumps a partition's leader epoch. While a partition is empty, a change costs nothing: the
replica list is rotated (AlterPartitionReassignments with the same replicas in another order completes at once)
and the new first replica elected (ElectLeaders, PREFERRED). Rounds repeat, all partitions at once, until every
partition's epoch is above its floor; the number of rounds is bounded by the highest floor.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable

from protocol.constants import ApiKey
from tierproxy.config.identity import ClientIdentity
from tierproxy.kafka.wireclient import WireClient

log = logging.getLogger("tierproxy.jobs.restore")
PREFERRED = 0
ELECTION_NOT_NEEDED = 84
WAIT_S = 30.0


class EpochsNotRaised(RuntimeError):
    """The cluster did not move leaders as asked (fewer than two brokers in sync, or reassignments refused)."""


def partition_state(bootstrap: str, topics: list[str], identity: ClientIdentity | None
                    ) -> dict[tuple[str, int], tuple[int, int, list[int], list[int]]]:
    """(topic, partition) → (leader, leader epoch, replicas, in-sync replicas), as Metadata answers now."""
    with WireClient(bootstrap, client_id="tierproxy-restore", identity=identity) as w:
        md = w.request(ApiKey.METADATA, 12, {"topics": [{"name": t, "topic_id": bytes(16)} for t in topics],
                                             "allow_auto_topic_creation": False,
                                             "include_topic_authorized_operations": False})
    return {(t["name"], p["partition_index"]): (p["leader_id"], p["leader_epoch"], list(p["replica_nodes"]),
                                                list(p["isr_nodes"]))
            for t in md["topics"] if t["error_code"] == 0 for p in t["partitions"]}


def raise_epochs(bootstrap: str, floors: dict[tuple[str, int], int], identity: ClientIdentity | None) -> int:
    """Move leaders until each partition's leader epoch is above its floor; returns the leader moves made."""
    topics = sorted({t for t, _ in floors})
    moves = 0
    for _ in range(max(floors.values(), default=0) + 10):
        _wait(bootstrap, topics, identity, lambda s: all(tp in s and s[tp][0] >= 0 for tp in floors),
              "every partition to be described with a leader (topics just created)")
        state = partition_state(bootstrap, topics, identity)
        behind = {tp: state[tp] for tp, floor in floors.items() if state[tp][1] <= floor}
        if not behind:
            return moves
        _move_leaders(bootstrap, topics, identity, behind)
        moves += len(behind)
    raise EpochsNotRaised(f"leader epochs still not above their floors after {moves} leader moves")


State = dict[tuple[str, int], tuple[int, int, list[int], list[int]]]


def _move_leaders(bootstrap: str, topics: list[str], identity: ClientIdentity | None, behind: State) -> None:
    """One round: each partition's next in-sync replica first in its list, then elected (its epoch bumps)."""
    rotated = {}
    for tp, (leader, _, replicas, isr) in behind.items():
        nxt = next((r for r in replicas if r != leader and r in isr), None)
        if nxt is None:
            raise EpochsNotRaised(f"{tp[0]}-{tp[1]} has no other in-sync replica than its leader: it cannot move")
        rotated[tp] = [nxt, *[r for r in replicas if r != nxt]]
    by_topic: dict[str, list[int]] = defaultdict(list)
    for t, p in rotated:
        by_topic[t].append(p)
    _request(bootstrap, identity, ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, {"timeout_ms": 30_000, "topics": [
        {"name": t, "partitions": [{"partition_index": p, "replicas": rotated[(t, p)]} for p in ps]}
        for t, ps in sorted(by_topic.items())]})

    def reordered(s: State) -> bool:
        return all(tp in s and s[tp][2] == r for tp, r in rotated.items())

    def elected(s: State) -> bool:
        return all(tp in s and s[tp][1] > behind[tp][1] for tp in rotated)

    _wait(bootstrap, topics, identity, reordered, "replica orders to apply")
    _request(bootstrap, identity, ApiKey.ELECT_LEADERS, 2, {"election_type": PREFERRED, "timeout_ms": 30_000,
             "topic_partitions": [{"topic": t, "partitions": ps} for t, ps in sorted(by_topic.items())]})
    _wait(bootstrap, topics, identity, elected, "the new leaders")


def _request(bootstrap: str, identity: ClientIdentity | None, api: int, version: int, body: dict[str, object]
             ) -> None:
    with WireClient(bootstrap, client_id="tierproxy-restore", identity=identity) as w:
        resp = w.request(api, version, body)
    if resp.get("error_code", 0) not in (0, ELECTION_NOT_NEEDED):
        raise EpochsNotRaised(f"{ApiKey(api).name} answered error {resp['error_code']}: {resp.get('error_message')}")
    results = resp.get("responses") or resp.get("replica_election_results") or []
    for t in results:
        for p in t.get("partitions") or t.get("partition_result") or []:
            if p["error_code"] not in (0, ELECTION_NOT_NEEDED):
                raise EpochsNotRaised(f"{ApiKey(api).name} for {t.get('name') or t.get('topic')}-"
                                      f"{p.get('partition_index', p.get('partition_id'))}: error {p['error_code']} "
                                      f"{p.get('error_message') or ''}")


def _wait(bootstrap: str, topics: list[str], identity: ClientIdentity | None, done: Callable[[State], bool],
          what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    delay = 0.05
    while True:
        if done(partition_state(bootstrap, topics, identity)):
            return
        if time.monotonic() > deadline:
            raise EpochsNotRaised(f"waited {WAIT_S:.0f}s for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
