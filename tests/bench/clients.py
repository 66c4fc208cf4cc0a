"""The Kafka clients the benchmarks drive, in one place: Kafka's ProducerPerformance to fill a topic, kcat and
kafka-consumer-perf-test to read it whole (each returning its wall-clock seconds)."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path

from tests.support.kafka import set_retention, watermarks
from tests.support.proxy import ProxyProcess
from tierproxy.dev.kafkadist import KafkaCluster


def produce(kafka: KafkaCluster, topic: str, records: int, size: int = 1024, *, bootstrap: str | None = None,
            batch_bytes: int = 262144) -> None:
    """`records` records of `size` random bytes, uncompressed, as fast as the broker takes them, in batches of up
    to `batch_bytes` (a fetch returns at least one whole batch, whatever its max bytes)."""
    subprocess.run(["java", "-Xmx512m", "-cp", f"{kafka.libs}/*", "org.apache.kafka.tools.ProducerPerformance",
                    "--topic", topic, "--num-records", str(records), "--record-size", str(size), "--throughput", "-1",
                    "--producer-props", f"bootstrap.servers={bootstrap or kafka.bootstrap}", "acks=1",
                    "linger.ms=20", f"batch.size={batch_bytes}", "compression.type=none"],
                   check=True, capture_output=True, timeout=900)


def kcat_seconds(kcat: str, bootstrap: str, topic: str, records: int) -> float:
    """kcat reading the whole topic from the beginning with 4 MiB fetches; every record must arrive."""
    start = time.perf_counter()
    out = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%o\n",
                          "-X", "fetch.message.max.bytes=4194304"], capture_output=True, timeout=600, check=True)
    took = time.perf_counter() - start
    assert out.stdout.count(b"\n") == records
    return took


def perf_test_seconds(kafka: KafkaCluster, bootstrap: str, topic: str, records: int) -> float:
    """kafka-consumer-perf-test (the Java consumer) reading `records` records."""
    cmd = ["java", "-Xmx512m", "-cp", f"{kafka.libs}/*", "org.apache.kafka.tools.ConsumerPerformance",
           "--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(records), "--timeout", "120000"]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - start
    assert out.returncode == 0, out.stderr[-2000:]
    return took


RECORDS = int(os.environ.get("TIERPROXY_BENCH_REMOTE_RECORDS", str(1 << 18)))


CLIENT_BUSY: dict[str, float] = {}  # the last kcat run's CPU, in cores (1.0: the client itself was the limit)


def kcat_args(kcat: str, bootstrap: str, topic: str, count: int | None, partition: int = 0) -> list[str]:
    """kcat reading `partition` from offset 0, one line per record: `count` records, or to the end."""
    return [kcat, "-b", bootstrap, "-C", "-t", topic, "-p", str(partition), "-o", "beginning", "-q", "-f", "%o\n",
            "-X", "fetch.message.max.bytes=4194304", *(["-c", str(count)] if count else ["-e"])]


def kcat_mbps(kcat: str, bootstrap: str, topic: str, count: int | None = None, size: int = 1024) -> float:
    args = kcat_args(kcat, bootstrap, topic, count)
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(args, capture_output=True, timeout=900, check=True)
    elapsed, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    CLIENT_BUSY["last"] = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / elapsed
    n = out.stdout.count(b"\n")
    assert n >= (count or RECORDS)
    return n * size / 1e6 / elapsed


def forget_tiered(kafka: KafkaCluster, topic: str) -> int:
    """The broker deletes every closed segment (all of them tiered); its log start after that."""
    set_retention(kafka.bootstrap, topic, 1000)
    deadline = time.monotonic() + 120
    while watermarks(kafka.bootstrap, topic)[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    set_retention(kafka.bootstrap, topic, 3_600_000)
    return watermarks(kafka.bootstrap, topic)[0]


def served_from_file_tier(kafka: KafkaCluster, topic: str, tmp: Path, name: str,
                          records: int) -> tuple[ProxyProcess, int]:
    """`topic` tiered by one pass into the filesystem tier `tmp/<name>` (32 MiB segments), the broker made to delete
    every closed segment (at least half of `records` then only in the tier), and a fresh proxy serving it: (the
    proxy, the broker's log start). The caller stops the proxy."""
    from tests.support.tiering import settings, tier_once

    tier, meta = f"file://{tmp}/{name}", f"file://{tmp}/meta-{name}"
    assert tier_once(settings(kafka.bootstrap, tmp, topic, storage=tier, metadata=meta, tier_segment_bytes=32 << 20,
                              tier_state_dir=tmp / f"state-{name}")).failed == 0
    tiered = forget_tiered(kafka, topic)
    assert tiered >= records // 2
    return ProxyProcess(kafka.bootstrap, tmp, extra={"TIERPROXY_STORAGE": tier, "TIERPROXY_METADATA": meta}), tiered


def perf_test_mbps(libs: Path, bootstrap: str, topic: str, count: int) -> float:
    """The Java consumer (kafka-consumer-perf-test) reading `count` records from offset 0: its fetch MB/s, the
    time after it joined its group (JVM start and the group join left out, alike on both sides)."""
    cmd = ["java", "-Xmx512m", "-cp", f"{libs}/*", "org.apache.kafka.tools.ConsumerPerformance",
           "--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(count), "--timeout", "120000"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.split(", ") for line in out.stdout.splitlines() if ", " in line]
    header = next(i for i, fields in enumerate(lines) if "fetch.MB.sec" in fields)
    values = dict(zip(lines[header], lines[header + 1], strict=True))
    assert int(values["data.consumed.in.nMsg"]) >= count
    return float(values["fetch.MB.sec"]) * 1.048576  # it counts MiB: MB/s like the kcat figures
