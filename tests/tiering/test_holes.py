"""A copy that keeps failing (its storage refuses it on every attempt) while the copies after it succeed: the
later segments stay (O item 10: the broker may already have deleted their data), the next pass fills the hole
first. While the hole exists, a fetch inside it is answered by the broker where it still holds the offsets, and
over what neither holds as over any gap: from the first offset either holds (never OFFSET_OUT_OF_RANGE, which would
reset the client to before the hole, or past everything; never records from above a hole the broker still holds)."""

from __future__ import annotations

import itertools
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from protocol.constants import ApiKey, ErrorCode
from protocol.records import iter_batches
from protocol.requests import fetch_request
from tests.support.kafka import (
    broker_forgets,
    create_topic,
    set_retention,
    small_segment_producer,
    small_segments,
    watermarks,
)
from tests.support.proxy import ProxyProcess
from tests.support.spark import worker_session
from tests.support.tiering import offsets_of, settings, tiered
from tests.support.waiting import wait_until
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.iceberg.catalog import open_catalog, open_table
from tierproxy.jobs.iceberg.run import options_of as iceberg_options
from tierproxy.jobs.iceberg.run import run_pass
from tierproxy.jobs.iceberg.sync import IcebergSync
from tierproxy.jobs.spark.options import parse_options
from tierproxy.jobs.spark.plan import Planner
from tierproxy.jobs.tiering.copy import CopyResult, CopyTask
from tierproxy.jobs.tiering.job import TieringJob
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
RECORDS = 3000


