"""A gibibyte to a real S3 server (SeaweedFS): `tier --once` copies 1 GiB in 32 MiB segments (multipart uploads),
the broker deletes it, and kcat through the proxy reads every record identical to what the broker served; two
tier passes started at once on the same metadata topic are fenced (one wins, the other stops with exit 4) and
what they leave reads back just as well."""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.clients import forget_tiered, produce
from tests.support.kafka import create_topic
from tests.support.proxy import ProxyProcess
from tests.support.relay import CountingRelay
from tests.support.s3 import S3Server
from tests.support.tiering import tiered
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.config import TierSettings
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3, pytest.mark.kcat]
RECORDS = 1 << 20  # x 1 KiB
SEGMENT = 32 << 20
ROOT = Path(__file__).resolve().parents[2]


def _kcat_digest(kcat: str, bootstrap: str, topic: str) -> tuple[int, str]:
    out = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-c",
                          str(RECORDS), "-q", "-f", "%o %k %s\n", "-X", "fetch.message.max.bytes=4194304"],
                         capture_output=True, timeout=600, check=True)
    return out.stdout.count(b"\n"), hashlib.sha256(out.stdout).hexdigest()


def _tier(kafka: KafkaCluster, topic: str, storage: str, metadata: str, state: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TIERPROXY_TIER_SEGMENT_BYTES": str(SEGMENT), "TIERPROXY_TIER_STATE_DIR": str(state),
           "TIERPROXY_SPARK_MASTER": "local[2]"}
    return subprocess.Popen([sys.executable, "-m", "tierproxy.cli", "tier", "--once", "--no-progress",
                             "--bootstrap-server", kafka.bootstrap, "--storage", storage, "--metadata", metadata,
                             "--topics", topic], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_a_gib_to_seaweedfs_and_back_with_fenced_concurrent_passes(kafka: KafkaCluster, s3: S3Server, kcat: str,
                                                                    tmp_path: Path, topic_name: str) -> None:
    """Slow (~55-80 s): a GiB is produced, tiered to SeaweedFS by two concurrent tier processes (one fenced) and a
    rerun, then compared by digest: the volume is the point."""
    create_topic(kafka.bootstrap, topic_name, config={"segment.bytes": str(64 << 20)})
    produce(kafka, topic_name, RECORDS)
    expected = _kcat_digest(kcat, kafka.bootstrap, topic_name)
    assert expected[0] == RECORDS
    s3.create_bucket("gib")
    relay = CountingRelay(int(s3.endpoint.rsplit(":", 1)[1]))
    storage = f"s3://gib/t?endpoint=http://127.0.0.1:{relay.port}&region={s3.region}"
    metadata = f"topic:__tp-meta-gib-{os.getpid()}?partitions=3&replication=1"
    try:
        # two passes at once: the metadata topic's transactional writer fences one of them
        first = _tier(kafka, topic_name, storage, metadata, tmp_path / "state-a")
        second = _tier(kafka, topic_name, storage, metadata, tmp_path / "state-b")
        outs = [p.communicate(timeout=900)[0] for p in (first, second)]
        codes = sorted(p.returncode for p in (first, second))
        assert codes in ([0, 4], [0, 0]), outs  # (both finishing means they did not overlap: the test says so)
        print(f"concurrent passes exited {codes}; {relay.requests}")
        if codes == [0, 4]:
            assert any("another tier job took over" in o for o in outs), outs
        rerun = _tier(kafka, topic_name, storage, metadata, tmp_path / "state-c")  # completes what was fenced
        rerun_out = rerun.communicate(timeout=900)[0]
        assert rerun.returncode == 0, rerun_out
        s = TierSettings(bootstrap_servers=kafka.bootstrap, storage=storage, metadata=metadata,
                         tier_state_dir=tmp_path / "state-c")
        segs = tiered(s, topic_name)[0]
        assert len(segs) >= 32 and sum(m.segment_size_in_bytes for m in segs) >= 1 << 30
        assert relay.requests.get("POST", 0) >= 2 * len(segs)  # CreateMultipartUpload + Complete per segment log
        assert [m.start_offset for m in segs] == sorted({m.start_offset for m in segs})  # no overlap, no twin
        assert all(a.end_offset + 1 == b.start_offset for a, b in itertools.pairwise(segs))

        only_tier = forget_tiered(kafka, topic_name)
        assert only_tier >= RECORDS // 2
        direct = f"s3://gib/t?endpoint={s3.endpoint}&region={s3.region}"  # the reads need no counting relay
        proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
            "TIERPROXY_STORAGE": direct, "TIERPROXY_METADATA": metadata,
            "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
        try:
            wait_until(lambda: proxy_serves_tier(proxy.bootstrap, topic_name), "the proxy's tier", timeout=60)
            assert _kcat_digest(kcat, proxy.bootstrap, topic_name) == expected
        finally:
            proxy.stop()
    finally:
        relay.close()
