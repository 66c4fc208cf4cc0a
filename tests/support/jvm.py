"""The JVMs a test run starts for Spark (drivers, through Spark's launcher) and the schema registry compile with C1
alone. They live seconds to minutes, and C2 compiling them costs more than its code gives back in that time; on
two loaded cores every CPU-second is wall time. Measured apart (CPU-seconds of the JVM; default → C1): a Spark
driver's start 24.8-25.6 → 12.8-13.1, a few small jobs 30.3-33.2 → 18.3-18.5.

Kafka brokers keep the full JIT, though C1 halved their start too (10.2-11.5 → 6.0-6.2 CPU-s): with C1 brokers a
full run failed once where a tier pass retries a copy at a killed leader's successor, whose high watermark had
not reached the range yet (the retry read nothing and the pass left the range to the next one). Benchmarks keep
the full JIT everywhere: their baselines are the broker's own speed."""

from __future__ import annotations

import os

QUICK_JIT = ["-XX:TieredStopAtLevel=1"]
options: list[str] = []  # what this run adds to the JVMs it starts itself (the registry's command line)


def quick_jit() -> None:
    """C1 only for the JVMs started from here on: Spark's launcher (`SPARK_SUBMIT_OPTS`, inherited by the
    `tierproxy` processes tests start) and the schema registry (`options`)."""
    options[:] = QUICK_JIT
    given = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if QUICK_JIT[0] not in given:
        os.environ["SPARK_SUBMIT_OPTS"] = " ".join([given, *QUICK_JIT]).strip()
