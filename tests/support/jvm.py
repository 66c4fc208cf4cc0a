"""The JVMs a test run starts (Kafka brokers and their storage format, Spark drivers, the schema registry) compile
with C1 alone. They live seconds to minutes, and C2 compiling them costs more than its code gives back in that
time; on two loaded cores every CPU-second is wall time. Measured apart (CPU-seconds of the JVM; default → C1):
a broker's start 10.2-11.5 → 6.0-6.2, its storage format 4.4-4.6 → 2.6-2.8, 200k records produced and read
2.3-3.4 → 1.3-1.4, idle 1.24-1.45 → 1.02-1.09 per 30 s; a Spark driver's start 24.8-25.6 → 12.8-13.1 and a few
small jobs 30.3-33.2 → 18.3-18.5. Benchmarks keep the full JIT: their baselines are the broker's own speed.

Brokers and Spark drivers also read their classes from a class data sharing archive (`tierproxy.dev.classshare`),
made once per cache by a training run: a node's start 4.7-5.4 → 3.0 CPU-s, its storage format 1.9 → 1.2.

Slower brokers once widened a real window (a killed leader's successor had not yet advanced its high watermark over
a range a tier pass retried there); the tier job now waits for it (`copy.BehindPlan`), as it must in production."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tierproxy.dev import classshare
from tierproxy.dev.kafkadist import KafkaCluster, class_archive, train_class_archive

QUICK_JIT = ["-XX:TieredStopAtLevel=1"]
options: list[str] = []  # what this run adds to each JVM it starts itself (the registry's reads it)
# an idle node's controller appends a no-op record to the metadata log every 500 ms by default (KIP-835), and the
# node publishes each: at 5 s an idle node spends 0.87 CPU-s per 30 s instead of 1.29 (a run keeps several alive)
IDLE_BROKER = {"metadata.max.idle.interval.ms": "5000"}

# a driver that runs a job with a Python worker and a DataFrame, then stops and waits for its JVM to exit (the
# archive is written at the exit)
_SPARK_TRAINING = """
from tierproxy.jobs.tiering.job import spark_session
s = spark_session("tierproxy-class-sharing", "local[1]", {})
gateway = s.sparkContext._gateway
assert s.sparkContext.parallelize([1, 2, 3], 2).map(lambda x: x * 2).sum() == 12
assert s.createDataFrame([(1, "a")], "n long, s string").groupBy("s").count().collect()[0][1] == 1
s.stop()
proc = gateway.proc
gateway.shutdown()
proc.stdin.close()
proc.wait(120)
"""


def java_command() -> list[str]:
    """`java` and this run's options (C1 alone, unless benchmarks run): for the Java clients and tools tests start."""
    return ["java", *options]


def _spark_options(given: str) -> list[str]:
    """SPARK_SUBMIT_OPTS without the class sharing options (what an archive's key is made of)."""
    return [o for o in given.split() if not o.startswith(("-XX:SharedArchiveFile=", "-Xlog:cds"))]


def spark_archive(options: list[str] | None = None) -> Path:
    """The Spark drivers' class data sharing archive for these SPARK_SUBMIT_OPTS (this process's by default),
    made or not."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")  # not imported: every test process computes this at its start
    assert spec is not None and spec.origin is not None
    home = Path(spec.origin).parent
    given = _spark_options(os.environ.get("SPARK_SUBMIT_OPTS", "")) if options is None else options
    return classshare.archive_path("spark", f"{home / 'conf'}:{home / 'jars'}/*", given)


def quick_jit() -> None:
    """C1 only for the JVMs started from here on: brokers (`KafkaCluster`), Spark's launcher (`SPARK_SUBMIT_OPTS`,
    inherited by the `tierproxy` processes tests start), and the schema registry (`options`). Brokers and Spark
    drivers read their classes from their archives once `train_archives` has made them."""
    options[:] = QUICK_JIT
    KafkaCluster.default_jvm_options = list(QUICK_JIT)
    KafkaCluster.class_sharing = True
    KafkaCluster.default_broker_config = dict(IDLE_BROKER)
    given = _spark_options(os.environ.get("SPARK_SUBMIT_OPTS", ""))
    if QUICK_JIT[0] not in given:
        given += QUICK_JIT
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join([*given, *classshare.sharing_options(spark_archive(given))])


def train_archives() -> None:
    """Make the Kafka nodes' archive, then the Spark drivers' (each unless it is there)."""
    train_class_archive()
    given = _spark_options(os.environ.get("SPARK_SUBMIT_OPTS", ""))

    def spark(dump: list[str]) -> None:
        subprocess.run([sys.executable, "-c", _SPARK_TRAINING], check=True, capture_output=True, timeout=300,
                       env={**os.environ, "SPARK_SUBMIT_OPTS": " ".join([*given, *dump])})

    classshare.train(spark_archive(), spark)


def start_training(root: Path, log: Path) -> bool:
    """`train_archives` in a process of its own beside the run (in the repository `root`), unless both archives
    are there: its start competes for the CPU less than a worker waiting for it would, and JVMs started before an
    archive is made run without it. Detached: a run shorter than the training leaves it to finish (in about two
    minutes at most, bounded by its JVMs' timeouts) for the next run."""
    if class_archive().exists() and spark_archive().exists():
        return False
    log.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["sh", "-c", 'exec "$0" -m tests.support.jvm > "$1" 2>&1 < /dev/null &', sys.executable, str(log)],
                   check=True, start_new_session=True, timeout=30, cwd=root)
    return True


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quick_jit()
    train_archives()
