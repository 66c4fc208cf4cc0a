"""The disaster the restore tests share (`tests/restore/conftest.py`): cluster A tiered, then lost with its data
directories; a new 3-broker cluster B, secured for one principal (SASL PLAIN on its `SASL` listener, ACLs
enforced; the PLAINTEXT listener is the super user's, used by every other test); `tierproxy restore` of `orders`.

Slow (~2 min): two 3-node clusters (A, then B), a tier pass and an Iceberg pass on A, a restore.
"""

from __future__ import annotations

import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.support.cli import run_cli
from tests.support.compacted import Rec, consume, create_compacted, produce_updates, wait_cleaned
from tests.support.iceberg import iceberg_cli
from tests.support.kafka import create_topic, small_segment_producer, small_segments, watermarks
from tests.support.tiering import tier_once
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.restore.epochs import partition_state, raise_epochs

TOPIC, OTHER, EXTRA = "orders", "audit", "extra"  # restored first; restored by a later run; left out
LEDGER = "ledger"  # restored by the secured principal (tests/restore/test_restored_topic.py)
TXNS, TXN_RECORDS = "txns", 50  # P1's aborted transaction, decided above the pass's stable offset (test_transactions)
LEDGER_RECORDS, LEDGER_GROUP, LEDGER_COMMITTED = 2000, "ledgers", 1200
RESTORER, RESTORER_PASSWORD = "restorer", "restorer-secret-41b7"  # B's one SASL user
AUDIT_RECORDS = 3000
# a group with offsets on TOPIC and OTHER, restored in two stages (tests/restore/test_staged.py): (offset, epoch)
THIRD, THIRD_RECORDS = "payments", 400  # restored only by the staged test's third stage: no other module touches it
STAGED_GROUP, STAGED_OFFSETS = "staged", {TOPIC: (300, -1), OTHER: (1500, -1), THIRD: (250, -1)}
PARTITIONS = 2
CHANGELOG = "changelog"  # compacted by A's cleaner before the pass (tests/restore/test_compacted_restore.py)
Rows = dict[tuple[int, int], tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]


@dataclass
class Disaster:
    tier: Path  # the tier after the restore
    before_restore: Path  # a copy of the tier as A left it
    b: KafkaCluster
    a_cluster_id: str
    a_epochs: dict[int, int]  # partition → A's leader epoch at the loss
    history: Rows  # every committed record of TOPIC at the tier pass, read from A
    tier_end: dict[int, int]  # N per partition (the high watermark at the pass: all of it tiered)
    lost_end: int  # partition 1's high watermark at the pass: A's open transaction, lost (S of partition 1)
    groups: dict[str, dict[int, tuple[int, int]]]  # group → partition → (offset, leader epoch) committed on A
    restore_out: str
    ledger: Rows  # every record of LEDGER, read from A (restored by test_restored_topic.py)
    ledger_t0: int  # ledger record i has timestamp ledger_t0 + i
    changelog: list[Rec]  # CHANGELOG as A served it (read_committed) once its cleaner had compacted it, before the pass
    changelog_end: int  # CHANGELOG's high watermark at the pass


def tier_settings(bootstrap: str, tier: Path, work: Path, **kw: Any) -> TierSettings:
    return TierSettings(bootstrap_servers=bootstrap,
                        tier_topics=f"{TOPIC}|{OTHER}|{EXTRA}|{LEDGER}|{TXNS}|{THIRD}|{CHANGELOG}",
                        storage=f"file://{tier}",
                        metadata="topic:", tier_segment_bytes=16 * 1024, spark_master="local[2]",
                        tier_state_dir=work, **kw)


def iceberg_args(bootstrap: str, tier: Path) -> list[str]:
    return ["--bootstrap-server", bootstrap, "--storage", f"file://{tier}", "--metadata", "topic:", "--topics", TOPIC,
            "--master", "local[2]", "--once"]


