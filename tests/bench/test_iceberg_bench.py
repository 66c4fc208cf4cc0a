"""Building the Iceberg table from the tier vs the usual way on the same data in the same run: Spark's Kafka source
reading the broker and writing the same rows as Parquet (zstd). local[2], best of 3 alternating rounds after a
warm-up of each. Goal ≥ 2x. Also: table bytes vs tier bytes, and the executors' peak memory vs the read range.

    pytest -m bench tests/bench/test_iceberg_bench.py -s   (TIERPROXY_BENCH_ICEBERG_RECORDS, default 256Ki of 1 KiB)
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.bench.clients import produce
from tests.bench.report import report
from tests.support.kafka import create_topic
from tests.support.spark import local_session, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.iceberg.catalog import catalog_config, open_catalog
from tierproxy.jobs.iceberg.sync import IcebergOptions, IcebergSummary, IcebergSync
from tierproxy.jobs.spark.slices import READ_BYTES

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark]
RECORDS = int(os.environ.get("TIERPROXY_BENCH_ICEBERG_RECORDS", str(256 << 10)))
ROUNDS = int(os.environ.get("TIERPROXY_BENCH_ICEBERG_ROUNDS", "3"))


def _bytes_under(path: Path, suffix: str) -> int:
    return sum(p.stat().st_size for p in path.rglob(f"*{suffix}"))


def test_table_from_the_tier_vs_sparks_kafka_source_to_parquet(kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = "bench-iceberg"
    create_topic(kafka.bootstrap, topic, partitions=2)
    produce(kafka, topic, RECORDS)
    storage, metadata = f"file://{tmp_path}/tier", f"file://{tmp_path}/meta"
    tier_once(kafka.bootstrap, topic, storage, metadata, tmp_path, segment_bytes=32 << 20)
    tier_bytes = _bytes_under(tmp_path / "tier", ".log")
    spark = local_session()
    n = 0

    def ours() -> tuple[float, int, IcebergSummary, tuple[int, int]]:
        nonlocal n
        n += 1
        cfg = catalog_config(None, storage, str(tmp_path / "state"))
        sync = IcebergSync(IcebergOptions(cfg, f"bench.t{n}", kafka.bootstrap, storage, metadata, topic,
                                          read_committed=True), lambda: spark)
        start = time.perf_counter()
        summary = sync.run_once()
        took = time.perf_counter() - start
        # the live table (its current snapshot's files), and what is on disk: a compacted pass keeps the files it
        # replaced for the older snapshots that refer to them
        table = open_catalog(cfg).load_table(f"bench.t{n}")
        live = sum(task.file.file_size_in_bytes for task in table.scan().plan_files())
        on_disk = _bytes_under(tmp_path / "tier" / "iceberg" / "bench" / f"t{n}", ".parquet")
        return took, summary.rows_added, summary, (live, on_disk)

    def usual() -> tuple[float, int, int]:
        out = tmp_path / "usual"
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        df = spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap) \
            .option("subscribe", topic).option("includeHeaders", "true").load()
        df.write.option("compression", "zstd").parquet(str(out))
        took = time.perf_counter() - start
        rows = spark.read.parquet(str(out)).count()
        return took, rows, _bytes_under(out, ".parquet")

    # the process's session (`local_session`): stopped when the run ends, not here
    ours()
    usual()
    best_ours: Any = None
    best_usual: Any = None
    for _ in range(ROUNDS):
        a, b = ours(), usual()
        best_ours = a if best_ours is None or a[0] < best_ours[0] else best_ours
        best_usual = b if best_usual is None or b[0] < best_usual[0] else best_usual
    ours_s, ours_rows, summary, (table_bytes, on_disk) = best_ours
    usual_s, usual_rows, usual_bytes = best_usual
    assert ours_rows == usual_rows == RECORDS
    mb = RECORDS * 1024 / 1e6
    report("iceberg table", f"from the tier {ours_rows / ours_s:,.0f} rows/s {mb / ours_s:.0f} MB/s vs Spark's Kafka "
                            f"source to Parquet (zstd) {usual_rows / usual_s:,.0f} rows/s {mb / usual_s:.0f} MB/s = "
                            f"{usual_s / ours_s:.2f}x ({RECORDS} x 1 KiB, 2 partitions, local[2], "
                            f"{summary.files_added} files); table {table_bytes / 1e6:.0f} MB vs tier "
                            f"{tier_bytes / 1e6:.0f} MB = {table_bytes / tier_bytes:.2f}, "
                            f"{on_disk / 1e6:.0f} MB on disk with the files compaction replaced (Spark's Parquet "
                            f"{usual_bytes / 1e6:.0f} MB); executor peak RSS {summary.executor_peak_rss_mb:.0f} MiB, "
                            f"{summary.executor_peak_rss_mb - summary.executor_base_rss_mb:.0f} MiB above a worker's "
                            f"{summary.executor_base_rss_mb:.0f} MiB before its first slice, with "
                            f"{READ_BYTES >> 20} MiB read ranges")
