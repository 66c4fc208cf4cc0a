"""A topic restored by a principal that holds only the ACLs docs/restore.md names, then the
scenarios of Kafka's own tiered-storage integration tests (`storage/.../tiered/storage/integration`), run black-box
against that restored topic through a proxy in front of B.

`ledger` (one partition, 2,000 records with known timestamps, group `ledgers` at 1,200) is restored by RESTORER over
B's SASL listener: first without READ on the group (the topic is restored, the group listed as not restored,
exit 1), then with it (a rerun commits it). The scenarios follow in order, each on what the one before left:
offload and consume, ListOffsets, a log start breach by DeleteRecords, partitions expanded, the topic deleted.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from protocol.constants import OffsetSpec
from tests.support.acls import create_acls, group_acls, restore_acls
from tests.support.cli import run_cli
from tests.support.kafka import broker_forgets, list_offsets_at_leaders, set_retention, set_topic_config, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.restore import (
    LEDGER,
    LEDGER_COMMITTED,
    LEDGER_GROUP,
    LEDGER_RECORDS,
    RESTORER,
    TOPIC,
    Disaster,
    committed,
    read_rows,
    restorer_config,
    tier_settings,
)
from tests.support.tiering import tier_once
from tests.support.waiting import wait_until
from tierproxy.jobs.restore.epochs import partition_state
from tierproxy.jobs.restore.plan import replay
from tierproxy.jobs.tiering.job import RunSummary
from tierproxy.tier import snapshot as snapshots
from tierproxy.tier.cache import PartitionCache
from tierproxy.tier.model import uuid_bytes
from tierproxy.tier.open import open_metadata
from tierproxy.tier.rlmm_topic import DEFAULT_TOPIC
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.storage import FileStore

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.process]
B_RECORDS = 500  # produced to the restored topic in B (then offloaded, and deleted by B's retention)


@dataclass
class Ledger:
    no_group_acl: subprocess.CompletedProcess[str]  # the restore before RESTORER may read the group
    rerun: subprocess.CompletedProcess[str]  # after
    history_id: bytes  # A's topic id of LEDGER: the history B's topic continues
    orders_id: bytes


def _ids(tier: Path) -> tuple[bytes, bytes]:
    async def read() -> tuple[bytes, bytes]:
        rsm = RemoteStorageManager.from_uri(f"file://{tier}")
        try:
            snap = await snapshots.newest(rsm.store, rsm.prefix)
        finally:
            await rsm.close()
        assert snap is not None
        return uuid_bytes(snap.topics[LEDGER].topic_id), uuid_bytes(snap.topics[TOPIC].topic_id)

    return asyncio.run(read())


@pytest.fixture(scope="module")
def ledger(disaster: Disaster, tmp_path_factory: pytest.TempPathFactory) -> Ledger:
    b, d = disaster.b, tmp_path_factory.mktemp("ledger")
    history_id, orders_id = _ids(disaster.before_restore)
    create_acls(b.bootstrap, restore_acls(RESTORER, [LEDGER], DEFAULT_TOPIC))
    args = ["restore", "--bootstrap-server", b.bootstrap_for("SASL"), "--command-config",
            str(restorer_config(d / "restorer.properties")), "--storage", f"file://{disaster.tier}",
            "--metadata", "topic:", "--topics", LEDGER]
    first = run_cli(*args)
    create_acls(b.bootstrap, group_acls(RESTORER, LEDGER_GROUP))
    return Ledger(first, run_cli(*args), history_id, orders_id)


def _proxy(disaster: Disaster, tmp: Path) -> ProxyProcess:
    return ProxyProcess(disaster.b.bootstrap, tmp, extra={"TIERPROXY_STORAGE": f"file://{disaster.tier}",
                                                          "TIERPROXY_METADATA": "topic:"})


def _tier_pass(disaster: Disaster, tmp: Path, **kw: Any) -> RunSummary:
    summary = tier_once(tier_settings(disaster.b.bootstrap, disaster.tier, tmp / "state-b", **kw))
    assert summary.failed == 0 and not summary.errors, summary
    return summary


def _history(disaster: Disaster, ledger: Ledger, partition: int = 0) -> PartitionCache | None:
    """The tier's view of LEDGER's history (A's id) as B's metadata topic holds it now."""
    async def read() -> PartitionCache | None:
        rlmm = open_metadata("topic:", disaster.b.bootstrap)
        await rlmm.start()
        try:
            return None if rlmm.cache.is_deleted(ledger.history_id, partition) else \
                rlmm.cache.get(ledger.history_id, partition)
        finally:
            await rlmm.close()

    return asyncio.run(read())


def _from(bootstrap: str, partition: int, offset: int, count: int) -> list[tuple[int, bytes | None]]:
    """`count` records of LEDGER from `offset` (an offset reset fails): (offset, value)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"from-{offset}", "auto.offset.reset": "error",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(LEDGER, partition, offset)])
    out: list[tuple[int, bytes | None]] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.3)
            if m is not None:
                assert m.error() is None, m.error()
                out.append((m.offset(), m.value()))
    finally:
        c.close()
    return out


