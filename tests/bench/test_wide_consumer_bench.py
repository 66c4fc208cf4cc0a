"""Ten thousand partitions through the proxy (issue 65, item 2): one Java consumer subscribed (by pattern) to 100
topics of 100 partitions catching up from the filesystem tier, against the same consumer reading one topic of 100
partitions holding the same records; bytes per second of each, and the proxy's peak RSS.

On a broker of its own: every wide partition gets `TIERPROXY_BENCH_WIDE_RECORDS` (default 22) records of 1000 bytes,
the narrow topic as many records in all; one pass tiers them, then the broker deletes everything (a retention of a
second rolls and deletes even the active segment), so every record is read from the tier. (One broker segment per
partition, deleted files closed at once: more would open more files than the broker may here, 20,000.) Reads
alternate narrow and wide (`TIERPROXY_BENCH_WIDE_READS` of each, default 2), each with a fresh proxy (the tier's
files in the page cache alike) and a new consumer group reading from the earliest offset; the consumer's clock
starts when its partitions are assigned (the JVM's start and the group join left out, alike on both sides). With
`TIERPROXY_BENCH_PYSPY` naming a py-spy binary, the proxy of the last wide read is sampled (its hottest frames).
`TIERPROXY_BENCH_WIDE_TREES` names source trees to run the proxy from, each read in turn on the same data (a
baseline beside a change in one run); `TIERPROXY_BENCH_WIDE_SETTINGS` proxy settings read in turn with each tree
(`KEY=VALUE`, comma-separated; an empty item is the defaults).

    pytest -m bench tests/bench/test_wide_consumer_bench.py -s
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, OffsetSpec

from tests.bench.report import busy_share, cpu_seconds, machine_ticks, peak_rss_mib, report
from tests.bench.test_remote_fetch_bench import _hottest
from tests.support.proxy import ProxyProcess
from tests.support.tiering import tier_once
from tests.support.waiting import wait_until
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.cluster, pytest.mark.spark]

TOPICS = int(os.environ.get("TIERPROXY_BENCH_WIDE_TOPICS", "100"))
PER_TOPIC = 100
PER_PARTITION = int(os.environ.get("TIERPROXY_BENCH_WIDE_RECORDS", "22"))  # records of 1000 B per wide partition
READS = int(os.environ.get("TIERPROXY_BENCH_WIDE_READS", "2"))  # reads of each side, alternated
# the proxy's source trees (PYTHONPATH), comma-separated, each read in turn on the same data: a baseline beside a
# change in one run (default: the tree the bench runs from)
TREES = os.environ.get("TIERPROXY_BENCH_WIDE_TREES", "").split(",")
# proxy settings read in turn (`KEY=VALUE`, comma-separated; the empty one: the defaults), e.g. a wider reader pool
VARIANTS = os.environ.get("TIERPROXY_BENCH_WIDE_SETTINGS", "").split(",")
VALUE = b"x" * 1000

# The Java consumer (Kafka's own client, defaults but for the group): subscribes to a pattern, counts records and
# their bytes until it has `count`, its clock started when its partitions are assigned. Run as a source file.
CONSUMER = """
import java.time.Duration;
import java.util.*;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class PatternConsumer {
    public static void main(String[] a) {
        Properties p = new Properties();
        p.put("bootstrap.servers", a[0]);
        p.put("group.id", a[3]);
        p.put("auto.offset.reset", "earliest");
        p.put("enable.auto.commit", "false");
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        long want = Long.parseLong(a[2]);
        long[] assigned = {0};
        long n = 0, bytes = 0, first = 0, end = 0, start = System.nanoTime();
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            c.subscribe(Pattern.compile(a[1]), new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> parts) {}
                public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                    if (assigned[0] == 0 && !parts.isEmpty()) assigned[0] = System.nanoTime();
                }
            });
            long deadline = start + 600_000_000_000L;
            while (n < want && System.nanoTime() < deadline) {
                ConsumerRecords<byte[], byte[]> rs = c.poll(Duration.ofMillis(200));
                if (!rs.isEmpty() && first == 0) first = System.nanoTime();
                for (ConsumerRecord<byte[], byte[]> r : rs) {
                    n++;
                    bytes += r.serializedValueSize() + Math.max(0, r.serializedKeySize());
                }
            }
            end = System.nanoTime();
        }
        System.out.println("records=" + n + " bytes=" + bytes + " assigned_s=" + (end - assigned[0]) / 1e9
                           + " first_s=" + (end - first) / 1e9 + " total_s=" + (end - start) / 1e9);
    }
}
"""


def consume(libs: Path, source: Path, bootstrap: str, pattern: str, count: int) -> dict[str, float]:
    """One Java consumer reading `count` records of the topics matching `pattern` from the earliest offset."""
    group = f"wide-bench-{time.monotonic_ns()}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(["java", "-Xmx1g", "-cp", f"{libs}/*", str(source), bootstrap, pattern, str(count), group],
                         capture_output=True, text=True, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("records="))
    got = {k: float(v) for k, v in (f.split("=") for f in line.split())}
    # the consumer's CPU (its JVM's start and compilation included, alike on both sides)
    got["consumer_cpu_s"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert got["records"] >= count, (line, out.stderr[-2000:])
    return got


def sees_all(prod: Producer, names: list[str]) -> bool:
    topics = prod.list_topics(timeout=30).topics
    return all(n in topics and len(topics[n].partitions) == PER_TOPIC for n in names)


def put(prod: Producer, topic: str, partition: int) -> None:
    """One record, waiting for room in the producer's queue when it is full."""
    for _ in range(1000):
        try:
            prod.produce(topic, VALUE, partition=partition)
            prod.poll(0)
            return
        except BufferError:
            prod.poll(0.1)
    raise TimeoutError("the producer's queue stayed full")


