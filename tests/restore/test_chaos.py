"""Issue 63's chaos restore: the restore killed -9 at each of its steps in turn, and B's leaders killed and started
again during the epoch raise and during the fill, then run again until done: the partitions end at log start = high
watermark = S exactly, no filler record is ever delivered, and every group's offsets are committed once (a group
that moved on in B after its commit is never rewound by a later run).

The lost cluster is the session's broker (`kafka`): a topic of its own tiered by one pass into a tier of this module;
the target is the disaster's B (`tests/restore/conftest.py`) with a metadata topic of this module's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.support.kafka import create_topic, small_segment_producer, small_segments, watermarks
from tests.support.restore import Disaster, commit, committed
from tests.support.tiering import settings, tier_once
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.restore.epochs import partition_state

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.process]
PARTITIONS, RECORDS = 3, 300  # per partition: S = 300, filled 10 offsets a request (30 requests: slow enough to hit)
GROUPS = {"chaos-a": {0: 100, 1: 200, 2: 299}, "chaos-b": {1: 50}}


class Run:
    """One `tierproxy restore` in a process of its own, its output in a file the test watches."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        env = {**os.environ, "TIERPROXY_RESTORE_FILL_BATCH_RECORDS": "10"}
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "tierproxy.cli", *args], stdout=out,
                                         stderr=subprocess.STDOUT, env=env)

    def reached(self, step: str) -> bool:
        return f"restore: step {step}" in self.log.read_text(errors="replace")

    def wait_for(self, step: str) -> bool:
        """True once the run has begun `step`; False if it ended first."""
        try:
            wait_until(lambda: self.reached(step) or self.proc.poll() is not None, f"the restore's step {step}",
                       timeout=300, interval=0.02)
        except AssertionError as exc:  # what the run was doing says why
            raise AssertionError(f"{exc}; the run's output:\n{self.log.read_text(errors='replace')[-6000:]}") from None
        return self.reached(step)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def finish(self) -> int:
        return self.proc.wait(300)


def _leader_node(b: KafkaCluster, topic: str) -> int:
    state = partition_state(b.bootstrap, [topic], None)
    return state[(topic, 0)][0]


def _bounce(b: KafkaCluster, node: int, topic: str) -> None:
    """Kill -9 one of B's brokers and start it again, back in every ISR of `topic`."""
    b.stop_node(node, kill=True)
    b.start_node(node)
    wait_until(lambda: all(len(isr) == len(replicas) for _, _, replicas, isr in
                           partition_state(b.bootstrap, [topic], None).values()), "the restarted broker in sync",
               timeout=120)


def test_a_restore_killed_at_every_step_with_bs_leaders_bounced_ends_at_exactly_s(
        disaster: Disaster, kafka: KafkaCluster, tmp_path: Path) -> None:
    """Slow (~2 min): seven killed runs, two broker restarts of B, and the runs that finish it."""
    topic = f"chaos-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, PARTITIONS, 1, small_segments())
    prod = small_segment_producer(kafka.bootstrap)
    for i in range(RECORDS * PARTITIONS):
        prod.produce(topic, f"chaos-{i}-{'c' * 60}".encode(), partition=i % PARTITIONS)
    assert prod.flush(30) == 0
    for group, offsets in GROUPS.items():
        commit(kafka.bootstrap, group, {p: (o, -1) for p, o in offsets.items()}, topic=topic)
    s = settings(kafka.bootstrap, tmp_path, topic)
    assert tier_once(s).snapshot
    b = disaster.b
    args = ["restore", "--bootstrap-server", b.bootstrap, "--storage", s.storage, "--metadata",
            f"topic:__tp_meta_{topic.replace('-', '_')}", "--topics", topic]
    runs = 0

    def start() -> Run:
        nonlocal runs
        runs += 1
        return Run(args, tmp_path / f"restore-{runs}.log")

    for step in ("hand-over", "create"):
        run = start()
        assert run.wait_for(step), run.log.read_text()
        run.kill()
    run = start()  # B's partition leader killed while the epochs rise; the restore killed as its fill begins
    assert run.wait_for("epochs"), run.log.read_text()
    _bounce(b, _leader_node(b, topic), topic)
    run.wait_for("fill")
    run.kill()
    run = start()  # the leader killed mid-fill; the restore killed as it verifies
    if run.wait_for("fill"):
        wait_until(lambda: run.proc.poll() is not None or watermarks(b.bootstrap, topic, 0)[1] > 10,
                   "the fill under way", timeout=120, interval=0.05)
        _bounce(b, _leader_node(b, topic), topic)
        run.wait_for("verify")
    run.kill()
    for step in ("metadata", "groups"):
        run = start()
        assert run.wait_for(step), run.log.read_text()
        run.kill()
    state = json.loads((Path(s.storage.removeprefix("file://")) / "restore" / f"{b.cluster_id}.json").read_text())
    moved_on = [k.rsplit("/", 2) for k in state.get("groups_done", [])]
    for group, t, p in moved_on:  # a member in B read on after the killed run committed the group
        commit(b.bootstrap, group, {int(p): (GROUPS[group][int(p)] + 1, -1)}, topic=t)

    for _ in range(4):  # to its end: a run may still stop on a broker just back (exit 1: run it again)
        run = start()
        if run.finish() == 0:
            break
    assert run.proc.returncode == 0, run.log.read_text()

    for p in range(PARTITIONS):
        assert watermarks(b.bootstrap, topic, p) == (RECORDS, RECORDS), f"partition {p}: log start = end = S"
    assert all(epoch > 0 for _, epoch, _, _ in partition_state(b.bootstrap, [topic], None).values())
    bumped = {(g, int(p)) for g, _, p in moved_on}
    for group, offsets in GROUPS.items():
        want = {p: (o + 1 if (group, p) in bumped else o) for p, o in offsets.items()}
        assert {p: o for p, (o, _) in committed(b.bootstrap, group, topic, PARTITIONS).items()} == want, group

    fresh = small_segment_producer(b.bootstrap)
    for p in range(PARTITIONS):
        for i in range(20):
            fresh.produce(topic, f"after-{p}-{i}".encode(), partition=p)
    assert fresh.flush(30) == 0
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"read-{topic}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_uncommitted"})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])  # from below S: B holds nothing there
    seen: list[tuple[int, int, bytes | None]] = []
    try:
        wait_until(lambda: seen.extend((m.partition(), m.offset(), m.value()) for m in c.consume(100, 0.5)
                                       if m.error() is None) or len(seen) >= 20 * PARTITIONS,
                   "the records produced after the restore", timeout=60)
    finally:
        c.close()
    assert len(seen) == 20 * PARTITIONS and all(o >= RECORDS and v and v.startswith(b"after-") for _, o, v in seen), \
        "no filler record is ever delivered: every record read at or after S is one produced after the restore"
