"""The remote reader's read-ahead against a real S3 API (moto) behind a loopback relay that adds latency to every
request: it deepens while storage is slower than a sequential reader, runs on into the next segment, stays within
the chunk cache's size, and what it serves is still the stored bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Iterator

import pytest

from protocol.records import Record, build_batch, iter_batches
from tests.support.relay import DelayRelay
from tests.support.s3 import S3Server
from tests.support.segments import seg, tp
from tierproxy.remote.reader import RemoteReader
from tierproxy.tier.indexes import build_segment
from tierproxy.tier.model import RemoteLogSegmentMetadata
from tierproxy.tier.rsm import IndexType, RemoteStorageManager
from tierproxy.tier.storage import S3Store

pytestmark = pytest.mark.s3
CHUNK = 64 * 1024


def segment_bytes(base: int, batches: int) -> bytes:
    return b"".join(build_batch([Record(base + b * 10 + i, 0, None, os.urandom(1000)) for i in range(10)],
                                base_offset=base + b * 10) for b in range(batches))


@pytest.fixture
def slow_s3(s3: S3Server) -> Iterator[tuple[RemoteStorageManager, DelayRelay]]:
    s3.create_bucket("ahead")
    relay = DelayRelay(int(s3.endpoint.rsplit(":", 1)[1]), delay=0.0)
    rsm = RemoteStorageManager(S3Store("ahead", endpoint=f"http://127.0.0.1:{relay.port}", region=s3.region,
                                       access_key=s3.access_key, secret_key=s3.secret_key), "c")
    yield rsm, relay
    relay.close()


async def tiered(rsm: RemoteStorageManager, segments: int, batches: int) -> list[tuple[RemoteLogSegmentMetadata,
                                                                                       bytes]]:
    part, out = tp("ahead"), []
    for i in range(segments):
        raw = segment_bytes(i * batches * 10, batches)
        files = build_segment(raw)
        md = dataclasses.replace(seg(part, files.start_offset, files.end_offset), segment_size_in_bytes=len(raw))
        await rsm.copy_segment(md, files)
        out.append((md, raw))
    return out


async def read_all(reader: RemoteReader, segs: list[tuple[RemoteLogSegmentMetadata, bytes]]) -> bytes:
    """A sequential consumer: fetches of 32 KiB from offset 0 to the end, as fast as they are answered."""
    got = bytearray()
    loop = asyncio.get_running_loop()
    for i, (md, _) in enumerate(segs):
        offset = md.start_offset
        while offset <= md.end_offset:
            res = await reader.read(md, offset, 32 * 1024, True, False, loop.time() + 30,
                                    [m for m, _ in segs[i + 1:]])
            got += res.records
            offset = list(iter_batches(bytes(res.records)))[-1].last_offset + 1
    return bytes(got)


async def read_ahead_cached(reader: RemoteReader, segments: list[RemoteLogSegmentMetadata]) -> bool:
    """Whether each segment's first chunk reaches the cache (the read-ahead finishes in the background), waiting
    up to 4 s."""
    def cached() -> bool:
        return all((md.segment_id.id, 0) in reader.chunks for md in segments)

    for _ in range(200):
        if cached():
            return True
        await asyncio.sleep(0.02)
    return cached()


def test_read_ahead_deepens_while_storage_is_slower_than_the_reader(
        slow_s3: tuple[RemoteStorageManager, DelayRelay]) -> None:
    rsm, relay = slow_s3

    async def run() -> None:
        segs = await tiered(rsm, 2, 80)  # two segments of ~800 KB: 13 chunks each
        relay.delay = 0.03  # every S3 request 30 ms late
        reader = RemoteReader(rsm, chunk_bytes=CHUNK, cache_bytes=64 * CHUNK, prefetch_chunks=1,
                              max_prefetch_chunks=5)
        assert await read_all(reader, segs) == b"".join(raw for _, raw in segs)  # the stored bytes, in order
        first, second = (md.segment_id.id for md, _ in segs)
        assert reader.depth[first] == 5  # deepened, up to the bound, not beyond
        assert reader.depth[second] == 5  # and carried on into the next segment
        assert 1 < reader.ahead_peak <= 5 + 1
        await reader.close()
        await rsm.close()

    asyncio.run(run())


def test_read_ahead_runs_on_into_the_next_segment_which_is_read_without_its_index(
        slow_s3: tuple[RemoteStorageManager, DelayRelay]) -> None:
    rsm, _relay = slow_s3

    async def run() -> None:
        (a, _), (b, _) = await tiered(rsm, 2, 30)
        reader = RemoteReader(rsm, chunk_bytes=CHUNK, prefetch_chunks=3)
        loop = asyncio.get_running_loop()
        last = a.end_offset - 5
        await reader.read(a, last, 1024, True, False, loop.time() + 30, [b])
        assert await read_ahead_cached(reader, [b])
        hits = reader.hits
        res = await reader.read(b, b.start_offset, 1024, True, False, loop.time() + 30, [])
        assert reader.hits > hits  # the next segment's first chunk came from the cache
        assert next(iter_batches(bytes(res.records))).base_offset == b.start_offset
        # from the segment's start: position 0, no offset index read (one storage round trip less)
        assert (b.segment_id.id, IndexType.OFFSET.value) not in reader.indexes
        res = await reader.read(b, b.start_offset + 105, 1024, True, False, loop.time() + 30, [])
        assert next(iter_batches(bytes(res.records))).base_offset == b.start_offset + 100  # its batch, by the index
        assert (b.segment_id.id, IndexType.OFFSET.value) in reader.indexes
        await reader.close()
        await rsm.close()

    asyncio.run(run())


def test_read_ahead_stays_within_half_the_chunk_cache(slow_s3: tuple[RemoteStorageManager, DelayRelay]) -> None:
    rsm, relay = slow_s3

    async def run() -> None:
        segs = await tiered(rsm, 6, 30)
        relay.delay = 0.05
        reader = RemoteReader(rsm, chunk_bytes=CHUNK, cache_bytes=4 * CHUNK, prefetch_chunks=3,
                              max_prefetch_chunks=8)
        raws = await asyncio.gather(*(read_all(reader, [s]) for s in segs))  # six readers at once
        assert raws == [raw for _, raw in segs]
        assert reader.ahead_peak <= 2  # never more read ahead than half the cache holds
        await reader.close()
        await rsm.close()

    asyncio.run(run())


def test_read_ahead_reaches_as_many_small_segments_as_its_depth(
        slow_s3: tuple[RemoteStorageManager, DelayRelay]) -> None:
    rsm, _relay = slow_s3

    async def run() -> None:
        segs = [md for md, _ in await tiered(rsm, 5, 4)]  # ~40 KB segments: less than a chunk each
        reader = RemoteReader(rsm, chunk_bytes=CHUNK, prefetch_chunks=3)
        loop = asyncio.get_running_loop()
        await reader.read(segs[0], segs[0].start_offset, 1024, True, False, loop.time() + 30, segs[1:])
        assert await read_ahead_cached(reader, segs[1:4])  # three chunks ahead: three segments
        assert (segs[4].segment_id.id, 0) not in reader.chunks  # not beyond the depth
        await reader.close()
        await rsm.close()

    asyncio.run(run())


def test_a_sequential_reader_reads_no_offset_index(slow_s3: tuple[RemoteStorageManager, DelayRelay]) -> None:
    """Each fetch goes on at the byte where the last one ended (and a segment's first at byte 0): the offset index
    is read only for a fetch that lands elsewhere."""
    rsm, _relay = slow_s3

    async def run() -> None:
        segs = await tiered(rsm, 2, 30)
        reader = RemoteReader(rsm, chunk_bytes=CHUNK)
        assert await read_all(reader, segs) == b"".join(raw for _, raw in segs)  # 32 KiB fetches: ~10 per segment
        assert not any(kind == IndexType.OFFSET.value for _, kind in reader.indexes)
        (md, raw), _ = segs
        loop = asyncio.get_running_loop()
        res = await reader.read(md, md.start_offset + 123, 1024, True, False, loop.time() + 30)
        batch = next(iter_batches(bytes(res.records)))
        assert batch.base_offset == md.start_offset + 120 and bytes(batch.view()) in raw
        assert (md.segment_id.id, IndexType.OFFSET.value) in reader.indexes
        await reader.close()
        await rsm.close()

    asyncio.run(run())


def test_byte_ranges_across_chunks_are_the_stored_bytes(slow_s3: tuple[RemoteStorageManager, DelayRelay]) -> None:
    rsm, _relay = slow_s3

    async def run() -> None:
        ((md, raw),) = await tiered(rsm, 1, 30)  # ~300 KB: five 64 KiB chunks
        reader = RemoteReader(rsm, chunk_bytes=CHUNK)
        deadline = asyncio.get_running_loop().time() + 30
        for start, end in [(0, 1), (5, CHUNK), (CHUNK - 1, CHUNK + 1), (CHUNK, 2 * CHUNK), (100, 3 * CHUNK + 7),
                           (CHUNK + 3, len(raw)), (0, len(raw) + 1000), (len(raw) - 1, len(raw))]:
            got = await reader.read_bytes(md, start, end, deadline)
            assert bytes(got) == raw[start:end], (start, end)
        await reader.close()
        await rsm.close()

    asyncio.run(run())


def test_read_ahead_is_read_before_the_cache_evicts_it(slow_s3: tuple[RemoteStorageManager, DelayRelay]) -> None:
    """Many sequential readers in a cache of a few chunks each (a worker of `serve --workers N` has 1/N of it): the
    read-ahead waiting to be read takes half the cache at most, so the other half keeps the chunks the readers
    are in, and storage is read about once per byte served (twice and more when read-ahead pushed out what it
    had read for another reader before that reader came)."""
    rsm, relay = slow_s3

    async def run() -> None:
        segs = await tiered(rsm, 6, 60)  # ~600 KB each: ten chunks
        relay.delay = 0.02
        reader = RemoteReader(rsm, chunk_bytes=CHUNK, cache_bytes=16 * CHUNK, prefetch_chunks=2,
                              max_prefetch_chunks=8)
        raws = await asyncio.gather(*(read_all(reader, [s]) for s in segs))  # six readers at once
        assert raws == [raw for _, raw in segs]
        served = sum(len(raw) for _, raw in segs)
        assert reader.bytes_read / served < 1.15, reader.bytes_read / served
        assert reader.ahead_peak <= 8  # never more read ahead than half the cache
        await reader.close()
        await rsm.close()

    asyncio.run(run())