def forgotten(admin: AdminClient, parts: list[TopicPartition]) -> dict[tuple[str, int], int]:
    """Each partition's log start once the broker has deleted every partition's history (or after 5 minutes)."""
    deadline, starts = time.monotonic() + 300, {}
    while time.monotonic() < deadline:
        try:
            starts = log_starts(admin, parts)
        except (TimeoutError, KafkaException):
            continue
        if min(starts.values()) > 0:
            break
        time.sleep(2)
    return starts


def alter_retention(admin: AdminClient, topics: list[str], ms: int) -> None:
    res = [ConfigResource("topic", t, incremental_configs=[ConfigEntry(
        "retention.ms", str(ms), incremental_operation=AlterConfigOpType.SET)]) for t in topics]
    for fut in admin.incremental_alter_configs(res).values():
        fut.result(60)


def log_starts(admin: AdminClient, parts: list[TopicPartition]) -> dict[tuple[str, int], int]:
    """Each partition's log start, asked 1,000 partitions at a time (10,000 at once took minutes)."""
    out: dict[tuple[str, int], int] = {}
    for at in range(0, len(parts), 1000):
        futs = admin.list_offsets({tp: OffsetSpec.earliest() for tp in parts[at:at + 1000]}, request_timeout=60)
        out.update({(tp.topic, tp.partition): f.result(120).offset for tp, f in futs.items()})
    return out


