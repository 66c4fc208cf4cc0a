"""Issue 63, findings 2, 3 and 5: a restore in stages, rerun after B served for a while, from a degraded last pass.

All on the disaster's clusters (`tests/restore/conftest.py`): B after the restore of `orders` (and whatever the
modules before this one restored since). A rerun that must not touch the disaster's own tier runs on a copy of it
(the same B: its state, its ownership, its pinned facts). The degraded pass is B's own, taken with one of B's
brokers killed (started again after): last in the module.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support.cli import run_cli
from tests.support.restore import (
    OTHER,
    STAGED_GROUP,
    STAGED_OFFSETS,
    THIRD,
    TOPIC,
    Disaster,
    commit,
    committed,
    tier_settings,
)
from tests.support.tiering import tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.tiering.cluster import describe_cluster, list_offsets
from tierproxy.jobs.tiering.describe import build_snapshot
from tierproxy.tier import snapshot as snapshots
from tierproxy.tier.rlmm import ReplayedMetadata
from tierproxy.tier.rsm import RemoteStorageManager

pytestmark = [pytest.mark.cluster, pytest.mark.process, pytest.mark.spark]


def _restore(bootstrap: str, tier: Path, *args: str) -> tuple[int, str]:
    out = run_cli("restore", "--bootstrap-server", bootstrap, "--storage", f"file://{tier}", "--metadata", "topic:",
                  *args)
    return out.returncode, out.stdout + out.stderr


def _written_by_b(disaster: Disaster) -> None:
    """B's clients wrote to the restored `orders` (B is in service)."""
    prod = Producer({"bootstrap.servers": disaster.b.bootstrap})
    for i in range(5):
        prod.produce(TOPIC, f"b-in-service-{i}".encode(), partition=0)
    assert prod.flush(30) == 0


def _pruned_by_b_passes(tier: Path) -> None:
    """What B's own `tier` passes do to A's snapshots within minutes: five newer snapshots (of B) written through
    `tier.snapshot.write`, which keeps the newest five."""
    async def go() -> None:
        rsm = RemoteStorageManager.from_uri(f"file://{tier}")
        try:
            keys = sorted(k for k in await rsm.store.list(rsm.object_key(snapshots.PREFIX)) if k.endswith(".json"))
            newest = snapshots.TierSnapshot.decode(await rsm.store.get(keys[-1]))
            for i in range(snapshots.KEPT):
                newest.cluster_id, newest.taken_ms, newest.run_id = "B-passes", int(time.time() * 1000) + i, f"b{i}"
                await snapshots.write(rsm.store, rsm.prefix, newest)
            left = [snapshots.TierSnapshot.decode(await rsm.store.get(k)).cluster_id
                    for k in await rsm.store.list(rsm.object_key(snapshots.PREFIX)) if k.endswith(".json")]
            assert left == ["B-passes"] * snapshots.KEPT, "none of A's snapshots is left"
        finally:
            await rsm.close()

    asyncio.run(go())


def _newest(tier: Path) -> snapshots.TierSnapshot:
    async def go() -> snapshots.TierSnapshot | None:
        rsm = RemoteStorageManager.from_uri(f"file://{tier}")
        try:
            return await snapshots.newest(rsm.store, rsm.prefix)
        finally:
            await rsm.close()

    snap = asyncio.run(go())
    assert snap is not None
    return snap


def _state(tier: Path, b: KafkaCluster) -> dict[str, Any]:
    return dict(json.loads((tier / "restore" / f"{b.cluster_id}.json").read_text()))


