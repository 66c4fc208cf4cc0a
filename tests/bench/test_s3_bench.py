"""The S3 path on a real S3 server (SeaweedFS), with moto beside it once for contrast, same run, same data: catch-up
through tierproxy from the S3 tier vs kcat reading the same records directly from the broker while it still had
them; requests per GiB tiered (PUT and POST, multipart parts included) and read (GET), counted by a loopback relay
in front of the server; and what a month of one 100 MB/s topic costs at AWS S3 Standard list prices beside three
broker replicas on EBS gp3.

    pytest -m bench tests/bench/test_s3_bench.py -s        (TIERPROXY_BENCH_S3_RECORDS, default 262144 x 1 KiB)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.bench.clients import forget_tiered, kcat_mbps, produce
from tests.bench.report import report
from tests.support.kafka import create_topic
from tests.support.proxy import ProxyProcess
from tests.support.relay import CountingRelay
from tests.support.s3 import S3Server, moto_server
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]
RECORDS = int(os.environ.get("TIERPROXY_BENCH_S3_RECORDS", str(1 << 18)))
SEGMENT = 16 << 20  # tier.segment.bytes' default

# AWS list prices (us-east-1, S3 Standard and EBS gp3, as published in 2026): the figures a platform team checks
S3_GB_MONTH = (0.023, 0.022)  # first 50 TB, next 450 TB
S3_WRITE_PER_1000 = 0.005  # PUT, COPY, POST, LIST
S3_READ_PER_1000 = 0.0004  # GET
GP3_GB_MONTH = 0.08  # 3,000 IOPS and 125 MB/s included per volume
GP3_FILL = 0.7  # disks kept at most 70% full


def _month_cost(writes_per_gib: float, reads_per_gib: float, read_share: float = 1.0) -> str:
    """One topic at 100 MB/s, kept 30 days: S3 (storage, writes, one full read of the month's history per month
    at `read_share`) vs 3 replicas on EBS gp3."""
    gb = 100e6 * 86400 * 30 / 1e9  # 259,200 GB a month, all retained
    gib = gb * 1e9 / (1 << 30)
    storage = min(gb, 50_000) * S3_GB_MONTH[0] + max(0.0, gb - 50_000) * S3_GB_MONTH[1]
    writes = gib * writes_per_gib / 1000 * S3_WRITE_PER_1000
    reads = gib * read_share * reads_per_gib / 1000 * S3_READ_PER_1000
    ebs = 3 * gb / GP3_FILL * GP3_GB_MONTH
    return (f"a month of one 100 MB/s topic kept 30 days ({gb / 1000:.0f} TB): S3 Standard ${storage:,.0f} storage "
            f"+ ${writes:,.0f} writes + ${reads:,.0f} reads (history read once) = ${storage + writes + reads:,.0f}; "
            f"3 replicas on EBS gp3 at {GP3_FILL:.0%} full ${ebs:,.0f} (prices: S3 ${S3_GB_MONTH[0]}/GB-month, "
            f"${S3_WRITE_PER_1000}/1k PUT, ${S3_READ_PER_1000}/1k GET; gp3 ${GP3_GB_MONTH}/GB-month)")


def _tier(name: str, server: S3Server, relay: CountingRelay, kafka: KafkaCluster, topic: str,
          tmp_path: Path) -> tuple[str, str, float]:
    """Tier the topic through the counting relay: (storage URI, a figure, PUT/POST per GiB)."""
    bucket = f"bench-{name}"
    server.create_bucket(bucket)
    storage = f"s3://{bucket}/t?endpoint=http://127.0.0.1:{relay.port}&region={server.region}"
    relay.requests.clear()
    started = time.perf_counter()
    summary = tier_once(settings(kafka.bootstrap, tmp_path, topic, storage=storage,
                                 metadata=f"file://{tmp_path}/meta-{name}", tier_segment_bytes=SEGMENT,
                                 tier_state_dir=tmp_path / f"state-{name}"))
    seconds = time.perf_counter() - started
    assert summary.failed == 0
    writes = (relay.requests.get("PUT", 0) + relay.requests.get("POST", 0)) / (summary.bytes / (1 << 30))
    return storage, (f"tiering {summary.bytes / 1e6 / seconds:.0f} MB/s ({summary.segments} segments of "
                     f"{SEGMENT >> 20} MiB), {writes:.0f} PUT/POST per GiB"), writes


def _catch_up(name: str, server: S3Server, relay: CountingRelay, storage: str, kafka: KafkaCluster, kcat: str,
              topic: str, records: int, tmp_path: Path, direct: float) -> tuple[str, float]:
    """kcat from offset 0 through a fresh proxy, twice: (a figure, GETs per GiB read)."""
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": storage, "TIERPROXY_METADATA": f"file://{tmp_path}/meta-{name}",
        "AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key})
    try:
        proxy.wait_tier_ready()
        relay.requests.clear()
        remote = kcat_mbps(kcat, proxy.bootstrap, topic, records)  # a fresh proxy: every chunk from the store
        reads = relay.requests.get("GET", 0) / (records * 1024 / (1 << 30))
    finally:
        proxy.stop()
    return f"catch-up {remote:.0f} MB/s = {remote / direct:.2f}x direct tail, {reads:.0f} GET per GiB", reads


def test_s3_catch_up_requests_and_cost(kafka: KafkaCluster, kcat: str, s3: S3Server, tmp_path: Path) -> None:
    topic = "bench-s3"
    create_topic(kafka.bootstrap, topic, config={"segment.bytes": str(32 << 20)})
    produce(kafka, topic, RECORDS)
    direct = max(kcat_mbps(kcat, kafka.bootstrap, topic, RECORDS) for _ in range(2))
    with moto_server(tmp_path) as moto:
        servers = {"seaweedfs": s3, "moto": moto}
        relays = {name: CountingRelay(int(srv.endpoint.rsplit(":", 1)[1])) for name, srv in servers.items()}
        try:
            tiered = {name: _tier(name, srv, relays[name], kafka, topic, tmp_path) for name, srv in servers.items()}
            only_tier = forget_tiered(kafka, topic)
            assert only_tier >= RECORDS // 2
            figures = [f"direct tail {direct:.0f} MB/s"]
            reads = {}
            for name, srv in servers.items():
                figure, reads[name] = _catch_up(name, srv, relays[name], tiered[name][0], kafka, kcat, topic,
                                                RECORDS, tmp_path, direct)
                figures.append(f"{name}: {figure}; {tiered[name][1]}")
        finally:
            for r in relays.values():
                r.close()
    figures.append(_month_cost(tiered["seaweedfs"][2], reads["seaweedfs"]))
    report("S3 tier (SeaweedFS, moto for contrast)", "; ".join(figures) + f" ({RECORDS} x 1 KiB, kcat; "
           f"{only_tier} records only in the tier)")
    assert tiered["seaweedfs"][2] > 0 and reads["seaweedfs"] > 0
