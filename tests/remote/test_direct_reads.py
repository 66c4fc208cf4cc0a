"""A file:// tier read directly (`remote.fetch.file.direct.reads`): each read takes exactly its bytes from the
segment file, through no chunk cache; its answers are byte for byte those of the chunk-cached reader over the same
files, for any offset and size (Hypothesis), and a file shorter than its metadata is never served."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.records import Record, build_batch, iter_batches
from tests.support.segments import file_tier
from tierproxy.remote.reader import Backoff, RemoteReader
from tierproxy.tier.model import RemoteLogSegmentMetadata
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.storage import StorageUnavailable


def _segment(rng_sizes: list[int], base: int) -> bytes:
    out, offset = [], base
    for n in rng_sizes:  # batches of 1..n records of varied sizes: batch boundaries fall anywhere in a chunk
        out.append(build_batch([Record(offset + i, 0, None, os.urandom(50 + 37 * i)) for i in range(n)],
                               base_offset=offset))
        offset += n
    return b"".join(out)


async def _tiered(root: Path) -> tuple[RemoteStorageManager, list[RemoteLogSegmentMetadata]]:
    return await file_tier(root, "direct", _segment)


_TIER: dict[str, tuple[RemoteStorageManager, list[RemoteLogSegmentMetadata]]] = {}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 1), at=st.floats(0, 1), max_bytes=st.integers(1, 300_000), min_one=st.booleans())
def test_direct_answers_are_the_chunk_cached_answers(tmp_path: Path, which: int, at: float, max_bytes: int,
                                                     min_one: bool) -> None:
    async def run() -> None:
        if str(tmp_path) not in _TIER:
            _TIER[str(tmp_path)] = await _tiered(tmp_path / "tier")
        rsm, mds = _TIER[str(tmp_path)]
        md = mds[which]
        offset = md.start_offset + int(at * (md.end_offset - md.start_offset))
        deadline = asyncio.get_running_loop().time() + 10
        direct = RemoteReader(rsm, direct=True)
        cached = RemoteReader(rsm, chunk_bytes=64 * 1024, prefetch_chunks=1)
        a = await direct.read(md, offset, max_bytes, min_one, False, deadline, mds[which + 1:])
        b = await cached.read(md, offset, max_bytes, min_one, False, deadline, mds[which + 1:])
        assert bytes(a.records) == bytes(b.records)
        window = max_bytes + 256 * 1024  # its window, and at most the next read's started ahead: never cached
        assert not direct.chunks and direct.bytes_read <= 2 * window
        batches = list(iter_batches(bytes(a.records)))
        if batches and batches[-1].last_offset < mds[-1].end_offset:  # the next fetch takes what was read ahead
            nxt = batches[-1].last_offset + 1
            here = md if nxt <= md.end_offset else mds[which + 1]
            c = await direct.read(here, nxt, max_bytes, min_one, False, deadline, mds[mds.index(here) + 1:])
            d = await cached.read(here, nxt, max_bytes, min_one, False, deadline, mds[mds.index(here) + 1:])
            assert bytes(c.records) == bytes(d.records) and direct.hits == 1
        await direct.close()
        await cached.close()

    asyncio.run(run())


def test_a_file_shorter_than_its_metadata_is_never_served(tmp_path: Path) -> None:
    async def run() -> None:
        rsm, mds = await _tiered(tmp_path / "tier")
        md = mds[0]
        logs = sorted((tmp_path / "tier").rglob("*.log"))
        assert len(logs) == 2
        for path in logs:  # every segment cut short by a byte
            path.write_bytes(path.read_bytes()[:-1])
        direct = RemoteReader(rsm, direct=True, backoff=Backoff(10, 20))
        deadline = asyncio.get_running_loop().time() + 0.3
        try:
            await direct.read(md, md.start_offset, 10 << 20, True, False, deadline)
        except StorageUnavailable as exc:
            assert "returned" in str(exc) and direct.short_reads >= 1
        else:
            raise AssertionError("a truncated segment file was served")

    asyncio.run(run())