def test_without_read_on_the_group_the_topic_is_restored_and_the_group_listed(disaster: Disaster,
                                                                             ledger: Ledger) -> None:
    refused = ledger.no_group_acl
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "some group offsets were not committed" in refused.stderr, refused.stderr
    assert f"groups failed: {{'{LEDGER_GROUP}'" in refused.stdout, refused.stdout
    assert f"{LEDGER}-0: tier 0..{LEDGER_RECORDS - 1}, begins at {LEDGER_RECORDS}" in refused.stdout
    rerun = ledger.rerun
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"groups committed: ['{LEDGER_GROUP}']" in rerun.stdout, rerun.stdout
    assert committed(disaster.b.bootstrap, LEDGER_GROUP, LEDGER, 1)[0][0] == LEDGER_COMMITTED
    assert committed(disaster.b.bootstrap, "classic") == disaster.groups["classic"], "orders' groups untouched"


def test_offload_and_consume_from_leader(disaster: Disaster, ledger: Ledger, tmp_path: Path) -> None:
    """Kafka's OffloadAndConsumeFromLeaderTest: records produced to the restored topic are offloaded and deleted
    locally; a consumer reads the whole log from 0, from inside A's history and from B's first record."""
    b = disaster.b
    set_topic_config(b.bootstrap, LEDGER, "internal.segment.bytes", str(16 * 1024))
    prod = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    for i in range(B_RECORDS):
        prod.produce(LEDGER, f"on-b-{i}".encode(), partition=0)
    assert prod.flush(30) == 0
    end = watermarks(b.bootstrap, LEDGER)[1]
    assert end == LEDGER_RECORDS + B_RECORDS
    _tier_pass(disaster, tmp_path)
    history = _history(disaster, ledger)
    assert history is not None and history.latest_tiered_offset() == end - 1, "B's records offloaded"
    assert broker_forgets(b.bootstrap, LEDGER, above=end - 1) == end, "and deleted from B's disk"
    p = _proxy(disaster, tmp_path)
    try:
        rows = read_rows(p.bootstrap, {0: end}, topic=LEDGER)
        assert {k: v for k, v in rows.items() if k[1] < LEDGER_RECORDS} == disaster.ledger, "A's bytes"
        assert [rows[(0, o)][1] for o in range(LEDGER_RECORDS, end)] == [f"on-b-{i}".encode() for i in range(B_RECORDS)]
        assert _from(p.bootstrap, 0, 1500, 10) == [(o, disaster.ledger[(0, o)][1]) for o in range(1500, 1510)]
        assert _from(p.bootstrap, 0, LEDGER_RECORDS, 3) == [(LEDGER_RECORDS + i, f"on-b-{i}".encode())
                                                            for i in range(3)]
    finally:
        p.stop()


def test_list_offsets(disaster: Disaster, ledger: Ledger, tmp_path: Path) -> None:
    """Kafka's ListOffsetsTest: earliest, latest, earliest-local, latest-tiered and by timestamp, through the
    proxy; B alone never answers below S."""
    b = disaster.b
    start, end = watermarks(b.bootstrap, LEDGER)
    p = _proxy(disaster, tmp_path)
    try:
        def through(spec: int) -> int:
            return list_offsets_at_leaders(p.bootstrap, spec, topic=LEDGER, version=9)[0][0]

        wait_until(lambda: through(OffsetSpec.EARLIEST) == 0, "the proxy's tier loaded")
        assert through(OffsetSpec.LATEST) == end
        assert through(OffsetSpec.EARLIEST_LOCAL) == start, "the broker's own log start"
        assert through(OffsetSpec.LATEST_TIERED) == LEDGER_RECORDS + B_RECORDS - 1, "the last of B's, tiered"
        assert through(disaster.ledger_t0 + 700) == 700, "a time inside A's history: found in the tier"
    finally:
        p.stop()
    direct = list_offsets_at_leaders(b.bootstrap, disaster.ledger_t0 + 700, topic=LEDGER, version=9)[0][0]
    assert direct == -1 or direct >= LEDGER_RECORDS, direct
    epoch = partition_state(b.bootstrap, [LEDGER], None)[(LEDGER, 0)][1]
    assert list_offsets_at_leaders(b.bootstrap, OffsetSpec.LATEST, topic=LEDGER, version=9)[0] == (end, epoch)


