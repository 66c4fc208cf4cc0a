"""A real Kafka Streams app (Kafka's own jars) re-keys its input through a repartition topic (which Streams creates
with `retention.ms=-1`) and purges what it has consumed of it with DeleteRecords, through a proxy. By default the
tier leaves repartition topics alone (`tier.topics.exclude`); here the topic is tiered on purpose. The tier copied
those records before the purge; each purge is recorded in the metadata before its answer, so afterwards nothing
below the broker's new log start comes back through the proxy that relayed it or through a second replica that
never saw it (ListOffsets -2, a read from the beginning), the next tier pass deletes the segments wholly below it,
a proxy started afterwards answers the same, and the tier read as a Spark DataFrame holds exactly what Spark's Kafka
source reads from the broker."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from protocol.constants import ApiKey, OffsetSpec
from protocol.requests import list_offsets_request, listed_offsets
from tests.support.jvm import java_command
from tests.support.kafka import create_topic, offsets_from_the_beginning, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.spark import local_session
from tests.support.tiering import settings, tier_once, tiered
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster, ensure_kafka_libs
from tierproxy.jobs.tiering.cluster import topic_configs
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
WORDS = [f"w{i}" for i in range(50)]

APP = """
import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.Stores;

/** args: bootstrap application.id input output state.dir repartition.purge.interval.ms */
public class WordCount {
    public static void main(String[] a) throws Exception {
        Properties p = new Properties();
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a[0]);
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, a[1]);
        p.put(StreamsConfig.STATE_DIR_CONFIG, a[4]);
        p.put(StreamsConfig.REPARTITION_PURGE_INTERVAL_MS_CONFIG, Long.parseLong(a[5]));
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        StreamsBuilder b = new StreamsBuilder();
        b.<String, String>stream(a[2])
            .selectKey((k, v) -> v)  // re-keyed by the word: through the repartition topic
            .groupByKey(Grouped.as("rekeyed"))
            .count(Materialized.<String, Long>as(Stores.inMemoryKeyValueStore("counts"))
                .withValueSerde(Serdes.Long()))
            .toStream()
            .to(a[3], Produced.with(Serdes.String(), Serdes.Long()));
        KafkaStreams s = new KafkaStreams(b.build(), p);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> s.close(Duration.ofSeconds(20))));
        s.start();
        Thread.currentThread().join();
    }
}
"""


class StreamsApp:
    """The word count above in its own JVM (Java's single-file launcher), its output in a file."""

    def __init__(self, workdir: Path, bootstrap: str, app_id: str, topics: tuple[str, str], purge_ms: int) -> None:
        src = workdir / "WordCount.java"
        src.write_text(APP)
        self.log = workdir / f"streams-{purge_ms}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*java_command(), "-Xmx256m", "-cp", f"{ensure_kafka_libs()}/*", str(src), bootstrap, app_id, *topics,
                 str(workdir / "state"), str(purge_ms)], stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)  # KafkaStreams.close(): commits what it processed
        try:
            self.proc.wait(40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _produce(bootstrap: str, topic: str, n: int, first: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(first, first + n):
        p.produce(topic, WORDS[i % len(WORDS)].encode(), f"line-{i}".encode())
        if i % 100 == 99:
            p.flush(10)
    p.flush(30)


def _counts(bootstrap: str, topic: str) -> dict[str, int]:
    """The latest count per word the app wrote (read straight from the broker)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out: dict[str, int] = {}
    try:
        end = watermarks(bootstrap, topic)[1]
        deadline = time.monotonic() + 20
        pos = 0
        while pos < end and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            out[m.key().decode()] = int.from_bytes(m.value(), "big")
            pos = m.offset() + 1
    finally:
        c.close()
    return out


def _listed(bootstrap: str, topic: str, spec: int = OffsetSpec.EARLIEST) -> int:
    with WireClient(bootstrap) as w:
        resp = w.request(ApiKey.LIST_OFFSETS, 9, list_offsets_request({topic: {0: spec}}))
    return listed_offsets(resp)[(topic, 0)]


def _same_dataframes(bootstrap: str, topic: str, storage: str, metadata: str, log_start: int, end: int) -> None:
    spark = local_session()

    def rows(fmt: str, options: dict[str, str]) -> list[tuple[object, ...]]:
        df = spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
        df = df.options(**options)
        return sorted((tuple(r) for r in df.load().collect()), key=lambda r: r[4])  # type: ignore[no-any-return]

    tier = rows("tierproxy", {"storage": storage, "metadata": metadata})
    assert [r[4] for r in tier] == list(range(log_start, end))
    assert tier == rows("kafka", {})


def test_records_purged_by_a_kafka_streams_app_never_come_back_through_the_proxy(
        kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    """Slow (~60 s): a real Kafka Streams application (a JVM, started twice) counts through the proxy and purges
    its repartition topic; two proxies, three tier passes and a DataFrame comparison check what comes back."""
    app_id = f"purge-{os.getpid()}"
    source, sink, repartition = f"{topic_name}-in", f"{topic_name}-out", f"{app_id}-rekeyed-repartition"
    create_topic(kafka.bootstrap, source)
    create_topic(kafka.bootstrap, sink)
    s = settings(kafka.bootstrap, tmp_path, repartition, tier_segment_bytes=4096, tier_topics_exclude="")
    extra = {"TIERPROXY_STORAGE": s.storage, "TIERPROXY_METADATA": s.metadata}
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra)
    second = ProxyProcess(kafka.bootstrap, tmp_path, extra)  # a replica no client of the app talks to
    try:
        # 1. the app counts 2,000 lines through the proxy and purges nothing yet; the tier copies the repartition
        app = StreamsApp(tmp_path, proxy.bootstrap, app_id, (source, sink), purge_ms=3_600_000)
        _produce(kafka.bootstrap, source, 2000, 0)
        wait_until(lambda: sum(_counts(kafka.bootstrap, sink).values()) == 2000, "the first 2,000 counted",
                   timeout=120)
        app.stop()
        config = topic_configs(kafka.bootstrap, [repartition])[repartition]
        assert config["retention.ms"] == "-1", config
        assert tier_once(settings(kafka.bootstrap, tmp_path, repartition)).segments == 0  # excluded by default
        assert tier_once(s).segments >= 2
        assert watermarks(kafka.bootstrap, repartition) == (0, 2000)
        wait_until(lambda: _listed(proxy.bootstrap, repartition, OffsetSpec.LATEST_TIERED) >= 1000,
                   "the proxy's tier", timeout=60)

        # 2. the app runs again, purging every 100 ms: DeleteRecords through the proxy moves the broker's log start
        app = StreamsApp(tmp_path, proxy.bootstrap, app_id, (source, sink), purge_ms=100)
        _produce(kafka.bootstrap, source, 500, 2000)
        wait_until(lambda: sum(_counts(kafka.bootstrap, sink).values()) == 2500, "all 2,500 counted", timeout=120)
        wait_until(lambda: watermarks(kafka.bootstrap, repartition)[0] >= 2000, "Streams' purge", timeout=60)
        app.stop()
        _produce(kafka.bootstrap, repartition, 100, 0)  # not processed yet, so not purged: read below
        counts = _counts(kafka.bootstrap, sink)
        assert counts == dict(Counter(WORDS[i % len(WORDS)] for i in range(2500)))
        log_start, end = watermarks(kafka.bootstrap, repartition)

        # what the proxies answer now: the broker's log start, never the purged records the tier still holds
        assert "purged below" in proxy.log_text() and "purged below" not in second.log_text()
        for p in (proxy, second):
            wait_until(lambda p=p: _listed(p.bootstrap, repartition) == log_start, "the purge on every replica",
                       timeout=10)
            got = offsets_from_the_beginning(p.bootstrap, repartition, end)
            assert got == list(range(log_start, end)), (got[:3], log_start, end)

        # 3. the next pass deletes the segments wholly below the recorded purge; a new proxy knows it too
        summary = tier_once(s)
        assert summary.purged >= 1 and summary.gaps == [], summary
        segs, _, _ = tiered(s, repartition)
        assert all(md.end_offset >= log_start for md in segs), [(m.start_offset, m.end_offset) for m in segs]
        assert segs and segs[0].start_offset <= log_start  # nothing missing from the log start on
        _same_dataframes(kafka.bootstrap, repartition, s.storage, s.metadata, log_start, end)
    finally:
        proxy.stop()
        second.stop()
    fresh = ProxyProcess(kafka.bootstrap, tmp_path, extra)
    try:
        fresh.wait_tier_ready(timeout=60, connections=False)
        assert _listed(fresh.bootstrap, repartition) == log_start
        assert offsets_from_the_beginning(fresh.bootstrap, repartition, end)[:1] == [log_start]
    finally:
        fresh.stop()
