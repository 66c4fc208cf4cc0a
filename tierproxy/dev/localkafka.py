"""`make kafka`: one local Apache Kafka broker (KRaft, broker and controller in one JVM) in the foreground, for the
README's quickstart. Its data stays in a directory of its own between runs (the same cluster: a tier written
against it stays its own); Ctrl-C or SIGTERM stops the JVM and returns once it is gone and its port free."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from tierproxy.dev.kafkadist import KAFKA_VERSION, KafkaCluster, KafkaUnavailable

# 1 MiB segments (Kafka 4's smallest; its default is 1 GiB): a broker deletes whole closed segments only, and a
# quickstart's few MB close some, so a shorter retention shows history served from the tier
BROKER_CONFIG = {"log.segment.bytes": str(1 << 20)}


def _say(text: str) -> None:
    print(text, flush=True)


def _in_use(port: int) -> str | None:
    try:
        socket.create_server(("127.0.0.1", port)).close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _formatted_id(data: Path) -> str | None:
    """The cluster id of log dirs formatted by an earlier run (None: none yet)."""
    meta = data / "meta.properties"
    if not meta.exists():
        return None
    found = [line.split("=", 1)[1].strip() for line in meta.read_text().splitlines() if line.startswith("cluster.id=")]
    return found[0] if found else None


def run_local_kafka(port: int, workdir: Path) -> int:
    """Start the broker, wait until it is stopped (KeyboardInterrupt: exit 0) or exits by itself (1); 2 when the
    port is taken, 1 when Kafka cannot be had or started (one line each, the log's path)."""
    if (problem := _in_use(port)) is not None:
        print(f"tierproxy: 127.0.0.1:{port} cannot be listened on ({problem}): another Kafka? "
              "(make kafka KAFKA_PORT=...)", file=sys.stderr)
        return 2
    cluster: KafkaCluster | None = None
    try:
        _say(f"Starting Apache Kafka {KAFKA_VERSION} (KRaft; its jars resolved from Maven Central and cached the "
             "first time)...")
        cluster = KafkaCluster(1, workdir=workdir, port=port, broker_config=BROKER_CONFIG,
                               cluster_id=_formatted_id(workdir / "node1" / "data"))
        node = cluster.nodes[0]
        cluster.start()
        _say(f"Kafka is at {node.bootstrap} (data in {node.workdir / 'data'}, log {node.log_file}). "
             "Ctrl-C stops it.")
        while node.alive:
            time.sleep(0.5)
        print(f"tierproxy: Kafka exited by itself (code {node.proc.poll() if node.proc else '?'}): see "
              f"{node.log_file}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except KafkaUnavailable as exc:
        lines = str(exc).splitlines() or [type(exc).__name__]
        # the first line says what failed; the first exception's line (a format's, a start's) why
        why = next((line.strip() for line in lines[1:] if "Exception" in line or "ERROR" in line), "")
        first = f"{lines[0].rstrip(':')}{': ' + why if why else ''}"
        where = f" (log: {cluster.nodes[0].log_file})" if cluster is not None else ""
        print(f"tierproxy: {first}{where}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            cluster.stop()
            _say("Kafka stopped.")