def read_rows(bootstrap: str, ends: dict[int, int], isolation: str = "read_committed", topic: str = TOPIC) -> Rows:
    """Every record of `topic` below `ends` (partition → end), assigned from offset 0; an offset reset fails. A
    partition is done at a record at or past its end, at its end of partition, or with its position there (the
    last offsets may be transaction markers, never delivered)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "error", "isolation.level": isolation, "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    out: Rows = {}
    done: set[int] = {p for p, end in ends.items() if end == 0}
    deadline = time.monotonic() + 90
    try:
        while len(done) < len(ends) and time.monotonic() < deadline:
            msgs = c.consume(500, 0.3)
            for m in msgs:
                if m.error() is not None:
                    assert m.error().code() == KafkaError._PARTITION_EOF, f"a reader met {m.error()}"
                    done.add(m.partition())
                    continue
                p, o = m.partition(), m.offset()
                if o >= ends[p]:
                    done.add(p)
                    continue
                out[(p, o)] = (m.key(), m.value(), list(m.headers() or []))
            if not msgs:
                done |= {tp.partition for tp in c.position([TopicPartition(topic, p) for p in ends])
                         if tp.offset >= ends[tp.partition]}
    finally:
        c.close()
    assert len(done) == len(ends), f"read {len(out)} records, partitions done {done} of {sorted(ends)}"
    return out


def _produce_history(bootstrap: str) -> int:
    """→ t0: ledger record i has timestamp t0 + i (an hour ago: inside any retention)."""
    t0 = int(time.time() * 1000) - 3_600_000
    prod = small_segment_producer(bootstrap, **{"compression.type": "lz4"})
    for i in range(3000):
        prod.produce(TOPIC, f"value-{i}-{'x' * 80}".encode(), f"key-{i % 97}".encode(), partition=i % PARTITIONS,
                     headers=[("n", str(i).encode())])
    prod.flush(60)
    for i in range(AUDIT_RECORDS):
        prod.produce(OTHER, f"audit-{i}".encode(), partition=0)
    for i in range(200):
        prod.produce(EXTRA, f"extra-{i}".encode(), partition=0)
    plain = small_segment_producer(bootstrap)  # uncompressed: A's ledger spans many segments (the purge scenario)
    for i in range(LEDGER_RECORDS):
        plain.produce(LEDGER, f"ledger-{i}-{'l' * 60}".encode(), f"account-{i % 13}".encode(), partition=0,
                      timestamp=t0 + i)
    plain.flush(60)
    prod.flush(60)
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:6]}"})
    txn.init_transactions(30)
    for ok in (True, False, True):
        txn.begin_transaction()
        for p in range(PARTITIONS):
            txn.produce(TOPIC, b"txn-committed" if ok else b"txn-aborted", partition=p)
        txn.flush(30)  # written before the abort (an abort purges what is still queued)
        txn.commit_transaction(30) if ok else txn.abort_transaction(30)
    return t0


def commit(bootstrap: str, group: str, offsets: dict[int, tuple[int, int]], protocol: str = "classic",
           topic: str = TOPIC) -> None:
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"
    c = Consumer(conf)
    try:
        c.commit(offsets=[TopicPartition(topic, p, o, leader_epoch=e) for p, (o, e) in offsets.items()],
                 asynchronous=False)
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str = TOPIC, partitions: int = PARTITIONS
              ) -> dict[int, tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    finally:
        c.close()
    return {tp.partition: (tp.offset, tp.leader_epoch if tp.leader_epoch is not None else -1) for tp in got
            if tp.offset >= 0}


def _secured_b() -> dict[str, str]:
    """B's broker config: ACLs enforced, one SASL PLAIN user (RESTORER); PLAINTEXT's ANONYMOUS is the super user."""
    return {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": "User:ANONYMOUS",
        "auto.create.topics.enable": "false",  # docs/restore.md, step 1
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl.plain.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                                                     f'required user_{RESTORER}="{RESTORER_PASSWORD}";',
    }


def restorer_config(path: Path) -> Path:
    """A `--command-config` for RESTORER on B's SASL listener."""
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'username="{RESTORER}" password="{RESTORER_PASSWORD}";\n')
    return path


def _decided_above_the_stable_offset(bootstrap: str) -> Producer:
    """P1 writes TXN_RECORDS in a transaction, P2 opens one after them, P1 aborts: the stable offset stops at P2's
    first record (left open, returned), so a pass copies P1's records but not its marker."""
    p1, p2 = (Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{n}-{uuid.uuid4().hex[:6]}",
                        "transaction.timeout.ms": 900_000}) for n in ("p1", "p2"))
    for p in (p1, p2):
        p.init_transactions(30)
    p1.begin_transaction()
    for i in range(TXN_RECORDS):
        p1.produce(TXNS, f"p1-aborted-{i}".encode(), partition=0)
    p1.flush(30)
    p2.begin_transaction()
    p2.produce(TXNS, b"p2-open", partition=0)
    p2.flush(30)
    p1.abort_transaction(30)
    return p2


