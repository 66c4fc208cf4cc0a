"""An answer that straddles the chunk cache's chunks, as the fetch path asks for it (`joined=False`): a view of each
chunk and a copy of no more than the one batch that crosses from one chunk into the next, the same bytes in the
same order as the joined answer, each piece whole batches; and the codec sends the pieces without joining them."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import pytest

from protocol.primitives import RecordPieces, Writer
from protocol.records import ABORT, Record, build_batch, build_control_batch, iter_batches
from tests.support.segments import stored_segment
from tierproxy.remote.reader import CorruptData, RemoteReader
from tierproxy.tier.model import RemoteLogSegmentMetadata
from tierproxy.tier.rsm import RemoteStorageManager

CHUNK = 16 * 1024


def batches(base: int, sizes: list[int], transactional_from: int = -1) -> bytes:
    """One record of `size` random bytes per batch from offset `base`; from `transactional_from` on, transactional
    batches of producer 7 (aborted by the caller's marker)."""
    rng = random.Random(base)
    out = []
    for i, size in enumerate(sizes):
        txn = 0 <= transactional_from <= base + i
        out.append(build_batch([Record(base + i, 0, None, rng.randbytes(size))], base_offset=base + i,
                               producer_id=7 if txn else -1, producer_epoch=0 if txn else -1,
                               base_sequence=0 if txn else -1, transactional=txn))
    return b"".join(out)


async def stored(rsm: RemoteStorageManager, raw: bytes) -> RemoteLogSegmentMetadata:
    return await stored_segment(rsm, raw, "pieces")


def test_an_answer_across_chunks_is_a_view_of_each_and_the_same_bytes_as_joined(tmp_path: Path) -> None:
    async def run() -> None:
        rsm = RemoteStorageManager.from_uri(f"file://{tmp_path}/tier")
        rng = random.Random(5)
        # batches of 0.3-5 KiB over 16 KiB chunks: many cross a boundary, some with their length field across it
        raw = batches(0, [rng.randrange(300, 5000) for _ in range(300)])
        md = await stored(rsm, raw)
        pieces = RemoteReader(rsm, chunk_bytes=CHUNK)
        joined = RemoteReader(rsm, chunk_bytes=CHUNK)
        deadline = asyncio.get_running_loop().time() + 30
        straddled = 0
        for offset in range(0, 300, 7):
            for max_bytes in (1, 6000, 40_000):
                got = (await pieces.read(md, offset, max_bytes, True, False, deadline, joined=False)).records
                want = (await joined.read(md, offset, max_bytes, True, False, deadline)).records
                assert isinstance(want, bytes | memoryview)
                parts = got.parts if isinstance(got, RecordPieces) else [got]
                assert b"".join(bytes(p) for p in parts) == bytes(want)  # same batches, same bytes, same order
                assert len(got) == len(want)
                cached = {id(c) for c in pieces.chunks.values()}
                for part in parts:
                    assert isinstance(part, memoryview)
                    inside = list(iter_batches(part))
                    assert inside and inside[-1].pos + inside[-1].size == len(part)  # whole batches, nothing more
                    # a view of a cached chunk, or a copy of exactly one batch (one that crosses a boundary)
                    assert id(part.obj) in cached or len(inside) == 1
                straddled += isinstance(got, RecordPieces)
        assert straddled > 10  # the table above did cross chunks (else it tested nothing)

    asyncio.run(run())


def test_read_committed_finds_the_aborted_transaction_across_pieces(tmp_path: Path) -> None:
    async def run() -> None:
        rsm = RemoteStorageManager.from_uri(f"file://{tmp_path}/tier")
        raw = batches(0, [3000] * 20, transactional_from=8)
        raw += build_control_batch(ABORT, offset=20, producer_id=7, producer_epoch=0, timestamp=0)
        md = await stored(rsm, raw)
        reader = RemoteReader(rsm, chunk_bytes=CHUNK)
        deadline = asyncio.get_running_loop().time() + 30
        res = await reader.read(md, 0, 1 << 20, True, True, deadline, joined=False)
        assert isinstance(res.records, RecordPieces)
        assert [(a.producer_id, a.first_offset) for a in res.aborted] == [(7, 8)]

    asyncio.run(run())


def test_the_codec_writes_the_pieces_as_chunks_of_their_own() -> None:
    a, b = memoryview(bytearray(b"x" * 1000)), memoryview(bytearray(b"y" * 300))
    w = Writer()
    w.bytes_(RecordPieces([a, b]), compact=True, zero_copy=True)
    assert w.chunks[1] is a and w.chunks[2] is b  # never copied
    assert bytes(w.chunks[0]) == bytes([1301 & 0x7F | 0x80, 1301 >> 7])  # compact length + 1 = 1301
    copied = Writer()
    copied.bytes_(RecordPieces([a, b]), compact=False)
    assert not copied.chunks and bytes(copied.buf) == (1300).to_bytes(4, "big") + b"x" * 1000 + b"y" * 300


def test_a_batch_length_that_lies_across_a_boundary_is_corrupt_data_not_a_hang(tmp_path: Path) -> None:
    async def run() -> None:
        rsm = RemoteStorageManager.from_uri(f"file://{tmp_path}/tier")
        raw = bytearray(batches(0, [3000] * 12))
        crossing = next(b for b in iter_batches(bytes(raw)) if b.pos < CHUNK < b.pos + b.size)
        raw[crossing.pos + 8:crossing.pos + 12] = (10 << 20).to_bytes(4, "big")  # a length past the segment's end
        md = await stored(rsm, bytes(raw[:crossing.pos]))  # indexes of the honest part
        md = dataclasses.replace(md, segment_size_in_bytes=len(raw))
        await rsm.store.put(rsm.key(md, "log"), bytes(raw))  # the whole log, the lie in it
        reader = RemoteReader(rsm, chunk_bytes=CHUNK)
        deadline = asyncio.get_running_loop().time() + 30
        with pytest.raises(CorruptData):
            await reader.read(md, crossing.base_offset, 1 << 20, True, False, deadline, joined=False)

    asyncio.run(run())
