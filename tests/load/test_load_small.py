"""The kcat load test at a small size through the proxy (tail and catch-up mixes): everything produced is
consumed by every tail consumer, catch-up consumers read the tiered history, no errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.load.kcat_load import run
from tests.remote.conftest import make_tiered_topic
from tests.support.proxy import ProxyProcess
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.kcat]


def test_small_load_through_the_proxy(kafka: KafkaCluster, kcat: str, tmp_path: Path, topic_name: str) -> None:
    tt = make_tiered_topic(kafka, tmp_path, topic_name, partitions=1, n=2000)
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tmp_path}/tier",
                                                           "TIERPROXY_METADATA": f"file://{tmp_path}/meta"})
    try:
        r = run(proxy.bootstrap, topic_name, producers=2, tail_consumers=2, catchup_consumers=2, messages=2000,
                size=512, timeout=120, history_messages=len(tt.produced[0]))
    finally:
        proxy.stop()
    print(r.line())
    assert r.errors == []
    assert r.messages_consumed_tail == 2 * 2 * 2000
    assert r.messages_consumed_catchup == 2 * len(tt.produced[0])
    assert r.latency_p99_ms > 0 and r.produced_mb_s > 0
