"""Kafka's fetch semantics over the tier (issue O items 1, 6): one byte budget per request, remote reads within
it; a fetch mixing a remote partition with an idle one does not wait the idle one's max_wait_ms first."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from protocol.constants import ApiKey, ErrorCode
from protocol.records import iter_batches
from protocol.requests import fetch_request
from tests.support.kafka import create_topic, set_retention, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once, tiered
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.kafka, pytest.mark.kcat, pytest.mark.spark]
PARTITIONS, PER_PARTITION = 120, 1000


def _tier_and_forget(kafka: KafkaCluster, tmp: Path, topic: str, partitions: int, per_partition: int,
                     size: int) -> dict[int, int]:
    """`per_partition` records in each partition, tiered, then deleted by the broker; → log start per partition."""
    create_topic(kafka.bootstrap, topic, partitions=partitions, config={"segment.ms": "2000"})
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20, "batch.size": 65536})
    for i in range(partitions * per_partition):
        p.produce(topic, b"v" * size, partition=i % partitions)
        if i % 20000 == 19999:
            p.flush(30)
    p.flush(60)
    s = settings(kafka.bootstrap, tmp, topic, tier_segment_bytes=1 << 20)
    assert tier_once(s).failed == 0
    set_retention(kafka.bootstrap, topic, 1000)
    try:
        def forgotten() -> dict[int, int] | None:
            for q in range(partitions):
                p.produce(topic, b"tick", partition=q)
            p.flush(10)
            starts = {q: watermarks(kafka.bootstrap, topic, q)[0] for q in range(partitions)}
            return starts if all(v >= per_partition for v in starts.values()) else None

        return wait_until(forgotten, "the broker deletes every partition's tiered records", timeout=120,
                          interval=0.5)
    finally:
        set_retention(kafka.bootstrap, topic, 3_600_000)


def test_one_kcat_reads_a_120_partition_tiered_topic_from_the_beginning(kafka: KafkaCluster, kcat: str,
                                                                       tmp_path: Path, topic_name: str) -> None:
    """Each fetch starts only the remote reads its byte budget allows (fetch.max.bytes 50 MiB over 1 MiB
    partitions: 50), never one per partition: the reader pool (10 + 100 queued) is not overflowed, and the
    client gets every record with no error."""
    _tier_and_forget(kafka, tmp_path, topic_name, PARTITIONS, PER_PARTITION, 300)
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                           "TIERPROXY_METADATA": f"file://{tmp_path}/meta"})
    try:
        out = subprocess.run([kcat, "-b", proxy.bootstrap, "-C", "-t", topic_name, "-o", "beginning", "-e", "-q",
                              "-f", "%p %o\n"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        got = [tuple(map(int, line.split())) for line in out.stdout.splitlines()]
        history = sorted(x for x in got if x[1] < PER_PARTITION)
        assert history == [(q, o) for q in range(PARTITIONS) for o in range(PER_PARTITION)]
        assert "pool full" not in proxy.log_text()
    finally:
        proxy.stop()


def test_a_response_stays_within_the_requests_max_bytes(kafka: KafkaCluster, tmp_path: Path,
                                                       topic_name: str) -> None:
    """max_bytes 1 MiB over 6 tiered partitions of 200 KiB partition max: the answer holds at most 1 MiB; the
    partitions beyond the budget come back empty with no error, and are read by the next fetches."""
    starts = _tier_and_forget(kafka, tmp_path, topic_name, 6, 3000, 300)
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                           "TIERPROXY_METADATA": f"file://{tmp_path}/meta"})
    try:
        # until the proxy has loaded the tier's metadata its answers are retriable (REPLICA_NOT_AVAILABLE), as
        # Kafka's are while its RLMM loads
        wait_until(lambda: proxy_serves_tier(proxy.bootstrap, topic_name, 6), "the tier via the proxy")
        offsets = dict.fromkeys(range(6), 0)
        with WireClient(proxy.bootstrap) as w:
            for _ in range(200):
                if all(offsets[q] >= 3000 for q in offsets):
                    break
                resp = w.request(ApiKey.FETCH, 12, fetch_request({topic_name: offsets}, max_bytes=1 << 20,
                                                                 partition_max_bytes=200 * 1024))
                total = 0
                for part in resp["responses"][0]["partitions"]:
                    assert part["error_code"] == ErrorCode.NONE, part
                    batches = list(iter_batches(part["records"]))
                    total += len(part["records"] or b"")
                    if batches:
                        offsets[part["partition_index"]] = batches[-1].last_offset + 1
                assert total <= 1 << 20
        assert all(offsets[q] >= 3000 for q in offsets) and all(s >= 3000 for s in starts.values())
    finally:
        proxy.stop()


def test_a_mixed_fetch_does_not_wait_for_the_idle_partition(kafka: KafkaCluster, tmp_path: Path,
                                                            topic_name: str) -> None:
    """Partition 0 is read from the tier, partition 1 is idle at its end; min_bytes 1 MiB and max_wait 10 s.
    The broker answers at once (an out-of-range partition completes a fetch), so the remote records come back
    without waiting the idle partition's max_wait."""
    starts = _tier_and_forget(kafka, tmp_path, topic_name, 2, 2000, 300)
    end1 = watermarks(kafka.bootstrap, topic_name, 1)[1]
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                           "TIERPROXY_METADATA": f"file://{tmp_path}/meta"})
    try:
        with WireClient(proxy.bootstrap) as w:
            def fetch(offset: int) -> tuple[float, int]:
                req = fetch_request({topic_name: {0: offset, 1: end1}}, max_bytes=50 << 20)
                req.update(max_wait_ms=10_000, min_bytes=1 << 20)
                started = time.monotonic()
                resp = w.request(ApiKey.FETCH, 12, req)
                p0 = next(p for p in resp["responses"][0]["partitions"] if p["partition_index"] == 0)
                return time.monotonic() - started, sum(1 for _ in iter_batches(p0["records"]))

            wait_until(lambda: fetch(0)[1] > 0, "the tier serves partition 0", timeout=60, interval=0.5)
            elapsed, batches = fetch(100)  # partition 0 is now known remote: its read starts early
            assert batches > 0 and elapsed < 5.0, (elapsed, batches)
        assert starts[0] >= 2000
    finally:
        proxy.stop()