def test_a_group_restored_in_stages_gets_each_topic_s_offsets(disaster: Disaster) -> None:
    """Finding 2: `staged` has offsets on orders and audit; orders is restored first (the disaster), audit by a later
    stage (here, or by test_disaster's kill test before): the later stage commits the group's audit offsets."""
    b = disaster.b
    code, out = _restore(b.bootstrap, disaster.tier, "--topics", OTHER)
    assert code == 0, out
    assert committed(b.bootstrap, STAGED_GROUP, OTHER, 1) == {0: STAGED_OFFSETS[OTHER]}, out
    assert committed(b.bootstrap, STAGED_GROUP, TOPIC, 1) == {0: STAGED_OFFSETS[TOPIC]}, "the first stage's"
    state = _state(disaster.tier, b)
    assert {f"{STAGED_GROUP}/{TOPIC}/0", f"{STAGED_GROUP}/{OTHER}/0"} <= set(state["groups_done"]), state


def test_a_later_stage_after_b_served_for_a_while_plans_from_a_s_pinned_facts(disaster: Disaster,
                                                                               tmp_path: Path) -> None:
    """Finding 5: B's passes pruned every snapshot of A, and B's clients wrote to the restored orders; a later stage
    whose --topics also names orders (a rerun of the whole) plans from the facts the first run pinned and leaves
    orders as B has it."""
    _written_by_b(disaster)
    tier = tmp_path / "tier"
    shutil.copytree(disaster.tier, tier)
    _pruned_by_b_passes(tier)
    code, out = _restore(disaster.b.bootstrap, tier, "--topics", f"{TOPIC}|{OTHER}|ledger", "--dry-run")
    assert code == 0, out
    earlier = next((line for line in out.splitlines() if "restored by an earlier run, left as they are:" in line), "")
    assert TOPIC in earlier.split(": ", 1)[-1].split(", "), out
    assert f"{TOPIC}-0:" not in out, "orders is B's now: not planned again"


def test_three_stages_with_b_in_service_between_every_group_resumes_every_partition_where_it_was_in_a(
        disaster: Disaster, tmp_path: Path) -> None:
    """orders (the disaster's run), audit (maybe run by a module before: then found done), then payments (no other
    module touches it), with
    B's clients writing to what is restored and B's own `tier` pass between the stages: every group of A, on every
    partition of the three topics, holds in B the offset (and leader epoch) it had in A."""
    b = disaster.b
    stages = [TOPIC, OTHER, THIRD]
    for i, topic in enumerate(stages):
        if i:
            code, out = _restore(b.bootstrap, disaster.tier, "--topics", topic)
            assert code == 0, out
        if i < len(stages) - 1:  # B in service: its clients write, its tier job runs
            prod = Producer({"bootstrap.servers": b.bootstrap})
            for n in range(20):
                prod.produce(topic, f"b-stage-{i}-{n}".encode(), partition=0)
            assert prod.flush(30) == 0
            summary = tier_once(tier_settings(b.bootstrap, disaster.tier, tmp_path / "state-b"))
            assert summary.snapshot and summary.failed == 0, summary
            unread = snapshots.TierSnapshot.decode((disaster.tier / summary.snapshot).read_bytes()).unread
            assert unread == [], f"a pass with every broker up reads everything: {unread}"
    facts = _newest(disaster.before_restore)  # A's last pass, as A left the tier
    want = {(g, o.topic, o.partition): (o.offset, o.leader_epoch) for g, offs in facts.groups.items() for o in offs
            if o.topic in stages}
    assert {g for g, _, _ in want} >= {"classic", "kip848", "past", STAGED_GROUP}, want
    assert {t for _, t, _ in want} == set(stages), "a group of A on each of the three topics"
    got = {(g, t, p): v for g, t in {(g, t) for g, t, _ in want}
           for p, v in committed(b.bootstrap, g, t, facts.topics[t].partitions).items()}
    assert got == want
    pinned = snapshots.TierSnapshot.decode((disaster.tier / "restore" / f"{b.cluster_id}.facts.json").read_bytes())
    assert pinned.cluster_id == disaster.a_cluster_id, "the stages planned from A's facts, not B's snapshots"


