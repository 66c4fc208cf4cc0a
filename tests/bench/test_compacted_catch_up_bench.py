"""Catch-up of a compacted partition (issue 66): the same compacted log read from offset 0 through the proxy, from
the tier's compacted segments, and directly from the broker's own log, cleaned by its cleaner; interleaved rounds.

Every topic has a twin with the same records in the same order (one idempotent producer writes each update to both,
no transactions: offset i is update i in both). `cleanup.policy=compact,delete`, 16 MiB segments, updates over a
key space of a fifth of their count (~1/5 of them live in the end, 5 % tombstones), timestamped an hour ago, with a
compaction lag of two hours (nothing is cleaned while they are produced); the active segment is rolled past them.
Then `cdirect-*`'s lag goes to 0 and the broker's cleaner cleans it, waited for until its cleaner-offset-checkpoint
passes the last update (cleaned as it was produced, a last dirty stretch under min.cleanable.dirty.ratio would
stay). `ctiered-*` is tiered raw by one pass, then its lag goes to 0 and the next pass compacts the tier (the tier's
own compaction step); then the broker deletes everything the tier holds (retention.ms half an hour: the updates are
an hour old). Both reads must give the same records, offsets, keys and values, which are what Kafka's rules give
for the updates (each key's last update, tombstones kept: delete.retention.ms is a day); a difference is reported
before the test fails on it.

Each round starts a fresh proxy and reads with kcat, then kafka-consumer-perf-test, each tool the proxy and the
direct twin in turn (which goes first alternates by round), and kcat once more through the same proxy (warm: its
connections made, the tier's metadata and files open); the ratio proxy/direct is taken within a round. Rounds
for `remote.authorization.cache.ms` 0 (the default: the broker authorizes every fetch of the tier, a round trip
each) and 1000 (a connection the broker authorized less than a second ago is not asked again).

    flock /tmp/bench.lock pytest -m bench tests/bench/test_compacted_catch_up_bench.py -s -p no:randomly
    (TIERPROXY_BENCH_COMPACTED_MIB produced per topic, default 512; TIERPROXY_BENCH_COMPACTED_ROUNDS, default 3)
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import time
from functools import partial
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.bench.clients import kcat_args, perf_test_mbps
from tests.bench.report import cpu_seconds, report
from tests.support.compacted import COMPACTED, Rec, cleaned_to, consume, roll
from tests.support.kafka import create_topic, set_topic_config, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark]
# 512 MiB produced leaves ~100 MB to read: a read of the 25 MB that 128 MiB leaves lasts ~0.1 s, kcat's start and
# first fetches a large part of it
MIB = int(os.environ.get("TIERPROXY_BENCH_COMPACTED_MIB", "512"))
ROUNDS = int(os.environ.get("TIERPROXY_BENCH_COMPACTED_ROUNDS", "3"))
SIZES = (1024, 200)
WINDOWS = (0, 1000)  # remote.authorization.cache.ms: 0, the default, the broker authorizes every fetch
HOUR_MS = 3_600_000


def _updates(size: int, seed: int) -> list[Rec]:
    """(offset, key, value) of `MIB` MiB of `size`-byte values over `count / 5` keys, every 20th a tombstone."""
    count = (MIB << 20) // size
    rng, pad = random.Random(seed), b"x" * (size - 10)
    return [(i, b"k%07d" % rng.randrange(count // 5), None if i % 20 == 7 else b"%09d|" % i + pad)
            for i in range(count)]


def _compacted(updates: list[Rec]) -> list[Rec]:
    """What Kafka's cleaner leaves of `updates` (a day before tombstones go): each key's last update."""
    last = {k: (o, k, v) for o, k, v in updates}
    return sorted(last.values())


def _produce(bootstrap: str, topics: tuple[str, str], updates: list[Rec], ts: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 262144, "compression.type": "none",
                  "queue.buffering.max.messages": 2_000_000, "enable.idempotence": True})
    for _, k, v in updates:
        for topic in topics:
            while True:
                try:
                    p.produce(topic, v, k, partition=0, timestamp=ts)
                    break
                except BufferError:  # the local queue is full: let it drain
                    p.poll(0.1)
    assert p.flush(120) == 0


def _differences(a: list[Rec], b: list[Rec]) -> str:
    """'' when equal, else how they differ (records only one holds, by offset, a few of each)."""
    sa, sb = set(a), set(b)
    only_a, only_b = sorted(sa - sb), sorted(sb - sa)
    if not only_a and not only_b:
        return ""
    return (f"{len(only_a)} records only direct (e.g. {[(o, k) for o, k, _ in only_a[:3]]}), {len(only_b)} only "
            f"through the proxy (e.g. {[(o, k) for o, k, _ in only_b[:3]]})")


def _deleted_below(bootstrap: str, topic: str, end: int) -> bool:
    return watermarks(bootstrap, topic)[0] >= end


def _kcat(kcat: str, bootstrap: str, topic: str, count: int) -> tuple[float, float]:
    """kcat reading `count` records from offset 0: (ms to its first record, seconds in all)."""
    start = time.perf_counter()
    with subprocess.Popen(kcat_args(kcat, bootstrap, topic, count), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        n = 1 if proc.stdout.readline() else 0
        first_ms = (time.perf_counter() - start) * 1000
        while chunk := proc.stdout.read(1 << 20):  # bounded: kcat stops at `count`
            n += chunk.count(b"\n")
        assert proc.wait(600) == 0
    assert n == count, (topic, n, count)
    return first_ms, time.perf_counter() - start


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})"


@pytest.mark.timeout(1200)
def test_compacted_catch_up_through_the_proxy_vs_the_brokers_cleaned_log(kafka: KafkaCluster, kcat: str,
                                                                        tmp_path: Path) -> None:
    began, boot = time.perf_counter(), kafka.bootstrap
    ts = int(time.time() * 1000) - HOUR_MS
    expected: dict[int, list[Rec]] = {}
    for size in SIZES:
        for kind in ("cdirect", "ctiered"):
            create_topic(boot, f"{kind}-{size}", config={
                **COMPACTED, "cleanup.policy": "compact,delete", "segment.bytes": str(16 << 20),
                "retention.ms": str(3 * HOUR_MS), "min.compaction.lag.ms": str(2 * HOUR_MS)})
        updates = _updates(size, seed=size)
        _produce(boot, (f"cdirect-{size}", f"ctiered-{size}"), updates, ts)
        end = len(updates)
        assert watermarks(boot, f"cdirect-{size}")[1] == watermarks(boot, f"ctiered-{size}")[1] == end
        for kind in ("cdirect", "ctiered"):
            roll(kafka, f"{kind}-{size}", end)
        expected[size] = _compacted(updates)
        del updates
    produced_s = time.perf_counter() - began

    began = time.perf_counter()
    for size in SIZES:  # the broker cleans the whole log at once
        set_topic_config(boot, f"cdirect-{size}", "min.compaction.lag.ms", "0")
    wait_until(lambda: all(cleaned_to(kafka, f"cdirect-{size}") >= (MIB << 20) // size for size in SIZES),
               "the broker's cleaner cleans the direct twins", timeout=300, interval=0.5)
    broker_clean_s = time.perf_counter() - began

    s = settings(boot, tmp_path, "ctiered-", tier_topics="ctiered-.*", tier_segment_bytes=16 << 20)
    began = time.perf_counter()
    copied = tier_once(s.model_copy(update={"tier_cleaner_enable": False}))
    copy_s = time.perf_counter() - began
    assert copied.failed == 0 and not copied.gaps and copied.segments >= len(SIZES), copied.line()
    for size in SIZES:
        set_topic_config(boot, f"ctiered-{size}", "min.compaction.lag.ms", "0")
    began = time.perf_counter()
    compacted = tier_once(s)
    compact_s, done = time.perf_counter() - began, compacted.compaction
    assert compacted.failed == 0 and done.get("partitions") == len(SIZES) and done["failed"] == 0, done
    for size in SIZES:  # the broker deletes what the tier holds: the updates are an hour old, the ticks new
        set_topic_config(boot, f"ctiered-{size}", "retention.ms", str(HOUR_MS // 2))
    for size in SIZES:
        end = (MIB << 20) // size
        wait_until(partial(_deleted_below, boot, f"ctiered-{size}", end), f"the broker deletes ctiered-{size} "
                   f"below {end}", timeout=120, interval=0.5)

    figures, findings = [], []
    for window, size in ((w, z) for w in WINDOWS for z in SIZES):
        want, end = expected[size], (MIB << 20) // size
        count, payload = len(want), sum(len(k or b"") + len(v or b"") for _, k, v in want)
        kcat_r, again_r, java_r, kcat_d, kcat_p, java_d, java_p, cpu = [], [], [], [], [], [], [], []
        first: dict[str, list[float]] = {"proxy": [], "direct": []}
        for r in range(ROUNDS):
            proxy = ProxyProcess(boot, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                        "TIERPROXY_METADATA": f"file://{tmp_path}/meta",
                                                        "TIERPROXY_REMOTE_AUTHORIZATION_CACHE_MS": str(window)})
            try:
                wait_until(partial(proxy_serves_tier, proxy.bootstrap, f"ctiered-{size}"), "the proxy's tier",
                           timeout=60)
                sides = [("proxy", proxy.bootstrap, f"ctiered-{size}"), ("direct", boot, f"cdirect-{size}")]
                order = sides if r % 2 == 0 else sides[::-1]
                took, mbps = {}, {}
                c0 = cpu_seconds(proxy.proc.pid)
                for name, bootstrap, topic in order:
                    first_ms, took[name] = _kcat(kcat, bootstrap, topic, count)
                    first[name].append(first_ms)
                cpu.append((cpu_seconds(proxy.proc.pid) - c0) / (payload / 1e9))
                took["again"] = _kcat(kcat, proxy.bootstrap, f"ctiered-{size}", count)[1]  # the proxy warm
                for name, bootstrap, topic in order:
                    mbps[name] = perf_test_mbps(kafka.libs, bootstrap, topic, count)
                if r == 0 and window == WINDOWS[0]:  # (after the cold read) the same content both ways, and Kafka's
                    # rules' for the updates
                    direct = consume(boot, f"cdirect-{size}", end, timeout=300)
                    through = consume(proxy.bootstrap, f"ctiered-{size}", end, timeout=300)
                    for name, got in (("direct", direct), ("proxy", through)):
                        if diff := _differences(want, got):
                            findings.append(f"{size} B: {name} vs Kafka's rules: {diff}")
                    if diff := _differences(direct, through):
                        findings.append(f"{size} B: direct vs proxy: {diff}")
                    del direct, through
            finally:
                proxy.stop()
            kcat_r.append(took["direct"] / took["proxy"])
            again_r.append(took["direct"] / took["again"])
            java_r.append(mbps["proxy"] / mbps["direct"])
            kcat_d.append(took["direct"])
            kcat_p.append(took["proxy"])
            java_d.append(mbps["direct"])
            java_p.append(mbps["proxy"])
        med_p, med_d = statistics.median(kcat_p), statistics.median(kcat_d)
        figures.append(
            f"window {window} ms, {size} B records ({end:,} updates, {MIB} MiB produced; {count:,} left, "
            f"{payload / 1e6:.1f} MB): kcat "
            f"{_spread(kcat_r)} ({count / med_p / 1e3:,.0f}k records/s, {payload / 1e6 / med_p:.0f} MB/s through the "
            f"proxy vs {count / med_d / 1e3:,.0f}k, {payload / 1e6 / med_d:.0f} MB/s direct, medians), "
            f"first record {statistics.median(first['proxy']):.0f} ms after kcat's start (direct "
            f"{statistics.median(first['direct']):.0f} ms), the same proxy again {_spread(again_r)}; "
            f"kafka-consumer-perf-test {_spread(java_r)} ({statistics.median(java_p):.0f} vs "
            f"{statistics.median(java_d):.0f} MB/s fetch); proxy CPU {statistics.median(cpu):.2f} core-s/GB (kcat)")
        print(figures[-1], flush=True)
    report("compacted catch-up through the proxy vs the broker's cleaned log (ratios per round: median (min-max))",
           f"produced {produced_s:.0f} s; broker's cleaner {broker_clean_s:.0f} s; tier copy pass {copy_s:.0f} s, "
           f"compaction pass {compact_s:.0f} s ({done['bytes_before'] / 1e6:.0f} -> {done['bytes_after'] / 1e6:.0f} "
           f"MB); " + "; ".join(figures) + "; content: " + ("; ".join(findings) or "the same records both ways, "
                                                             "as Kafka's rules give"))
    assert not findings, findings
