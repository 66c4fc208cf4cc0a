"""While the segment metadata loads (made deterministic: tierproxy's own listener sits behind a loopback gate the
test opens late), a fetch below the broker's log start gets REPLICA_NOT_AVAILABLE (retriable, as Kafka answers
while its RLMM initializes), never OFFSET_OUT_OF_RANGE: kcat, confluent-kafka and the Java consumer, reading from
offset 0 with their default auto.offset.reset (latest), read every record once the tier is ready."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from protocol.constants import ApiKey, ErrorCode, OffsetSpec
from protocol.requests import fetch_request, list_offsets_request
from tests.support.jvm import java_command
from tests.support.kafka import broker_forgets, create_topic, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tests.support.waiting import connected_ports, wait_until
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.kafka, pytest.mark.kcat, pytest.mark.spark]
RECORDS = 4000


@contextmanager
def gate(target: str) -> Iterator[tuple[int, threading.Event]]:
    """A loopback TCP forwarder to `target` on a port that refuses connections until the event is set."""
    port, opened = free_port(), threading.Event()
    stop = threading.Event()
    host, _, tport = target.rpartition(":")

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def serve() -> None:
        opened.wait()
        with socket.create_server(("127.0.0.1", port)) as srv:
            srv.settimeout(0.2)
            while not stop.is_set():
                try:
                    c, _ = srv.accept()
                except TimeoutError:
                    continue
                u = socket.create_connection((host, int(tport)))
                for a, b in ((c, u), (u, c)):
                    threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield port, opened
    finally:
        stop.set()
        opened.set()
        t.join(5)


def _tiered_then_forgotten(kafka: KafkaCluster, tmp: Path, topic: str, metadata: str | None = None
                           ) -> tuple[TierSettings, int]:
    """RECORDS records tiered (metadata in `metadata`, default files), then the first half deleted by the broker;
    → the settings and the broker's new log start."""
    create_topic(kafka.bootstrap, topic, config={"segment.ms": "2000"})
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        p.produce(topic, f"r{i}".encode() * 20)
    p.flush(60)
    s = settings(kafka.bootstrap, tmp, topic, **({"metadata": metadata} if metadata else {}))
    assert tier_once(s).failed == 0
    return s, broker_forgets(kafka.bootstrap, topic, above=RECORDS // 2)


@contextmanager
def _gated_proxy(kafka: KafkaCluster, tmp: Path, s: TierSettings) -> Iterator[tuple[ProxyProcess, threading.Event]]:
    """A proxy whose own listener (command config's bootstrap.servers) sits behind a closed gate: set the event
    to open it. The proxy is stopped by the caller."""
    with gate(kafka.bootstrap) as (port, opened):
        cfg = tmp / "own.properties"
        cfg.write_text(f"security.protocol=PLAINTEXT\nbootstrap.servers=127.0.0.1:{port}\n")
        yield ProxyProcess(kafka.bootstrap, tmp, extra={"TIERPROXY_COMMAND_CONFIG": str(cfg),
                                                        "TIERPROXY_STORAGE": s.storage,
                                                        "TIERPROXY_METADATA": str(s.metadata)}), opened


def test_readers_from_zero_wait_for_the_tier_instead_of_resetting(kafka: KafkaCluster, kcat: str, tmp_path: Path,
                                                                  topic_name: str) -> None:
    meta = f"topic:__tierproxy_meta_{topic_name}?partitions=2&replication=1"
    s, log_start = _tiered_then_forgotten(kafka, tmp_path, topic_name, meta)
    with _gated_proxy(kafka, tmp_path, s) as (proxy, opened):
        try:
            with WireClient(proxy.bootstrap) as w:  # loading: no earliest offset that would skip the tier
                resp = w.request(ApiKey.LIST_OFFSETS, 9, list_offsets_request({topic_name: {0: OffsetSpec.EARLIEST}}))
            part = resp["topics"][0]["partitions"][0]
            assert (part["error_code"], part["offset"]) == (ErrorCode.REPLICA_NOT_AVAILABLE, -1)
            readers = {
                "kcat": subprocess.Popen([kcat, "-b", proxy.bootstrap, "-C", "-t", topic_name, "-p", "0", "-o", "0",
                                          "-c", str(RECORDS), "-q", "-f", "%o\n"], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True),
                "java": subprocess.Popen([*java_command(), "-Xmx256m", "-cp", f"{kafka.libs}/*",
                                          "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                                          proxy.bootstrap, "--topic", topic_name, "--partition", "0", "--offset", "0",
                                          "--max-messages", str(RECORDS), "--timeout-ms", "120000",
                                          "--property", "print.offset=true", "--property", "print.value=false"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True),
            }
            c = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"{topic_name}-loading",
                          "enable.auto.commit": False})
            c.assign([TopicPartition(topic_name, 0, 0)])
            got: list[int] = [m.offset() for m in c.consume(100, 3.0) if m.error() is None]
            assert got == []  # nothing yet: neither records nor a reset to the end
            brokers = range(proxy.base, proxy.base + 100)  # the proxy's per-broker listeners
            for name in ("kcat", "java"):  # each reader is past bootstrap, fetching from a broker while it loads
                wait_until(lambda r=readers[name]: any(p in brokers for p in connected_ports(r.pid)),  # type: ignore[misc]
                           f"{name} fetching through the proxy", timeout=60)
            opened.set()  # the metadata can load now
            deadline = time.monotonic() + 120
            while len(got) < RECORDS and time.monotonic() < deadline:
                got += [m.offset() for m in c.consume(1000, 1.0) if m.error() is None]
            c.close()
            assert got[:RECORDS] == list(range(RECORDS))
            outputs = {name: r.communicate(timeout=150)[0] for name, r in readers.items()}
            assert [int(x) for x in outputs["kcat"].split()] == list(range(RECORDS))
            java = [int(m) for m in re.findall(r"Offset:(\d+)", outputs["java"])]
            assert java == list(range(RECORDS))
            assert log_start > RECORDS // 2  # the first half really was served from the tier
        finally:
            proxy.stop()


