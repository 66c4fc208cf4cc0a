"""A recorded aborted transaction reaches only as far as its own records (review of issue 63 finding 1), in the
DataFrame reader's planner (also the Iceberg step's) and in the proxy's reads, over a real file tier.

Two tiers, each one partition. `one_cluster`: P1 (producer 7) aborts T1 at [0, 2), its marker tiered later (at 2,
in the next segment), then commits T2 at [4, 6) in a third. `restored`: A's last segment ends inside T1 (recorded
aborted: its marker was lost with [N, S)), and B, after the restore, writes a committed transaction from producer
id 7 again at S (B hands out producer ids from 0 again).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path

import pytest

from protocol.records import ABORT, COMMIT, Record, build_batch, build_control_batch
from tests.support.segments import seg, tp
from tierproxy.config import ProxySettings
from tierproxy.dev.ports import free_port
from tierproxy.jobs.spark.options import parse_options
from tierproxy.jobs.spark.plan import PartitionPlan, Planner
from tierproxy.jobs.spark.rows import visible_batches
from tierproxy.jobs.spark.source import read_tier_slice
from tierproxy.jobs.tiering.cluster import ClusterView, PartitionInfo
from tierproxy.remote.service import RemoteTier
from tierproxy.tier.cache import MetadataCache, PartitionCache
from tierproxy.tier.indexes import build_segment
from tierproxy.tier.model import SegmentState, TransactionOutcome, TxnOutcome
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.transactions import COPIED, LOST_RULE

P1 = 7
TOPIC = "txns"


def txn(base: int, *values: bytes) -> bytes:
    return build_batch([Record(base + i, 0, None, v) for i, v in enumerate(values)], base_offset=base,
                       producer_id=P1, producer_epoch=0, base_sequence=base, transactional=True)


def marker(kind: int, offset: int) -> bytes:
    return build_control_batch(kind, offset=offset, producer_id=P1, producer_epoch=0, timestamp=0)


def plain(offset: int, value: bytes) -> bytes:
    return build_batch([Record(offset, 0, None, value)], base_offset=offset)


async def tiered(root: Path, histories: list[list[bytes]], learnt: str) -> PartitionCache:
    """Each cluster's segments (log bytes each, the producer state carried from one to the next as a broker
    carries it) in a file tier under `root`, finished, and T1 (producer 7, first offset 0) recorded aborted, as
    `learnt` records it."""
    rsm = RemoteStorageManager.from_uri(f"file://{root}")
    cache = MetadataCache()
    part = tp(TOPIC, 0)
    try:
        for segments in histories:
            producers = None  # a new cluster's producer state begins empty
            for raw in segments:
                files = build_segment(raw, producers)
                producers = files.producers
                md = dataclasses.replace(seg(part, files.start_offset, files.end_offset),
                                         segment_size_in_bytes=len(raw), txn_index_empty=files.txn_index_empty)
                await rsm.copy_segment(md, files)
                cache.apply(md)
                cache.apply_record(dataclasses.replace(md, state=SegmentState.COPY_SEGMENT_FINISHED))
    finally:
        await rsm.close()
    cache.apply(TransactionOutcome(part, P1, 0, TxnOutcome.ABORTED, learnt, 1_000))
    pc = cache.get(part.topic_id, 0)
    assert pc is not None
    return pc


ONE_CLUSTER = [[txn(0, b"t1-a", b"t1-b"),  # T1 open at the segment's end: recorded aborted by the pass
                marker(ABORT, 2) + plain(3, b"x"),  # T1's marker, tiered by a later pass
                txn(4, b"t2-a", b"t2-b") + marker(COMMIT, 6)]]  # T2, committed
RESTORED = [[txn(0, b"t1-a", b"t1-b")],  # A's last segment: T1's marker was in [N, S), lost
            [txn(10, b"b-a", b"b-b") + marker(COMMIT, 12) + plain(13, b"b-c")]]  # B's: producer id 7 again


def dataframe(root: Path, pc: PartitionCache, starting: str = "earliest") -> list[bytes]:
    """The values a read_committed DataFrame (and the Iceberg step, which reads the same slices) holds: the real
    planner's slices of the tier, each read from the tier and filtered by its aborted list."""
    o = parse_options({"kafka.bootstrap.servers": "unused:9092", "storage": f"file://{root}", "subscribe": TOPIC,
                       "kafka.isolation.level": "read_committed", "failOnDataLoss": "false",
                       "startingOffsets": starting})
    info = PartitionInfo(TOPIC, pc.tp.topic_id, 0, -1, 0)
    pp = PartitionPlan(info, list(pc.finished()), None, outcomes={k: v.outcome for k, v in pc.outcomes.items()})

    async def plan() -> list[bytes]:
        rsm = RemoteStorageManager.from_uri(f"file://{root}")
        try:
            slices = await Planner(o)._partition_slices(ClusterView({}, [info], set()), pp, rsm)
        finally:
            await rsm.close()
        return [r.value or b"" for s in slices
                for b in visible_batches(read_tier_slice(f"file://{root}", s), True, list(s.aborted))
                for r in b.records() if s.start <= r.offset < s.end]

    return asyncio.run(plan())


