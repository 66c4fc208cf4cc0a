"""The Kafka clients the benchmarks drive, in one place: Kafka's ProducerPerformance to fill a topic, kcat and
kafka-consumer-perf-test to read it whole (each returning its wall-clock seconds)."""

from __future__ import annotations

import subprocess
import time

from tierproxy.kafkadist import KafkaCluster


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
