"""Issue 66's compaction benchmarks: the tier's engine against Kafka's own LogCleaner on the same bytes.

A broker of the benchmark's own (Kafka 4.1, full JIT: `-Xmx1g -Xms128m -XX:+UseG1GC`, no C1-only flag, no class
sharing archive; `log.cleaner.threads=1`, the default 128 MiB dedupe buffer), its cleaner warmed on another topic
first. A history of 1,000,000 updates over 100,000 keys (100 B values, 5 % tombstones) is produced as a normal
producer batches it into a topic of 16 MiB segments with cleaning held off (min.compaction.lag.ms huge); its
closed segment files are copied (the exact bytes), then the broker cleans them once (the whole closed log: the
dirty section in its log). Kafka's figures are its cleaner's own (server.log, `LogCleaner.recordStats`: MB are MiB
of the whole log the copy read, over the cleaning's wall time, the map's share apart). The tier's: the same segment
bytes through `plan_cleaning` + `clean_partition` in this process, one thread, timed in CPU and wall, at the
broker's cleaning time (read back from the delete horizon it stored), the same settings; both give the same key →
(offset, value) map.

Then the bytes after compaction against the live key set: the tier cleans again once the tombstones' horizon
passed (with the broker's active segment appended, as the tier copies it once closed), against a topic holding one
record per live key (its latest value) produced by the same producer.

    pytest -m bench tests/bench/test_compaction_bench.py -s -p no:randomly
    (TIERPROXY_BENCH_COMPACTION_RECORDS, default 1,000,000, keys are a tenth; TIERPROXY_BENCH_COMPACTION_CODEC,
    the producer's compression.type, default none; TIERPROXY_BENCH_COMPACTION_SEGMENT_MIB, default 16: 2 with lz4,
    whose log of these values is about ten times smaller; TIERPROXY_BENCH_COMPACTION_KEYS, default 10,000,000, for the
    memory one)
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.records import Record, build_batch, iter_batches
from tests.bench import compaction_data as cd
from tests.bench.compaction_memory import compact_in_a_fresh_process, measured_task, write_tier
from tests.bench.report import report
from tests.support.compaction import Tier, decode, latest_values
from tests.support.fetchraw import fetch_raw
from tests.support.s3 import S3Server
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.tiering import compact
from tierproxy.tier.compaction import CleanerConfig, TierSegment

pytestmark = [pytest.mark.bench, pytest.mark.kafka]

RECORDS = int(os.environ.get("TIERPROXY_BENCH_COMPACTION_RECORDS", "1000000"))
CODEC = os.environ.get("TIERPROXY_BENCH_COMPACTION_CODEC", "none")  # the producer's compression.type
SEGMENT = int(os.environ.get("TIERPROXY_BENCH_COMPACTION_SEGMENT_MIB", "16")) << 20  # (lz4: 2 for a few segments)
RETENTION = 5_000  # delete.retention.ms: the tombstones' horizon passes within the run
MIB = 1 << 20


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(workdir=tmp_path_factory.mktemp("cbench-kafka"), heap="1g", broker_config={
        "log.cleaner.threads": "1", "log.cleaner.dedupe.buffer.size": str(cd.DEDUPE_BUFFER),
        "log.cleaner.backoff.ms": "500"})
    assert not cluster.default_jvm_options and not cluster.class_sharing, "the baseline needs the full JIT"
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _warm(kafka: KafkaCluster) -> None:
    """The cleaner's code compiled before the measured cleaning, as a long-running broker's is."""
    cd.create_held_off(kafka, "warm", 4 << 20, RETENTION)
    cd.produce(kafka.bootstrap, "warm", cd.history(300_000, 30_000, seed=1))
    cd.let_clean(kafka, "warm")


class Clock:
    """The engine's reads, timed: `clean_partition` reads each segment for its txn index, then the dirty ones for
    the key map, then each again for the copy (`at[n]`: wall and CPU time of the first n-th read of a segment)."""

    def __init__(self) -> None:
        self.reads: dict[bytes, int] = {}
        self.at: dict[int, tuple[float, float]] = {}

    def __call__(self, s: TierSegment) -> None:
        n = self.reads[s.segment_id] = self.reads.get(s.segment_id, 0) + 1
        self.at.setdefault(n, (time.perf_counter(), time.thread_time()))


def test_compaction_against_kafkas_cleaner(broker: KafkaCluster, s3: S3Server, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    _warm(broker)
    topic = "cbench"
    cd.create_held_off(broker, topic, SEGMENT, RETENTION)
    recs = cd.history(RECORDS, RECORDS // 10)
    began = time.monotonic()
    cd.produce(broker.bootstrap, topic, recs, CODEC)
    produced_s = time.monotonic() - began
    segments = cd.closed_segments(broker, topic)
    active = cd.active_base(broker, topic)
    # the tier job copies the same log into the real S3 server (its compaction held off as the broker's is)
    s3.create_bucket("cbench")
    tiering = settings(broker.bootstrap, tmp_path, topic, storage=f"s3://cbench/t?endpoint={s3.endpoint}&region="
                       f"{s3.region}", tier_segment_bytes=SEGMENT)
    assert tier_once(tiering).failed == 0

    cpu_before = cd.cleaner_cpu_seconds(broker)
    kafka = cd.let_clean(broker, topic)
    kafka_cpu = cd.cleaner_cpu_seconds(broker) - cpu_before  # (its idle wake-ups: a few ms)
    assert (kafka.first_dirty, kafka.end) == (0, active), f"not one cleaning of the whole closed log: {kafka}"
    broker_batches = [b for b in decode(fetch_raw(broker.bootstrap, topic, end=active)[0]) if b.base < active]
    horizons = [b.horizon for b in broker_batches if b.horizon is not None]
    assert horizons, "no delete horizon stored: the history needs tombstones"
    now = max(horizons) - RETENTION  # the broker's cleaning time (KIP-534: horizon = now + delete.retention.ms)
    kafka_bytes = cd.log_bytes(broker, topic) - (cd.log_dir(broker, topic) / f"{active:020d}.log").stat().st_size

    tier = Tier(CleanerConfig(delete_retention_ms=RETENTION, segment_bytes=SEGMENT))
    for seg in segments:
        tier.append([bytes(b.view()) for b in iter_batches(seg)])
    raw_bytes = sum(len(s) for s in segments)
    warm = Tier(CleanerConfig(delete_retention_ms=RETENTION, segment_bytes=SEGMENT), kernel=tier.kernel)
    for seg in segments[:2]:  # the compiled loops loaded (or compiled) outside the timing, as a running job has them
        warm.append([bytes(b.view()) for b in iter_batches(seg)])
    assert warm.clean(now, map_bytes=1 << 20)
    print(f"engine kernel: {type(tier.kernel).__name__}")
    clock = Clock()
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    cleaned = tier.clean(now, map_bytes=cd.DEDUPE_BUFFER, on_read=clock)
    wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
    assert cleaned and set(clock.reads.values()) == {3}, clock.reads
    (map_wall0, map_cpu0), (copy_wall0, copy_cpu0) = clock.at[2], clock.at[3]
    map_wall, map_cpu = copy_wall0 - map_wall0, copy_cpu0 - map_cpu0
    copy_wall, copy_cpu = wall0 + wall - copy_wall0, cpu0 + cpu - copy_cpu0
    ours = tier.batches()
    assert latest_values(ours) == latest_values(broker_batches)  # the same surviving key → (offset, value)
    assert ours == broker_batches  # and the same batches, horizons included

    # the tier job's compaction step over its copy, its task in a Spark worker (the task's own time)
    tasks = tmp_path / "tasks.json"
    monkeypatch.setattr(compact, "compact_task", functools.partial(measured_task, compact.compact_task, str(tasks)))
    step = tier_once(tiering).compaction
    spark_task = json.loads(tasks.read_text().splitlines()[-1])
    assert step["partitions"] == 1 and not spark_task["error"], (step, spark_task)

    mib = raw_bytes / MIB
    kafka_rate = kafka.read_mb / kafka.seconds
    kafka_map = kafka.indexed_mb / max(kafka.index_seconds, 0.05)
    task_mib = spark_task["bytes_in"] / MIB
    report("compaction vs Kafka's cleaner", (
        f"{RECORDS:,} updates over {RECORDS // 10:,} keys (100 B values, 5 % tombstones, compression {CODEC}, "
        f"produced in {produced_s:.1f} s), {len(segments)} closed segments of {SEGMENT // MIB} MiB, {mib:.1f} MiB, "
        f"one cleaning at the same time and settings; Kafka 4.1's cleaner (1 thread, full JIT, warm): "
        f"{kafka.seconds:.1f} s wall, "
        f"{kafka_rate:.1f} MiB/s, its thread {kafka_cpu:.2f} CPU-s: {mib / kafka_cpu:.1f} MiB/s per CPU-second "
        f"(map {kafka.index_seconds:.1f} s, {kafka_map:.1f} MiB/s; copy {kafka.clean_seconds:.1f} s); the tier's "
        f"engine in one thread: {wall:.2f} s wall, {cpu:.2f} s CPU, {mib / cpu:.1f} MiB/s per CPU-second (map "
        f"{map_cpu:.2f} s CPU / {map_wall:.2f} s wall, copy {copy_cpu:.2f} s CPU / {copy_wall:.2f} s wall, the "
        f"rest plan and txn indexes): {kafka_cpu / cpu:.2f}x Kafka per CPU-second ({mib / wall / kafka_rate:.2f}x "
        f"its wall rate); "
        f"{kafka.start_messages:,} → {kafka.end_messages:,} records on both sides, the same batches; the tier job's "
        f"compaction step on Spark against S3 (context): its task {task_mib:.1f} MiB in {spark_task['wall_s']:.2f} s "
        f"wall, {spark_task['cpu_s']:.2f} s CPU ({task_mib / spark_task['cpu_s']:.1f} MiB/s per CPU-second; reads, "
        f"writes and uploads included; the step {step['seconds']:.1f} s)"))

    # the bytes after compaction: the tombstones' horizon passes, and the tier cleans again once something is dirty
    # (here one new key: a cleaned log with nothing dirty is not cleaned again, by Kafka's rules too); against the
    # closed log's live key set and that key, produced alike
    tick = (b"tick", b"t")
    later = max(now + RETENTION + 1, int(time.time() * 1000))
    tier.append([build_batch([Record(active, later, *tick)], base_offset=active)])
    tier.config = dataclasses.replace(tier.config, min_cleanable_dirty_ratio=0.0)  # (one record is dirty enough)
    assert tier.clean(later, map_bytes=cd.DEDUPE_BUFFER)
    after = tier.batches()
    assert not any(v is None for b in after for _, _, v in b.records), "tombstones past their horizon kept"
    live = [*cd.live_set(recs[:active]), tick]
    assert {k: v for k, (_, v) in latest_values(after).items()} == dict(live)
    cd.create_held_off(broker, "cbench-live", SEGMENT, RETENTION)
    cd.produce(broker.bootstrap, "cbench-live", live, CODEC)
    live_bytes = len(fetch_raw(broker.bootstrap, "cbench-live")[0])
    tier_bytes = len(tier.log())
    report("compaction bytes vs the live key set", (
        f"{len(live):,} live keys of {RECORDS // 10:,}: the tier's log after a second cleaning past the tombstones' "
        f"horizon {tier_bytes / MIB:.2f} MiB ({len(after):,} batches) against {live_bytes / MIB:.2f} MiB for one "
        f"record per live key produced alike: {tier_bytes / live_bytes:.2f}x (goal ≤ 1.2x); Kafka's own cleaned "
        f"closed log {kafka_bytes / MIB:.2f} MiB after its one cleaning (tombstones kept until their horizon; the "
        f"raw closed log {mib:.1f} MiB)"))
    assert tier_bytes / live_bytes <= 1.2


MEMORY_KEYS = int(os.environ.get("TIERPROXY_BENCH_COMPACTION_KEYS", "10000000"))


def test_compaction_task_memory_is_bounded_by_the_setting(tmp_path: Path) -> None:
    """10,000,000 distinct keys (generated, written into a file tier as the tier job writes its copies: producing
    them through a broker would take longer than the measurement); the compaction step's task in a fresh process
    at tier.cleaner.dedupe.buffer.size 64 MiB (twice: the map fills, the next pass goes on) and 256 MiB."""
    began = time.monotonic()
    written, segments = asyncio.run(write_tier(f"file://{tmp_path}/meta", f"file://{tmp_path}/tier", "mem",
                                               MEMORY_KEYS))
    write_s = time.monotonic() - began
    # min.cleanable.dirty.ratio low: the second pass goes on whatever share of the log the first one cleaned
    configs = {"cleanup.policy": "compact", "segment.bytes": str(32 << 20), "min.cleanable.dirty.ratio": "0.01"}
    runs = []
    for run, map_mib in enumerate((64, 64, 256)):
        copy = tmp_path / ("small" if map_mib == 64 else "large")  # each setting from the same uncleaned tier
        if run != 1:
            for part in ("meta", "tier"):
                shutil.copytree(tmp_path / part, copy / part)
        got = compact_in_a_fresh_process(f"file://{copy}/meta", f"file://{copy}/tier", "mem", map_mib * MIB, configs)
        assert not got["error"] and not got["summary"]["errors"], got
        runs.append((map_mib, got))
    reach = [r["cleaned_to"] + 1 for _, r in runs]
    # the 64 MiB map fills (~2.5M keys: 24 B entries at a 0.9 load): the first pass cleans part of the log, the
    # second goes further; the 256 MiB one holds every key
    assert 0 < reach[0] < reach[1] and reach[0] < MEMORY_KEYS and reach[2] == MEMORY_KEYS, reach
    lines = [f"{m} MiB: task peak {r['peak_mib'] - r['rss_before_mib']:.0f} MiB over its {r['rss_before_mib']:.0f} "
             f"MiB before ({r['peak_mib']:.0f} MiB peak), cleaned up to offset {r['cleaned_to'] + 1:,} in "
             f"{r['wall_s']:.0f} s ({r['cpu_s']:.0f} CPU-s)" for m, r in runs]
    report("compaction task memory", (
        f"{MEMORY_KEYS:,} distinct keys, {written / MIB:.0f} MiB in {segments} tier segments (written in "
        f"{write_s:.0f} s); the step's task in a fresh process: " + "; ".join(lines)
        + " (the 64 MiB map filled in the first pass; the second went on, recopying the cleaned prefix as Kafka's "
          "cleaner does)"))
    for m, r in runs:
        # the map, then segments read and written (groups of up to 32 MiB) and the allocator's slack: a bound that
        # fails if a task's memory grows with the partition's key count or size rather than with the setting
        assert r["peak_mib"] - r["rss_before_mib"] < m + 8 * 32, (m, r)
