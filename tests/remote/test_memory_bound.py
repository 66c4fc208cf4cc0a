"""Memory under load: 100 consumers catching up from the tier and 100 tail consumers on one proxy; its RSS stays
within the bound its configuration sets (requests and remote responses in `queued.max.request.bytes`, the chunk
and index caches, the relayed connections' own buffers)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from protocol import registry
from protocol.constants import ApiKey
from protocol.headers import RequestHeader
from protocol.records import iter_batches
from protocol.requests import fetch_request
from tests.support.kafka import create_topic, set_retention, small_segments, watermarks
from tests.support.parts import free_port_block
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.kafka]

PARTITIONS = 10
PER_PARTITION = 2000  # records of 1 KiB: 2 MiB of history per partition, 20 MiB in all
CONSUMERS = 100  # of each kind
MIB = 1 << 20


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _history(kafka: KafkaCluster, tmp: Path, topic: str) -> None:
    """PARTITIONS x PER_PARTITION records (incompressible 1 KiB values) tiered, then deleted by the broker."""
    create_topic(kafka.bootstrap, topic, partitions=PARTITIONS, config=small_segments(512 * 1024))
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20, "batch.size": 256 * 1024})
    for i in range(PER_PARTITION):
        for q in range(PARTITIONS):
            p.produce(topic, os.urandom(1000), f"{q}-{i}".encode(), partition=q)
    p.flush(30)
    assert tier_once(settings(kafka.bootstrap, tmp, topic, tier_segment_bytes=512 * 1024)).failed == 0
    set_retention(kafka.bootstrap, topic, 1000)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and min(watermarks(kafka.bootstrap, topic, q)[0] for q in range(PARTITIONS)) \
            < PER_PARTITION // 2:
        for q in range(PARTITIONS):
            p.produce(topic, b"tick", partition=q)
        p.flush(5)
        time.sleep(0.4)
    set_retention(kafka.bootstrap, topic, 3_600_000)
    assert min(watermarks(kafka.bootstrap, topic, q)[0] for q in range(PARTITIONS)) >= PER_PARTITION // 2


@pytest.fixture(scope="module")
def history(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One tiered topic shared by the tests here: (topic, the directory holding its tier and metadata)."""
    tmp = tmp_path_factory.mktemp("memory-history")
    topic = f"memory-history-{os.getpid()}"
    _history(kafka, tmp, topic)
    return topic, tmp


def _proxy(kafka: KafkaCluster, tier: Path, workdir: Path, bounds: dict[str, int]) -> ProxyProcess:
    proxy = ProxyProcess(kafka.bootstrap, workdir, extra={
        "TIERPROXY_STORAGE": f"file://{tier}/tier", "TIERPROXY_METADATA": f"file://{tier}/meta",
        "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{free_port_block(1)}",
        **{k: str(v) for k, v in bounds.items()}})
    wait_until(lambda: _ready(proxy), "the proxy's tier", timeout=60)
    # its admin API starts after the Kafka port opens (0.35-0.4 s here, on the loop the test then loads): the
    # tests read /metrics without retrying
    wait_until(lambda: proxy.metric("tierproxy_remote_fetch_purgatory") >= 0, "the admin API", timeout=30)
    return proxy