def test_a_lost_object_inside_the_tier_is_retriable_not_out_of_range(kafka: KafkaCluster, tmp_path: Path,
                                                                     topic_name: str) -> None:
    """The metadata still lists the segment but its log object is gone (a lost copy): the fetch gets
    UNKNOWN_SERVER_ERROR (the client retries the same offset), never OFFSET_OUT_OF_RANGE (which would reset it
    past records that exist)."""
    _tier_and_forget(kafka, tmp_path, topic_name, 1, 2000, 300)
    logs = sorted((tmp_path / "tier").rglob("*.log"))
    assert logs
    for f in logs:
        f.unlink()
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                           "TIERPROXY_METADATA": f"file://{tmp_path}/meta"})
    try:
        with WireClient(proxy.bootstrap) as w:
            def answer() -> int | None:
                resp = w.request(ApiKey.FETCH, 12, fetch_request({topic_name: {0: 0}}, max_bytes=1 << 20))
                code = int(resp["responses"][0]["partitions"][0]["error_code"])
                return code if code != ErrorCode.REPLICA_NOT_AVAILABLE else None  # still loading

            assert wait_until(answer, "an answer from the tier", timeout=60, interval=0.5) == \
                ErrorCode.UNKNOWN_SERVER_ERROR
    finally:
        proxy.stop()


