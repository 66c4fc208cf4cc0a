"""Remote catch-up benchmark, same run, same data: kcat reading a topic from offset 0 through tierproxy after the
broker deleted it (filesystem tier and S3 tier on moto) vs kcat reading the same topic directly from the broker
while it was still local; and the proxy's peak RSS with 100 concurrent remote consumers.

    pytest -m bench tests/bench/test_remote_bench.py -s     (TIERPROXY_BENCH_REMOTE_RECORDS, default 262144 x 1 KiB;
                                                             TIERPROXY_BENCH_S3_LATENCY_RECORDS, default 524288)
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from protocol.constants import ApiKey, OffsetSpec
from protocol.requests import list_offsets_request
from tests.bench.clients import (
    CLIENT_BUSY,
    RECORDS,
    forget_tiered,
    kcat_args,
    kcat_mbps,
    perf_test_mbps,
    produce,
    served_from_file_tier,
)
from tests.bench.report import cpu_seconds, peak_rss_mib, report
from tests.support.kafka import create_topic, set_retention, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.relay import DelayRelay
from tests.support.s3 import S3Server
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]
# catch-up with slow S3 reads 512 MiB: long enough that a cold proxy's first round trips (index, first chunk) are
# not most of the run; the time to the first record is reported beside it
S3_LATENCY_RECORDS = int(os.environ.get("TIERPROXY_BENCH_S3_LATENCY_RECORDS", str(1 << 19)))








def _kcat_first_and_mbps(kcat: str, bootstrap: str, topic: str, count: int) -> tuple[float, float]:
    """(seconds to the first record, MB/s over the whole run) of a kcat reading `count` records from offset 0."""
    start = time.perf_counter()
    with subprocess.Popen(kcat_args(kcat, bootstrap, topic, count), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        first_s = time.perf_counter() - start
        n = 1 if first else 0
        while chunk := proc.stdout.read(1 << 20):  # bounded by `count` lines: kcat stops there
            n += chunk.count(b"\n")
        assert proc.wait(900) == 0
    elapsed = time.perf_counter() - start
    assert n >= count
    return first_s, n * 1024 / 1e6 / elapsed


def _native_remote_mbps(kcat: str, tmp: Path, count: int) -> tuple[float, float]:
    """Kafka's own tiered storage (LocalTieredStorage from the kafka-storage test jar): the same data, read from
    offset 0 once the broker keeps only the tail locally, by kcat and by the Java consumer (MB/s each)."""
    cfg = {"remote.log.storage.system.enable": "true",
           "remote.log.storage.manager.class.name": "org.apache.kafka.server.log.remote.storage.LocalTieredStorage",
           "rsm.config.dir": str(tmp / "native-remote"), "remote.log.metadata.manager.listener.name": "PLAINTEXT",
           "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
           "remote.log.manager.task.interval.ms": "1000"}
    native = KafkaCluster(1, workdir=tmp / "native", broker_config=cfg).start()
    try:
        topic = "bench-native"
        create_topic(native.bootstrap, topic, config={"remote.storage.enable": "true", "local.retention.ms": "1000",
                                                      "segment.bytes": str(32 << 20)})
        produce(native, topic, RECORDS)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with WireClient(native.bootstrap) as w:
                r = w.request(ApiKey.LIST_OFFSETS, 9, list_offsets_request({topic: {0: OffsetSpec.EARLIEST_LOCAL}}))
            if r["topics"][0]["partitions"][0]["offset"] >= count:
                break
            time.sleep(2)
        return (max(kcat_mbps(kcat, native.bootstrap, topic, count) for _ in range(2)),
                max(perf_test_mbps(native.libs, native.bootstrap, topic, count) for _ in range(2)))
    finally:
        native.stop()


def test_remote_catch_up_vs_direct_tail(kafka: KafkaCluster, kcat: str, s3: S3Server, tmp_path: Path) -> None:
    topic = "bench-remote"
    create_topic(kafka.bootstrap, topic, config={"segment.bytes": str(32 << 20)})
    produce(kafka, topic, RECORDS)
    # the same read as the remote runs (`-c RECORDS`): kcat's `-e` waits out a last empty fetch, which would halve it
    direct = max(kcat_mbps(kcat, kafka.bootstrap, topic, RECORDS) for _ in range(2))

    s3.create_bucket("tier")
    tiers = {"filesystem": (f"file://{tmp_path}/tier", f"file://{tmp_path}/meta-fs"),
             "s3": (f"s3://tier/b?endpoint={s3.endpoint}&region={s3.region}", f"file://{tmp_path}/meta-s3")}
    for storage, metadata in tiers.values():
        assert tier_once(settings(kafka.bootstrap, tmp_path, topic, storage=storage, metadata=metadata,
                                  tier_segment_bytes=32 << 20)).failed == 0
    set_retention(kafka.bootstrap, topic, 1000)
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": kafka.bootstrap})
    deadline = time.monotonic() + 120
    while watermarks(kafka.bootstrap, topic)[0] < RECORDS // 2 and time.monotonic() < deadline:
        p.produce(topic, b"x" * 1024, partition=0)
        p.flush(5)
        time.sleep(0.5)
    set_retention(kafka.bootstrap, topic, 3_600_000)
    figures = [f"direct tail {direct:.0f} MB/s"]
    cpu: dict[str, float] = {}
    for name, (storage, metadata) in tiers.items():
        proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
            "TIERPROXY_STORAGE": storage, "TIERPROXY_METADATA": metadata,
            "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
        try:
            proxy.wait_tier_ready()
            # a fresh proxy: the first read takes every chunk from the store; the second finds the tiered half in
            # the chunk cache (256 MiB): both are reported, the first is the catch-up from the store
            c0, s0 = cpu_seconds(proxy.proc.pid), cpu_seconds(s3.proc.pid)
            cold = kcat_mbps(kcat, proxy.bootstrap, topic, RECORDS)
            gb = RECORDS * 1024 / 1e9
            cpu[name] = (cpu_seconds(proxy.proc.pid) - c0) / gb
            store_cpu = f", SeaweedFS {(cpu_seconds(s3.proc.pid) - s0) / gb:.2f}" if name == "s3" else ""
            warm = kcat_mbps(kcat, proxy.bootstrap, topic, RECORDS)
            figures.append(f"catch-up from {name} {cold:.0f} MB/s ({cold / direct:.2f}x; proxy CPU {cpu[name]:.2f} "
                           f"core-s/GB{store_cpu}; again through the same proxy {warm:.0f} MB/s, {warm / direct:.2f}x)")
            if name == "filesystem":
                half = max(kcat_mbps(kcat, proxy.bootstrap, topic, RECORDS // 2) for _ in range(2))
                half_busy = CLIENT_BUSY["last"]
                java_half = max(perf_test_mbps(kafka.libs, proxy.bootstrap, topic, RECORDS // 2)
                                for _ in range(2))
                broker = kafka.nodes[0].proc
                assert broker is not None
                c0, b0 = cpu_seconds(proxy.proc.pid), cpu_seconds(broker.pid)
                kcat_mbps(kcat, proxy.bootstrap, topic, RECORDS // 2)
                gb = RECORDS // 2 * 1024 / 1e9
                figures.append(f"remote path CPU: proxy {(cpu_seconds(proxy.proc.pid) - c0) / gb:.2f} core-s/GB, "
                               f"broker {(cpu_seconds(broker.pid) - b0) / gb:.2f} core-s/GB")
            if name == "filesystem":
                base = peak_rss_mib(proxy.proc.pid)
                procs = [subprocess.Popen([kcat, "-b", proxy.bootstrap, "-C", "-t", topic, "-p", "0", "-o",
                                           "beginning", "-q", "-c", "5000", "-f", "%o\n"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(100)]
                for pr in procs:
                    pr.wait(300)
                assert all(pr.returncode == 0 for pr in procs)
                peak = peak_rss_mib(proxy.proc.pid)
                figures.append(f"proxy peak RSS with 100 concurrent remote consumers {peak:.0f} MiB (before "
                               f"{base:.0f} MiB)")
        finally:
            proxy.stop()
    native, java_native = _native_remote_mbps(kcat, tmp_path, RECORDS // 2)
    figures.append(f"first {RECORDS // 2} records vs Kafka's native tiered storage (LocalTieredStorage): kcat "
                   f"{half:.0f} vs {native:.0f} MB/s = {half / native:.1f}x (kcat itself busy {half_busy:.2f} "
                   f"cores through tierproxy, {CLIENT_BUSY['last']:.2f} with native); Java consumer "
                   f"{java_half:.0f} vs {java_native:.0f} MB/s = {java_half / java_native:.1f}x")
    figures.append(f"proxy CPU per GB from S3 / from the filesystem tier {cpu['s3'] / cpu['filesystem']:.2f}x")
    report("remote catch-up", "; ".join(figures) + f" ({RECORDS} x 1 KiB)")




def test_remote_catch_up_of_300_byte_records(kafka: KafkaCluster, kcat: str, tmp_path: Path) -> None:
    """P2 with small records: the same bytes as the 1 KiB runs in 300-byte records, read from offset 0 directly
    while the broker has them, then through tierproxy from the filesystem tier once the broker deleted them."""
    topic, size = "bench-remote-300", 300
    records = RECORDS * 1024 // size
    create_topic(kafka.bootstrap, topic, config={"segment.bytes": str(32 << 20)})
    produce(kafka, topic, records, size)
    direct = max(kcat_mbps(kcat, kafka.bootstrap, topic, records, size) for _ in range(2))
    direct_busy = CLIENT_BUSY["last"]
    proxy, tiered = served_from_file_tier(kafka, topic, tmp_path, "tier-300", records)
    try:
        proxy.wait_tier_ready()
        c0, t0 = cpu_seconds(proxy.proc.pid), time.perf_counter()
        remote = kcat_mbps(kcat, proxy.bootstrap, topic, records, size)  # a fresh proxy: chunks from the tier
        proxy_busy = (cpu_seconds(proxy.proc.pid) - c0) / (time.perf_counter() - t0)
    finally:
        proxy.stop()
    report("remote catch-up, 300-byte records", f"direct {direct:.0f} MB/s, from the filesystem tier through "
           f"tierproxy {remote:.0f} MB/s = {remote / direct:.2f}x ({records} x {size} B, {tiered} of them only in "
           f"the tier, kcat); kcat busy {direct_busy:.2f} cores direct, {CLIENT_BUSY['last']:.2f} through "
           f"tierproxy; tierproxy busy {proxy_busy:.2f} cores")
    assert remote > 0


class _CountingDelayRelay(DelayRelay):
    """The latency relay in front of moto, counting the GETs it carries."""

    def __init__(self, upstream_port: int, delay: float) -> None:
        self.gets = 0
        self._count = threading.Lock()
        super().__init__(upstream_port, delay)

    def _chunk(self, state: Any, data: bytes, toward_server: bool) -> None:
        if toward_server and data.startswith(b"GET "):
            with self._count:
                self.gets += 1
        super()._chunk(state, data, toward_server)


def test_catch_up_when_s3_is_slow(kafka: KafkaCluster, kcat: str, s3: S3Server, tmp_path: Path) -> None:
    """P8: catch-up through tierproxy from an S3 tier with 0, 25 and 100 ms added to every S3 request (a loopback
    relay in front of moto), each with a freshly started proxy (cold caches); and the S3 GETs per GiB served."""
    topic, records = "bench-s3-latency", S3_LATENCY_RECORDS
    create_topic(kafka.bootstrap, topic, config={"segment.bytes": str(32 << 20)})
    produce(kafka, topic, records)
    s3.create_bucket("slow")
    storage = "s3://slow/b?endpoint={}&region=" + s3.region
    assert tier_once(settings(kafka.bootstrap, tmp_path, topic, storage=storage.format(s3.endpoint),
                              metadata=f"file://{tmp_path}/meta-slow", tier_segment_bytes=32 << 20,
                              tier_state_dir=tmp_path / "state-slow")).failed == 0
    tiered = forget_tiered(kafka, topic)  # what only the tier holds now
    assert tiered >= records // 2
    relay = _CountingDelayRelay(int(s3.endpoint.rsplit(":", 1)[1]), 0.0)
    runs: dict[float, list[tuple[float, float, float]]] = {}  # delay → (MB/s, first record s, GETs per GiB)
    gib = tiered * 1024 / (1 << 30)
    try:
        for delay in (0.0, 0.025, 0.1) * 2:  # two rounds, alternating: each figure is the better of two cold runs
            relay.delay, relay.gets = delay, 0
            proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
                "TIERPROXY_STORAGE": storage.format(f"http://127.0.0.1:{relay.port}"),
                "TIERPROXY_METADATA": f"file://{tmp_path}/meta-slow",
                "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
            try:
                proxy.wait_tier_ready()
                relay.gets = 0
                first, rate = _kcat_first_and_mbps(kcat, proxy.bootstrap, topic, tiered)
                runs.setdefault(delay, []).append((rate, first, relay.gets / gib))
            finally:
                proxy.stop()
    finally:
        relay.close()
    rates = {delay: max(r)[0] for delay, r in runs.items()}
    figures = [f"+{delay * 1e3:.0f} ms: {rates[delay]:.0f} MB/s ({rates[delay] / rates[0.0]:.2f}x; runs "
               f"{', '.join(f'{rate:.0f}' for rate, _, _ in got)}), first record after "
               f"{min(first for _, first, _ in got) * 1e3:.0f} ms, {max(g for _, _, g in got):.0f} GETs per GiB"
               for delay, got in runs.items()]
    report("remote catch-up with slow S3", "; ".join(figures) + f" ({tiered} x 1 KiB tiered, kcat, cold proxy)")
    assert rates[0.1] > 0
