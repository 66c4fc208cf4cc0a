"""Issue 63, finding 4: the fill never writes past S, by construction.

A Produce with acks=all that times out may already be appended at the leader: here a follower of B is killed -9
(it stays in the ISR until the controller fences it, ~9 s), so every Produce times out after its append (at the
broker, or at the fill's socket) and the high watermark stands still. The fill sends the same batch again (its
idempotent producer's sequence): the leader holds it already and never appends it twice; once the ISR has shrunk
the fill goes on, and the partition ends at exactly S. Before, the fill asked the high watermark before each
retry and wrote the next batch on top.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from tests.support.kafka import create_topic, watermarks
from tests.support.restore import Disaster
from tests.support.waiting import wait_until
from tierproxy.jobs.restore.fill import ForeignRecords, fill_partition, log_end, offsets
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.cluster]
S, BATCH = 30, 10  # three batches: a batch written twice would end past S


@pytest.mark.parametrize(("timeout_ms", "socket_timeout"), [(500, None), (30_000, 0.5)],
                         ids=["request-timed-out", "socket-timeout"])
def test_a_produce_timed_out_after_its_append_is_never_written_twice(disaster: Disaster, timeout_ms: int,
                                                                     socket_timeout: float | None) -> None:
    """Slow (~25 s each): one of B's brokers killed and started again. The Produce times out after its append at
    the broker (REQUEST_TIMED_OUT) or at the fill's socket (no answer at all)."""
    b = disaster.b
    topic = f"fill-{uuid.uuid4().hex[:6]}"
    create_topic(b.bootstrap, topic, 1, 3)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})

    def placement() -> tuple[int, list[int]] | None:
        p = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(0)
        return (p.leader, list(p.replicas)) if p is not None and p.leader >= 0 and len(p.isrs) == 3 else None

    wait_until(lambda: placement() is not None, "the partition's three replicas in sync")
    got = placement()
    assert got is not None
    leader, replicas = got
    follower = next(r for r in replicas if r != leader)
    b.stop_node(follower, kill=True)  # still in the ISR: acks=all waits for it until the controller fences it
    try:
        result = fill_partition(b.node(leader).bootstrap, topic, 0, S, BATCH, None, timeout_ms=timeout_ms,
                                socket_timeout=socket_timeout)
        assert watermarks(b.bootstrap, topic) == (S, S), "log start = high watermark = S"
        with WireClient(b.node(leader).bootstrap) as w:
            assert log_end(w, topic, 0, offsets(w, topic, 0)[2]) == S, "nothing appended past S at the leader"
        assert result.resent > 0, "a Produce timed out after its append and was sent again"
    finally:
        b.start_node(follower)


def test_a_record_something_else_wrote_is_never_purged_by_the_fill(disaster: Disaster) -> None:
    """A client wrote to the partition before (or while) the fill ran: the fill stops, not retried, and purges
    nothing (before: it filled on from the log's end and purged below it, the client's acknowledged record too)."""
    b = disaster.b
    topic = f"fill-foreign-{uuid.uuid4().hex[:6]}"
    create_topic(b.bootstrap, topic, 1, 3)
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    p.produce(topic, b"someone's record", partition=0)
    assert p.flush(30) == 0
    leader = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(topic, timeout=10).topics[topic] \
        .partitions[0].leader
    with pytest.raises(ForeignRecords, match="holds records the fill did not write"):
        fill_partition(b.node(leader).bootstrap, topic, 0, S, BATCH, None)
    assert watermarks(b.bootstrap, topic) == (0, 1), "the client's record is still there, nothing filled"