def test_delete_segments_due_to_log_start_offset_breach(disaster: Disaster, ledger: Ledger, tmp_path: Path) -> None:
    """Kafka's DeleteSegmentsDueToLogStartOffsetBreachTest: DeleteRecords (through the proxy) inside A's history
    moves the log start; readers begin there; the next pass deletes the segments wholly below it, and its
    snapshot records the purge."""
    before = _history(disaster, ledger)
    assert before is not None
    below = [md for md in before.finished() if md.end_offset < 800]
    assert below, "A's history has segments wholly below the purge"
    p = _proxy(disaster, tmp_path)
    try:
        wait_until(lambda: list_offsets_at_leaders(p.bootstrap, OffsetSpec.EARLIEST, quiet=True, topic=LEDGER),
                   "the proxy's tier loaded")
        admin = AdminClient({"bootstrap.servers": p.bootstrap})
        done = admin.delete_records([TopicPartition(LEDGER, 0, 800)], request_timeout=30)
        assert next(iter(done.values())).result(30).low_watermark == 800
        assert list_offsets_at_leaders(p.bootstrap, OffsetSpec.EARLIEST, topic=LEDGER)[0][0] == 800
        c = Consumer({"bootstrap.servers": p.bootstrap, "group.id": "after-purge", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
        c.subscribe([LEDGER])
        try:
            first = None
            for _ in range(300):
                if (m := c.poll(0.2)) is not None and m.error() is None and m.partition() == 0:
                    first = m.offset()
                    break
        finally:
            c.close()
        assert first == 800
    finally:
        p.stop()
    summary = _tier_pass(disaster, tmp_path)
    assert summary.purged == len(below), summary
    history = _history(disaster, ledger)
    assert history is not None and history.log_start_offset == 800
    assert min(md.end_offset for md in history.finished()) >= 800, "segments wholly below the purge deleted"
    snap = asyncio.run(snapshots.read(FileStore(disaster.tier), "", summary.snapshot))
    assert (pc := replay(snap).get(ledger.history_id, 0)) is not None and pc.log_start_offset == 800, \
        "the purge reached the snapshot"


def test_partitions_expand(disaster: Disaster, ledger: Ledger, tmp_path: Path) -> None:
    """Kafka's PartitionsExpandTest: a partition added to the restored topic is tiered into the same history and
    served after B deleted it."""
    b = disaster.b
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    for fut in admin.create_partitions([NewPartitions(LEDGER, 2)], request_timeout=30).values():
        fut.result(30)
    # every broker of B, not one: the pass below asks whichever it reaches, and one that has not applied the new
    # partition yet answers without it (the last stop's CI: that pass tiered nothing; this test and the next failed)
    def has_leader(bootstrap: str) -> bool:
        return partition_state(bootstrap, [LEDGER], None).get((LEDGER, 1), (-1,))[0] >= 0

    for node in b.nodes:
        wait_until(functools.partial(has_leader, node.bootstrap),
                   f"the new partition's leader, as broker {node.node_id} describes it")
    prod = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(300):
        prod.produce(LEDGER, f"new-{i}".encode(), partition=1)
    assert prod.flush(30) == 0
    _tier_pass(disaster, tmp_path)
    new = _history(disaster, ledger, 1)
    assert new is not None and new.latest_tiered_offset() == 299, "under the history's id"
    set_retention(b.bootstrap, LEDGER, 1000)
    try:
        wait_until(lambda: watermarks(b.bootstrap, LEDGER, 1)[0] == 300, "B's retention on the new partition",
                   timeout=90)
    finally:
        set_retention(b.bootstrap, LEDGER, 3_600_000)
    p = _proxy(disaster, tmp_path)
    try:
        assert [v for _, v in _from(p.bootstrap, 1, 0, 300)] == [f"new-{i}".encode() for i in range(300)]
    finally:
        p.stop()


def test_delete_topic(disaster: Disaster, ledger: Ledger, tmp_path: Path) -> None:
    """Kafka's DeleteTopicTest, last: the restored topic deleted in B (the cluster that owns the tier now) takes
    its history with it — through B's own id of it — and nothing else."""
    b = disaster.b
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.delete_topics([LEDGER], request_timeout=30)[LEDGER].result(30)
    wait_until(lambda: LEDGER not in admin.list_topics(timeout=10).topics, "the topic gone from B")
    # (confirmed: alone in the module, ledger's history is most of the tier, which the deletion guard refuses
    # to delete at once without it; the guard has its own tests)
    # B has three brokers, and the one a pass asks may not have applied the deletion yet: such a pass deletes
    # nothing (the topic still exists for it); the next ones do, exactly the two partitions
    deleted: list[int] = []
    broken: list[AssertionError] = []  # a pass that fails or errs ends the wait and the test, as before

    def passes_delete() -> bool:
        try:
            summary = _tier_pass(disaster, tmp_path, tier_topic_delete_delay_ms=0, confirm_retention=True)
        except AssertionError as exc:
            broken.append(exc)
            return True
        deleted.append(summary.partitions_deleted)
        return sum(deleted) >= 2

    wait_until(passes_delete, "a tier pass deletes the topic's history", timeout=120, interval=1)
    assert not broken, broken[0]
    assert sum(deleted) == 2, deleted
    assert _history(disaster, ledger, 0) is None and _history(disaster, ledger, 1) is None

    async def orders_kept() -> int:
        rlmm = open_metadata("topic:", b.bootstrap)
        await rlmm.start()
        try:
            pc = rlmm.cache.get(ledger.orders_id, 0)
            return len(list(pc.finished())) if pc is not None else 0
        finally:
            await rlmm.close()

    assert asyncio.run(orders_kept()) > 0, "orders' history stays"
