"""The JVMs a test run starts (Kafka brokers and their storage format, Spark drivers, the schema registry) compile
with C1 alone. They live seconds to minutes, and C2 compiling them costs more than its code gives back in that
time; on two loaded cores every CPU-second is wall time. Measured apart (CPU-seconds of the JVM; default → C1):
a broker's start 10.2-11.5 → 6.0-6.2, its storage format 4.4-4.6 → 2.6-2.8, 200k records produced and read
2.3-3.4 → 1.3-1.4, idle 1.24-1.45 → 1.02-1.09 per 30 s; a Spark driver's start 24.8-25.6 → 12.8-13.1 and a few
small jobs 30.3-33.2 → 18.3-18.5. Benchmarks keep the full JIT: their baselines are the broker's own speed.

Slower brokers once widened a real window (a killed leader's successor had not yet advanced its high watermark over
a range a tier pass retried there); the tier job now waits for it (`copy.BehindPlan`), as it must in production."""

from __future__ import annotations

import os

from tierproxy.dev.kafkadist import KafkaCluster

QUICK_JIT = ["-XX:TieredStopAtLevel=1"]
options: list[str] = []  # what this run adds to each JVM it starts itself (the registry's reads it)


def quick_jit() -> None:
    """C1 only for the JVMs started from here on: brokers (`KafkaCluster`), Spark's launcher (`SPARK_SUBMIT_OPTS`,
    inherited by the `tierproxy` processes tests start), and the schema registry (`options`)."""
    options[:] = QUICK_JIT
    KafkaCluster.default_jvm_options = list(QUICK_JIT)
    given = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if QUICK_JIT[0] not in given:
        os.environ["SPARK_SUBMIT_OPTS"] = " ".join([given, *QUICK_JIT]).strip()
