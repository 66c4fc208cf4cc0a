"""The proxy's CPU per GB served from S3 (SeaweedFS) against its CPU per GB served from the filesystem tier: the
same tiered history, kcat from offset 0, rounds interleaved so the machine's drift cancels out in each round's
ratio. Each round starts a fresh proxy per tier and reads twice through it: cold (the chunk cache's memory touched
for the first time) and again (the history is larger than the chunk cache, so every chunk comes from the store
again, into memory freed by evicted chunks: what a proxy that has run a while pays per GB; the proxy's own count of
bytes read from storage checks it). The proxy's own CPU time only (the store's is reported beside it); catch-up MB/s
of each against the direct tail read in the same round.

    pytest -m bench tests/bench/test_s3_cpu_bench.py -s   (TIERPROXY_BENCH_S3_CPU_RECORDS, default 262144 x 1 KiB;
                                                          TIERPROXY_BENCH_S3_CPU_ROUNDS, default 3)
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import pytest

from tests.bench.clients import forget_tiered, kcat_mbps, produce
from tests.bench.report import cpu_seconds, report
from tests.support.kafka import create_topic
from tests.support.proxy import ProxyProcess
from tests.support.s3 import S3Server
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]
RECORDS = int(os.environ.get("TIERPROXY_BENCH_S3_CPU_RECORDS", str(1 << 18)))
ROUNDS = int(os.environ.get("TIERPROXY_BENCH_S3_CPU_ROUNDS", "3"))


@pytest.mark.timeout(1800)
def test_proxy_cpu_per_gb_from_s3_vs_from_files(kafka: KafkaCluster, kcat: str, s3: S3Server, tmp_path: Path) -> None:
    tiered, local = "s3cpu-tiered", "s3cpu-local"
    for topic in (tiered, local):
        create_topic(kafka.bootstrap, topic, config={"segment.bytes": str(32 << 20)})
        produce(kafka, topic, RECORDS)
    s3.create_bucket("tier")
    tiers = {"files": (f"file://{tmp_path}/tier", f"file://{tmp_path}/meta-fs"),
             "s3": (f"s3://tier/b?endpoint={s3.endpoint}&region={s3.region}", f"file://{tmp_path}/meta-s3")}
    for storage, metadata in tiers.values():
        assert tier_once(settings(kafka.bootstrap, tmp_path, tiered, storage=storage, metadata=metadata,
                                  tier_segment_bytes=32 << 20)).failed == 0
    held = forget_tiered(kafka, tiered)  # the tier alone holds [0, held)
    gb = held * 1024 / 1e9
    cpu: dict[str, list[float]] = {k: [] for k in ("files", "s3", "store", "files again", "s3 again", "store again")}
    speed: dict[str, list[float]] = {"files": [], "s3": [], "s3 again": []}
    ratios: list[float] = []
    again: list[float] = []
    for _ in range(ROUNDS):
        direct = kcat_mbps(kcat, kafka.bootstrap, local, held)
        for name, (storage, metadata) in tiers.items():
            proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
                "TIERPROXY_STORAGE": storage, "TIERPROXY_METADATA": metadata,
                "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{free_port()}",
                "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
            try:
                proxy.wait_tier_ready()
                for read in (name, f"{name} again"):
                    stored = proxy.metric("tierproxy_remote_storage_read_bytes_total")
                    c0, s0 = cpu_seconds(proxy.proc.pid), cpu_seconds(s3.proc.pid)
                    mbps = kcat_mbps(kcat, proxy.bootstrap, tiered, held)
                    cpu[read].append((cpu_seconds(proxy.proc.pid) - c0) / gb)
                    if read in speed:
                        speed[read].append(mbps / direct)
                    if name == "s3":
                        cpu["store" + read[2:]].append((cpu_seconds(s3.proc.pid) - s0) / gb)
                        # every byte from the store again, none from the cache (else this is not S3's cost)
                        assert proxy.metric("tierproxy_remote_storage_read_bytes_total") - stored >= held * 1024
            finally:
                proxy.stop()
        ratios.append(cpu["s3"][-1] / cpu["files"][-1])
        again.append(cpu["s3 again"][-1] / cpu["files again"][-1])

    def each(xs: list[float], unit: str = "") -> str:
        return " / ".join(f"{x:.2f}{unit}" for x in xs)

    report("proxy CPU per GB, S3 vs files", f"{held} x 1 KiB, {ROUNDS} rounds: S3 / files cold {each(ratios, 'x')} "
           f"(median {statistics.median(ratios):.2f}x), again {each(again, 'x')} (median "
           f"{statistics.median(again):.2f}x); proxy core-s/GB from S3 {each(cpu['s3'])}, again "
           f"{each(cpu['s3 again'])}; "
           f"from files {each(cpu['files'])}, again {each(cpu['files again'])}; SeaweedFS {each(cpu['store'])}, again "
           f"{each(cpu['store again'])} core-s/GB; catch-up vs the direct tail: S3 {each(speed['s3'], 'x')}, again "
           f"{each(speed['s3 again'], 'x')}, files {each(speed['files'], 'x')}")
    assert all(r > 0 for r in ratios + again)
