"""The DataFrame reader vs Spark's own Kafka source on the same data, local[2], same run: rows/s and MB/s of a full
scan (every column materialised by one aggregate), best of 3 alternating rounds after a warm-up of each. Goal ≥ 2x.

    pytest -m bench tests/bench/test_spark_reader_bench.py -s   (TIERPROXY_BENCH_SPARK_RECORDS, default 256Ki of 1 KiB)
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.bench.clients import produce
from tests.bench.report import report
from tests.support.kafka import create_topic
from tests.support.spark import local_session, tier_once
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark]
RECORDS = int(os.environ.get("TIERPROXY_BENCH_SPARK_RECORDS", str(256 << 10)))
ROUNDS = int(os.environ.get("TIERPROXY_BENCH_SPARK_ROUNDS", "3"))


class ArrowCeiling:
    """A Python data source that only yields pre-built Arrow batches of 1 KiB values (no IO, no decoding) from as
    many input partitions as the tier read has: what Spark's Python Data Source path itself can carry on this
    machine, the ceiling for any Python reader (each Spark task also costs ~0.1 s of fixed time here, so the
    number of input partitions matters as much as the rows)."""

    @staticmethod
    def register(spark: Any, rows: int, partitions: int) -> None:
        from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

        from tierproxy.jobs.spark.rows import SCHEMA_DDL

        class Reader(DataSourceReader):
            def __init__(self, schema: Any) -> None:
                self.schema = schema

            def partitions(self) -> list[InputPartition]:
                return [InputPartition(i) for i in range(partitions)]

            def read(self, partition: InputPartition) -> Any:
                import pyarrow as pa
                from pyspark.sql.pandas.types import to_arrow_schema

                n = 8192
                batch = pa.RecordBatch.from_arrays(
                    [pa.nulls(n, pa.binary()), pa.array([b"x" * 1024] * n, pa.binary()), pa.array(["t"] * n),
                     pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()),
                     pa.array([0] * n, pa.int64()).cast(pa.timestamp("us", "UTC")), pa.array([0] * n, pa.int32())],
                    schema=to_arrow_schema(self.schema, timezone="UTC"))
                for _ in range(rows // partitions // n):
                    yield batch

        class Source(DataSource):
            @classmethod
            def name(cls) -> str:
                return "arrow-ceiling"

            def schema(self) -> str:
                return SCHEMA_DDL

            def reader(self, schema: Any) -> Reader:
                return Reader(schema)

        spark.dataSource.register(Source)


def scan(spark: Any, fmt: str, options: dict[str, str]) -> tuple[float, int, int]:
    """Seconds, rows and value bytes of one full scan."""
    from pyspark.sql import functions as f

    df = spark.read.format(fmt).options(**options).load()
    start = time.perf_counter()
    row = df.agg(f.count("*"), f.sum(f.length("value")), f.sum(f.length("key")), f.max("timestamp"),
                 f.max("offset")).collect()[0]
    return time.perf_counter() - start, int(row[0]), int(row[1])


def best_of(spark: Any, sources: dict[str, tuple[str, dict[str, str]]], rounds: int = ROUNDS
            ) -> dict[str, tuple[float, int, int]]:
    """Each source's fastest scan: one warm-up scan each (JVM, JIT and Python workers), then `rounds` rounds that
    alternate the sources, so both see the same machine noise."""
    for fmt, options in sources.values():
        scan(spark, fmt, options)
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(rounds):
        for name, (fmt, options) in sources.items():
            got = scan(spark, fmt, options)
            if name not in best or got[0] < best[name][0]:
                best[name] = got
    return best


def test_tier_reader_vs_sparks_kafka_source(kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = "bench-spark"
    create_topic(kafka.bootstrap, topic, partitions=2)
    produce(kafka, topic, RECORDS)
    storage, metadata = f"file://{tmp_path}/tier", f"file://{tmp_path}/meta"
    tier_once(kafka.bootstrap, topic, storage, metadata, tmp_path, segment_bytes=32 << 20)
    spark = local_session()
    # the process's session (`local_session`): stopped when the run ends, not here
    best = best_of(spark, {
        "kafka": ("kafka", {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic}),
        "tier": ("tierproxy", {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic,
                               "storage": storage, "metadata": metadata})})
    (kafka_s, kafka_rows, kafka_bytes), (tier_s, tier_rows, tier_bytes) = best["kafka"], best["tier"]
    tasks = spark.read.format("tierproxy").options(**{
        "kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic, "storage": storage,
        "metadata": metadata}).load().rdd.getNumPartitions()
    ArrowCeiling.register(spark, RECORDS, tasks)
    ceiling_s, ceiling_rows, _ = best_of(spark, {"ceiling": ("arrow-ceiling", {})}, 1)["ceiling"]
    assert tier_rows == kafka_rows == RECORDS and tier_bytes == kafka_bytes
    ratio = kafka_s / tier_s
    report("spark reader", f"tier {tier_rows / tier_s:,.0f} rows/s {tier_bytes / 1e6 / tier_s:.0f} MB/s vs "
                           f"Spark's Kafka source {kafka_rows / kafka_s:,.0f} rows/s {kafka_bytes / 1e6 / kafka_s:.0f}"
                           f" MB/s = {ratio:.2f}x ({RECORDS} x 1 KiB, 2 partitions, local[2], {tasks} tier tasks); "
                           f"Spark's Python Data Source path alone (pre-built Arrow, no IO, {tasks} tasks) "
                           f"{ceiling_rows / ceiling_s:,.0f} rows/s = "
                           f"{kafka_s / ceiling_s * ceiling_rows / kafka_rows:.2f}x, the ceiling for a Python reader")