@pytest.mark.timeout(2400)  # creating 10,100 partitions and a pass tiering them take about ten minutes
def test_one_java_consumer_over_ten_thousand_partitions(tmp_path: Path) -> None:
    cluster = KafkaCluster(1, workdir=tmp_path / "wide").start()
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        wide = [f"wide-{t:03d}" for t in range(TOPICS)]
        # one broker segment per partition, and a deleted one's file closed at once: the broker may open 20,000
        # files here, and a retention that rolls every partition's segment holds two per partition for a minute
        config = {"file.delete.delay.ms": "0"}
        for chunk in range(0, TOPICS, 10):
            futures = admin.create_topics([NewTopic(n, PER_TOPIC, 1, config=config) for n in wide[chunk:chunk + 10]],
                                          operation_timeout=120)
            for f in futures.values():
                f.result(300)
        for f in admin.create_topics([NewTopic("narrow", PER_TOPIC, 1, config=config)],
                                     operation_timeout=120).values():
            f.result(120)
        total = TOPICS * PER_TOPIC * PER_PARTITION
        began = time.perf_counter()
        prod = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 50})
        wait_until(lambda: sees_all(prod, [*wide, "narrow"]), "the producer sees every partition", 120, 1.0)
        for topic in wide:
            for p in range(PER_TOPIC):
                for _ in range(PER_PARTITION):
                    put(prod, topic, p)
        for i in range(total):
            put(prod, "narrow", i % PER_TOPIC)
        assert prod.flush(300) == 0
        produced_s = time.perf_counter() - began
        tier, meta = f"file://{tmp_path}/tier", f"file://{tmp_path}/meta"
        began = time.perf_counter()
        summary = tier_once(TierSettings(bootstrap_servers=cluster.bootstrap, tier_topics="wide-.*|narrow",
                                         storage=tier, metadata=meta, spark_master="local[2]",
                                         tier_state_dir=tmp_path / "state"))
        tiered_s = time.perf_counter() - began
        assert summary.failed == 0, summary
        source = tmp_path / "PatternConsumer.java"
        source.write_text(CONSUMER)
        # the same reads straight from the broker while it still holds everything: what the client itself costs
        # over 10,000 partitions, whoever serves them
        direct = {side: consume(cluster.libs, source, cluster.bootstrap, pattern, total)
                  for side, pattern in (("narrow", "narrow"), ("wide", "wide-.*"))}
        alter_retention(admin, [*wide, "narrow"], 1000)  # the broker forgets what the tier holds
        parts = [TopicPartition(t, p) for t in [*wide, "narrow"] for p in range(PER_TOPIC)]
        starts = forgotten(admin, parts)
        alter_retention(admin, [*wide, "narrow"], 3_600_000)
        assert min(starts.values()) > 0, "the broker kept some history"
        from_tier = {side: sum(v for (t, _), v in starts.items() if (t == "narrow") == (side == "narrow"))
                     for side in ("narrow", "wide")}
        reads: dict[tuple[str, str], list[dict[str, float]]] = {}
        profile = ""
        for i in range(READS):
            for tree, variant in [(t, v) for t in TREES for v in VARIANTS]:
                for side, pattern in (("narrow", "narrow"), ("wide", "wide-.*")):
                    # `python -m` puts the working directory first on sys.path: PYTHONSAFEPATH leaves it out
                    extra = {"TIERPROXY_STORAGE": tier, "TIERPROXY_METADATA": meta,
                             **({"PYTHONPATH": tree, "PYTHONSAFEPATH": "1"} if tree else {}),
                             **dict(kv.split("=", 1) for kv in [variant] if kv)}
                    label = f"{tree}{' ' + variant if variant else ''}"
                    proxy = ProxyProcess(cluster.bootstrap, tmp_path, extra=extra)
                    spy, raw = None, tmp_path / "pyspy.txt"
                    try:
                        if (side == "wide" and i == READS - 1
                                and (pyspy := os.environ.get("TIERPROXY_BENCH_PYSPY"))):
                            raw.unlink(missing_ok=True)
                            spy = subprocess.Popen([pyspy, "record", "--pid", str(proxy.proc.pid), "--rate", "200",
                                                    "--format", "raw", "-o", str(raw), "--nonblocking"],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        ticks, c0 = machine_ticks(), cpu_seconds(proxy.proc.pid)
                        got = consume(cluster.libs, source, proxy.bootstrap, pattern, total)
                        got["proxy_cpu_s"] = cpu_seconds(proxy.proc.pid) - c0
                        got["machine_busy"] = busy_share(ticks, machine_ticks())
                        got["rss_mib"] = peak_rss_mib(proxy.proc.pid)
                        reads.setdefault((label, side), []).append(got)
                    finally:
                        if spy is not None:
                            spy.send_signal(2)
                            spy.wait(60)
                        proxy.stop()
                    # reads a full reader pool refused (each answered empty, its fetch waiting out its max wait)
                    reads[label, side][-1]["refused"] = proxy.log_text().count("pool full")
                    if raw.exists():
                        profile += f"; {label or 'this tree'}'s wide read, hottest frames: {_hottest(raw, 8)}"
    finally:
        cluster.stop()

    def mbps(r: dict[str, float]) -> float:
        return r["bytes"] / 1e6 / r["assigned_s"]

    def side(tree: str, name: str) -> str:
        return (f"{name} " + " / ".join(f"{mbps(r):.0f} MB/s ({r['assigned_s']:.1f} s after assignment, "
                                         f"{r['total_s']:.1f} s in all; proxy CPU {r['proxy_cpu_s']:.1f} s, "
                                         f"consumer CPU {r['consumer_cpu_s']:.1f} s, "
                                         f"machine {r['machine_busy']:.0%} busy, peak RSS {r['rss_mib']:.0f} MiB, "
                                         f"{r['refused']:.0f} reads refused by a full reader pool)"
                                         for r in reads[tree, name]))

    figures = []
    for tree in [f"{t}{' ' + v if v else ''}" for t in TREES for v in VARIANTS]:
        ratios = [mbps(w) / mbps(n) for w, n in zip(reads[tree, "wide"], reads[tree, "narrow"], strict=True)]
        figures.append(f"{tree or 'this tree'}: wide / narrow {', '.join(f'{x:.2f}x' for x in ratios)} (median "
                       f"{statistics.median(ratios):.2f}x); {side(tree, 'narrow')}; {side(tree, 'wide')}")
    report("java consumer, 10,000 partitions vs 100", (
        f"{TOPICS * PER_TOPIC:,} partitions x {PER_PARTITION} records of 1000 B vs 100 partitions x "
        f"{total // PER_TOPIC:,} (produced in {produced_s:.0f} s, tiered in one pass of {tiered_s:.0f} s; from the "
        f"tier: narrow {from_tier['narrow']:,} records, wide {from_tier['wide']:,}); straight from the broker before "
        f"the deletion: narrow {mbps(direct['narrow']):.0f} MB/s (consumer CPU {direct['narrow']['consumer_cpu_s']:.1f}"
        f" s), wide {mbps(direct['wide']):.0f} MB/s (consumer CPU {direct['wide']['consumer_cpu_s']:.1f} s), wide / "
        f"narrow {mbps(direct['wide']) / mbps(direct['narrow']):.2f}x; " + "; ".join(figures) + profile))
    assert all(r["records"] >= total for rs in reads.values() for r in rs)