def test_remote_answers_carry_the_leaders_offsets_or_a_retriable_error(kafka: KafkaCluster, tmp_path: Path,
                                                                       topic_name: str) -> None:
    """O item 7: the high watermark, last stable offset and log start of a remote answer are the leader's (asked on
    tierproxy's own listener), never made up from the tier's end. While the leader cannot be asked (own listener
    behind a closed gate, metadata from files so the tier is ready), the partition gets REPLICA_NOT_AVAILABLE and no
    records; once it can, the records come with the broker's own high watermark."""
    s, log_start = _tiered_then_forgotten(kafka, tmp_path, topic_name)
    with _gated_proxy(kafka, tmp_path, s) as (proxy, opened):
        try:
            def fetch() -> dict[str, Any]:
                with WireClient(proxy.bootstrap) as w:  # relayed to the one broker (per-broker ports need the gate)
                    resp = w.request(ApiKey.FETCH, 12, fetch_request({topic_name: {0: 0}}, max_bytes=1 << 20))
                return dict(resp["responses"][0]["partitions"][0])

            proxy.wait_tier_ready(timeout=30, connections=False)
            blind = fetch()
            assert blind["error_code"] == ErrorCode.REPLICA_NOT_AVAILABLE
            assert len(blind["records"] or b"") == 0 and blind["high_watermark"] == -1
            opened.set()
            # an answer with no error may still hold no records (a tier read still running when the 500 ms purgatory
            # expired, on a loaded machine): the client fetches again, and so does the test
            seen = wait_until(lambda: (f := fetch())["error_code"] == 0 and f["records"] and f, "a remote answer",
                              timeout=30)
            hw = watermarks(kafka.bootstrap, topic_name)[1]
            assert len(seen["records"]) > 0
            assert (seen["high_watermark"], seen["last_stable_offset"], seen["log_start_offset"]) == (hw, hw, 0)
            assert log_start > 0
        finally:
            proxy.stop()
