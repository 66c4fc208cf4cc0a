"""A spark-submit job (also the README's example): read a topic's history from the tier with the "tierproxy"
format and write the row count and a checksum of every row to OUT as JSON.

    spark-submit --master spark://HOST:7077 tests/spark/read_job.py BOOTSTRAP STORAGE METADATA TOPIC OUT
"""

from __future__ import annotations

import hashlib
import json
import sys

from pyspark.sql import SparkSession

from tierproxy.jobs.spark import register


def digest(rows: list[tuple[object, ...]]) -> str:
    h = hashlib.sha256()
    for r in sorted(rows, key=lambda r: (r[3], r[4])):  # (partition, offset)
        h.update(repr(r).encode())
    return h.hexdigest()


def main(bootstrap: str, storage: str, metadata: str, topic: str, out: str) -> None:
    spark = SparkSession.builder.appName("tierproxy-read-history").getOrCreate()
    register(spark)
    df = (spark.read.format("tierproxy").option("kafka.bootstrap.servers", bootstrap).option("storage", storage)
          .option("metadata", metadata).option("subscribe", topic).option("includeHeaders", "true").load())
    rows = [tuple(r) for r in df.collect()]
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    with open(out, "w") as f:
        json.dump({"rows": len(rows), "digest": digest(rows), "partitions": df.rdd.getNumPartitions(),
                   "executors": executors, "master": spark.sparkContext.master}, f)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