class _OneCopyRefused(TieringJob):
    """A real job whose copy of the third planned range goes to a storage location that refuses writes."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.refused: tuple[int, int] | None = None

    def _run_tasks(self, tasks: list[CopyTask]) -> list[CopyResult]:
        if self.refused is None and len(tasks) >= 4:
            third = sorted(tasks, key=lambda t: t.start)[2]
            self.refused = (third.start, third.end)
        tasks = [replace(t, storage="file:///proc/tierproxy-refused")
                 if self.refused is not None and t.start == self.refused[0] else t for t in tasks]
        return super()._run_tasks(tasks)


def _topic(kafka: KafkaCluster, tmp: Path, topic: str) -> TierSettings:
    # broker segments of 16 KiB (a batch must fit in one); segment.ms lets broker_forgets' ticks roll the last one
    create_topic(kafka.bootstrap, topic, config={**small_segments(16 * 1024), "segment.ms": "300"})
    p = small_segment_producer(kafka.bootstrap)
    for i in range(RECORDS):
        p.produce(topic, f"v{i}".encode() * 20, f"k{i}".encode())
        if i % 20 == 19:
            p.flush(10)  # small batches: every planned range holds some
    assert p.flush(30) == 0
    return settings(kafka.bootstrap, tmp, topic, tier_segment_bytes=16 * 1024, tier_task_max_attempts=2)


def _pass_with_a_refused_copy(s: TierSettings, topic: str) -> tuple[int, int]:
    """One pass where one copy is refused twice; → the hole it left, [first missing, next tiered)."""
    job = _OneCopyRefused(s, progress=False, spark=worker_session())
    try:
        summary = job.run_once()
    finally:
        job.close()
    assert job.refused is not None and summary.failed == 2, summary  # both attempts of that one copy
    segs = sorted(tiered(s, topic)[0], key=lambda md: md.start_offset)
    holes = [(x.end_offset + 1, y.start_offset) for x, y in itertools.pairwise(segs)
             if y.start_offset > x.end_offset + 1]
    (hole,) = holes  # whole batches: the refused range's, give or take the batch straddling its start
    assert job.refused[0] <= hole[0] < hole[1] <= job.refused[1] + 20, (hole, job.refused)
    return hole


def test_a_failed_copy_leaves_a_hole_the_next_pass_fills(kafka: KafkaCluster, tmp_path: Path,
                                                        topic_name: str) -> None:
    s = _topic(kafka, tmp_path, topic_name)
    a, b = _pass_with_a_refused_copy(s, topic_name)
    segs, raw, _ = tiered(s, topic_name)
    assert offsets_of(raw) == [o for o in range(RECORDS) if not a <= o < b]  # the copies after it stayed
    assert max(md.end_offset for md in segs) == RECORDS - 1
    job = TieringJob(s, progress=False, spark=worker_session())
    try:
        again = job.run_once()
    finally:
        job.close()
    assert again.failed == 0 and again.segments >= 1 and not again.gaps, again
    assert offsets_of(tiered(s, topic_name)[1]) == list(range(RECORDS))


def test_a_fetch_inside_a_hole_reads_on_from_the_next_segment(kafka: KafkaCluster, tmp_path: Path, topic_name: str,
                                                              kcat: str) -> None:
    s = _topic(kafka, tmp_path, topic_name)
    a, b = _pass_with_a_refused_copy(s, topic_name)
    # the hole's records are gone for good, and so are the broker's "tick" records appended to make it delete:
    # a second gap, between the tier's end and the broker's log start, that only the broker can read on from
    log_start = broker_forgets(kafka.bootstrap, topic_name, above=RECORDS)
    hw = watermarks(kafka.bootstrap, topic_name)[1]
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": s.storage,
                                                           "TIERPROXY_METADATA": str(s.metadata)})
    try:
        for start in (0, a + (b - a) // 2):  # from the beginning, and from inside the hole
            out = subprocess.run([kcat, "-b", proxy.bootstrap, "-C", "-t", topic_name, "-p", "0", "-o", str(start),
                                  "-e", "-q", "-f", "%o\n"], capture_output=True, text=True, timeout=120)
            got = [int(x) for x in out.stdout.split()]
            want = [o for o in range(start, RECORDS) if not a <= o < b] + list(range(log_start, hw))
            assert got == want, (start, out.stderr[-500:])
    finally:
        proxy.stop()
    job = TieringJob(s, progress=False, spark=worker_session())
    try:
        later = job.run_once()
    finally:
        job.close()
    gaps = [(a, b - 1)] + ([(RECORDS, log_start - 1)] if log_start > RECORDS else [])
    assert [(g["first_missing"], g["last_missing"]) for g in later.gaps] == gaps  # reported, never copied

    # five more records, never tiered; then the broker deletes everything it has (log start = high watermark):
    # nothing after that gap to read on from. The answer inside it is a batch with no records up to the log
    # start, which moves the client there (before: empty answers, the client one short of the HW forever)
    tiered_end = hw - 1  # the pass above copied the broker's records up to its high watermark
    assert offsets_of(tiered(s, topic_name)[1])[-1] == tiered_end
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for _ in range(5):
        p.produce(topic_name, b"late")
    p.flush(10)
    set_retention(kafka.bootstrap, topic_name, 1000)
    try:
        empty_to = wait_until(lambda: (w := watermarks(kafka.bootstrap, topic_name))[0] == w[1] and w[0],
                               "the broker deletes all it has", timeout=60, interval=0.5)
    finally:
        set_retention(kafka.bootstrap, topic_name, 3_600_000)
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": s.storage,
                                                           "TIERPROXY_METADATA": str(s.metadata)})
    try:
        def answered() -> dict[str, Any] | None:
            with WireClient(proxy.bootstrap) as w:
                resp = w.request(ApiKey.FETCH, 12, fetch_request({topic_name: {0: hw}}, max_bytes=1 << 20))
            got: dict[str, Any] = resp["responses"][0]["partitions"][0]
            # REPLICA_NOT_AVAILABLE is the retriable answer while the new proxy loads the tier's metadata (its port
            # opens first): a client retries it, so does the test (a CI run asked before the load ended)
            return None if got["error_code"] == ErrorCode.REPLICA_NOT_AVAILABLE else got

        part = wait_until(answered, "a fetch answered without a retriable error", timeout=60, interval=0.2)
        (empty,) = iter_batches(part["records"])
        assert (part["error_code"], part["high_watermark"]) == (0, empty_to)
        assert (empty.base_offset, empty.last_offset, list(empty.records()), empty.crc_ok()) == \
            (hw, empty_to - 1, [], True)
        out = subprocess.run([kcat, "-b", proxy.bootstrap, "-C", "-t", topic_name, "-p", "0", "-o", "0", "-e", "-q",
                              "-f", "%o\n"], capture_output=True, text=True, timeout=120)
        assert [int(x) for x in out.stdout.split()] == \
            [o for o in range(RECORDS) if not a <= o < b] + list(range(log_start, hw))
    finally:
        proxy.stop()


def _slices_cover(s: TierSettings, topic: str) -> list[int]:
    """The offsets the DataFrame reader's plan reads (includeLive, failOnDataLoss=false), tier and brokers."""
    plan = Planner(parse_options({"kafka.bootstrap.servers": s.bootstrap_servers, "storage": s.storage,
                                  "metadata": str(s.metadata), "subscribe": topic, "includeLive": "true",
                                  "failOnDataLoss": "false"})).plan()
    return sorted({o for sl in plan for o in range(sl.start, sl.end)})


