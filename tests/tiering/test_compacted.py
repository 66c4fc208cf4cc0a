"""Compacted topics tiered as the broker holds them (issue 66): a topic the session broker's cleaner compacted
(`cleanup.policy=compact,delete`, 16 KiB segments, min.cleanable.dirty.ratio 0.01; the suite's brokers run the
cleaner every 500 ms), tiered, then deleted by the broker's retention; read back through a proxy from offset 0 by
confluent-kafka, kcat and the Java consumer, by raw Fetch / ListOffsets, and by the Spark reader."""

from __future__ import annotations

import itertools
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from protocol.constants import ApiKey, ErrorCode, OffsetSpec
from protocol.records import iter_batches
from protocol.requests import fetch_request, list_offsets_request
from tests.support.compacted import (
    Rec,
    consume,
    create_compacted,
    latest,
    produce_updates,
    records_of,
    wait_cleaned,
)
from tests.support.iceberg import Step, pyiceberg_rows
from tests.support.jvm import java_command
from tests.support.kafka import broker_forgets, set_topic_config
from tests.support.proxy import ProxyProcess
from tests.support.spark import read
from tests.support.tiering import settings, tier_once, tiered
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient
from tierproxy.tier.model import RemoteLogSegmentMetadata
from tierproxy.tier.rules import holes_between

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@dataclass
class Compacted:
    topic: str
    settings: TierSettings
    served: list[Rec]  # what the broker served (read_committed, from offset 0) before the pass
    segments: list[RemoteLogSegmentMetadata]
    tier: list[Rec]  # what the tier holds (read_committed)
    tier_uncommitted: list[Rec]
    tier_end: int  # the tier's last offset
    gaps: list[Any]
    proxy: ProxyProcess
    ts0: int


@pytest.fixture(scope="module")
def compacted(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Compacted]:
    tmp = tmp_path_factory.mktemp("compacted")
    topic = f"compacted-{uuid.uuid4().hex[:6]}"
    create_compacted(kafka.bootstrap, topic)
    ts0 = int(time.time() * 1000) - 60_000
    written = produce_updates(kafka.bootstrap, topic, ts0=ts0)
    wait_cleaned(kafka.bootstrap, topic, written)
    served = consume(kafka.bootstrap, topic, written)
    # the tier as copied from the broker's cleaned log (the tier's own compaction: test_compaction_step)
    s = settings(kafka.bootstrap, tmp, topic, tier_segment_bytes=1024, tier_cleaner_enable=False)  # ranges the
    # cleaner emptied
    summary = tier_once(s)
    assert summary.failed == 0 and summary.segments > 2, summary.line()
    assert summary.tombstone_risks == []  # its oldest record is a minute old, delete.retention.ms a day
    segs, raw, txns = tiered(s, topic)
    aborted = [(a.producer_id, a.first_offset) for a in txns]
    broker_forgets(kafka.bootstrap, topic, above=segs[-1].end_offset, key=b"tick")
    # single raw fetches check what one answer holds: a tier read still running when the purgatory expires (500 ms by
    # default; a loaded machine's cold read can take longer) would be answered empty, so the purgatory waits longer
    proxy = ProxyProcess(kafka.bootstrap, tmp, extra={"TIERPROXY_STORAGE": f"file://{tmp}/tier",
                                                      "TIERPROXY_METADATA": f"file://{tmp}/meta",
                                                      "TIERPROXY_REMOTE_FETCH_MAX_WAIT_MS": "30000"})
    try:
        wait_until(lambda: proxy_serves_tier(proxy.bootstrap, topic), "the proxy serves the tier", timeout=60)
        yield Compacted(topic, s, served, segs, records_of(raw, aborted), records_of(raw, aborted, False),
                        segs[-1].end_offset, summary.gaps, proxy, ts0)
    finally:
        proxy.stop()


def test_a_cleaned_topic_is_tiered_contiguous_with_its_offset_gaps_inside_segments(compacted: Compacted) -> None:
    """From the broker's log start (0) to the tier's end with no hole and no gap reported, though batches and
    records are missing inside and between segments; what the tier holds is what the broker served (a subset:
    the cleaner may have cleaned more by the pass) with the same latest value of every key."""
    segs, c = compacted.segments, compacted
    assert segs[0].start_offset == 0 and not c.gaps
    assert all(b.start_offset == a.end_offset + 1 for a, b in itertools.pairwise(segs)), \
        [(m.start_offset, m.end_offset) for m in segs]
    assert holes_between(segs) == []
    assert any(md.segment_size_in_bytes == 0 for md in segs)  # a range whose every record the cleaner removed
    offsets = [o for o, _, _ in c.tier_uncommitted]
    assert len(offsets) < (c.tier_end + 1) // 3  # most offsets were compacted away
    served = {o: (k, v) for o, k, v in c.served}
    assert all(served.get(o) == (k, v) for o, k, v in c.tier)
    assert latest(c.tier) == latest([r for r in c.served if r[0] <= c.tier_end])


