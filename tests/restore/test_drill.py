"""The restore drill's reading of the tier (`jobs/restore/drill.py`) on a real file tier: every served segment's
objects found and its log's size checked; what it finds as Prometheus text. (End to end, through `restore --dry-run`
against the disaster's tier: tests/restore/test_disaster.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from protocol.records import Record, build_batch
from tests.support.segments import stored_segment
from tierproxy.jobs.restore.drill import DrillFindings, check_objects, prometheus_text, write_metrics
from tierproxy.tier.cache import MetadataCache
from tierproxy.tier.model import SegmentState
from tierproxy.tier.rsm import LOG_EXT, IndexType, RemoteStorageManager
from tierproxy.tier.storage import FileStore


def _log(base: int, n: int) -> bytes:
    return build_batch([Record(i, 1_000 + i, b"k", b"v" * 50) for i in range(n)], base_offset=base)


def _tier(root: Path) -> tuple[RemoteStorageManager, MetadataCache, list[str]]:
    async def make() -> tuple[RemoteStorageManager, MetadataCache, list[str]]:
        rsm = RemoteStorageManager(FileStore(root), "t")
        cache = MetadataCache()
        mds = [await stored_segment(rsm, _log(0, 10), "drilled"), await stored_segment(rsm, _log(0, 5), "drilled")]
        for md in mds:
            cache.apply_record(dataclasses.replace(md, state=SegmentState.COPY_SEGMENT_FINISHED))
        return rsm, cache, [rsm.key(md, LOG_EXT) for md in mds]

    return asyncio.run(make())


def test_a_whole_tier_has_every_object_and_a_missing_or_short_one_is_named(tmp_path: Path) -> None:
    rsm, cache, logs = _tier(tmp_path)
    whole = asyncio.run(check_objects(rsm, cache, {"drilled"}))
    assert (whole.segments, whole.objects, whole.broken) == (2, 12, [])
    assert asyncio.run(check_objects(rsm, cache, {"other"})).segments == 0  # topics not restored are not read

    (tmp_path / (logs[0].removesuffix(LOG_EXT) + IndexType.TRANSACTION.value)).unlink()
    (tmp_path / logs[1]).write_bytes((tmp_path / logs[1]).read_bytes()[:-7])
    broken = asyncio.run(check_objects(rsm, cache, {"drilled"}))
    assert broken.segments == 2 and broken.objects == 11
    assert any("missing txnindex" in why for why in broken.broken), broken.broken
    assert any("its log holds" in why and "bytes, its metadata says" in why for why in broken.broken), broken.broken


def test_the_findings_are_prometheus_text_written_whole(tmp_path: Path) -> None:
    f = DrillFindings(segments=3, objects=17, broken=["x"], lost={("a\"b", 0): (10, 25), ("c", 1): (5, 5)},
                      open_transactions=2, unrecorded=["group g"], snapshot_age_s=42.5)
    out = tmp_path / "drill" / "tierproxy.prom"
    write_metrics(out, prometheus_text(f, 1_700_000_000.0))
    assert [p.name for p in tmp_path.joinpath("drill").iterdir()] == ["tierproxy.prom"]  # no temporary file left
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(out.read_text()) for s in fam.samples}
    assert samples[("tierproxy_restore_drill_lost_offsets", (("partition", "0"), ("topic", 'a"b')))] == 15
    assert samples[("tierproxy_restore_drill_lost_offsets", (("partition", "1"), ("topic", "c")))] == 0
    assert samples[("tierproxy_restore_drill_broken_segments", ())] == 1
    assert samples[("tierproxy_restore_drill_open_transactions", ())] == 2
    assert samples[("tierproxy_restore_drill_unrecorded_facts", ())] == 1
    assert samples[("tierproxy_restore_drill_snapshot_age_seconds", ())] == 42.5
    assert f.lost_offsets == 15 and "15 offsets would be lost" in f.lines()[0]
