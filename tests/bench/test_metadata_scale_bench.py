"""A tier of a million segments (issue 65, item 1): what a `tier` pass writes of its snapshot when it adds 100
segments, against the same pass on a tier of a thousand (the ratio, in the same run), and what a restore's plan
costs from that snapshot (load the chain, choose the facts, replay the records: time and peak RSS); and the proxy's
metadata view of it read from a real compacted metadata topic. Each side in a fresh process.

    pytest -m bench tests/bench/test_metadata_scale_bench.py -s      # TIERPROXY_BENCH_SEGMENTS (default 1000000)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.bench.metadata_scale import Generated
from tests.bench.report import report
from tests.bench.test_rlmm_bench import _bootstrap as bootstrap
from tests.bench.test_rlmm_bench import _partition as partition_of
from tests.bench.test_rlmm_bench import _produce as produce
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench]

SEGMENTS = int(os.environ.get("TIERPROXY_BENCH_SEGMENTS", "1000000"))
PARTITIONS = 1000


def _step(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "tests.bench.metadata_scale", *args], capture_output=True,
                         text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_pass_on_a_million_segments_writes_what_changed(tmp_path: Path) -> None:
    small = _step("write", str(tmp_path / "small"), "1000", str(PARTITIONS // 10))
    big = _step("write", str(tmp_path / "big"), str(SEGMENTS), str(PARTITIONS))
    plan = _step("plan", str(tmp_path / "big"))
    assert big["live"] >= SEGMENTS and plan["segments"] >= SEGMENTS * 0.99
    report("tier snapshot, incremental", (
        f"{big['live']:,} live records ({SEGMENTS:,} segments, {PARTITIONS} partitions): the base "
        f"{big['base_bytes'] / 1e6:.1f} MB in {big['base_s']:.1f}s; a pass adding 100 segments writes "
        f"{big['pass_bytes'] / 1e3:.0f} kB in {big['pass_s'] * 1000:.0f} ms (median of 10) against "
        f"{small['pass_bytes'] / 1e3:.0f} kB in {small['pass_s'] * 1000:.0f} ms on {small['live']:,} records "
        f"({big['pass_s'] / small['pass_s']:.1f}x; writer peak RSS {big['rss_mib']:.0f} MiB); a restore's plan "
        f"from it {plan['seconds']:.1f}s (chain loaded in {plan['load_s']:.1f}s), peak RSS {plan['rss_mib']:.0f} MiB"))
    assert big["pass_bytes"] < 1_000_000, "a pass adding 100 segments writes under 1 MB of snapshot"


@pytest.mark.kafka
def test_a_proxy_view_of_a_million_segments_from_the_metadata_topic(kafka: KafkaCluster) -> None:
    """The proxy's start on such a tier: its metadata view read from a real compacted metadata topic holding the
    live records (what the log cleaner leaves), in a fresh process (`tests/bench/rlmm_bootstrap.py`)."""
    gen = Generated(SEGMENTS, PARTITIONS)
    topic = f"__bench-million-{uuid.uuid4().hex[:6]}"
    where: dict[bytes, int] = {}
    produce(kafka.bootstrap, topic, [(k, v, partition_of(k, v, where)) for k, v in gen.values.items()], compact=True)
    del gen
    start = bootstrap(kafka.bootstrap, topic)
    assert start["live"] >= SEGMENTS * 0.99, start
    report("proxy start, a million segments", (
        f"metadata view of {start['consumed']:,.0f} records ({start['live']:,.0f} live segments) read from the "
        f"compacted metadata topic in {start['seconds']:.1f}s, RSS {start['rss_at_start_mib']:.0f} MiB then (segment "
        f"records deferred); the first /metrics scrape's sums (every partition's records applied first) "
        f"{start['scrape_s']:.1f}s, peak RSS {start['rss_mib']:.0f} MiB"))
