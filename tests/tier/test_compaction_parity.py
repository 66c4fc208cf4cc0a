"""LogCleaner parity: one produced history (keys, tombstones, committed and aborted transactions, idempotent and
plain producers, an lz4 producer) compacted by the session broker's own cleaner and by the tier's engine from
the raw batches of the same log gives the same batches — offsets, records, surviving markers, kept-empty
batches, delete horizons — and every segment the engine writes passes Kafka's DumpLogSegments.

The broker's cleaning time is read back from the delete horizon it stored in a batch (KIP-534: horizon =
cleaning time + delete.retention.ms), so the engine cleans "at the same moment". Two cleanings: the second after
the first one's horizon passed, with more data, removes tombstones on both sides. The broker's cleaner runs only
when the test lets it (min.cleanable.dirty.ratio 1.0 otherwise; the session broker's log.cleaner.backoff.ms is
500 ms) and the test waits on its cleaner-offset-checkpoint."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from protocol.records import iter_batches
from tests.support.compaction import Batch, Tier, decode, latest_values
from tests.support.fetchraw import fetch_raw
from tests.support.jvm import java_command
from tests.support.kafka import create_topic, set_topic_config, small_segments
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.compaction import CleanedSegment, CleanerConfig

pytestmark = pytest.mark.kafka
RETENTION = 1_500


def _produce(bootstrap: str, topic: str) -> None:
    keys = [f"key-{i}".encode() for i in range(40)]
    base = {"bootstrap.servers": bootstrap, "linger.ms": 0}
    plain = Producer({**base, "enable.idempotence": False, "acks": "all"})
    idem = Producer({**base, "enable.idempotence": True, "compression.type": "lz4", "linger.ms": 5})
    tx = Producer({**base, "transactional.id": f"tx-{topic}"})
    tx.init_transactions(30)
    n = 0
    for round_ in range(6):
        for i, k in enumerate(keys):
            n += 1
            value = None if (i + round_) % 9 == 0 else b"v%d-" % n + b"x" * 300
            (idem if i % 3 == 0 else plain).produce(topic, value, k)
            if i % 10 == 9:
                idem.flush(10)
                plain.flush(10)
        tx.begin_transaction()
        for k in keys[round_ * 3:round_ * 3 + 5]:
            tx.produce(topic, b"tx%d-" % round_ + k, k)
        tx.flush(10)
        if round_ % 3 == 1:
            tx.abort_transaction(30)
        else:
            tx.commit_transaction(30)
    # producers whose last batch loses all its records: the cleaner keeps it, empty (their state)
    idem.produce(topic, b"superseded", keys[0])
    idem.flush(10)
    tx.begin_transaction()
    tx.produce(topic, b"aborted", keys[1])
    tx.flush(10)
    tx.abort_transaction(30)
    plain.produce(topic, b"latest", keys[0])
    plain.flush(10)
    for i in range(80):  # fills the segment so the above leaves the active segment (never cleaned)
        plain.produce(topic, b"f" * 300, b"filler-%d" % i)
        if i % 10 == 9:
            plain.flush(10)  # batches well under the segment size


def _checkpoint(kafka: KafkaCluster, topic: str) -> int | None:
    """The broker cleaner's checkpoint for partition 0 (the end of its last cleaning), if any."""
    path = kafka.nodes[0].workdir / "data" / "cleaner-offset-checkpoint"
    if not path.exists():
        return None
    for line in path.read_text().splitlines()[2:]:
        name, part, offset = line.rsplit(" ", 2)
        if name == topic and part == "0":
            return int(offset)
    return None


def _segments(raw: bytes, active_base: int, per_segment: int = 12) -> list[bytes]:
    """The raw log in segments, one ending where the broker's active segment begins (its cleaner stops there)."""
    below = [bytes(b.view()) for b in iter_batches(raw) if b.base_offset < active_base]
    rest = b"".join(bytes(b.view()) for b in iter_batches(raw) if b.base_offset >= active_base)
    segs = [b"".join(below[i:i + per_segment]) for i in range(0, len(below), per_segment)]
    return segs + ([rest] if rest else [])


