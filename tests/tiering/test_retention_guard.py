"""The retention guard over the whole tier (in process: a file RLMM and a file tier, no broker): a mistyped
`tier.retention.ms` must cost a refused pass on low-volume partitions too, not their history."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.segments import seg, tp
from tierproxy.jobs.tiering.housekeeping import enforce_retention
from tierproxy.tier.model import SegmentState as S
from tierproxy.tier.rlmm import transition
from tierproxy.tier.rlmm_file import FileRLMM
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.storage import FileStore


async def _tier(root: Path, layout: dict[str, list[int]]) -> FileRLMM:
    """Per topic, one partition per entry: that many finished segments of 100 offsets (10,000 bytes each), all
    with timestamps long past."""
    rlmm = FileRLMM(root / "meta")
    await rlmm.start()
    for topic, partitions in layout.items():
        for p, segments in enumerate(partitions):
            t = tp(topic, p)
            for i in range(segments):
                md = seg(t, i * 100, i * 100 + 99)
                await rlmm.add_segment(md)
                await rlmm.update_segment(transition(md, S.COPY_SEGMENT_FINISHED))
    return rlmm


def _finished(rlmm: FileRLMM) -> int:
    return sum(1 for pc in rlmm.cache.partitions.values() for _ in pc.finished())


def test_a_mistyped_retention_on_low_volume_partitions_is_refused_over_the_whole_tier(tmp_path: Path) -> None:
    """Twelve partitions of one or two segments each, every segment past a mistyped retention of 1 ms and below
    the broker's log start: before, each partition was too small to be guarded and the pass deleted all of it."""
    async def go() -> None:
        rlmm = await _tier(tmp_path, {"quiet": [1, 2] * 6})
        rsm = RemoteStorageManager(FileStore(tmp_path / "tier"), "c")
        try:
            before = _finished(rlmm)
            starts = {(pc.tp.topic, pc.tp.partition): 10_000 for pc in rlmm.cache.partitions.values()}
            out = await enforce_retention(rlmm, rsm, {"quiet": (1, -1)}, starts, max_delete_fraction=0.5)
            assert out.expired == 0 and _finished(rlmm) == before
            assert len(out.refused) == 1 and "the whole tier" in out.refused[0], out.refused
            assert "tier.retention.max.delete.fraction" in out.refused[0]
            done = await enforce_retention(rlmm, rsm, {"quiet": (1, -1)}, starts, max_delete_fraction=0.5,
                                           confirmed=True)  # --confirm-retention: the operator meant it
            assert done.expired == before and _finished(rlmm) == 0
        finally:
            await rlmm.close()

    asyncio.run(go())


def test_ordinary_expiry_of_small_partitions_goes_on_within_the_bound(tmp_path: Path) -> None:
    """One segment of each two-segment partition expires (its records are older) beside a large partition that
    keeps everything: a quarter of the tier, within the bound: deleted, no refusal."""
    async def go() -> None:
        rlmm = await _tier(tmp_path, {"quiet": [2] * 4, "busy": [8]})
        rsm = RemoteStorageManager(FileStore(tmp_path / "tier"), "c")
        try:
            starts = {(pc.tp.topic, pc.tp.partition): 100 for pc in rlmm.cache.partitions.values()}
            out = await enforce_retention(rlmm, rsm, {"quiet": (1, -1)}, starts, max_delete_fraction=0.5)
            assert out.refused == [] and out.expired == 4
        finally:
            await rlmm.close()

    asyncio.run(go())
