"""Issue 66's Kafka Streams restore at full size: 1,000,000 updates over 100,000 keys (5 % tombstones, four
partitions) into a KTable whose compacted changelog is tiered; the broker keeps the last ten minutes, the state is
wiped and restored through the proxy (tests/support/streams_restore.py, the suite's steps at this size). In the same
run, before the broker deletes anything, the same wiped state is restored from the broker itself: the baseline.

    pytest -m bench tests/bench/test_streams_bench.py -s -p no:randomly
    (TIERPROXY_BENCH_STREAMS_UPDATES, default 1,000,000; keys are a tenth of the updates)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.bench.report import report
from tests.support.streams_restore import Size, restore_through_the_proxy
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark, pytest.mark.process]

UPDATES = int(os.environ.get("TIERPROXY_BENCH_STREAMS_UPDATES", "1000000"))


def test_streams_restore_through_the_proxy_at_full_size(kafka: KafkaCluster, tmp_path: Path) -> None:
    size = Size(updates=UPDATES, keys=UPDATES // 10, partitions=4, segment_bytes=1 << 20,
                tier_segment_bytes=4 << 20, heap="1g", timeout=900)
    out = restore_through_the_proxy(kafka.bootstrap, tmp_path, f"bench-streams-{os.getpid()}", size, baseline=True)
    f = out.figures
    assert out.copied is not None and out.compacted is not None
    done = out.compacted.compaction
    tier = (f"the tier copied {out.copied.segments} segments ({out.copied.bytes / 1e6:.1f} MB) in "
            f"{f['copy_pass_s']:.1f} s and compacted them {done['bytes_before'] / 1e6:.1f} → "
            f"{done['bytes_after'] / 1e6:.1f} MB ({done['segments_before']} → {done['segments_after']} segments) in a "
            f"pass of {f['compaction_pass_s']:.1f} s (the step {done['seconds']:.1f} s)")
    report("streams restore", (
        f"{size.updates:,} updates over {size.keys:,} keys ({f['keys']:,.0f} in the table), {size.partitions} "
        f"partitions: produced in {f['produce_s']:.1f} s, built by the app in {f['build_s']:.1f} s "
        f"({size.updates / f['build_s']:,.0f} updates/s; changelog {f['changelog_offsets']:,.0f} offsets); "
        f"restored from the broker in {f['broker_restore_s']:.1f} s ({f['broker_restored_records']:,.0f} records), "
        f"then the broker kept the last ten minutes ({f['lost_on_broker']:,.0f} keys' latest values on the tier "
        f"only), {tier}; restored through the proxy in {f['proxy_restore_s']:.1f} s "
        f"({f['proxy_restored_records']:,.0f} records): {f['proxy_restore_s'] / f['broker_restore_s']:.2f}x the "
        f"broker's restore time; each restore's time is the app's whole run (JVM start, group join, restore, "
        f"dump)"))
