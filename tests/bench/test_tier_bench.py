"""Tiering throughput, same run, same data: `tierproxy tier` with local[1] and local[2] (filesystem tier) vs a
raw sequential fetch of the partition from the broker. Goal ≥ 0.8x. The JVM's and the Python workers' start-up are
left out (a pass of a running `tierproxy tier` finds both started); the workers' start is printed.

    pytest -m bench tests/bench/test_tier_bench.py -s      (TIERPROXY_BENCH_RECORDS for a smaller topic)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from protocol.constants import ApiKey, IsolationLevel
from protocol.records import iter_batches
from protocol.requests import fetch_request
from tests.bench.report import report
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.tiering.job import TieringJob
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark]


def _raw_fetch_seconds(bootstrap: str, topic: str, sink: Path | None = None) -> tuple[float, int]:
    """Fetch the whole partition sequentially (and append it to `sink`: the ceiling any copy to that disk has)."""
    total, offset = 0, 0
    start = time.perf_counter()
    out = open(sink, "wb") if sink else None  # noqa: SIM115
    with WireClient(bootstrap) as w:
        while True:
            resp = w.request(ApiKey.FETCH, 12, fetch_request({topic: {0: offset}}, max_bytes=8 << 20,
                                                             isolation=IsolationLevel.READ_COMMITTED))
            part = resp["responses"][0]["partitions"][0]
            batches = list(iter_batches(part["records"]))
            if not batches:
                break
            total += sum(b.size for b in batches)
            if out is not None:
                out.writelines(b.view() for b in batches)
            offset = batches[-1].last_offset + 1
            if offset >= part["last_stable_offset"]:
                break
    if out is not None:
        out.close()
    return time.perf_counter() - start, total


def _import_copy(_: int) -> int:
    """Run on a Python worker: start it and import what a copy task needs."""
    import tierproxy.jobs.tiering.copy  # noqa: F401

    return 0


def test_tiering_throughput_vs_raw_fetch(kafka: KafkaCluster, bench_topic: str, tmp_path: Path) -> None:
    raw_s, raw_bytes = _raw_fetch_seconds(kafka.bootstrap, bench_topic)
    raw = raw_bytes / 1e6 / raw_s
    disk_s, _ = _raw_fetch_seconds(kafka.bootstrap, bench_topic, tmp_path / "raw-copy.log")
    disk = raw_bytes / 1e6 / disk_s
    (tmp_path / "raw-copy.log").unlink()
    figures = [f"raw fetch {raw:.0f} MB/s", f"raw fetch written to the same disk {disk:.0f} MB/s"]
    starts: list[float] = []
    for cores in (1, 2):
        s = TierSettings(bootstrap_servers=kafka.bootstrap, storage=f"file://{tmp_path}/tier-{cores}",
                         metadata=f"file://{tmp_path}/meta-{cores}", tier_topics=bench_topic,
                         tier_segment_bytes=64 << 20, spark_master=f"local[{cores}]",
                         tier_state_dir=tmp_path / f"state-{cores}")
        job = TieringJob(s, progress=False)
        try:
            sc = job.spark().sparkContext  # the JVM start is not part of the copy, nor the Python workers' start:
            warm = time.perf_counter()     # a pass in a running `tierproxy tier` finds them started
            sc.parallelize(range(cores), cores).map(_import_copy).collect()
            starts.append(time.perf_counter() - warm)
            start = time.perf_counter()
            summary = job.run_once()
            elapsed = time.perf_counter() - start
        finally:
            job.close()
        assert summary.failed == 0 and summary.bytes >= raw_bytes * 0.99
        mbps = summary.bytes / 1e6 / elapsed
        figures.append(f"local[{cores}] {mbps:.0f} MB/s ({mbps / raw:.2f}x raw fetch, {mbps / disk:.2f}x fetch+write)")
    report("tiering throughput", ", ".join(figures) + f" over {raw_bytes / 1e6:.0f} MB (Python workers started "
           f"before, in {', '.join(f'{t:.1f}' for t in starts)} s)")
