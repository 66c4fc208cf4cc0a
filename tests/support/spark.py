"""Spark parts for the DataFrame reader's tests: Spark's own Kafka source (spark-sql-kafka-0-10 from Maven Central,
for the comparison), a local session, a standalone cluster started with the PySpark distribution's
`bin/spark-class`, and `tierproxy tier --once` in a subprocess (its own Spark, not the test's)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from tests.support.kafka import set_retention, watermarks
from tests.support.parts import unavailable
from tierproxy.dev.kafkadist import stop_processes
from tierproxy.dev.maven import Artifact, MavenUnavailable, resolve
from tierproxy.dev.ports import free_port

SPARK_VERSION = "4.2.0"
# the connector and what it needs beyond PySpark's own jars
_WANTED = ("spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13", "kafka-clients", "commons-pool2")


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka source for PySpark's version, resolved once with Maven into the project cache."""
    try:
        libs = resolve(f"spark-sql-kafka-{SPARK_VERSION}",
                       [Artifact("org.apache.spark", "spark-sql-kafka-0-10_2.13", SPARK_VERSION)])
    except MavenUnavailable as exc:
        unavailable("spark-sql-kafka", str(exc))
    return sorted(str(j) for j in libs.glob("*.jar") if j.name.startswith(_WANTED))


def spark_avro_jars() -> list[str]:
    """Spark's Avro functions (`from_avro`) for PySpark's version, resolved once with Maven (Avro itself is in
    PySpark's own jars)."""
    try:
        libs = resolve(f"spark-avro-{SPARK_VERSION}", [Artifact("org.apache.spark", "spark-avro_2.13", SPARK_VERSION)])
    except MavenUnavailable as exc:
        unavailable("spark-avro", str(exc))
    return sorted(str(j) for j in libs.glob("*.jar") if j.name.startswith("spark-avro"))


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


_WORKER_SESSION: list[Any] = []
# what the process's session carries on its class path, resolved when it starts (a JVM's class path is fixed then):
# Spark's Kafka source always; the benchmarks add Spark's Avro functions (tests/bench/conftest.py)
SESSION_JARS: list[Callable[[], list[str]]] = [spark_kafka_jars]


def worker_session() -> Any:
    """The one SparkSession of this test process (an xdist worker, or the whole run without xdist), started on
    first use and stopped when the process's tests end (`stop_worker_session`): the tier job, the Iceberg step and
    the DataFrame tests all use it, as a notebook's jobs share the notebook's session. Its configuration is the
    union of what they need (the tier job's own settings, Spark's Kafka source on the class path, UTC)."""
    if _WORKER_SESSION:
        return _WORKER_SESSION[0]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from tierproxy.jobs.spark import register
    from tierproxy.jobs.tiering.job import spark_session

    spark = spark_session("tierproxy-tests", "local[2]", {
        "spark.jars": ",".join(j for jars in SESSION_JARS for j in jars()), "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "2"})
    register(spark)
    _WORKER_SESSION.append(spark)
    return spark


def stop_worker_session() -> None:
    if _WORKER_SESSION:
        _WORKER_SESSION.pop().stop()


def local_session() -> Any:
    """The process's Spark session (`worker_session`): never stop it."""
    return worker_session()


def tier_once(bootstrap: str, topic: str, storage: str, metadata: str, workdir: Path,
              segment_bytes: int = 16 * 1024) -> None:
    """One tier pass of one topic, on the process's Spark session."""
    from tests.support.tiering import settings
    from tests.support.tiering import tier_once as run

    s = settings(bootstrap, workdir, topic, storage=storage, metadata=metadata, tier_segment_bytes=segment_bytes)
    summary = run(s)
    assert summary.failed == 0, summary.errors


@contextmanager
def standalone_cluster(workdir: Path, workers: int = 2) -> Iterator[str]:
    """A Spark standalone master and `workers` workers from the PySpark distribution (bin/spark-class)."""
    home = spark_home()
    spark_class = home / "bin" / "spark-class"
    if not spark_class.exists():
        unavailable("Spark standalone", f"{spark_class} missing")
    port, ui = free_port(), free_port()
    from tests.support.jvm import options as jvm_options

    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_WORKER_DIR": str(workdir / "work"),
           "SPARK_DAEMON_JAVA_OPTS": " ".join(jvm_options)}  # the master and workers: the run's JVM options
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


def read(spark: Any, fmt: str, options: dict[str, str]) -> list[tuple[Any, ...]]:
    df = spark.read.format(fmt).options(**options).load()
    return sorted((tuple(r) for r in df.collect()), key=lambda r: (r[3], r[4]))


def kafka_source(spark: Any, bootstrap: str, topic: str, **opts: str) -> list[tuple[Any, ...]]:
    return read(spark, "kafka", {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **opts})


def delete_on_broker(bootstrap: str, topic: str, partitions: int, above: list[int] | None = None) -> None:
    """Shorten retention and roll segments until the broker's log start moved on every partition (past
    `above[partition]` when given: ticks appended here after that offset are deleted too)."""
    past = above or [0] * partitions
    set_retention(bootstrap, topic, 1000)
    p = Producer({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 90
    while any(watermarks(bootstrap, topic, i)[0] <= past[i] for i in range(partitions)):
        assert time.monotonic() < deadline, "the broker did not delete"
        for i in range(partitions):
            p.produce(topic, b"tick", partition=i)
        p.flush(5)
        time.sleep(0.5)
