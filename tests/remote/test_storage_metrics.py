"""`serve` exports the object-store requests it sends (`tierproxy_storage_requests_total{kind}`) and their bytes
(`tierproxy_storage_bytes_total{direction}`): while a consumer reads a topic's history from an S3 tier through it,
they move exactly as SeaweedFS's own count of the requests and bytes it served."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.kafka import read_to_end
from tests.support.proxy import ProxyProcess
from tests.support.remote import tier_to_s3_and_forget
from tests.support.s3 import S3Server
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3, pytest.mark.process]


def exported(admin: str) -> tuple[int, int, int]:
    """(requests of every kind, bytes read, bytes written) as the proxy's /metrics says."""
    requests = read = written = 0
    for family in text_string_to_metric_families(httpx.get(f"http://{admin}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == "tierproxy_storage_requests_total":
                requests += int(sample.value)
            elif sample.name == "tierproxy_storage_bytes_total":
                read += int(sample.value) if sample.labels["direction"] == "read" else 0
                written += int(sample.value) if sample.labels["direction"] == "written" else 0
    return requests, read, written


def test_serve_exports_the_requests_s3_counted(kafka: KafkaCluster, s3: S3Server, tmp_path: Path,
                                               topic_name: str) -> None:
    tier_to_s3_and_forget(kafka, s3, tmp_path, topic_name)
    admin = f"127.0.0.1:{free_port()}"
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": f"s3://tier/p?endpoint={s3.endpoint}&region={s3.region}",
        "TIERPROXY_METADATA": f"file://{tmp_path}/meta", "TIERPROXY_ADMIN_LISTEN": admin,
        "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
    try:
        wait_until(lambda: proxy_serves_tier(f"127.0.0.1:{proxy.port}", topic_name), "the tier via the proxy")
        # the admin API starts after the Kafka port opens (0.35-0.4 s here): the tier may be served before it answers
        ours0 = wait_until(lambda: exported(admin), "the admin API", timeout=30)
        theirs0 = s3.counted("tier")
        values = read_to_end(f"127.0.0.1:{proxy.port}", topic_name)
        assert values[:2] == ["v0" * 30, "v1" * 30]  # from the tier: the broker deleted these

        def same() -> tuple[int, int, int] | None:  # (a request in flight is counted by one side first)
            ours, theirs = exported(admin), s3.counted("tier") - theirs0
            moved = (ours[0] - ours0[0], ours[1] - ours0[1], ours[2] - ours0[2])
            return moved if moved == (sum(theirs.requests.values()), theirs.sent, theirs.received) else None

        moved = wait_until(same, "the proxy's storage metrics to equal SeaweedFS's count", timeout=30, interval=0.5)
        assert moved[0] > 0 and moved[1] > 0  # the GETs of the history it served
    finally:
        proxy.stop()