def test_the_dataframe_hides_only_the_aborted_transaction_from_inside_a_later_segment(tmp_path: Path) -> None:
    pc = asyncio.run(tiered(tmp_path, ONE_CLUSTER, COPIED))
    assert dataframe(tmp_path, pc) == [b"x", b"t2-a", b"t2-b"]
    # from inside T2's segment, past T1's marker (an Iceberg ledger past it, a later startingOffsets): T2 is there
    # (before: T1 was planned as open above the tier, and every later transaction of producer 7 was dropped)
    assert dataframe(tmp_path, pc, '{"txns": {"0": 4}}') == [b"t2-a", b"t2-b"]


# a restore that went on without a partition's high watermark (--accept-missing) begins B at the tier's end: S = N
RESTORED_AT_N = [RESTORED[0], [txn(2, b"b-a", b"b-b") + marker(COMMIT, 4) + plain(5, b"b-c")]]


@pytest.mark.parametrize("histories", [RESTORED, RESTORED_AT_N], ids=["S above N", "S = N"])
def test_after_a_restore_the_dataframe_shows_the_new_clusters_transactions_of_the_same_producer_id(
        tmp_path: Path, histories: list[list[bytes]]) -> None:
    pc = asyncio.run(tiered(tmp_path, histories, LOST_RULE))
    # T1 hidden (aborted by the rule); B's committed records shown (before: hidden behind T1, for good); with no
    # gap between the histories, B's segment's producer snapshot says T1 is not open there
    assert dataframe(tmp_path, pc) == [b"b-a", b"b-b", b"b-c"]


def test_after_a_restore_the_proxy_lists_the_recorded_abort_whatever_the_new_cluster_wrote(tmp_path: Path) -> None:
    """The proxy's read of A's last segment lists T1 aborted though B's segment holds producer id 7 with no
    transaction open (before: that was taken as T1 decided inside B's segment, committed, and T1's records reached
    read_committed consumers). No broker: an outcome the tier records is never asked of one."""
    pc = asyncio.run(tiered(tmp_path, RESTORED, LOST_RULE))
    nobody = f"127.0.0.1:{free_port()}"

    async def read(offset: int) -> list[tuple[int, int]]:
        tier = RemoteTier(ProxySettings(bootstrap_servers=nobody, storage=f"file://{tmp_path}",
                                        metadata=f"file://{tmp_path}/meta-{os.getpid()}"))
        try:
            deadline = asyncio.get_running_loop().time() + 30
            task = tier.submit_read(pc, offset, 1 << 20, True, deadline)
            assert task is not None
            res = await asyncio.wait_for(task, 30)
            return [(a.producer_id, a.first_offset) for a in res.aborted]
        finally:
            await tier.close()

    assert asyncio.run(read(0)) == [(P1, 0)]
    assert asyncio.run(read(10)) == [], "B's transaction is committed"
