"""The compaction benchmarks' data and Kafka's side: a keyed history produced as a normal producer batches it, a
broker of the benchmark's own with the full JIT and one cleaner thread, its closed segment files copied, and its
cleaner's own figures read from its server.log (Kafka's LogCleaner.recordStats)."""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer

from tests.support.kafka import create_topic
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster

DEDUPE_BUFFER = 128 << 20  # log.cleaner.dedupe.buffer.size's default, and tier.cleaner.dedupe.buffer.size's
HELD_OFF = str(2**62)  # min.compaction.lag.ms: no cleaning until the benchmark lets it
Rec = tuple[bytes, bytes | None]


def history(records: int, keys: int, value_bytes: int = 100, tombstones: float = 0.05, seed: int = 66) -> list[Rec]:
    """`records` updates of `keys` keys drawn at random, ~`value_bytes` values, a share of them tombstones."""
    rnd = random.Random(seed)
    pad = b"x" * value_bytes
    out: list[Rec] = []
    for i in range(records):
        key = b"key-%07d" % rnd.randrange(keys)
        out.append((key, None if rnd.random() < tombstones else (b"v%d-" % i + pad)[:value_bytes]))
    return out


def live_set(recs: list[Rec]) -> list[Rec]:
    """One record per live key, its latest value, in the order of those latest records."""
    last: dict[bytes, int] = {}
    for i, (k, _) in enumerate(recs):
        last[k] = i
    return [recs[i] for i in sorted(last.values()) if recs[i][1] is not None]


def produce(bootstrap: str, topic: str, recs: list[Rec], compression: str = "none") -> None:
    """As a normal producer batches them (librdkafka's defaults: linger.ms 5, batch.size 1 MB)."""
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": compression, "acks": "all",
                  "queue.buffering.max.messages": 1_000_000})
    for k, v in recs:
        while True:
            try:
                p.produce(topic, v, k)
                break
            except BufferError:
                p.poll(0.1)
    assert p.flush(120) == 0


def create_held_off(kafka: KafkaCluster, topic: str, segment_bytes: int, delete_retention_ms: int) -> None:
    create_topic(kafka.bootstrap, topic, config={
        "cleanup.policy": "compact", "segment.bytes": str(segment_bytes), "min.compaction.lag.ms": HELD_OFF,
        "delete.retention.ms": str(delete_retention_ms)})


def log_dir(kafka: KafkaCluster, topic: str) -> Path:
    return kafka.nodes[0].workdir / "data" / f"{topic}-0"


def closed_segments(kafka: KafkaCluster, topic: str) -> list[bytes]:
    """The bytes of the partition's closed segment files (all but the active one), in offset order."""
    logs = sorted(log_dir(kafka, topic).glob("*.log"))
    assert len(logs) >= 2, f"{topic}: {len(logs)} segments, no closed one"
    return [p.read_bytes() for p in logs[:-1]]


def active_base(kafka: KafkaCluster, topic: str) -> int:
    return int(sorted(log_dir(kafka, topic).glob("*.log"))[-1].stem)


def log_bytes(kafka: KafkaCluster, topic: str) -> int:
    return sum(p.stat().st_size for p in log_dir(kafka, topic).glob("*.log"))


_NUM = r"([\d,]+(?:\.\d+)?)"
_STATS = re.compile(
    r"cleaned log (?P<log>\S+) \(dirty section = \[(?P<first>\d+), (?P<end>\d+)\]\)\s+"
    rf"{_NUM} MB of log processed in {_NUM} seconds.*?\s+"
    rf"Indexed {_NUM} MB in {_NUM} seconds.*?"
    rf"Cleaned {_NUM} MB in {_NUM} seconds.*?"
    rf"Start size: {_NUM} MB \({_NUM} messages\)\s+End size: {_NUM} MB \({_NUM} messages\)", re.S)


@dataclass(frozen=True)
class CleanerStats:
    """One cleaning as Kafka's cleaner logged it (MB are MiB; `read_mb`: what the copy read, the whole log below
    the dirty section's end; `indexed_mb`: the dirty bytes the map read; seconds are wall, at 0.1 s)."""

    first_dirty: int
    end: int
    read_mb: float
    seconds: float
    indexed_mb: float
    index_seconds: float
    clean_seconds: float
    start_messages: int
    end_mb: float
    end_messages: int


def cleaner_stats(kafka: KafkaCluster, topic: str) -> list[CleanerStats]:
    text = kafka.nodes[0].log_file.read_text(errors="replace")

    def f(s: str) -> float:
        return float(s.replace(",", ""))

    return [CleanerStats(int(m["first"]), int(m["end"]), f(m[4]), f(m[5]), f(m[6]), f(m[7]), f(m[9]),
                         int(f(m[11])), f(m[12]), int(f(m[13])))
            for m in _STATS.finditer(text) if m["log"] == f"{topic}-0"]


def cleaner_cpu_seconds(kafka: KafkaCluster) -> float:
    """CPU seconds the broker's cleaner thread has used so far (/proc/PID/task/TID; its name cut to 15 chars)."""
    proc = kafka.nodes[0].proc
    assert proc is not None
    for task in Path(f"/proc/{proc.pid}/task").iterdir():
        if (task / "comm").read_text().strip().startswith("kafka-log-clean"):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    raise AssertionError("no log cleaner thread in the broker")


def let_clean(kafka: KafkaCluster, topic: str, before: int = 0, timeout: float = 300) -> CleanerStats:
    """Let the broker's cleaner at the topic (min.compaction.lag.ms 0) and wait for its figures in server.log (it
    cleans again only once more is dirty than min.cleanable.dirty.ratio, past its active segment)."""
    from tests.support.kafka import set_topic_config

    set_topic_config(kafka.bootstrap, topic, "min.compaction.lag.ms", "0")
    return wait_until(lambda: len(s := cleaner_stats(kafka, topic)) > before and s[-1],
                      f"the broker's cleaner cleans {topic}", timeout, interval=0.5)