@contextmanager
def disaster_clusters(root: Path) -> Iterator[Disaster]:
    """A tiered and lost; B started and `orders` restored into it (a dry run first)."""
    tier = root / "tier"
    a = KafkaCluster(3, workdir=root / "a").start()
    try:
        create_topic(a.bootstrap, TOPIC, PARTITIONS, 3, small_segments())
        create_topic(a.bootstrap, OTHER, 1, 3, small_segments())
        create_topic(a.bootstrap, EXTRA, 1, 3, small_segments())
        create_topic(a.bootstrap, LEDGER, 1, 3, small_segments())
        create_topic(a.bootstrap, TXNS, 1, 3, small_segments())
        create_topic(a.bootstrap, THIRD, 1, 3, small_segments())
        create_compacted(a.bootstrap, CHANGELOG, replication=3)
        changelog_end = produce_updates(a.bootstrap, CHANGELOG)
        wait_cleaned(a.bootstrap, CHANGELOG, changelog_end)
        changelog = consume(a.bootstrap, CHANGELOG, changelog_end)
        third = small_segment_producer(a.bootstrap)
        for i in range(THIRD_RECORDS):
            third.produce(THIRD, f"payment-{i}".encode(), partition=0)
        assert third.flush(30) == 0
        # leaders moved several times: A's epochs reach 5
        raise_epochs(a.bootstrap, {(t, p): 4 for t, n in ((TOPIC, PARTITIONS), (OTHER, 1)) for p in range(n)}, None)
        ledger_t0 = _produce_history(a.bootstrap)
        state = partition_state(a.bootstrap, [TOPIC, LEDGER], None)
        epochs = {p: state[(TOPIC, p)][1] for p in range(PARTITIONS)}
        ends = {p: watermarks(a.bootstrap, TOPIC, p)[1] for p in range(PARTITIONS)}
        history = read_rows(a.bootstrap, ends)
        ledger = read_rows(a.bootstrap, {0: LEDGER_RECORDS}, topic=LEDGER)
        groups = {"classic": {0: (500, epochs[0]), 1: (700, epochs[1])},
                  "kip848": {0: (1000, epochs[0])}}
        commit(a.bootstrap, "classic", groups["classic"])
        commit(a.bootstrap, "kip848", groups["kip848"], protocol="consumer")
        commit(a.bootstrap, LEDGER_GROUP, {0: (LEDGER_COMMITTED, state[(LEDGER, 0)][1])}, topic=LEDGER)
        for topic, offset in STAGED_OFFSETS.items():
            commit(a.bootstrap, STAGED_GROUP, {0: offset}, topic=topic)
        # A dies in the middle of a transaction: its 150 records are past the last stable offset, never tiered,
        # and lost; a group reading uncommitted had committed 100 of them
        open_txn = Producer({"bootstrap.servers": a.bootstrap, "transactional.id": "dies-open",
                             "transaction.timeout.ms": 900_000})  # still open when A dies, however slow the pass
        open_txn.init_transactions(30)
        open_txn.begin_transaction()
        for i in range(150):
            open_txn.produce(TOPIC, f"lost-{i}".encode(), partition=1)
        open_txn.flush(30)
        open_p2 = _decided_above_the_stable_offset(a.bootstrap)
        groups["past"] = {1: (ends[1] + 100, epochs[1])}
        commit(a.bootstrap, "past", groups["past"])
        summary = tier_once(tier_settings(a.bootstrap, tier, root / "state-a"))
        assert summary.segments > 0 and summary.snapshot, summary
        iceberg_cli(root, *iceberg_args(a.bootstrap, tier))  # the table A's history had before the loss
        a_cluster_id = a.cluster_id
    finally:
        a.stop()
    open_txn.purge()
    del open_txn
    open_p2.purge()
    del open_p2
    shutil.rmtree(root / "a")  # the data directories are gone: the tier is all that is left
    before = root / "tier-before"
    shutil.copytree(tier, before)
    b = KafkaCluster(3, workdir=root / "b", broker_config=_secured_b(),
                     extra_listeners={"SASL": "SASL_PLAINTEXT"}).start()
    try:
        dry = run_cli("restore", "--bootstrap-server", b.bootstrap, "--storage", f"file://{tier}", "--metadata",
                      "topic:", "--topics", TOPIC, "--dry-run", check=True)
        assert "would restore 2 partitions" in dry.stdout and "LOST offsets" in dry.stdout, dry.stdout
        assert re.search(r"drill: \d+ served segments, \d+ objects found, 0 broken", dry.stdout), dry.stdout
        assert TOPIC not in AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=10).topics
        assert not (tier / "restore").exists(), "a dry run changes nothing"
        out = run_cli("restore", "--bootstrap-server", b.bootstrap, "--storage", f"file://{tier}",
                      "--metadata", "topic:", "--topics", TOPIC, check=True)
        yield Disaster(tier, before, b, a_cluster_id, epochs, history, ends, ends[1] + 150, groups, out.stdout,
                       ledger, ledger_t0, changelog, changelog_end)
    finally:
        b.stop()