def test_a_rerun_killed_inside_the_group_commits_never_rewinds_a_group_that_moved_on(disaster: Disaster,
                                                                                     tmp_path: Path) -> None:
    """Finding 5: the state as a kill -9 inside the group commits leaves it (topics finished, the group commits not
    saved yet); meanwhile `staged` moved on in B and B's clients wrote to orders. The rerun commits nothing again."""
    b = disaster.b
    _written_by_b(disaster)
    moved = (STAGED_OFFSETS[TOPIC][0] + 50, -1)
    commit(b.bootstrap, STAGED_GROUP, {0: moved}, topic=TOPIC)
    tier = tmp_path / "tier"
    shutil.copytree(disaster.tier, tier)
    state = _state(tier, b)
    for key in ("done_ms", "groups_committed", "groups_done"):
        state.pop(key, None)
    (tier / "restore" / f"{b.cluster_id}.json").write_text(json.dumps(state))
    try:
        code, out = _restore(b.bootstrap, tier, "--topics", TOPIC)
        assert code == 0, out
        assert committed(b.bootstrap, STAGED_GROUP, TOPIC, 1) == {0: moved}, "not rewound to A's offset"
        assert "groups committed" not in out and f"{STAGED_GROUP}/{TOPIC}/0" in out, out
        assert "done_ms" in _state(tier, b)
    finally:
        commit(b.bootstrap, STAGED_GROUP, {0: STAGED_OFFSETS[TOPIC]}, topic=TOPIC)


def test_a_degraded_last_pass_is_completed_from_an_older_one_or_refused_naming_what_is_missing(
        disaster: Disaster, kafka: KafkaCluster, tmp_path: Path) -> None:
    """Finding 3: B's pass with the leader of orders-1 killed (before the controller fences it: the pass still
    asks it) cannot read orders-1's offsets nor that broker's group listing. Restoring B's tier (onto the session's
    one-broker cluster: every check of the facts comes before the broker count, so nothing is changed there): with
    a whole older pass kept, its facts stand in; with none, the restore refuses naming each missing item, and
    --accept-missing goes on without them. Last in the module: it kills one of B's brokers (started again)."""
    b = disaster.b
    tier = tmp_path / "tier"
    view = describe_cluster(b.bootstrap, None)
    parts = [p for p in view.partitions if p.topic == TOPIC]
    empty = ReplayedMetadata.of([])

    def write(name: str, offsets: dict[tuple[str, int], Any]) -> str:
        snap = build_snapshot(name, int(time.time() * 1000), view, parts, {}, offsets, empty, None)

        async def go() -> str:
            rsm = RemoteStorageManager.from_uri(f"file://{tier}")
            try:
                return await snapshots.write(rsm.store, rsm.prefix, snap)
            finally:
                await rsm.close()

        return asyncio.run(go())

    whole = write("whole", list_offsets(view, parts))
    leader = next(p.leader for p in parts if p.partition == 1)
    b.stop_node(leader, kill=True)
    try:
        degraded = write("degraded", list_offsets(view, parts))
    finally:
        b.start_node(leader)
    snap = snapshots.TierSnapshot.decode((tier / degraded).read_bytes())
    described = [u.describe() for u in snap.unread]
    assert f"partition {TOPIC}-1 (its leader (node {leader}) gave no offsets)" in described, described
    # its ListGroups failed (or, were it the broker asked first, every group look-up did)
    assert any(u.startswith("the group listing at") for u in described), described

    args = ("--topics", TOPIC, "--dry-run")
    code, out = _restore(kafka.bootstrap, tier, *args)
    assert code == 2 and "has one broker" in out and "holds these whole" not in out, \
        f"the older whole pass stands in for what the last could not read: {out}"
    (tier / whole).unlink()
    code, out = _restore(kafka.bootstrap, tier, *args)
    assert code == 2 and "holds these whole" in out and f"partition {TOPIC}-1 (its leader" in out, out
    assert "the group listing at" in out and "--accept-missing" in out, out
    code, out = _restore(kafka.bootstrap, tier, *args, "--accept-missing")
    assert code == 2 and "has one broker" in out, out