def test_clients_read_the_compacted_history_from_offset_0_through_the_proxy(compacted: Compacted, kcat: str,
                                                                          kafka: KafkaCluster) -> None:
    """confluent-kafka (read_committed), kcat and the Java consumer, from offset 0 after the broker deleted the
    tiered range: every record the tier holds, in order, nothing else, no reset."""
    c = compacted
    assert consume(c.proxy.bootstrap, c.topic, c.tier_end + 1) == c.tier
    out = subprocess.run([kcat, "-b", c.proxy.bootstrap, "-C", "-t", c.topic, "-p", "0", "-o", "beginning",
                          "-c", str(len(c.tier_uncommitted)), "-q", "-f", "%o %k\n",
                          "-X", "isolation.level=read_uncommitted"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:-1] == [f"{o} {k.decode()}" for o, k, _ in c.tier_uncommitted]
    cmd = [*java_command(), "-Xmx256m", "-cp", f"{kafka.libs}/*", "org.apache.kafka.tools.consumer.ConsoleConsumer",
           "--bootstrap-server", c.proxy.bootstrap, "--topic", c.topic, "--from-beginning",
           "--max-messages", str(len(c.tier)), "--timeout-ms", "30000", "--group", f"java-{uuid.uuid4().hex[:6]}",
           "--isolation-level", "read_committed", "--property", "print.key=true", "--property", "print.offset=true",
           "--property", "print.value=false"]
    java = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert java.returncode == 0, java.stderr[-2000:]
    assert [line.split()[0:2] for line in java.stdout.splitlines()] == [
        [f"Offset:{o}", k.decode()] for o, k, _ in c.tier]


def _fetch(address: str, topic: str, offset: int) -> list[Any]:
    with WireClient(address, timeout=10) as w:
        resp = w.request(ApiKey.FETCH, 12, fetch_request({topic: {0: offset}}, max_bytes=1 << 20))
    part = resp["responses"][0]["partitions"][0]
    assert part["error_code"] == ErrorCode.NONE, part["error_code"]
    return list(iter_batches(part["records"]))


def test_a_fetch_at_a_removed_offset_answers_the_next_batch_also_across_segments(compacted: Compacted) -> None:
    """As a broker does: inside a segment, and where the cleaner removed a segment's end (the next segment's first
    batch answers)."""
    c = compacted
    held = sorted(o for o, _, _ in c.tier_uncommitted)
    inside = next(o for o in range(1, c.tier_end) if o not in set(held) and o > held[0])
    got = _fetch(c.proxy.bootstrap, c.topic, inside)
    assert got and got[0].last_offset >= inside
    assert next(r.offset for b in got if not b.is_control for r in b.records() if r.offset >= inside) == min(
        o for o in held if o > inside)
    ends = [md for md in c.segments[:-1] if not any(md.end_offset - 1 <= o <= md.end_offset for o in held)]
    assert ends, "no segment whose last offsets the cleaner removed"
    md = ends[0]
    got = _fetch(c.proxy.bootstrap, c.topic, md.end_offset)
    assert got and got[0].base_offset > md.end_offset  # the next segment's, in the same answer


def test_list_offsets_by_time_and_earliest_over_compacted_segments(compacted: Compacted) -> None:
    """ListOffsets by timestamp answers the first record kept at or after the time (the removed ones skipped), and
    earliest answers 0 with its leader epoch (the segment's range starts below its first batch)."""
    c = compacted
    with WireClient(c.proxy.bootstrap, timeout=10) as w:
        def ask(spec: int) -> dict[str, Any]:
            resp = w.request(ApiKey.LIST_OFFSETS, 7, list_offsets_request({c.topic: {0: spec}}))
            p: dict[str, Any] = resp["topics"][0]["partitions"][0]
            assert p["error_code"] == 0, p
            return p

        earliest = ask(OffsetSpec.EARLIEST)
        assert (earliest["offset"], earliest["leader_epoch"]) == (0, 0)
        held = {o for o, _, _ in c.tier_uncommitted}
        removed = next(i for i in range(100, 3000) if i not in held)
        assert ask(c.ts0 + 10 * removed)["offset"] == min(o for o in held if o > removed)


def test_the_spark_reader_reads_the_compacted_history(compacted: Compacted, spark: Any) -> None:
    s = compacted.settings
    rows = read(spark, "tierproxy", {"kafka.bootstrap.servers": s.bootstrap_servers, "storage": s.storage,
                                     "metadata": s.metadata, "subscribe": compacted.topic})
    assert [(r[4], r[0], r[1]) for r in rows] == compacted.tier_uncommitted


def test_the_iceberg_raw_table_holds_the_rows_the_tier_holds(compacted: Compacted) -> None:
    """The raw table (append mode) of a compacted topic: the committed records the tier holds, offsets with gaps."""
    s = compacted.settings
    step = Step(s.bootstrap_servers, Path(str(s.tier_state_dir)).parent, compacted.topic)
    step.run()
    assert [(r[4], r[0], r[1]) for r in pyiceberg_rows(step.table())] == compacted.tier


def test_a_pass_reports_tombstones_at_risk_past_delete_retention_ms(kafka: KafkaCluster, tmp_path: Path,
                                                                   topic_name: str) -> None:
    """A compacted topic first tiered when its oldest record is older than its delete.retention.ms (1 s here): the
    cleaner may have removed tombstones the tier never saw; the pass says so (`TOMBSTONES`), once per partition."""
    create_compacted(kafka.bootstrap, topic_name)
    set_topic_config(kafka.bootstrap, topic_name, "delete.retention.ms", "1000")
    written = produce_updates(kafka.bootstrap, topic_name, n=600, keys=5)
    wait_cleaned(kafka.bootstrap, topic_name, written)
    summary = tier_once(settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=1024))
    assert summary.failed == 0 and len(summary.tombstone_risks) == 1, summary.tombstone_risks
    assert summary.tombstone_risks[0].startswith(f"{topic_name}-0: ") and "delete.retention.ms=1000" in \
        summary.tombstone_risks[0]
