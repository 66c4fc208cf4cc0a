"""A real Kafka Streams application (Kafka's own `kafka-streams` jar, `tests/streams/TableApp.java`) builds a KTable
from an input topic of updates and tombstones; its changelog, a compacted topic whose broker keeps the last minutes
only (`cleanup.policy=compact,delete`, set through Streams' topic configs), is tiered. The instance loses its disk
(state directory wiped) and starts again with the proxy as its bootstrap: Streams restores the store from the
changelog's earliest offset, which only the tier still holds, and the store equals the table the whole input makes,
key by key. The full size (1,000,000 updates over 100,000 keys) is a benchmark: tests/bench/test_streams_bench.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.kafka import create_topic, set_topic_config, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.streams import TableApp, changelog_of, final_state, latest_by_key, produce_updates, table_updates
from tests.support.tiering import settings, tier_once
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

UPDATES, KEYS, PARTITIONS = 20_000, 2_000, 2
HOUR_MS = 3_600_000
# the changelog as Streams creates it: compacted and deleted by time, small segments (many for the broker to
# delete); retention starts long, so that nothing goes before the tier has copied it. The broker's cleaner cleans
# the hour-old records only (min.compaction.lag.ms): it groups the segments it cleans into as few as fit in a
# segment, and a group holding the last minutes' records too would keep the hour-old ones from time retention
CHANGELOG = {"cleanup.policy": "compact,delete", "retention.ms": str(2 * HOUR_MS), "internal.segment.bytes": "32768",
             "min.compaction.lag.ms": str(HOUR_MS // 2)}
KEEP_MS = 600_000  # then the broker keeps the last ten minutes


def test_a_wiped_kafka_streams_ktable_is_restored_through_the_proxy_from_the_tier(
        kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    """~40 s: two Streams JVM runs (build, restore), a tier pass, a proxy."""
    app_id, source = f"table-{os.getpid()}-{time.monotonic_ns() % 10**6}", f"{topic_name}-in"
    changelog = changelog_of(app_id)
    create_topic(kafka.bootstrap, source, PARTITIONS)
    updates = table_updates(UPDATES, KEYS)
    expected = final_state(updates)
    # an hour old but the last tenth: Streams gives each changelog record its input's timestamp, so the broker's
    # time retention deletes the older nine tenths of the changelog and keeps the rest
    now = int(time.time() * 1000)
    produce_updates(kafka.bootstrap, source, updates, [now - HOUR_MS if i < UPDATES * 9 // 10 else now
                                                       for i in range(UPDATES)])

    # 1. the app builds its table from the whole input, straight from the broker
    app = TableApp(tmp_path, app_id, source, PARTITIONS, CHANGELOG)
    app.build(kafka.bootstrap)
    wait_until(lambda: app.caught_up(kafka.bootstrap), "the app's commit of the whole input", timeout=120,
               interval=0.3)
    app.stop()
    ends = [watermarks(kafka.bootstrap, changelog, p)[1] for p in range(PARTITIONS)]

    # 2. the tier copies the changelog, then the broker keeps the last minutes only
    s = settings(kafka.bootstrap, tmp_path, changelog)
    summary = tier_once(s)
    assert summary.failed == 0 and summary.gaps == [], summary
    assert summary.segments >= PARTITIONS, f"the tier copied {summary.segments} segments of the changelog"
    set_topic_config(kafka.bootstrap, changelog, "retention.ms", str(KEEP_MS))

    def broker_starts() -> list[int] | None:
        got = [watermarks(kafka.bootstrap, changelog, p)[0] for p in range(PARTITIONS)]
        return got if all(got) else None

    starts = wait_until(broker_starts, "the broker's time retention on every changelog partition", timeout=60)
    # what the broker still holds could not restore the table: many keys' latest values are gone from it
    held = latest_by_key(kafka.bootstrap, changelog, PARTITIONS)
    lost = [k for k in expected if k not in held]
    assert len(lost) > len(expected) // 10, (len(lost), len(expected), starts)

    # 3. the instance loses its disk and starts again through the proxy: its store is the whole input's table
    app.wipe()
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, {"TIERPROXY_STORAGE": s.storage,
                                                     "TIERPROXY_METADATA": s.metadata})
    try:
        wait_until(lambda: proxy_serves_tier(proxy.bootstrap, changelog, PARTITIONS), "the proxy's tier", timeout=60)
        state, restores = app.dump(proxy.bootstrap)
    finally:
        proxy.stop()
    wrong = sorted(k for k in expected.keys() | state.keys() if state.get(k) != expected.get(k))
    assert not wrong, (f"{len(wrong)} of {len(expected)} keys differ, e.g. "
                       + ", ".join(f"{k}: {state.get(k)!r} (expected {expected.get(k)!r})" for k in wrong[:5]))
    # Streams restored each partition from below the broker's log start (the tier's part) to the changelog's end
    assert [(r.partition, r.end) for r in restores] == list(enumerate(ends)), restores
    assert all(r.start < start for r, start in zip(restores, starts, strict=True)), (restores, starts)
