"""`tierproxy demo`: a real local Kafka on loopback and the kcat commands that reach it."""

from __future__ import annotations

import shutil
import subprocess
import time

from tierproxy.kafkadist import KAFKA_VERSION, KafkaCluster


def run_demo(duration: float = 0.0) -> int:
    """Start a broker, prove it with kcat when available, print how to reach it, run until stopped."""
    print(f"Resolving Apache Kafka {KAFKA_VERSION} from Maven Central (cached after the first run)...", flush=True)
    cluster = KafkaCluster(1)
    cluster.start()
    try:
        bootstrap = cluster.bootstrap
        kcat = shutil.which("kcat") or "kcat"
        produce = f"echo hello-tierproxy | {kcat} -b {bootstrap} -P -t demo"
        consume = f"{kcat} -b {bootstrap} -C -t demo -o beginning -e"
        if shutil.which("kcat"):
            subprocess.run(produce, shell=True, check=True, timeout=60)
            out = subprocess.run(consume, shell=True, check=True, timeout=60, capture_output=True, text=True)
            print(f"kcat read back: {out.stdout.strip()!r}")
        print(f"\nKafka {KAFKA_VERSION} (KRaft) is running at {bootstrap}; logs in {cluster.workdir}")
        print("Try:")
        print(f"  {produce}")
        print(f"  {consume}")
        print(f"  {kcat} -b {bootstrap} -L", flush=True)
        deadline = time.monotonic() + duration if duration > 0 else float("inf")
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        print("Kafka stopped.")
    return 0
