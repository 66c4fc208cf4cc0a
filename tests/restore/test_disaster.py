"""The disaster, end to end: cluster A tiered, then lost with its data directories; `tierproxy restore` into a new
3-broker cluster B; through a proxy in front of B every tiered offset reads as before, the groups resume, and the
tail goes on after the old end.

The disaster itself is `tests/support/restore.py` (set up once for the package).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from protocol.constants import ApiKey, OffsetSpec
from tests.support.balancer import Fleet
from tests.support.cli import run_cli
from tests.support.iceberg import iceberg_cli, pyiceberg_rows, pyiceberg_table
from tests.support.jvm import java_command
from tests.support.kafka import (
    create_topic,
    list_offsets_at_leaders,
    set_topic_config,
    small_segment_producer,
    watermarks,
)
from tests.support.proxy import ProxyProcess
from tests.support.restore import (
    AUDIT_RECORDS,
    CHANGELOG,
    EXTRA,
    OTHER,
    PARTITIONS,
    TOPIC,
    Disaster,
    committed,
    iceberg_args,
    read_rows,
    tier_settings,
)
from tests.support.tiering import tier_once
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port
from tierproxy.jobs.restore.epochs import partition_state
from tierproxy.kafka.wireclient import WireClient
from tierproxy.tier import snapshot as snapshots
from tierproxy.tier.model import uuid_bytes
from tierproxy.tier.ownership import WrongCluster, check_cluster, recorded_owner
from tierproxy.tier.rsm import RemoteStorageManager

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.process, pytest.mark.kcat]


def test_the_restore_reports_where_each_partition_begins_and_what_was_lost(disaster: Disaster) -> None:
    out = disaster.restore_out
    assert f"of cluster {disaster.a_cluster_id} into cluster {disaster.b.cluster_id}" in out
    assert f"{TOPIC}-1: tier 0..{disaster.tier_end[1] - 1}, begins at {disaster.lost_end}" in out
    assert f"LOST offsets {disaster.tier_end[1]}..{disaster.lost_end - 1}" in out
    assert f"{TOPIC}-0: tier 0..{disaster.tier_end[0] - 1}, begins at {disaster.tier_end[0]}," in out


def test_the_new_cluster_begins_each_partition_where_the_old_one_ended(disaster: Disaster) -> None:
    starts = {0: disaster.tier_end[0], 1: disaster.lost_end}
    earliest = list_offsets_at_leaders(disaster.b.bootstrap, OffsetSpec.EARLIEST, topic=TOPIC)
    latest = list_offsets_at_leaders(disaster.b.bootstrap, OffsetSpec.LATEST, topic=TOPIC)
    assert {p: o for p, (o, _) in earliest.items()} == starts
    assert {p: o for p, (o, _) in latest.items()} == starts
    state = partition_state(disaster.b.bootstrap, [TOPIC], None)
    for p in range(PARTITIONS):
        assert state[(TOPIC, p)][1] > disaster.a_epochs[p], "B's leader epoch is above every epoch of A's history"


def test_through_a_proxy_the_history_reads_as_before_and_the_tail_goes_on(disaster: Disaster, tmp_path: Path,
                                                                          kcat: str) -> None:
    b = disaster.b
    p = ProxyProcess(b.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{disaster.tier}",
                                                   "TIERPROXY_METADATA": "topic:"})
    try:
        assert read_rows(p.bootstrap, disaster.tier_end) == disaster.history
        wanted = sorted(o for (q, o) in disaster.history if q == 0)
        out = subprocess.run([kcat, "-b", p.bootstrap, "-C", "-t", TOPIC, "-p", "0", "-o", "beginning", "-c",
                              str(len(wanted)), "-q", "-f", "%o\\n"], capture_output=True, text=True, timeout=120)
        assert [int(x) for x in out.stdout.split()] == wanted, out.stderr[-2000:]
        aborted = read_rows(p.bootstrap, disaster.tier_end, isolation="read_uncommitted")
        assert sum(v == b"txn-aborted" for _, v, _ in aborted.values()) == PARTITIONS
        assert not any(v == b"txn-aborted" for _, v, _ in disaster.history.values())
        # the tail: new records land at S and a reader crosses [N, S) without a reset and without a filler
        prod = Producer({"bootstrap.servers": p.bootstrap, "enable.idempotence": True})
        for i in range(100):
            prod.produce(TOPIC, f"after-{i}".encode(), partition=i % PARTITIONS)
        assert prod.flush(30) == 0
        starts = {0: disaster.tier_end[0], 1: disaster.lost_end}
        rows = read_rows(p.bootstrap, {q: starts[q] + 50 for q in range(PARTITIONS)})
        for q in range(PARTITIONS):
            tail = sorted(o for (pp, o) in rows if pp == q and o >= disaster.tier_end[q])
            assert tail == list(range(starts[q], starts[q] + 50)), "the tail begins at S"
        assert all(v is not None for _, v, _ in rows.values()), "no filler record is ever delivered"
        # the Java consumer across the lost range: A's history, then B's records from S, no reset (none allowed)
        wanted = sorted(o for (q, o) in disaster.history if q == 1) + list(range(starts[1], starts[1] + 50))
        java = subprocess.run([*java_command(), "-Xmx256m", "-cp", f"{b.libs}/*",
                               "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                               p.bootstrap, "--topic", TOPIC, "--partition", "1", "--offset", "0",
                               "--max-messages", str(len(wanted)), "--timeout-ms", "60000",
                               "--consumer-property", "isolation.level=read_committed",
                               "--consumer-property", "auto.offset.reset=none",
                               "--property", "print.offset=true", "--property", "print.value=false"],
                              capture_output=True, text=True, timeout=180)
        assert [int(o) for o in re.findall(r"Offset:(\d+)", java.stdout)] == wanted, java.stderr[-2000:]
    finally:
        p.stop()


def test_the_groups_resume_where_they_were(disaster: Disaster) -> None:
    for group, offsets in disaster.groups.items():
        assert committed(disaster.b.bootstrap, group) == offsets, group
    assert "groups committed: ['classic', 'kip848', 'past', 'staged']" in disaster.restore_out


def test_a_consumer_protocol_member_resumes_its_group_where_it_was(disaster: Disaster, tmp_path: Path) -> None:
    """KIP-848: a `group.protocol=consumer` member of `kip848` (committed on A with that protocol) joins through a
    proxy in front of B and reads on from the committed offset: nothing read twice or skipped."""
    (offset, _), = disaster.groups["kip848"].values()
    wanted = sorted(o for (q, o) in disaster.history if q == 0 and o >= offset)[:50]
    p = ProxyProcess(disaster.b.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{disaster.tier}",
                                                            "TIERPROXY_METADATA": "topic:"})
    c = Consumer({"bootstrap.servers": p.bootstrap, "group.id": "kip848", "group.protocol": "consumer",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        c.subscribe([TOPIC])
        got: list[int] = []
        deadline = time.monotonic() + 90
        while len(got) < len(wanted) and time.monotonic() < deadline:
            m = c.poll(0.3)
            if m is not None and m.error() is None and m.partition() == 0:
                got.append(m.offset())
    finally:
        c.close()
        p.stop()
    assert got == wanted, f"first {got[:3]}, wanted from {offset}"


def test_a_group_that_had_read_into_the_lost_range_resumes_at_s(disaster: Disaster, tmp_path: Path) -> None:
    b = disaster.b
    admin = f"127.0.0.1:{free_port()}"
    p = ProxyProcess(b.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{disaster.tier}",
                                                   "TIERPROXY_METADATA": "topic:", "TIERPROXY_ADMIN_LISTEN": admin})
    try:
        def restored() -> dict[str, Any] | None:  # once the proxy has loaded the tier's metadata
            topics = httpx.get(f"http://{admin}/v1/topics", timeout=5).json()
            return next((t for t in topics if t["topic"] == TOPIC and t["restored_from_cluster"]), None)

        orders = wait_until(restored, "the admin API naming the restored topic's origin")
        assert orders["restored_from_cluster"] == disaster.a_cluster_id and orders["history_topic_id"]
        assert orders["history_topic_id"] != orders["topic_id"], "B's id is an alias of the history's"
        prod = Producer({"bootstrap.servers": p.bootstrap})
        for i in range(10):
            prod.produce(TOPIC, f"for-past-{i}".encode(), partition=1)
        assert prod.flush(30) == 0
        c = Consumer({"bootstrap.servers": p.bootstrap, "group.id": "past", "auto.offset.reset": "error",
                      "enable.auto.commit": False})
        c.assign([TopicPartition(TOPIC, 1)])  # from the committed offset, inside [N, S)
        try:
            first = None
            for _ in range(300):
                m = c.poll(0.2)
                if m is None:
                    continue
                assert m.error() is None, f"the group met {m.error()}"
                first = m.offset()
                break
        finally:
            c.close()
        assert first == disaster.lost_end, "resumed at S: nothing of the lost range is ever read as other records"
    finally:
        p.stop()


def test_the_tier_now_belongs_to_the_new_cluster_and_the_old_one_is_refused(disaster: Disaster) -> None:
    async def check() -> None:
        rsm = RemoteStorageManager.from_uri(f"file://{disaster.tier}")
        try:
            owner = await recorded_owner(rsm)
            assert owner is not None and owner.cluster_id == disaster.b.cluster_id
            assert owner.lineage_ids == [disaster.a_cluster_id]
            with pytest.raises(WrongCluster, match="restored from cluster"):
                await check_cluster(rsm, disaster.a_cluster_id, record=True, brokers="a:9092")
        finally:
            await rsm.close()

    asyncio.run(check())


def test_a_second_restore_onto_another_cluster_is_refused_and_changes_nothing(disaster: Disaster,
                                                                             kafka: KafkaCluster) -> None:
    out = run_cli("restore", "--bootstrap-server", kafka.bootstrap, "--storage", f"file://{disaster.tier}",
                  "--metadata", "topic:")
    assert out.returncode == 2 and "refusing a second restore" in out.stderr, out.stderr
    assert TOPIC not in AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10).topics


def test_a_single_broker_cluster_is_refused(disaster: Disaster, kafka: KafkaCluster, tmp_path: Path) -> None:
    tier = tmp_path / "tier"
    shutil.copytree(disaster.before_restore, tier)
    out = run_cli("restore", "--bootstrap-server", kafka.bootstrap, "--storage", f"file://{tier}",
                  "--metadata", "topic:", "--dry-run")
    assert out.returncode == 2 and "has one broker" in out.stderr and "offline method" in out.stderr, out.stderr


def test_a_tier_without_a_snapshot_is_refused(disaster: Disaster, tmp_path: Path) -> None:
    tier = tmp_path / "tier"
    shutil.copytree(disaster.before_restore, tier)
    shutil.rmtree(tier / "snapshots")
    out = run_cli("restore", "--bootstrap-server", disaster.b.bootstrap, "--storage", f"file://{tier}",
                  "--metadata", "topic:", "--topics", EXTRA)
    assert out.returncode == 2 and "holds no snapshot" in out.stderr, out.stderr


def test_a_topic_that_holds_records_in_the_new_cluster_is_refused(disaster: Disaster, tmp_path: Path) -> None:
    b = disaster.b
    create_topic(b.bootstrap, EXTRA, 1, 3)
    prod = Producer({"bootstrap.servers": b.bootstrap})
    prod.produce(EXTRA, b"someone else's")
    prod.flush(30)
    tier = tmp_path / "tier"
    shutil.copytree(disaster.before_restore, tier)
    out = run_cli("restore", "--bootstrap-server", b.bootstrap, "--storage", f"file://{tier}", "--metadata",
                  "topic:", "--topics", EXTRA)
    assert out.returncode == 2 and f"topic {EXTRA} partition 0 in the new cluster" in out.stderr, out.stderr
    assert watermarks(b.bootstrap, EXTRA) == (0, 1), "nothing changed"
    assert not (tier / "restore").exists()


def test_a_rerun_finds_everything_done(disaster: Disaster) -> None:
    out = run_cli("restore", "--bootstrap-server", disaster.b.bootstrap, "--storage", f"file://{disaster.tier}",
                  "--metadata", "topic:", "--topics", TOPIC)
    assert out.returncode == 0, out.stderr
    assert "finished at" in out.stdout and "nothing to do" in out.stdout, out.stdout
    state = json.loads((disaster.tier / "restore" / f"{disaster.b.cluster_id}.json").read_text())
    assert state["source"] == disaster.a_cluster_id and "done_ms" in state


async def _snapshot_of(tier: Path) -> snapshots.TierSnapshot | None:
    rsm = RemoteStorageManager.from_uri(f"file://{tier}")
    try:
        return await snapshots.newest(rsm.store, rsm.prefix)
    finally:
        await rsm.close()


def test_the_snapshot_of_a_pass_describes_the_tier(disaster: Disaster) -> None:
    snap = asyncio.run(_snapshot_of(disaster.before_restore))
    assert snap is not None and snap.cluster_id == disaster.a_cluster_id
    assert snap.metadata_topic == "__remote_log_metadata" or snap.metadata_topic
    assert snap.topics[TOPIC].partitions == PARTITIONS and snap.topics[TOPIC].replication_factor == 3
    assert snap.topics[TOPIC].configs.get("cleanup.policy") == "delete"
    assert {g: {o.partition: (o.offset, o.leader_epoch) for o in offs} for g, offs in snap.groups.items()
            if g in disaster.groups} == disaster.groups
    assert snap.records, "the live metadata records"
    assert snap.unread == [] and snap.groups_unreadable is None, "a pass with every broker up reads everything"


def test_tier_on_the_new_cluster_continues_the_same_history_and_deletes_none_of_the_old_ids(
        disaster: Disaster, tmp_path: Path) -> None:
    b = disaster.b
    prod = small_segment_producer(b.bootstrap)
    for i in range(400):
        prod.produce(TOPIC, f"on-b-{i}-{'y' * 80}".encode(), partition=0)
    assert prod.flush(30) == 0
    end = watermarks(b.bootstrap, TOPIC, 0)[1]
    s = tier_settings(b.bootstrap, disaster.tier, tmp_path / "state-b", tier_topic_delete_delay_ms=0)
    summary = tier_once(s)
    assert summary.segments > 0 and summary.partitions_deleted == 0, summary
    assert {(g["topic"], g["partition"], g["first_missing"], g["last_missing"]) for g in summary.gaps} == {
        (TOPIC, 1, disaster.tier_end[1], disaster.lost_end - 1)}, "the lost range is a gap, reported"

    snap = asyncio.run(_snapshot_of(disaster.before_restore))
    assert snap is not None
    a_ids = {name: uuid_bytes(f.topic_id) for name, f in snap.topics.items()}

    async def tier_view() -> tuple[Any, Any]:
        from tierproxy.tier.open import open_metadata

        rlmm = open_metadata("topic:", b.bootstrap)
        await rlmm.start()
        try:
            return rlmm.cache.get(a_ids[TOPIC], 0), rlmm.cache.get(a_ids[EXTRA], 0)
        finally:
            await rlmm.close()

    orders, extra = asyncio.run(tier_view())
    assert orders is not None and orders.latest_tiered_offset() == end - 1, "B's records joined the history"
    assert {md.tp.topic_id for md in orders.finished()} == {a_ids[TOPIC]}, "one history, under A's id"
    # (another test may have created a topic of that name in B: a new topic, tiered under its own id)
    assert extra is not None and extra.latest_tiered_offset() == 199, "a topic left out of the restore is kept"
    assert summary.snapshot and disaster.b.cluster_id in json.loads(
        (disaster.tier / summary.snapshot).read_text())["cluster_id"]


def test_killed_during_the_fill_a_rerun_finishes_at_exactly_s(disaster: Disaster, tmp_path: Path) -> None:
    """Slow (~30 s): a second restore run for another topic, its fill made slow (one record per Produce) so that
    kill -9 lands in it; then a rerun."""
    import os
    import signal
    import sys

    b = disaster.b
    orders_before = {p: watermarks(b.bootstrap, TOPIC, p) for p in range(PARTITIONS)}
    cmd = [sys.executable, "-m", "tierproxy.cli", "restore", "--bootstrap-server", b.bootstrap, "--storage",
           f"file://{disaster.tier}", "--metadata", "topic:", "--topics", OTHER]
    env = {**os.environ, "TIERPROXY_RESTORE_FILL_BATCH_RECORDS": "1"}
    with open(tmp_path / "restore.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: proc.poll() is None and watermarks(b.bootstrap, OTHER)[1] > 10, "the fill under way",
                   timeout=120, interval=0.2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    killed_at = watermarks(b.bootstrap, OTHER)
    assert 0 < killed_at[1] < AUDIT_RECORDS, f"killed mid-fill: {killed_at}"
    out = run_cli("restore", "--bootstrap-server", b.bootstrap, "--storage", f"file://{disaster.tier}",
                  "--metadata", "topic:", "--topics", OTHER)
    assert out.returncode == 0, out.stdout + out.stderr
    assert watermarks(b.bootstrap, OTHER) == (AUDIT_RECORDS, AUDIT_RECORDS), "the log ends at exactly S"
    assert {p: watermarks(b.bootstrap, TOPIC, p) for p in range(PARTITIONS)} == orders_before, "orders untouched"
    state = json.loads((disaster.tier / "restore" / f"{b.cluster_id}.json").read_text())
    # (CHANGELOG: restored by tests/restore/test_compacted_restore.py when it ran first)
    assert set(state["topics"]) - {CHANGELOG} == {TOPIC, OTHER} and "done_ms" in state


def test_epochs_and_timestamps_answer_consistently_on_both_sides(disaster: Disaster, tmp_path: Path) -> None:
    b = disaster.b
    starts = {0: disaster.tier_end[0], 1: disaster.lost_end}
    with WireClient(b.bootstrap) as w:
        md = w.request(ApiKey.METADATA, 12, {"topics": [{"name": TOPIC, "topic_id": bytes(16)}],
                                             "allow_auto_topic_creation": False,
                                             "include_topic_authorized_operations": False})
    brokers = {n["node_id"]: f"{n['host']}:{n['port']}" for n in md["brokers"]}
    for x in md["topics"][0]["partitions"]:
        q = x["partition_index"]
        with WireClient(brokers[x["leader_id"]]) as w:
            resp = w.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, {"replica_id": -1, "topics": [{
                "topic": TOPIC, "partitions": [{"partition": q, "current_leader_epoch": -1,
                                                "leader_epoch": disaster.a_epochs[q]}]}]})
        r = resp["topics"][0]["partitions"][0]
        # A's last epoch ends where B's first begins, as far as B knows: S (no truncation below it)
        assert (r["error_code"], r["end_offset"]) == (0, starts[q]), r
    p = ProxyProcess(b.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{disaster.tier}",
                                                   "TIERPROXY_METADATA": "topic:"})
    try:
        first = wait_until(lambda: list_offsets_at_leaders(p.bootstrap, 0, topic=TOPIC, quiet=True),
                           "the proxy's tier loaded")
        assert {q: o for q, (o, _) in first.items()} == {0: 0, 1: 0}, "by timestamp: the history's first record"
        before = int(time.time() * 1000)
        txn = Producer({"bootstrap.servers": p.bootstrap, "transactional.id": f"after-{uuid.uuid4().hex[:6]}"})
        txn.init_transactions(30)
        txn.begin_transaction()
        for i in range(10_000):
            txn.produce(TOPIC, f"txn-after-{i}".encode(), partition=i % PARTITIONS)
        txn.commit_transaction(60)
        # (the watermarks' consumer reads the last stable offset: the commit markers land just after the commit)
        def committed_ends() -> dict[int, int] | None:
            e = {q: watermarks(b.bootstrap, TOPIC, q)[1] for q in range(PARTITIONS)}
            return e if all(e[q] >= starts[q] + 5000 for q in range(PARTITIONS)) else None

        ends = wait_until(committed_ends, "the transaction's 10,000 records committed from S on")
        by_time = list_offsets_at_leaders(p.bootstrap, before, topic=TOPIC)
        assert all(starts[q] <= by_time[q][0] < ends[q] for q in range(PARTITIONS)), by_time
        direct = list_offsets_at_leaders(b.bootstrap, 0, topic=TOPIC)
        assert all(direct[q][0] >= starts[q] for q in range(PARTITIONS)), "B alone never answers below S"
    finally:
        p.stop()


def test_spark_reads_the_restored_topic_as_one_history(disaster: Disaster, spark: Any) -> None:
    starts = {0: disaster.tier_end[0], 1: disaster.lost_end}
    options = {"kafka.bootstrap.servers": disaster.b.bootstrap, "storage": f"file://{disaster.tier}",
               "metadata": "topic:", "subscribe": TOPIC}
    with pytest.raises(Exception, match=rf"orders-1 offsets \[{disaster.tier_end[1]}, {starts[1]}\) are neither"):
        spark.read.format("tierproxy").options(**options).load().collect()  # the lost range is data loss
    df = spark.read.format("tierproxy").options(**options, failOnDataLoss="false").load()
    got = [(r.partition, r.offset) for r in df.select("partition", "offset").collect()]
    assert len(got) == len(set(got)), "every offset once"
    assert set(disaster.history) <= set(got), "A's history, whole"
    assert not [(q, o) for q, o in got if disaster.tier_end[q] <= o < starts[q]], "nothing in the lost range"


def test_the_iceberg_table_goes_on_with_every_record_once(disaster: Disaster, tmp_path: Path) -> None:
    b = disaster.b
    tier_once(tier_settings(b.bootstrap, disaster.tier, tmp_path / "state-b"))  # B's records into the tier
    iceberg_cli(tmp_path, *iceberg_args(b.bootstrap, disaster.tier))
    table = pyiceberg_table(f"sqlite:///{disaster.tier}/iceberg/catalog.db", f"file://{disaster.tier}/iceberg",
                            "kafka.history")
    got = [(r[3], r[4]) for r in pyiceberg_rows(table)]
    starts = {0: disaster.tier_end[0], 1: disaster.lost_end}
    assert len(got) == len(set(got)), "every record once across the restore"
    assert set(disaster.history) <= set(got), "A's rows stay"
    assert not [(q, o) for q, o in got if disaster.tier_end[q] <= o < starts[q]], "nothing in the lost range"
    assert any(o >= starts[0] for q, o in got if q == 0), "B's records join the same table"
    # one incarnation across the restore: B's rows carry the id the history is kept under (A's), as the ledger
    ids = set(table.scan(selected_fields=("topicId",)).to_arrow().column("topicId").to_pylist())
    assert ids == {json.loads(table.properties["tierproxy.ledger"])["topics"][TOPIC]}, ids


def test_what_b_tiered_and_then_deleted_by_its_retention_is_still_served(disaster: Disaster, tmp_path: Path) -> None:
    b = disaster.b
    set_topic_config(b.bootstrap, TOPIC, "internal.segment.bytes", str(16 * 1024))  # B's segments roll small
    prod = small_segment_producer(b.bootstrap)
    for i in range(1500):
        prod.produce(TOPIC, f"b-{i}-{'z' * 80}".encode(), partition=0)
    assert prod.flush(30) == 0
    summary = tier_once(tier_settings(b.bootstrap, disaster.tier, tmp_path / "state-b"))
    assert summary.segments > 0, summary
    tiered_to = watermarks(b.bootstrap, TOPIC, 0)[1]  # no transaction open on B: all of it below the LSO
    set_topic_config(b.bootstrap, TOPIC, "retention.ms", "1000")
    ticks = Producer({"bootstrap.servers": b.bootstrap})

    def forgotten() -> int | None:
        ticks.produce(TOPIC, b"tick", partition=0)  # each append lets retention roll and delete the expired
        ticks.flush(5)
        start = watermarks(b.bootstrap, TOPIC, 0)[0]
        return start if start > disaster.tier_end[0] + 1000 else None

    log_start = wait_until(forgotten, "B's retention deleting the restored topic's first segments", timeout=90,
                           interval=0.3)
    set_topic_config(b.bootstrap, TOPIC, "retention.ms", "-1")
    assert log_start <= tiered_to, "deleted only what B had tiered"
    p = ProxyProcess(b.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{disaster.tier}",
                                                   "TIERPROXY_METADATA": "topic:"})
    try:
        rows = read_rows(p.bootstrap, {0: tiered_to})
    finally:
        p.stop()
    assert {k: v for k, v in rows.items() if k[1] < disaster.tier_end[0]} == {
        k: v for k, v in disaster.history.items() if k[0] == 0}, "A's history"
    deleted_by_b = set(range(disaster.tier_end[0], log_start))
    served = {o for (_, o) in rows} & deleted_by_b
    assert len(deleted_by_b - served) <= 5, "B's records below its log start, served from the tier (transaction " \
        f"markers aside): {len(deleted_by_b - served)} missing"
    assert sum(1 for v in rows.values() if v[1] is not None and v[1].startswith(b"b-")) == 1500, \
        "each of B's 1,500 records once"

def test_two_replicas_behind_the_balancer_give_the_same_history(disaster: Disaster, tmp_path: Path) -> None:
    fleet = Fleet(disaster.b.bootstrap, tmp_path, f"file://{disaster.tier}", "topic:")
    try:
        fleet.wait_ready()
        assert read_rows(fleet.address, disaster.tier_end) == disaster.history
        assert read_rows(fleet.address, disaster.tier_end) == disaster.history, "again (the other replica, likely)"
    finally:
        fleet.close()

def test_the_leader_killed_mid_read_the_java_consumer_goes_on_without_a_reset(disaster: Disaster,
                                                                                tmp_path: Path) -> None:
    """Last in the module: it stops one of B's brokers (started again after)."""
    b = disaster.b
    p = ProxyProcess(b.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{disaster.tier}",
                                                   "TIERPROXY_METADATA": "topic:"})
    leader = partition_state(b.bootstrap, [TOPIC], None)[(TOPIC, 1)][0]
    wanted = sorted(o for (q, o) in disaster.history if q == 1)
    java = subprocess.Popen([*java_command(), "-Xmx256m", "-cp", f"{b.libs}/*",
                             "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", p.bootstrap,
                             "--topic", TOPIC, "--partition", "1", "--offset", "0",
                             "--max-messages", str(len(wanted)), "--timeout-ms", "90000",
                             "--consumer-property", "isolation.level=read_committed",
                             "--consumer-property", "auto.offset.reset=none",
                             "--consumer-property", "max.partition.fetch.bytes=4096",
                             "--consumer-property", "metadata.max.age.ms=1000",
                             "--property", "print.offset=true", "--property", "print.value=true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert java.stdout is not None
        got = []
        for line in java.stdout:  # the pipe holds ~600 lines: the reader waits on it until read further
            got += [int(o) for o in re.findall(r"Offset:(\d+)", line)]
            if len(got) == 100:
                b.stop_node(leader, kill=True)  # mid-read: the partition's leader is gone
        java.wait(120)
        err = java.stderr.read() if java.stderr else ""
        assert got == wanted, f"{len(got)} of {len(wanted)} offsets; stderr: {err[-2000:]}"
        assert "OffsetOutOfRange" not in err and "reset" not in err.lower(), err[-2000:]
    finally:
        if java.poll() is None:
            java.kill()
            java.wait(30)
        for pipe in (java.stdout, java.stderr):
            if pipe is not None:
                pipe.close()
        p.stop()
        if not b.node(leader).alive:
            b.start_node(leader)
