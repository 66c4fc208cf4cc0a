"""Spark reading an Iceberg table as a user's Spark does: `spark.read.format("iceberg")` on the table's metadata file,
with Iceberg's Spark runtime. Iceberg publishes no runtime for the Spark 4.2 the tier job runs on, so this is
PySpark 4.1 with `iceberg-spark-runtime-4.1_2.13`, in its own environment (`make tools`), one subprocess per test
process serving its reads."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support.parts import unavailable
from tierproxy.dev.maven import Artifact, MavenUnavailable, cache_dir, fetch

RUNTIME = Artifact("org.apache.iceberg", "iceberg-spark-runtime-4.1_2.13", "1.12.0")

# one Spark per test process, reading what each line of stdin asks; a line {"done": n} (or {"error": ...}) ends
# each answer (Spark's own log goes to stderr). A read is [metadata file, columns], or [table, columns, catalog
# configuration] for a table read through a catalog (Spark loads a catalog from the session's configuration when
# first named, so one set at run time is as one set at the start)
_SERVE = """
import json, sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.jars", sys.argv[1])
         .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
for line in sys.stdin:
    reads = json.loads(line)
    try:
        for i, (source, columns, *catalog) in enumerate(reads):
            for k, v in (catalog[0] if catalog else {}).items():
                spark.conf.set(k, v)
            df = spark.table(source) if catalog else spark.read.format("iceberg").load(source)
            for row in df.selectExpr(*columns).collect():
                print(json.dumps([i, row.asDict()], default=str))
        print(json.dumps({"done": len(reads)}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": repr(exc)[:2000]}), flush=True)
spark.stop()
"""
_READER: list[tuple[subprocess.Popen[str], Path]] = []


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


def _reader() -> tuple[subprocess.Popen[str], Path]:
    """This process's Iceberg reader, started on first use (a JVM's start is most of a read's cost) and stopped when
    the process exits."""
    if _READER and _READER[0][0].poll() is None:
        return _READER[0]
    from tests.support.jvm import options as jvm_options

    # its own Spark: none of the test process's (SPARK_HOME would point PySpark 4.1 at Spark 4.2's jars); C1 alone
    # where the run's JVMs have it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_")) and k != "PYTHONPATH"}
    if jvm_options:
        env["SPARK_SUBMIT_OPTS"] = " ".join(jvm_options)
    log = Path(tempfile.mkstemp(prefix="spark-iceberg-", suffix=".log")[1])
    with log.open("w") as err:
        proc = subprocess.Popen([str(spark_iceberg_python()), "-c", _SERVE, iceberg_runtime_jar()], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    _READER[:] = [(proc, log)]
    atexit.register(_stop, proc, log)
    return proc, log


def _stop(proc: subprocess.Popen[str], log: Path) -> None:
    log.unlink(missing_ok=True)
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def spark_iceberg_reads(*reads: tuple[str, list[str]] | tuple[str, list[str], dict[str, str]]
                        ) -> list[list[dict[str, Any]]]:
    """Several tables' rows (as `spark_iceberg_rows` reads one), read by this process's Spark with Iceberg; a read
    of three parts names a table in a catalog and that catalog's Spark configuration (`spark.sql.catalog.<name>…`,
    e.g. `RestCatalogServer.spark_read`)."""
    proc, log = _reader()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(reads) + "\n")
    proc.stdin.flush()
    rows: list[list[dict[str, Any]]] = [[] for _ in reads]
    for line in proc.stdout:  # a reader that dies ends the loop: its log says why
        if line.startswith("["):
            i, row = json.loads(line)
            rows[i].append(row)
        elif line.startswith("{"):
            end = json.loads(line)
            assert "error" not in end, end["error"]
            return rows
    lines = log.read_text().splitlines()
    raise AssertionError("\n".join([ln for ln in lines if "Exception" in ln][:5] or lines[-40:]))