def test_100_remote_and_100_tail_consumers_stay_within_the_memory_bound(kafka: KafkaCluster, tmp_path: Path,
                                                                        history: tuple[str, Path], topic_name: str,
                                                                        kcat: str) -> None:
    history_topic, tier = history
    tail = topic_name
    create_topic(kafka.bootstrap, tail, partitions=PARTITIONS)
    bounds = {"TIERPROXY_QUEUED_MAX_REQUEST_BYTES": 8 * MIB, "TIERPROXY_REMOTE_FETCH_CACHE_BYTES": 8 * MIB,
              "TIERPROXY_REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES": 4 * MIB,
              "TIERPROXY_REMOTE_FETCH_CHUNK_BYTES": 1 * MIB}
    proxy = _proxy(kafka, tier, tmp_path, bounds)
    procs: list[subprocess.Popen[str]] = []
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss(proxy.proc.pid))
            time.sleep(0.05)

    try:
        base = _rss(proxy.proc.pid)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        tail_records = 200
        for i in range(CONSUMERS):  # tail consumers wait at the end (offset 0: the topic is empty, so one that
            # starts after the first records misses none) for records not yet written
            procs.append(subprocess.Popen([kcat, "-b", proxy.bootstrap, "-C", "-t", tail, "-p", str(i % PARTITIONS),
                                           "-o", "0", "-c", str(tail_records), "-q", "-f", "%o\n", "-m", "60"],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for i in range(CONSUMERS):  # catch-up consumers read their partition's whole history from offset 0
            procs.append(subprocess.Popen([kcat, "-b", proxy.bootstrap, "-C", "-t", history_topic, "-p",
                                           str(i % PARTITIONS), "-o", "0", "-c", str(PER_PARTITION), "-q", "-m", "60",
                                           "-f", "%o\n"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
        for i in range(tail_records):
            for q in range(PARTITIONS):
                p.produce(tail, os.urandom(1000), partition=q)
            if i % 20 == 19:
                p.flush(10)
                time.sleep(0.05)
        p.flush(30)
        outputs = [proc.communicate(timeout=240) for proc in procs]
        stop.set()
        sampler.join(5)
        grown = peak[0] - base
        for (out, err), proc in zip(outputs, procs, strict=True):
            wanted = tail_records if tail in proc.args else PER_PARTITION  # type: ignore[operator]
            got = [int(x) for x in out.split()]
            assert len(got) == wanted and got == sorted(got), err[-500:]
            if wanted == PER_PARTITION:
                assert got == list(range(PER_PARTITION))  # from the tier, then the broker
        bound = sum(bounds.values()) - bounds["TIERPROXY_REMOTE_FETCH_CHUNK_BYTES"] + 400 * 256 * 1024
        print(f"proxy RSS {base / MIB:.0f} MiB idle, peak {peak[0] / MIB:.0f} MiB (+{grown / MIB:.0f} MiB); "
              f"bound {bound / MIB:.0f} MiB")
        assert grown < bound, f"RSS grew {grown / MIB:.0f} MiB, bound {bound / MIB:.0f} MiB"
    finally:
        stop.set()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        proxy.stop()


def _ready(proxy: ProxyProcess) -> bool:
    try:
        with WireClient(proxy.bootstrap) as w:
            w.request(3, 12, {"topics": [], "allow_auto_topic_creation": False})
        return "remote tier ready" in proxy.log_text()
    except OSError:
        return False


def _read_frame(s: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = s.recv(n - len(out))
            assert chunk, "connection closed mid-frame"
            out += chunk
        return bytes(out)
    return exactly(int.from_bytes(exactly(4), "big"))


def test_remote_responses_to_clients_that_do_not_read_are_held_within_queued_max_request_bytes(
        kafka: KafkaCluster, tmp_path: Path, history: tuple[str, Path]) -> None:
    """20 clients each send a Fetch of every partition's history from offset 0 (50 MiB max_bytes, 4 MiB per
    partition: a 10-20 MiB remote response each) and then read nothing. The remote responses count against
    queued.max.request.bytes (8 MiB here) until they have left the process, so the proxy holds about that much for
    them, not 20 x 20 MiB; the others are answered empty (read again later). Once the stalled clients go, a
    normal client reads every record from the tier — also after 10 more clients read that Fetch's answer, sent it
    again and hung up before the second answer (a connection that knows its partitions are remote has reads started
    with the request: their grant comes back when the connection closes, not only when an answer is written)."""
    topic, tier = history
    bounds = {"TIERPROXY_QUEUED_MAX_REQUEST_BYTES": 8 * MIB, "TIERPROXY_REMOTE_FETCH_CACHE_BYTES": 4 * MIB,
              "TIERPROXY_REMOTE_LOG_INDEX_FILE_CACHE_TOTAL_SIZE_BYTES": 4 * MIB,
              "TIERPROXY_REMOTE_FETCH_CHUNK_BYTES": 1 * MIB, "TIERPROXY_BUFFER_HIGH_WATER_BYTES": 256 * 1024}
    proxy = _proxy(kafka, tier, tmp_path, bounds)
    address = ("127.0.0.1", proxy.base + kafka.nodes[0].node_id)
    stalled: list[socket.socket] = []
    try:
        base = _rss(proxy.proc.pid)
        header = RequestHeader(ApiKey.FETCH, 12, 1, "stalled", 2, 0)
        body = fetch_request({topic: dict.fromkeys(range(PARTITIONS), 0)}, max_bytes=50 * MIB,
                             partition_max_bytes=4 * MIB)
        frame = b"".join(bytes(c) for c in registry.encode_request(header, body))
        for _ in range(20):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            s.connect(address)
            s.sendall(frame)
            stalled.append(s)
        peak = base
        started = time.monotonic()
        deadline = started + 60
        while time.monotonic() < deadline:  # until every purgatory has expired and every read has finished
            for _ in range(25):
                peak = max(peak, _rss(proxy.proc.pid))
                time.sleep(0.02)
            if time.monotonic() - started > 1 and not any(proxy.metric(m) for m in (
                    "tierproxy_remote_fetch_purgatory", "tierproxy_remote_log_reader_busy",
                    "tierproxy_remote_log_reader_task_queue_size")):
                break
        else:
            raise AssertionError("remote reads still running after 60 s")
        grown = peak - base
        print(f"proxy RSS {base / MIB:.0f} MiB idle, peak {peak / MIB:.0f} MiB (+{grown / MIB:.0f} MiB) with 20 "
              "stalled remote responses")
        assert grown < 32 * MIB, f"RSS grew {grown / MIB:.0f} MiB for bounds of 16 MiB"
    finally:
        for s in stalled:
            s.close()
    for _ in range(10):
        with socket.create_connection(address, timeout=30) as s:
            s.sendall(frame)
            _read_frame(s)
            s.sendall(frame)  # the reads start at once; the connection is gone before the answer comes back
    try:
        nxt = dict.fromkeys(range(PARTITIONS), 0)
        with WireClient(f"{address[0]}:{address[1]}", timeout=60) as w:
            for _ in range(400):
                want = {q: o for q, o in nxt.items() if o < PER_PARTITION}
                if not want:
                    break
                resp = w.request(ApiKey.FETCH, 12, fetch_request({topic: want}, max_bytes=50 * MIB,
                                                                 partition_max_bytes=4 * MIB))
                for part in resp["responses"][0]["partitions"]:
                    assert part["error_code"] == 0, part["error_code"]
                    for b in iter_batches(part["records"]):
                        nxt[part["partition_index"]] = max(nxt[part["partition_index"]], b.last_offset + 1)
        assert min(nxt.values()) >= PER_PARTITION, nxt
    finally:
        proxy.stop()
