"""read_committed over the tier, and S3 trouble that remote readers feel but tail readers do not.

Tail latency under S3 trouble is measured in tests/bench/test_outage_bench.py (timing belongs in benchmarks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from protocol.records import iter_batches
from tests.support.kafka import broker_forgets, create_topic, read_to_end, set_retention, set_topic_config, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.relay import DelayRelay
from tests.support.remote import tier_to_s3_and_forget, timed_fetch
from tests.support.s3 import S3Server
from tests.support.spark import local_session
from tests.support.tiering import settings, tier_once
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark]




def fetch_p99(address: str, topic: str, offset: int, n: int = 200) -> float:
    lat = sorted(timed_fetch(address, topic, offset)[0] for _ in range(n))
    return lat[int(n * 0.99) - 1]


@contextmanager
def remote_readers(read: Callable[[], object], n: int = 4) -> Iterator[None]:
    """`n` threads calling `read` in a loop for as long as the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            read()

    threads = [threading.Thread(target=loop) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(10)




def _forgotten_then_read_committed(kafka: KafkaCluster, tmp_path: Path, topic: str) -> list[str]:
    """The broker deletes the tiered records; then a read_committed consumer reads the topic through a proxy
    serving the filesystem tier (the broker's "tick" records left out)."""
    broker_forgets(kafka.bootstrap, topic, interval=0.4)
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                           "TIERPROXY_METADATA": f"file://{tmp_path}/meta"})
    try:
        return [v for v in read_to_end(proxy.bootstrap, topic, "read_committed", timeout=90) if v != "tick"]
    finally:
        proxy.stop()


def test_read_committed_sees_no_aborted_record(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name, config={"segment.ms": "300"})
    tx = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{topic_name}", "linger.ms": 0})
    plain = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    tx.init_transactions(30)
    committed = []
    ts0 = int(time.time() * 1000) - 600_000  # each transaction a second later: its first record rolls the segment
    for n, outcome in enumerate(["commit", "abort"] * 4):
        tx.begin_transaction()
        for i in range(30):
            tx.produce(topic_name, f"{outcome}-{n}-{i}".encode() * 20, timestamp=ts0 + n * 1000)
            tx.flush(10)
            if i % 10 == 0:
                plain.produce(topic_name, f"plain-{n}-{i}".encode(), timestamp=ts0 + n * 1000)
                plain.flush(10)
                committed.append(f"plain-{n}-{i}")
        if outcome == "commit":
            tx.commit_transaction(30)
            committed += [f"commit-{n}-{i}" * 20 for i in range(30)]
        else:
            tx.abort_transaction(30)
    assert tier_once(settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=8 * 1024)).segments > 3
    got = _forgotten_then_read_committed(kafka, tmp_path, topic_name)
    assert not [v for v in got if v.startswith("abort")]
    assert sorted(got) == sorted(committed)


def test_an_abort_many_tiered_segments_later_is_found(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    """A transaction stays open over 30+ tiered segments (a producer slow to abort, much written meanwhile) and is
    then aborted: read_committed through the proxy follows every later segment to its abort marker (Kafka's
    collectAbortedTransactions), so none of its records is served."""
    create_topic(kafka.bootstrap, topic_name, config={"segment.ms": "2000"})
    tx = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{topic_name}", "linger.ms": 0})
    plain = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    tx.init_transactions(30)
    tx.begin_transaction()
    committed = []
    for i in range(240):
        tx.produce(topic_name, f"abort-{i}-".encode() + b"x" * 400)
        tx.flush(10)
        plain.produce(topic_name, f"plain-{i}".encode())
        plain.flush(10)
        committed.append(f"plain-{i}")
    tx.abort_transaction(30)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=4 * 1024)
    assert tier_once(s).segments > 30
    got = _forgotten_then_read_committed(kafka, tmp_path, topic_name)
    assert not [v for v in got if v.startswith("abort")]
    assert got == committed


def test_an_abort_still_in_the_brokers_log_is_found(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    """T1 writes 100 records and is aborted only after T2 (another producer) has opened a transaction: the tier
    copies up to the last stable offset (T2's start), so T1's records are tiered and its ABORT marker is not. Once
    the broker has deleted T1's records but still holds the marker, read_committed through the proxy knows the
    abort: the pass recorded it in the tier (`tier.transactions`, from the copy's own READ_COMMITTED fetch; a tier
    without that record asks the broker's log, as Kafka's collectAbortedTransactions goes on into the local log):
    none of T1's records is served (before: all 100 were, as committed), through the proxy nor in the tier's
    DataFrame."""
    create_topic(kafka.bootstrap, topic_name, config={"segment.ms": "300"})
    t1, t2 = (Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"{n}-{topic_name}",
                        "linger.ms": 0}) for n in ("t1", "t2"))
    plain = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0})
    t1.init_transactions(30)
    t2.init_transactions(30)
    t1.begin_transaction()
    for i in range(100):
        t1.produce(topic_name, f"abort-{i}".encode())
    t1.flush(10)
    time.sleep(0.5)
    # rolls the segment (segment.ms has passed); an hour-ahead timestamp keeps the new one from expiring below
    plain.produce(topic_name, b"plain-0", timestamp=int(time.time() * 1000) + 1_800_000)
    plain.flush(10)
    set_topic_config(kafka.bootstrap, topic_name, "segment.ms", "3600000")
    t2.begin_transaction()
    t2.produce(topic_name, b"open-0")
    t2.flush(10)
    t1.abort_transaction(30)  # its marker lands after T2's first record: LSO = T2's start
    try:
        assert tier_once(settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=4 * 1024)).segments
        set_retention(kafka.bootstrap, topic_name, 1000)
        try:
            wait_until(lambda: watermarks(kafka.bootstrap, topic_name)[0] == 100, "the broker deletes T1's records",
                       timeout=60, interval=0.5)
        finally:
            set_retention(kafka.bootstrap, topic_name, 3_600_000)
        proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                               "TIERPROXY_METADATA": f"file://{tmp_path}/meta"})
        try:
            assert read_to_end(proxy.bootstrap, topic_name, "read_uncommitted", timeout=60)[:101] == \
                [f"abort-{i}" for i in range(100)] + ["plain-0"]  # T1's records are served from the tier
            assert read_to_end(proxy.bootstrap, topic_name, "read_committed", timeout=60) == ["plain-0"]
        finally:
            proxy.stop()
        # the tier as a Spark DataFrame: the same abort, from the tier's recorded outcome when the read is planned
        spark = local_session()

        def values(isolation: str) -> list[str]:
            df = spark.read.format("tierproxy").option("kafka.bootstrap.servers", kafka.bootstrap).options(
                storage=f"file://{tmp_path}/tier", metadata=f"file://{tmp_path}/meta", subscribe=topic_name,
                **{"kafka.isolation.level": isolation}).load()
            return [bytes(r.value).decode() for r in df.orderBy("offset").collect()]

        assert values("read_uncommitted") == [f"abort-{i}" for i in range(100)] + ["plain-0"]
        assert values("read_committed") == ["plain-0"]
    finally:
        t2.abort_transaction(30)


