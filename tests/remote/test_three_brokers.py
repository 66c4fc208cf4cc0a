"""Three brokers, replication factor 3: the partition leader is killed, and the partition reassigned, while a tiering
pass copies it and while readers catch up from the tier through the proxy.

Readers (kcat and the Java consumer) write to pipes the test drains line by line, with small fetches, so the
leader change lands in the middle of their catch-up rather than after a prefetch of everything."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from protocol.constants import ApiKey
from tests.support.jvm import java_command
from tests.support.kafka import broker_forgets, create_topic, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.spark import worker_session
from tests.support.tiering import offsets_of, settings, tiered
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.tiering.copy import CopyResult, CopyTask
from tierproxy.jobs.tiering.job import TieringJob
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]


def _partition(bootstrap: str, topic: str) -> tuple[int, list[int]]:
    """(leader, replicas) of partition 0 as the cluster says now."""
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic].partitions[0]
    return int(md.leader), [int(r) for r in md.replicas]


def _wait_leader(bootstrap: str, topic: str, not_: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            leader, _ = _partition(bootstrap, topic)
            if leader >= 0 and leader != not_:
                return leader
        except Exception:  # a bootstrap node may be the dead one
            pass
        time.sleep(0.3)
    raise AssertionError(f"{topic}-0 still led by {not_} after {timeout}s")


def _live_bootstrap(cluster: KafkaCluster) -> str:
    return ",".join(n.bootstrap for n in cluster.nodes if n.alive)


def _produce(bootstrap: str, topic: str, first: int, n: int, size: int = 200, roll_every: int = 0) -> None:
    # idempotent: a retried batch (a leader not yet elected for a new topic) never lands after later ones, so key i
    # is at offset i (a CI run once found keys 0..4654 written after 4655..5999 by a non-idempotent producer)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "compression.type": "lz4",
                  "enable.idempotence": True})
    # several broker segments without waiting: a record stamped segment.ms past its segment's first one rolls it
    # (Kafka rolls on the records' timestamps), so each run of `roll_every` records is a second later, all in the past
    ts0 = int(time.time() * 1000) - 600_000
    for i in range(first, first + n):
        stamp = {"timestamp": ts0 + (i // roll_every) * 1000} if roll_every else {}
        p.produce(topic, f"v{i}-".encode().ljust(size, b"x"), f"k{i}".encode(), **stamp)
    assert p.flush(60) == 0


def _epoch_end(bootstrap: str, topic: str, epoch: int) -> tuple[int, int, int]:
    """OffsetForLeaderEpoch (v4, as a consumer asks it) for partition 0: (error, leader epoch, end offset)."""
    body = {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
        {"partition": 0, "current_leader_epoch": -1, "leader_epoch": epoch}]}]}
    with WireClient(bootstrap) as w:
        resp = w.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, body)
    p = resp["topics"][0]["partitions"][0]
    return p["error_code"], p["leader_epoch"], p["end_offset"]


class _KillLeaderOnFirstCopy(TieringJob):
    """A real tiering job whose first copy round starts right after the partition's leader was killed -9."""

    def __init__(self, cluster: KafkaCluster, topic: str, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.cluster, self.topic, self.killed = cluster, topic, -1

    def _run_tasks(self, tasks: list[CopyTask]) -> list[CopyResult]:
        if self.killed < 0:
            self.killed, _ = _partition(self.cluster.bootstrap, self.topic)
            self.cluster.stop_node(self.killed, kill=True)
        return super()._run_tasks(tasks)


def test_a_tiering_pass_moves_to_the_new_leader_and_records_its_epoch(kafka_cluster: KafkaCluster, tmp_path: Path,
                                                                       topic_name: str, kcat: str) -> None:
    cluster, topic = kafka_cluster, topic_name
    create_topic(cluster.bootstrap, topic, replication=3, config={"min.insync.replicas": "2", "segment.ms": "300"})
    _produce(cluster.bootstrap, topic, 0, 3000, roll_every=1000)
    s = settings(cluster.bootstrap, tmp_path, topic, tier_segment_bytes=32 * 1024,
                 remote_log_manager_task_retry_backoff_ms=200)
    job = _KillLeaderOnFirstCopy(cluster, topic, s, progress=False, spark=worker_session())
    try:
        first = job.run_once()
        old = job.killed
        live = _live_bootstrap(cluster)
        new = _wait_leader(live, topic, old)
        # every copy of the first round went to the dead leader; the retries went to the new one
        assert first.failed > 0 and first.segments > 0, first
        segs, raw, _ = tiered(s, topic)
        assert offsets_of(raw) == list(range(3000))
        epoch0 = {e for md in segs for e in md.segment_leader_epochs}
        assert len(epoch0) == 1
        assert all(md.broker_leader_epoch > max(epoch0) for md in segs)  # written under the new leader's epoch

        _produce(live, topic, 3000, 2000, roll_every=1000)  # written under the new leader's epoch
        cluster.start_node(old)
        second = job.run_once()
        assert second.failed == 0 and second.segments > 0, second
    finally:
        job.close()
    segs, raw, _ = tiered(s, topic)
    assert offsets_of(raw) == list(range(5000))
    epochs = {}
    for md in segs:
        for e, start in md.segment_leader_epochs.items():
            epochs[e] = min(start, epochs.get(e, start))
    (e0,) = epoch0
    assert sorted(epochs.items())[0] == (e0, 0) and len(epochs) == 2, epochs
    e1 = max(epochs)
    assert epochs[e1] == 3000

    # what the broker answers for the two epochs while it still has them, then after it deleted epoch e0 and more
    lead = cluster.node(_partition(cluster.bootstrap, topic)[0]).bootstrap
    before = {e: _epoch_end(lead, topic, e) for e in (e0, e1)}
    assert before[e0] == (0, e0, 3000) and before[e1] == (0, e1, 5000)
    log_start = broker_forgets(cluster.bootstrap, topic, above=3500)
    assert log_start > 3000
    (tmp_path / "proxy").mkdir()
    proxy = ProxyProcess(cluster.bootstrap, tmp_path / "proxy", extra={"TIERPROXY_STORAGE": s.storage,
                                                                       "TIERPROXY_METADATA": str(s.metadata)})
    try:
        leader = _partition(cluster.bootstrap, topic)[0]
        assert _epoch_end(cluster.node(leader).bootstrap, topic, e0)[2] != 3000  # the broker alone no longer knows
        via_proxy = f"127.0.0.1:{proxy.base + leader}"
        # the proxy's port opens before its tier's metadata is loaded; until then the broker's answer is relayed
        wait_until(lambda: proxy_serves_tier(via_proxy, topic), "the tier via the proxy", timeout=60)
        assert _epoch_end(via_proxy, topic, e0) == before[e0]  # answered from the tier's lineage
        assert _epoch_end(via_proxy, topic, e1) == _epoch_end(cluster.node(leader).bootstrap, topic, e1)  # the broker's
        out = subprocess.run([kcat, "-b", proxy.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "0", "-c", "5000",
                              "-q", "-f", "%o %k\n"], capture_output=True, text=True, timeout=120)
        assert out.stdout.split("\n")[:5000] == [f"{i} k{i}" for i in range(5000)]
    finally:
        proxy.stop()
    assert new != old


def _reassign(cluster: KafkaCluster, topic: str, replicas: list[int], tmp: Path) -> None:
    plan = tmp / "reassign.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": replicas}]}))
    out = subprocess.run([*java_command(), "-Xmx256m", "-cp", f"{cluster.libs}/*",
                          "org.apache.kafka.tools.reassign.ReassignPartitionsCommand", "--bootstrap-server",
                          _live_bootstrap(cluster), "--reassignment-json-file", str(plan), "--execute"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


class _PacedReader:
    """A consumer process writing one line per record into a pipe the test drains at its own pace."""

    def __init__(self, cmd: list[str], pattern: str) -> None:
        import re

        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.regex = re.compile(pattern)
        self.got: list[tuple[int, str]] = []

    def read(self, until: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while len(self.got) < until and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if m := self.regex.search(line):
                self.got.append((int(m.group(1)), m.group(2)))

    def close(self) -> str:
        self.proc.kill()
        _, err = self.proc.communicate(timeout=30)
        return err[-3000:]


def test_catch_up_through_the_proxy_survives_a_leader_kill_and_a_reassignment(
        kafka_cluster: KafkaCluster, tmp_path: Path, topic_name: str, kcat: str) -> None:
    cluster, topic, total = kafka_cluster, topic_name, 30_000
    create_topic(cluster.bootstrap, topic, replication=3, config={"min.insync.replicas": "2", "segment.ms": "300"})
    _produce(cluster.bootstrap, topic, 0, total, roll_every=6000)
    s = settings(cluster.bootstrap, tmp_path, topic, tier_segment_bytes=256 * 1024)
    job = TieringJob(s, progress=False, spark=worker_session())
    try:
        assert job.run_once().segments > 0
    finally:
        job.close()
    log_start = broker_forgets(cluster.bootstrap, topic, above=total - 3000)
    assert watermarks(cluster.bootstrap, topic)[0] == log_start
    expected = [(i, f"k{i}") for i in range(total)]
    (tmp_path / "proxy").mkdir()
    proxy = ProxyProcess(cluster.bootstrap, tmp_path / "proxy", extra={"TIERPROXY_STORAGE": s.storage,
                                                                       "TIERPROXY_METADATA": str(s.metadata)})
    small = ["-X", "message.max.bytes=16384", "-X", "fetch.max.bytes=16384", "-X", "fetch.message.max.bytes=8192",
             "-X", "queued.min.messages=50", "-X", "queued.max.messages.kbytes=64",
             "-X", "topic.metadata.refresh.interval.ms=1000"]
    readers = {
        "kcat": _PacedReader([kcat, "-b", proxy.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "0", "-c", str(total),
                              "-q", "-f", "%o %k\n", *small], r"^(\d+) (k\d+)$"),
        "java": _PacedReader([*java_command(), "-Xmx256m", "-cp", f"{cluster.libs}/*",
                              "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", proxy.bootstrap,
                              "--topic", topic, "--partition", "0", "--offset", "0", "--max-messages", str(total),
                              "--timeout-ms", "120000", "--consumer-property", "max.partition.fetch.bytes=8192",
                              "--consumer-property", "fetch.max.bytes=16384", "--consumer-property",
                              "metadata.max.age.ms=1000", "--property", "print.offset=true", "--property",
                              "print.key=true", "--property", "print.value=false"],
                             r"Offset:(\d+)\s+(k\d+)"),
    }
    errors: dict[str, str] = {}
    try:
        for r in readers.values():
            r.read(until=total // 4)
        assert all(len(r.got) == total // 4 for r in readers.values()), {n: len(r.got) for n, r in readers.items()}
        leader, replicas = _partition(cluster.bootstrap, topic)
        cluster.stop_node(leader, kill=True)  # 1: the leader dies during both catch-ups
        second = _wait_leader(_live_bootstrap(cluster), topic, leader)
        for r in readers.values():
            r.read(until=total // 2)
        cluster.start_node(leader)
        # 2: a reassignment that leaves out the current leader: the controller moves the leadership with it
        _reassign(cluster, topic, [n for n in replicas if n != second], tmp_path)
        third = _wait_leader(cluster.bootstrap, topic, second)
        for r in readers.values():
            r.read(until=total)
        assert _partition(cluster.bootstrap, topic)[1] == [n for n in replicas if n != second]
        assert len({leader, second, third}) >= 2 and third != second
    finally:
        for name, r in readers.items():
            errors[name] = r.close()
        proxy.stop()
    for name, r in readers.items():  # no record lost, duplicated or reordered, tier part and local part
        assert r.got == expected, (name, len(r.got), errors[name])
