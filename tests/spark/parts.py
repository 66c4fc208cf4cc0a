"""Spark parts for the DataFrame reader's tests: Spark's own Kafka source (spark-sql-kafka-0-10 from Maven Central,
for the comparison), a local session, a standalone cluster started with the PySpark distribution's
`bin/spark-class`, and `tierproxy tier --once` in a subprocess (its own Spark, not the test's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.realparts import unavailable
from tierproxy.kafkadist import cache_dir, free_port, stop_processes

SPARK_VERSION = "4.2.0"
# the connector and what it needs beyond PySpark's own jars
_WANTED = ("spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients", "commons-pool2")
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>tierproxy</groupId><artifactId>spark-kafka</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies><dependency><groupId>org.apache.spark</groupId><artifactId>spark-sql-kafka-0-10_2.13</artifactId>
    <version>{v}</version></dependency></dependencies>
</project>
"""


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka source for PySpark's version, resolved once with Maven into the project cache."""
    root = cache_dir() / f"spark-sql-kafka-{SPARK_VERSION}"
    libs = root / "libs"
    if not (root / ".complete").exists():
        if shutil.which("mvn") is None:
            unavailable("spark-sql-kafka", "mvn not on PATH")
        root.mkdir(parents=True, exist_ok=True)
        (root / "pom.xml").write_text(_POM.format(v=SPARK_VERSION))
        proc = subprocess.run(["mvn", "-q", "-B", "-f", str(root / "pom.xml"), "dependency:copy-dependencies",
                               f"-DoutputDirectory={libs}", "-DincludeScope=runtime"], capture_output=True, text=True,
                              timeout=900)
        if proc.returncode != 0:
            unavailable("spark-sql-kafka", proc.stdout[-2000:] + proc.stderr[-2000:])
        (root / ".complete").write_text(SPARK_VERSION)
    return sorted(str(j) for j in libs.glob("*.jar") if j.name.startswith(_WANTED))


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def local_session(master: str = "local[2]") -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # moto's credentials, before the JVM starts: Python workers inherit its environment (the usual AWS chain)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    from pyspark.sql import SparkSession

    from tierproxy.spark import register

    spark = (SparkSession.builder.master(master).appName("tierproxy-dataframe-tests")
             .config("spark.jars", ",".join(spark_kafka_jars())).config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def tier_once(bootstrap: str, topic: str, storage: str, metadata: str, workdir: Path,
              segment_bytes: int = 16 * 1024) -> None:
    """`tierproxy tier --once` for one topic, in its own process."""
    env = {**os.environ, "TIERPROXY_TIER_SEGMENT_BYTES": str(segment_bytes),
           "TIERPROXY_TIER_STATE_DIR": str(workdir / "state")}
    proc = subprocess.run([sys.executable, "-m", "tierproxy.cli", "tier", "--once", "--no-progress",
                           "--bootstrap-server", bootstrap, "--storage", storage, "--metadata", metadata,
                           "--topics", topic.replace(".", "\\."), "--master", "local[2]"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=workdir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@contextmanager
def standalone_cluster(workdir: Path, workers: int = 2) -> Iterator[str]:
    """A Spark standalone master and `workers` workers from the PySpark distribution (bin/spark-class)."""
    home = spark_home()
    spark_class = home / "bin" / "spark-class"
    if not spark_class.exists():
        unavailable("Spark standalone", f"{spark_class} missing")
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_WORKER_DIR": str(workdir / "work")}
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    master = f"spark://127.0.0.1:{port}"
    try:
        def start(name: str, *args: str) -> None:
            log = workdir / f"{name}.log"
            logs.append(log)
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(["bash", str(spark_class), *args], stdout=out,
                                              stderr=subprocess.STDOUT, env=env))

        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui))
        for i in range(workers):
            start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "1g", "--webui-port", str(free_port()), master)
        deadline = time.monotonic() + 90
        while sum("Successfully registered with master" in log.read_text(errors="replace")
                  for log in logs[1:]) < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                unavailable("Spark standalone", "\n".join(log.read_text(errors="replace")[-1500:] for log in logs))
            time.sleep(0.5)
        yield master
    finally:
        stop_processes(procs, 20)
