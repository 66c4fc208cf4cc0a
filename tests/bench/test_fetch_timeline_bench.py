"""Where a remote answer's time goes (issue 65, item 4): one 1 KiB-record topic read by kcat from offset 0 directly
while the broker holds it, then through a proxy from the filesystem tier once the broker deleted it; kcat's own
round trip per 4 MiB fetch on both paths (librdkafka's `-d protocol`), and the proxy's steps of each fetch (request
in, plan and forward, the broker's authorizing round trip, answer made, first and last file byte out, the client's
turn until its next request), stamped by `timeline/sitecustomize.py`, which only this benchmark loads.

    pytest -m bench tests/bench/test_fetch_timeline_bench.py -s
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from tests.bench.clients import RECORDS, kcat_args, produce, served_from_file_tier
from tests.bench.report import report
from tests.bench.timeline_read import inclusive, kcat_rtts, proxy_steps
from tests.support.kafka import create_topic
from tests.support.proxy import ProxyProcess
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark, pytest.mark.kcat]
TIMELINE = Path(__file__).parent / "timeline"
PROFILED = ["fetch_request", "decode_fetch_request", "plan_fetch", "forward", "start_early", "submit_read", "read",
            "_read_region", "fetch_response", "scan_fetch_response", "complete_now", "write_answer", "flush",
            "_send_rest", "sendfile", "buffer_updated", "process_upstream"]


def _read(kcat: str, bootstrap: str, topic: str) -> tuple[float, list[float]]:
    """kcat's MB/s over the topic's RECORDS and its round trips (ms) of the 1 MiB+ fetch answers."""
    start = time.perf_counter()
    out = subprocess.run([*kcat_args(kcat, bootstrap, topic, RECORDS), "-d", "protocol"], capture_output=True,
                         timeout=900, check=True)
    took = time.perf_counter() - start
    assert out.stdout.count(b"\n") >= RECORDS
    return RECORDS * 1024 / 1e6 / took, kcat_rtts(out.stderr.decode(errors="replace"))


def test_where_a_remote_answer_spends_its_time(kafka: KafkaCluster, kcat: str, tmp_path: Path) -> None:
    topic = f"bench-timeline-{time.monotonic_ns() % 100000}"
    create_topic(kafka.bootstrap, topic, config={"segment.bytes": str(32 << 20)})
    produce(kafka, topic, RECORDS, 1024)
    direct = [_read(kcat, kafka.bootstrap, topic) for _ in range(3)]
    plain, _ = served_from_file_tier(kafka, topic, tmp_path, "tier", RECORDS)
    plain.stop()
    line = tmp_path / "timeline.txt"
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": f"file://{tmp_path}/tier", "TIERPROXY_METADATA": f"file://{tmp_path}/meta-tier",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TIMELINE), os.environ.get("PYTHONPATH")])),
        "TIERPROXY_BENCH_TIMELINE": str(line)})
    spy, raw = None, tmp_path / "pyspy.txt"
    try:
        _read(kcat, proxy.bootstrap, topic)  # a fresh proxy: every chunk from the tier once
        if pyspy := os.environ.get("TIERPROXY_BENCH_PYSPY"):  # where the loop's time goes, by function
            spy = subprocess.Popen([pyspy, "record", "--pid", str(proxy.proc.pid), "--rate", "1000", "--format",
                                    "raw", "-o", str(raw), "--nonblocking"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        remote = [_read(kcat, proxy.bootstrap, topic) for _ in range(3)]
    finally:
        if spy is not None:
            spy.send_signal(2)  # py-spy writes what it sampled on SIGINT
            spy.wait(60)
        proxy.stop()
    steps = proxy_steps(line)
    rtt_d = statistics.median(r for _, rtts in direct for r in rtts)
    rtt_r = statistics.median(r for _, rtts in remote for r in rtts)
    report("a remote answer's timeline, 1 KiB records, 4 MiB fetches", (
        f"direct {statistics.median(m for m, _ in direct):.0f} MB/s, kcat's round trip per fetch {rtt_d:.2f} ms; "
        f"remote {statistics.median(m for m, _ in remote):.0f} MB/s, round trip {rtt_r:.2f} ms; the proxy's steps "
        f"(medians over {steps.pop('fetches'):.0f} fetches of the last read, ms): "
        + ", ".join(f"{k} {v:.3f}" for k, v in steps.items())))
    if raw.exists():
        report("the proxy's loop by function (share of py-spy's samples holding it)", ", ".join(
            f"{k} {v:.1f} %" for k, v in inclusive(raw, PROFILED).items()))
    assert rtt_r > 0 and rtt_d > 0
