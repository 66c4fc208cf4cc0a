"""READ_COMMITTED remote reads over a real filesystem tier: the aborted transactions a fetch needs, and no
transaction index or producer snapshot read for records that hold no transactional batch (a client applies the
aborted list only to transactional batches, so those reads would cost a storage round trip per segment for
nothing)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from protocol.records import ABORT, Record, build_batch, build_control_batch, iter_batches
from tests.support.segments import stored_segment
from tierproxy.remote.reader import RemoteReader
from tierproxy.tier.model import RemoteLogSegmentMetadata
from tierproxy.tier.rsm import IndexType, RemoteStorageManager

PID = 7


def plain(base: int, n: int) -> bytes:
    return b"".join(build_batch([Record(base + i, 0, None, b"p%d" % (base + i))], base_offset=base + i)
                    for i in range(n))


def aborted_transaction(base: int) -> bytes:
    """Two transactional records of producer PID at `base`, `base + 1`, its ABORT marker at `base + 2`."""
    txn = build_batch([Record(base, 0, None, b"t0"), Record(base + 1, 0, None, b"t1")], base_offset=base,
                      producer_id=PID, producer_epoch=0, base_sequence=0, transactional=True)
    return txn + build_control_batch(ABORT, offset=base + 2, producer_id=PID, producer_epoch=0, timestamp=0)


async def store(rsm: RemoteStorageManager, raw: bytes) -> RemoteLogSegmentMetadata:
    return await stored_segment(rsm, raw, "txn")


def index_kinds(reader: RemoteReader, md: RemoteLogSegmentMetadata) -> set[str]:
    return {kind for seg_id, kind in reader.indexes if seg_id == md.segment_id.id}


def test_read_committed_reads_transaction_indexes_only_for_transactional_records(tmp_path: Path) -> None:
    async def run() -> None:
        rsm = RemoteStorageManager.from_uri(f"file://{tmp_path}/tier")
        first = await store(rsm, plain(0, 10))  # no transaction at all
        second = await store(rsm, plain(10, 5) + aborted_transaction(15) + plain(18, 5))
        reader = RemoteReader(rsm, chunk_bytes=4096)
        deadline = asyncio.get_running_loop().time() + 30

        res = await reader.read(first, 0, 1 << 20, True, True, deadline, [second])
        assert [b.base_offset for b in iter_batches(res.records)] == list(range(10))
        assert res.aborted == [] and res.unresolved == {}
        assert index_kinds(reader, first) == set()  # no snapshot, no txn index (nor offset index: from its start)

        # records before the transaction, in the segment that holds it: still nothing to look up
        res = await reader.read(second, 11, len(plain(11, 4)), True, True, deadline)
        assert [b.base_offset for b in iter_batches(res.records)] == list(range(11, 15))
        assert index_kinds(reader, second) == {IndexType.OFFSET.value}

        # records holding the transaction: its abort is listed, from the segment's txn index
        res = await reader.read(second, 10, 1 << 20, True, True, deadline)
        assert bytes(res.records) == plain(10, 5) + aborted_transaction(15) + plain(18, 5)
        assert [(a.producer_id, a.first_offset) for a in res.aborted] == [(PID, 15)]
        assert {IndexType.TRANSACTION.value, IndexType.PRODUCER_SNAPSHOT.value} <= index_kinds(reader, second)

        # READ_UNCOMMITTED never lists aborts
        res = await reader.read(second, 10, 1 << 20, True, False, deadline)
        assert res.aborted == []
        await reader.close()
        await rsm.close()

    asyncio.run(run())
