"""The object-store cost model at the defaults, from tierproxy's own request metrics (`tier.requests`), each figure
checked against SeaweedFS's own count: requests and bytes per GiB tiered (a `tier` pass's summary), per pass with
nothing new, and per GiB served (a fresh proxy, kcat from offset 0, `tierproxy_storage_*_total`); the GETs per
second one proxy sends at full speed against S3's 5,500 GET/s per prefix.

    pytest -m bench tests/bench/test_cost_model_bench.py -s     (TIERPROXY_BENCH_COST_RECORDS, default 262144 x 1 KiB)
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.bench.clients import forget_tiered, kcat_mbps, produce
from tests.bench.report import report
from tests.support.kafka import create_topic
from tests.support.proxy import ProxyProcess
from tests.support.s3 import S3Server
from tests.support.tiering import settings, tier_once
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]
RECORDS = int(os.environ.get("TIERPROXY_BENCH_COST_RECORDS", str(1 << 18)))
GIB = 1 << 30
PREFIX_GETS = 5500  # S3's GET/HEAD requests per second per partitioned prefix


def _exported(admin: str) -> dict[str, Any]:
    """The proxy's storage counters, as `StorageRequests.as_dict` figures."""
    out: dict[str, Any] = {"requests": {}, "bytes_read": 0, "bytes_written": 0}
    for family in text_string_to_metric_families(httpx.get(f"http://{admin}/metrics", timeout=10).text):
        for s in family.samples:
            if s.name == "tierproxy_storage_requests_total":
                out["requests"][s.labels["kind"]] = int(s.value)
            elif s.name == "tierproxy_storage_bytes_total":
                out[f"bytes_{s.labels['direction']}"] = int(s.value)
    return out


def _per_gib(counts: dict[str, Any], nbytes: int) -> str:
    kinds = ", ".join(f"{n * GIB / nbytes:.1f} {kind}" for kind, n in counts["requests"].items() if n)
    return (f"{kinds} per GiB; {counts['bytes_read'] / nbytes:.3f} GiB read, "
            f"{counts['bytes_written'] / nbytes:.3f} GiB written per GiB")


def test_cost_model_at_the_defaults(kafka: KafkaCluster, kcat: str, s3: S3Server, tmp_path: Path) -> None:
    topic = "bench-cost"
    create_topic(kafka.bootstrap, topic, config={"segment.bytes": str(32 << 20)})
    produce(kafka, topic, RECORDS)
    s3.create_bucket("cost")
    storage = f"s3://cost/t?endpoint={s3.endpoint}&region={s3.region}"
    segment = TierSettings.model_fields["tier_segment_bytes"].default  # the default remote segment: 16 MiB
    s = settings(kafka.bootstrap, tmp_path, topic, storage=storage, tier_segment_bytes=segment)

    before = s3.counted("cost")
    tiered = tier_once(s)
    theirs = s3.counted("cost") - before
    assert tiered.failed == 0 and tiered.segments > 0
    assert sum(tiered.storage["requests"].values()) == sum(theirs.requests.values())
    assert tiered.storage["bytes_written"] == theirs.received
    idle = tier_once(s)
    assert idle.segments == 0
    idle_kinds = ", ".join(f"{n} {k}" for k, n in idle.storage["requests"].items() if n)

    only_tier = forget_tiered(kafka, topic)
    assert only_tier >= RECORDS // 2
    admin = f"127.0.0.1:{free_port()}"
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": storage, "TIERPROXY_METADATA": s.metadata, "TIERPROXY_ADMIN_LISTEN": admin,
        "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
    try:
        wait_until(lambda: proxy_serves_tier(f"127.0.0.1:{proxy.port}", topic), "the tier via the proxy", timeout=60)
        ours0, theirs0 = _exported(admin), s3.counted("cost")
        started = time.perf_counter()
        mbps = kcat_mbps(kcat, proxy.bootstrap, topic, RECORDS)  # a fresh proxy: every chunk from the store
        seconds = time.perf_counter() - started
        ours1, theirs1 = _exported(admin), s3.counted("cost") - theirs0
    finally:
        proxy.stop()
    served_bytes = only_tier * 1024  # the records only the tier held (the rest came from the broker)
    served = {"requests": {k: n - ours0["requests"].get(k, 0) for k, n in ours1["requests"].items()},
              "bytes_read": ours1["bytes_read"] - ours0["bytes_read"], "bytes_written": 0}
    assert sum(served["requests"].values()) == sum(theirs1.requests.values())
    assert served["bytes_read"] == theirs1.sent
    gets_per_s = served["requests"].get("get", 0) / seconds
    report("object-store cost model at the defaults (SeaweedFS; tierproxy's counts = the server's)",
           f"tiered {tiered.bytes / 1e6:.0f} MB in {tiered.segments} segments of {segment >> 20} MiB: "
           f"{_per_gib(tiered.storage, tiered.bytes)}; a pass with nothing new: {idle_kinds} "
           f"({idle.storage['bytes_written']} B written); served from the tier {served_bytes / 1e6:.0f} MB "
           f"at {mbps:.0f} MB/s (kcat, a fresh proxy): {_per_gib(served, served_bytes)}; "
           f"{gets_per_s:.0f} GET/s from one proxy at full speed = {gets_per_s / PREFIX_GETS:.2%} of S3's "
           f"{PREFIX_GETS} GET/s per prefix ({PREFIX_GETS / max(gets_per_s, 1e-9):.0f} such catch-ups on one "
           f"prefix reach it)")
    assert served["requests"].get("get", 0) > 0 and idle.storage["requests"]["list"] <= 2
