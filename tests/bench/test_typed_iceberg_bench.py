"""A typed table (Avro values from the schema registry as columns) built from the tier vs the usual way on the same
data in the same run: Spark's Kafka source reading the broker, `from_avro` on the payload after Confluent's 5-byte
header, the same typed rows written as Parquet (zstd). local[2], best of 3 alternating rounds after a warm-up of each.
Goal ≥ 2x. Also the raw table from the same tier, for what decoding costs.

    pytest -m bench tests/bench/test_typed_iceberg_bench.py -s   (TIERPROXY_BENCH_TYPED_RECORDS, default 256Ki)
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import fastavro
import httpx
import pytest
from confluent_kafka import Producer

from tests.bench.report import report
from tests.support.kafka import create_topic
from tests.support.registry import Registry
from tests.support.spark import local_session, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.iceberg.catalog import catalog_config
from tierproxy.jobs.iceberg.registry import RegistryConfig
from tierproxy.jobs.iceberg.sync import IcebergOptions, IcebergSync
from tierproxy.jobs.iceberg.typed_tables import TypedOptions

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark, pytest.mark.registry]
RECORDS = int(os.environ.get("TIERPROXY_BENCH_TYPED_RECORDS", str(256 << 10)))
ROUNDS = int(os.environ.get("TIERPROXY_BENCH_TYPED_ROUNDS", "3"))
ORDER = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"}, {"name": "qty", "type": "int"},
    {"name": "price", "type": "double"}, {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "tags", "type": {"type": "array", "items": "string"}}]}


def _produce(bootstrap: str, registry: Registry, topic: str) -> int:
    """RECORDS Avro records in Confluent's wire format; the bytes produced."""
    r = httpx.post(f"{registry.url}/subjects/{topic}-value/versions", json={"schema": json.dumps(ORDER)}, timeout=30)
    r.raise_for_status()
    header = b"\0" + struct.pack(">I", r.json()["id"])
    parsed = fastavro.parse_schema(ORDER)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 262144,
                  "queue.buffering.max.messages": 1_000_000})
    total = 0
    for i in range(RECORDS):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, {
            "id": i, "item": f"item-{i % 5000}", "qty": i % 100, "price": i * 0.25, "at": 1_700_000_000_000 + i,
            "note": None if i % 4 else f"note {i}", "tags": ["a", "b"] if i % 2 else []})
        value = header + out.getvalue()
        total += len(value)
        while True:
            try:
                p.produce(topic, value, partition=i % 2)
                break
            except BufferError:
                p.poll(0.1)
    p.flush(120)
    return total


@pytest.mark.timeout(1800)
def test_typed_table_from_the_tier_vs_sparks_kafka_source_with_from_avro(kafka: KafkaCluster,
                                                                         schema_registry: Registry,
                                                                         tmp_path: Path) -> None:
    topic = "bench-typed"
    create_topic(kafka.bootstrap, topic, partitions=2)
    payload = _produce(kafka.bootstrap, schema_registry, topic)
    storage, metadata = f"file://{tmp_path}/tier", f"file://{tmp_path}/meta"
    tier_once(kafka.bootstrap, topic, storage, metadata, tmp_path, segment_bytes=32 << 20)
    spark = local_session()
    n = 0

    def ours(typed: bool) -> tuple[float, int]:
        nonlocal n
        n += 1
        cfg = catalog_config(None, storage, str(tmp_path / "state"))
        options = IcebergOptions(cfg, f"bench.typed{n}", kafka.bootstrap, storage, metadata, f"^{topic}$",
                                 typed=TypedOptions(RegistryConfig(schema_registry.url), f"{topic}-value")
                                 if typed else None)
        start = time.perf_counter()
        summary = IcebergSync(options, lambda: spark).run_once()
        took = time.perf_counter() - start
        assert summary.dead_letters == 0
        return took, summary.rows_added

    def usual() -> tuple[float, int]:
        from pyspark.sql.avro.functions import from_avro
        from pyspark.sql.functions import col, expr

        out = tmp_path / "usual"
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        df = spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap) \
            .option("subscribe", topic).load()
        typed = df.select(from_avro(expr("substring(value, 6, length(value) - 5)"), json.dumps(ORDER)).alias("v"),
                          col("key"), col("topic"), col("partition"), col("offset"), col("timestamp"),
                          col("timestampType")).select("v.*", "key", "topic", "partition", "offset", "timestamp",
                                                       "timestampType")
        typed.write.option("compression", "zstd").parquet(str(out))
        took = time.perf_counter() - start
        return took, spark.read.parquet(str(out)).count()

    # the process's session (`local_session`): stopped when the run ends, not here
    ours(True)
    usual()
    best: dict[str, tuple[float, int]] = {}
    for _ in range(ROUNDS):
        for name, run in (("typed", lambda: ours(True)), ("raw", lambda: ours(False)), ("usual", usual)):
            got = run()
            if name not in best or got[0] < best[name][0]:
                best[name] = got
    assert best["typed"][1] == best["usual"][1] == best["raw"][1] == RECORDS
    rate: dict[str, Any] = {k: RECORDS / v[0] for k, v in best.items()}
    report("typed iceberg table", f"from the tier {rate['typed']:,.0f} rows/s vs Spark's Kafka source + from_avro to "
                                  f"Parquet (zstd) {rate['usual']:,.0f} rows/s = "
                                  f"{best['usual'][0] / best['typed'][0]:.2f}x; the raw table from the same tier "
                                  f"{rate['raw']:,.0f} rows/s (decoding costs {best['typed'][0] / best['raw'][0]:.2f}x "
                                  f"its time); {RECORDS} Avro records of {payload / RECORDS:.0f} B, 2 partitions, "
                                  "local[2]")
