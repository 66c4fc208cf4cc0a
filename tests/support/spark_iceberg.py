"""Spark reading an Iceberg table as a user's Spark does: `spark.read.format("iceberg")` on the table's metadata file,
with Iceberg's Spark runtime. Iceberg publishes no runtime for the Spark 4.2 the tier job runs on, so this is
PySpark 4.1 with `iceberg-spark-runtime-4.1_2.13`, in its own environment (`make tools`), run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.support.parts import unavailable
from tierproxy.dev.maven import Artifact, MavenUnavailable, cache_dir, fetch

RUNTIME = Artifact("org.apache.iceberg", "iceberg-spark-runtime-4.1_2.13", "1.12.0")

_READ = """
import json, sys
from pyspark.sql import SparkSession
jar, reads = sys.argv[1], json.loads(sys.argv[2])
spark = (SparkSession.builder.master("local[2]").config("spark.jars", jar)
         .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
for i, (metadata, columns) in enumerate(reads):
    for row in spark.read.format("iceberg").load(metadata).selectExpr(*columns).collect():
        print(json.dumps([i, row.asDict()], default=str))
spark.stop()
"""


def spark_iceberg_python() -> Path:
    """The Python of the PySpark 4.1 environment `make tools` builds."""
    python = cache_dir() / "spark-iceberg" / "bin" / "python"
    if not python.exists():
        unavailable("PySpark with Iceberg", f"{python} is missing (make tools builds it)")
    return python


def iceberg_runtime_jar() -> str:
    """Iceberg's Spark runtime (one self-contained jar) from Maven Central, fetched once into the project cache."""
    try:
        return str(fetch(f"iceberg-spark-runtime-{RUNTIME.version}", RUNTIME))
    except MavenUnavailable as exc:
        unavailable("iceberg-spark-runtime", str(exc))


def spark_iceberg_rows(metadata: str, columns: list[str]) -> list[dict[str, Any]]:
    """The table's rows as Spark reads them from `metadata` (a metadata.json location), `columns` as Spark SQL
    expressions (`selectExpr`), each row a dict (values Spark cannot put in JSON as their text)."""
    return spark_iceberg_reads((metadata, columns))[0]


def spark_iceberg_reads(*reads: tuple[str, list[str]]) -> list[list[dict[str, Any]]]:
    """Several tables' rows (as `spark_iceberg_rows` reads one) from one Spark: a JVM started once."""
    # its own Spark: none of the test process's (SPARK_HOME would point PySpark 4.1 at Spark 4.2's jars)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_")) and k != "PYTHONPATH"}
    out = subprocess.run([str(spark_iceberg_python()), "-c", _READ, iceberg_runtime_jar(), json.dumps(reads)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, "\n".join([ln for ln in out.stderr.splitlines() if "Exception" in ln][:5]
                                          or out.stderr.splitlines()[-40:])
    rows: list[list[dict[str, Any]]] = [[] for _ in reads]
    for line in out.stdout.splitlines():
        if line.startswith("["):
            i, row = json.loads(line)
            rows[i].append(row)
    return rows