def _iceberg_offsets(s: TierSettings, job: TieringJob) -> list[int]:
    """One Iceberg pass (the embedded catalog beside the tier), then the table's offsets."""
    options = iceberg_options(s)
    run_pass(IcebergSync(options, job.spark))
    table = open_table(open_catalog(options.catalog), options.catalog, options.table)
    return sorted(table.scan(selected_fields=("offset",)).to_arrow().column("offset").to_pylist())


def test_a_hole_under_the_brokers_log_start_skips_nothing_either_holds(kafka: KafkaCluster, tmp_path: Path,
                                                                     topic_name: str, kcat: str) -> None:
    """The broker's log start moves into the hole: [a, cut) is gone from both (a gap), [cut, b) only the broker
    holds. A consumer from 0 reads [0, a) from the tier, then the broker from cut; the DataFrame reader plans the
    same; the Iceberg table stops at the hole until the next pass fills [cut, b), then gets those rows once.
    Before: the proxy answered the fetch at a from the tiered segment at b, skipping [cut, b)."""
    s = _topic(kafka, tmp_path, topic_name)
    a, b = _pass_with_a_refused_copy(s, topic_name)
    cut = a + (b - a) // 2
    assert a < cut < b
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    (done,) = admin.delete_records([TopicPartition(topic_name, 0, cut)]).values()
    assert done.result(30).low_watermark == cut  # the broker alone: no purge recorded in the tier
    held = [o for o in range(RECORDS) if o < a or o >= cut]

    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": s.storage,
                                                           "TIERPROXY_METADATA": str(s.metadata)})
    try:
        out = subprocess.run([kcat, "-b", proxy.bootstrap, "-C", "-t", topic_name, "-p", "0", "-o", "0", "-e", "-q",
                              "-f", "%o\n"], capture_output=True, text=True, timeout=120)
        assert [int(x) for x in out.stdout.split()] == held, out.stderr[-500:]
        assert "are neither tiered nor on the broker" in proxy.log_text()  # the gap [a, cut), logged as such
    finally:
        proxy.stop()
    assert _slices_cover(s, topic_name) == held

    iceberg = settings(s.bootstrap_servers, tmp_path, topic_name, iceberg_catalog="embedded")
    job = TieringJob(iceberg, progress=False, spark=worker_session())
    try:
        assert _iceberg_offsets(iceberg, job) == list(range(a))  # held back at the hole the next pass fills
        filled = job.run_once()
        assert [(g["first_missing"], g["last_missing"]) for g in filled.gaps] == [(a, cut - 1)]
        # the refill copies whole batches: the one straddling cut comes whole (its records below cut are not a
        # recorded purge, so the tier keeps them, as it keeps what the broker's retention deletes)
        refilled = offsets_of(tiered(s, topic_name)[1])
        straddle = next(o for o in refilled if o >= a)
        assert a < straddle <= cut and refilled == [o for o in range(RECORDS) if o < a or o >= straddle]
        assert _iceberg_offsets(iceberg, job) == refilled  # the refilled rows, once; past the gap for good
        assert _iceberg_offsets(iceberg, job) == refilled
    finally:
        job.close()
