"""The tiered history as a Spark DataFrame, read straight from the tier (no broker in the data path).

    from tierproxy.jobs.spark import register
    register(spark)
    df = (spark.read.format("tierproxy")
          .option("kafka.bootstrap.servers", "broker:9092")
          .option("storage", "s3://bucket/prefix?endpoint=...")
          .option("subscribe", "orders")
          .load())

The schema and option names are those of Spark's Kafka source (`tierproxy.jobs.spark.options` lists them).
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the "tierproxy" data source with a SparkSession. Raises `WorkerPythonError` (with the fix) when
    Spark's Python workers cannot import tierproxy."""
    from tierproxy.jobs.spark.source import TierDataSource
    from tierproxy.jobs.spark.workers import check_worker_python

    check_worker_python(spark)
    spark.dataSource.register(TierDataSource)
