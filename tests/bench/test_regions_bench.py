"""A segment's first answer from a file tier: what finding its batches costs on the proxy's loop.

A 16 MiB segment of 16 KiB batches (1 KiB records) with the offset index the tier writes for it; a 4 MiB answer
from its start found (a) by reading every batch header, (b) with the index read at once from its file (a direct
reader of a tier of files, `RemoteReader._read_at_once`) and its positions decoded, (c) the index read through
`FileStore.get`, the thread hop an index took before (that one then waited for, as the next answer did). In-process:
no Kafka, no proxy; each median of 50.

    pytest -m bench tests/bench/test_regions_bench.py -s
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from protocol.records import Record, build_batch
from tests.bench.report import report
from tierproxy.remote.regions import Walked, walk
from tierproxy.tier.indexes import build_segment, index_positions
from tierproxy.tier.storage import FileStore

pytestmark = [pytest.mark.bench]
BATCHES, PER_BATCH, ANSWER = 1024, 16, 4 << 20


def _median_ms(fn: Callable[[], object], times: int = 50) -> float:
    took = []
    for _ in range(times):
        start = time.perf_counter()
        fn()
        took.append((time.perf_counter() - start) * 1000)
    return statistics.median(took)


def test_a_segments_first_answer_with_and_without_its_index(tmp_path: Path) -> None:
    raw = b"".join(build_batch([Record(b * PER_BATCH + i, 0, None, b"v" * 1000) for i in range(PER_BATCH)],
                               base_offset=b * PER_BATCH) for b in range(BATCHES))
    files = build_segment(raw)
    store = FileStore(tmp_path)
    (tmp_path / "seg.log").write_bytes(raw)
    (tmp_path / "seg.index").write_bytes(files.offset_index)
    log, size = str(tmp_path / "seg.log"), len(raw)

    def every_header() -> Walked:
        return walk(log, size, 0, 0, ANSWER, True)

    def index_at_once() -> Walked:
        index = store.read_small("seg.index", 1 << 20)
        assert index is not None
        return walk(log, size, 0, 0, ANSWER, True, index_positions(index))

    every, skipping = every_header(), index_at_once()
    assert every.region is not None and skipping.region is not None
    assert (every.region.position, every.region.length, every.last_offset) == \
        (skipping.region.position, skipping.region.length, skipping.last_offset)
    loop = asyncio.new_event_loop()
    try:
        hop = statistics.median(_timed_get(loop, store) for _ in range(50))
    finally:
        loop.close()
    a, b = _median_ms(every_header), _median_ms(index_at_once)
    report("a segment's first 4 MiB answer from a file tier (16 KiB batches, in-process)",
           f"every header read: {a:.3f} ms ({every.headers} headers); index read at once and used: {b:.3f} ms "
           f"({skipping.headers} headers), {a / b:.1f}x less; the index through FileStore.get's thread hop alone: "
           f"{hop:.3f} ms on an idle loop")


def _timed_get(loop: asyncio.AbstractEventLoop, store: FileStore) -> float:
    start = time.perf_counter()
    loop.run_until_complete(store.get("seg.index"))
    return (time.perf_counter() - start) * 1000