def test_a_failed_timestamp_lookup_is_an_error_not_a_later_offset(kafka: KafkaCluster, tmp_path: Path,
                                                                  topic_name: str) -> None:
    """The tier's time index cannot be read (objects gone): ListOffsets by timestamp answers KAFKA_STORAGE_ERROR
    for that partition within remote.list.offsets.request.timeout.ms, never the broker's local offset (which
    would skip every tiered record); the lookups of several partitions run at once."""
    from protocol.requests import list_offsets_request

    _tier_and_forget(kafka, tmp_path, topic_name, 3, 1000, 300)
    for f in (tmp_path / "tier").rglob("*.timeindex"):
        f.unlink()
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": f"file://{tmp_path}/tier", "TIERPROXY_METADATA": f"file://{tmp_path}/meta",
        "TIERPROXY_REMOTE_LIST_OFFSETS_REQUEST_TIMEOUT_MS": "3000"})
    try:
        with WireClient(proxy.bootstrap, timeout=60) as w:
            def answer() -> tuple[float, list[tuple[int, int]]] | None:
                started = time.monotonic()
                resp = w.request(ApiKey.LIST_OFFSETS, 9, list_offsets_request({topic_name: dict.fromkeys(range(3), 0)}))
                got = [(p["error_code"], p["offset"]) for p in resp["topics"][0]["partitions"]]
                loading = any(code == ErrorCode.REPLICA_NOT_AVAILABLE for code, _ in got)
                return None if loading else (time.monotonic() - started, got)

            elapsed, got = wait_until(answer, "an answer from the tier", timeout=60, interval=0.5)
        assert got == [(ErrorCode.KAFKA_STORAGE_ERROR, -1)] * 3
        assert elapsed < 3 * 3.0  # in parallel: not one timeout per partition
    finally:
        proxy.stop()


def _read_history(address: str, topic: str, until: int, client_id: str) -> tuple[float, int, list[int]]:
    """Fetch partition 0 from offset 0 up to `until`, one fetch after another (honouring throttle_time_ms as a
    client does); → (seconds, largest throttle_time_ms seen, offsets read)."""
    got: list[int] = []
    throttled, started = 0, time.monotonic()
    with WireClient(address, client_id=client_id) as w:
        for _ in range(2000):
            offset = got[-1] + 1 if got else 0
            if offset >= until:
                break
            resp = w.request(ApiKey.FETCH, 12, fetch_request({topic: {0: offset}}, max_bytes=1 << 20))
            part = resp["responses"][0]["partitions"][0]
            assert part["error_code"] == ErrorCode.NONE, part["error_code"]
            got += [o for b in iter_batches(part["records"]) for o in range(b.base_offset, b.last_offset + 1)
                    if o >= offset]
            throttled = max(throttled, resp["throttle_time_ms"])
            time.sleep(resp["throttle_time_ms"] / 1000)
    return time.monotonic() - started, throttled, got


def test_a_per_client_remote_byte_rate_throttles_a_backfill_not_the_others(kafka: KafkaCluster, tmp_path: Path,
                                                                           topic_name: str) -> None:
    """O item 12: `remote.fetch.client.max.bytes.per.second` (tierproxy's own key; the broker's quotas never see
    tier bytes): a client reading history gets throttle_time_ms and takes about history / rate; another client id
    reading at the same time is served at once."""
    log_starts = _tier_and_forget(kafka, tmp_path, topic_name, 1, 6000, 200)
    history = sum(md.segment_size_in_bytes for md in tiered(settings(kafka.bootstrap, tmp_path, topic_name),
                                                                topic_name)[0] if md.start_offset < log_starts[0])
    rate = history // 4
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": f"file://{tmp_path}/tier", "TIERPROXY_METADATA": f"file://{tmp_path}/meta",
        "TIERPROXY_REMOTE_FETCH_CLIENT_MAX_BYTES_PER_SECOND": str(rate)})
    try:
        address = f"127.0.0.1:{proxy.base + 1}"
        proxy.wait_tier_ready(timeout=30, connections=False)
        seconds, throttled, got = _read_history(address, topic_name, log_starts[0], "backfill")
        assert got[:log_starts[0]] == list(range(log_starts[0]))  # everything, in order, just slower
        assert throttled > 0 and seconds > 2.0, (seconds, throttled)  # ~4 s of history at the rate, 1 s of burst
        other_seconds, other_throttled, other = _read_history(address, topic_name, 200, "dashboard")
        assert other[:200] == list(range(200)) and other_throttled == 0 and other_seconds < 2.0
    finally:
        proxy.stop()