@pytest.mark.s3
def test_s3_outage_and_latency_hit_only_remote_readers(kafka: KafkaCluster, s3: S3Server, tmp_path: Path,
                                                       topic_name: str) -> None:
    tier_to_s3_and_forget(kafka, s3, tmp_path, topic_name)
    storage = f"s3://tier/p?endpoint={s3.endpoint}&region={s3.region}"
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": storage, "TIERPROXY_METADATA": f"file://{tmp_path}/meta",
        "TIERPROXY_REMOTE_FETCH_CACHE_BYTES": "0", "TIERPROXY_REMOTE_FETCH_PREFETCH_CHUNKS": "0",
        "TIERPROXY_REMOTE_LOG_MANAGER_TASK_RETRY_BACKOFF_MS": "50",
        "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
    broker_port = f"127.0.0.1:{proxy.base + 1}"
    hw = watermarks(kafka.bootstrap, topic_name)[1]

    def fetch(offset: int) -> tuple[float, dict[str, Any]]:
        return timed_fetch(broker_port, topic_name, offset)

    try:
        wait_until(lambda: proxy_serves_tier(broker_port, topic_name), "the tier via the proxy")

        def answered() -> dict[str, Any] | None:  # a read still running when the 500 ms purgatory expires (a loaded
            # machine, no cache) is answered empty with no error: a client fetches again, and so does the test
            got = fetch(0)[1]
            return None if got["error_code"] == 0 and not list(iter_batches(got["records"])) else got

        part = wait_until(answered, "an answer with records (or an error)", timeout=30)
        assert part["error_code"] == 0 and list(iter_batches(part["records"]))  # S3 up: served remotely
        s3.proc.kill()  # S3 down
        s3.proc.wait(10)
        took, part = fetch(0)
        assert took < 0.5 + 1.0  # within remote.fetch.max.wait.ms (500 ms) plus slack
        assert part["error_code"] in (0, 56) and not list(iter_batches(part["records"]))  # empty or storage error
        with remote_readers(lambda: fetch(0)):  # catch-up readers hammer the dead store meanwhile
            tail = [fetch(hw - 1)[1] for _ in range(50)]
        assert all(t["error_code"] == 0 and list(iter_batches(t["records"])) for t in tail)
    finally:
        proxy.stop()


@pytest.mark.s3
def test_five_second_s3_latency_expires_remote_reads_not_tail_reads(kafka: KafkaCluster, s3: S3Server,
                                                                    tmp_path: Path, topic_name: str) -> None:
    """Slow (~35-70 s): every S3 request takes 5 s more, on purpose, while remote reads expire and tail reads go on."""
    tier_to_s3_and_forget(kafka, s3, tmp_path, topic_name)
    port = int(s3.endpoint.rsplit(":", 1)[1])
    slow = DelayRelay(port, delay=5.0)  # every request to S3 now takes 5 s more
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": f"s3://tier/p?endpoint=http://127.0.0.1:{slow.port}&region={s3.region}",
        "TIERPROXY_METADATA": f"file://{tmp_path}/meta", "TIERPROXY_REMOTE_FETCH_CACHE_BYTES": "0",
        "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
    broker_port = f"127.0.0.1:{proxy.base + 1}"
    hw = watermarks(kafka.bootstrap, topic_name)[1]

    def fetch(offset: int) -> tuple[float, dict[str, Any]]:
        return timed_fetch(broker_port, topic_name, offset)

    try:
        wait_until(lambda: proxy_serves_tier(broker_port, topic_name), "the tier via the proxy")
        took, part = fetch(0)
        assert took < 0.5 + 1.0 and part["error_code"] == 0 and not list(iter_batches(part["records"]))
        with remote_readers(lambda: fetch(0)):  # catch-up reads wait on slow S3 meanwhile
            tail = [fetch(hw - 1)[1] for _ in range(50)]
        assert all(t["error_code"] == 0 and list(iter_batches(t["records"])) for t in tail)
        deadline = time.monotonic() + 30  # the slow reads finish in the background and warm nothing (cache 0);
        served = False                    # a fetch whose read completes within the wait is served
        while not served and time.monotonic() < deadline:
            slow.delay = 0.0
            took, part = fetch(0)
            served = part["error_code"] == 0 and bool(list(iter_batches(part["records"])))
        assert served, "remote reads did not recover once S3 was fast again"
    finally:
        proxy.stop()
        slow.close()
