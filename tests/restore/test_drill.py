"""The restore drill's reading of the tier (`jobs/restore/drill.py`) on a real file tier: every served segment's
objects found and its log's size checked; what it finds as Prometheus text. (End to end, through `restore --dry-run`
against the disaster's tier: tests/restore/test_disaster.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from protocol.records import Record, build_batch
from tests.support.cli import run_cli
from tests.support.kafka import create_topic, small_segment_producer, small_segments, watermarks
from tests.support.segments import stored_segment
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
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


@pytest.mark.kafka
@pytest.mark.spark
def test_the_drill_against_the_live_cluster_reports_what_a_restore_now_would_lose(kafka: KafkaCluster,
                                                                                 tmp_path: Path) -> None:
    """`restore --dry-run` against the tiered cluster itself: the tier's objects checked, [N, the end now) lost per
    partition, as text and as Prometheus metrics; a missing object makes it fail (exit 1), naming the segment."""
    topic = f"drilled-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 2, 1, small_segments())
    prod = small_segment_producer(kafka.bootstrap)
    for i in range(1200):
        prod.produce(topic, f"drilled-{i}-{'d' * 60}".encode(), partition=i % 2)
    prod.flush(30)
    s = settings(kafka.bootstrap, tmp_path, topic, tier_segment_bytes=16 * 1024)
    assert tier_once(s).segments > 0
    for i in range(50):  # after the pass: a restore now would lose these
        prod.produce(topic, f"late-{i}".encode(), partition=0)
    prod.flush(30)
    ends = {p: watermarks(kafka.bootstrap, topic, p)[1] for p in range(2)}
    prom = tmp_path / "textfile" / "tierproxy.prom"
    prom.parent.mkdir()
    drill = ["restore", "--bootstrap-server", kafka.bootstrap, "--storage", s.storage, "--topics", topic,
             "--dry-run", "--metrics-file", str(prom)]
    out = run_cli(*drill)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout and "drill:" in out.stdout, out.stdout
    assert "storage requests: none;" in out.stdout, "a file tier is asked no billed request, and the run says so"
    samples = {(m.name, m.labels.get("partition")): m.value
               for fam in text_string_to_metric_families(prom.read_text()) for m in fam.samples}
    lost = samples[("tierproxy_restore_drill_lost_offsets", "0")]
    assert 50 <= lost <= ends[0], (lost, ends)  # at least what came after the pass, never more than the partition
    assert f"LOST offsets {int(ends[0] - lost)}..{ends[0] - 1}" in out.stdout, out.stdout
    assert samples[("tierproxy_restore_drill_broken_segments", None)] == 0
    assert samples[("tierproxy_restore_drill_segments", None)] > 0

    victim = next(p for p in Path(s.storage.removeprefix("file://")).rglob("*.timeindex"))
    victim.unlink()
    out = run_cli(*drill)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "BROKEN" in out.stdout and "missing timeindex" in out.stdout, out.stdout
    assert "would not have everything" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "tierproxy_restore_drill_broken_segments 1" in prom.read_text()

    refused = run_cli("restore", "--bootstrap-server", kafka.bootstrap, "--storage", s.storage,
                      "--metrics-file", str(prom))
    assert refused.returncode == 2 and "--metrics-file" in refused.stderr and "--dry-run" in refused.stderr