def dump_log_segments(kafka: KafkaCluster, cleaned: list[CleanedSegment], tmp: Path) -> str:
    """Kafka's own DumpLogSegments --deep-iteration over the engine's segments (log, offset and time indexes)."""
    files = []
    for c in cleaned:
        if c.files is None:
            continue
        name = f"{c.start_offset:020d}"
        (tmp / f"{name}.log").write_bytes(c.files.log)
        (tmp / f"{name}.index").write_bytes(c.files.offset_index)
        (tmp / f"{name}.timeindex").write_bytes(c.files.time_index)
        files += [str(tmp / f"{name}.{ext}") for ext in ("log", "index", "timeindex")]
    out = subprocess.run([*java_command(), "-Xmx256m", "-cp", f"{kafka.libs}/*", "kafka.tools.DumpLogSegments",
                          "--deep-iteration", "--files", ",".join(files)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Mismatches" not in out.stderr and "mismatch" not in out.stderr, out.stderr[-3000:]
    return out.stdout


def _produce_more(bootstrap: str, topic: str) -> None:
    """Tombstones, updates and new keys after the first cleaning; then fillers to roll the segment."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(0, 40, 4):
        p.produce(topic, None if i % 8 == 0 else b"again-%d" % i, f"key-{i}".encode())
        p.produce(topic, b"new", f"new-{i}".encode())
    p.flush(10)
    for i in range(80):
        p.produce(topic, b"g" * 300, b"filler2-%d" % i)
        if i % 10 == 9:
            p.flush(10)


def _cleaned_by_broker(kafka: KafkaCluster, topic: str, after: int) -> tuple[int, list[Batch], int]:
    """Let the broker's cleaner run (ratio 0.01) and wait for its checkpoint past `after`: (the first offset it
    did not clean, the log's batches, the cleaning's time read back from the newest delete horizon)."""
    set_topic_config(kafka.bootstrap, topic, "min.cleanable.dirty.ratio", "0.01")
    end = wait_until(lambda: (c := _checkpoint(kafka, topic)) is not None and c > after and c,
                     "the broker's cleaner checkpoint", 60)
    # no cleaning until the test asks again (a ratio is never above 1)
    set_topic_config(kafka.bootstrap, topic, "min.cleanable.dirty.ratio", "1.0")
    batches = decode(fetch_raw(kafka.bootstrap, topic)[0])
    horizons = [b.horizon for b in batches if b.horizon is not None]
    assert horizons, "no batch with a delete horizon: the history needs tombstones"
    return end, batches, max(horizons) - RETENTION


def test_the_engine_cleans_as_the_brokers_log_cleaner(kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    started = time.monotonic()
    create_topic(kafka.bootstrap, topic_name, config=small_segments(16 * 1024))
    _produce(kafka.bootstrap, topic_name)
    raw, _ = fetch_raw(kafka.bootstrap, topic_name)
    assert len(list(iter_batches(raw))) > 50
    for key, value in (("delete.retention.ms", str(RETENTION)), ("min.cleanable.dirty.ratio", "1.0"),
                       ("cleanup.policy", "compact")):
        set_topic_config(kafka.bootstrap, topic_name, key, value)
    active_base, broker_batches, now = _cleaned_by_broker(kafka, topic_name, 0)

    config = CleanerConfig(delete_retention_ms=RETENTION, min_cleanable_dirty_ratio=0.01)
    tier = Tier(config)
    for seg in _segments(raw, active_base):
        tier.append([bytes(b.view()) for b in iter_batches(seg)])
    # the broker's cleaner stops at its active segment: the same bound for the engine
    cleaned = tier.clean(now, last_stable_offset=active_base)
    assert cleaned and max(c.end_offset for c in cleaned) == active_base - 1
    ours = tier.batches()

    assert ours == broker_batches
    assert latest_values(ours) == latest_values(broker_batches)
    markers = [(b.base, b.control) for b in ours if b.control is not None]
    assert markers == [(b.base, b.control) for b in broker_batches if b.control is not None]
    assert any(not b.records for b in ours)  # kept-empty batches on both sides (producers' last batches)
    assert any(b.control is not None and b.records for b in ours)
    tombstones = {off for b in ours for off, _, v in b.records if v is None}
    assert tombstones

    # every segment the engine wrote passes Kafka's own reader, CRCs valid
    out = dump_log_segments(kafka, cleaned, tmp_path)
    batches = [line for line in out.splitlines() if "isvalid:" in line]
    assert len(batches) == sum(len(list(iter_batches(c.files.log))) for c in cleaned if c.files)
    assert all("isvalid: true" in line for line in batches)

    # a second cleaning once the first horizon has passed: tombstones go, as the broker's go
    wait_until(lambda: time.time() * 1000 > now + RETENTION + 50, "the first cleaning's delete horizon", 10)
    tier_end = tier.segments[-1][0].end_offset
    _produce_more(kafka.bootstrap, topic_name)
    more, _ = fetch_raw(kafka.bootstrap, topic_name, start=tier_end + 1)
    active_base2, broker_batches2, now2 = _cleaned_by_broker(kafka, topic_name, active_base)
    assert now2 >= now + RETENTION and active_base2 > tier_end
    for seg in _segments(more, active_base2):
        tier.append([bytes(b.view()) for b in iter_batches(seg)])
    assert tier.clean(now2, last_stable_offset=active_base2)
    ours2 = tier.batches()
    assert ours2 == broker_batches2
    assert not tombstones & {off for b in ours2 for off, _, v in b.records if v is None}
    print(f"parity: {len(list(iter_batches(raw)))} raw batches, {len(ours)} after, {len(ours2)} after the second "
          f"cleaning, {time.monotonic() - started:.1f}s")
