"""`serve --workers 2` against one worker on a load that binds one worker to its core: eight catch-ups at once from
the tier, one kcat per partition of a tiered topic of 8 partitions, beside the same eight reads straight from the
broker (a copy of the topic it still holds). The tier is a filesystem read as S3 is (`remote.fetch.file.direct.reads`
and `remote.fetch.file.sendfile` off: chunk cache, read-ahead, every batch's CRC checked in the proxy), the load the
S3 path puts on the proxy without a store beside it on the same two cores. Each round starts a fresh proxy per
worker count (every byte from the store, none from a warm cache), rounds interleaved so the machine's drift cancels
out in each round's ratio. Reported: MB/s of each, 2 workers / 1 worker, the proxy's CPU per GB (all its
workers), and the CPU split (kcat, the proxy) with the machine's busy share: kcat, the broker and the proxy share
its cores.

    pytest -m bench tests/bench/test_workers_bench.py -s   (TIERPROXY_BENCH_WORKERS_RECORDS per partition, default
                                                           32768 x 1 KiB; TIERPROXY_BENCH_WORKERS_ROUNDS, default 2;
                                                           TIERPROXY_BENCH_WORKERS_PARTITIONS, default 8)
"""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.bench.clients import kcat_args, produce
from tests.bench.report import busy_share, cpu_seconds, machine_ticks, report
from tests.support.kafka import create_topic, set_retention, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark]
PARTITIONS = int(os.environ.get("TIERPROXY_BENCH_WORKERS_PARTITIONS", "8"))  # one kcat each, all at once
RECORDS = int(os.environ.get("TIERPROXY_BENCH_WORKERS_RECORDS", str(1 << 15)))
ROUNDS = int(os.environ.get("TIERPROXY_BENCH_WORKERS_ROUNDS", "2"))


def _eight_reads(kcat: str, bootstrap: str, topic: str, counts: list[int]) -> tuple[float, float]:
    """(MB/s of all eight together, kcat's CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    procs = [subprocess.Popen(kcat_args(kcat, bootstrap, topic, n, p), stdout=subprocess.PIPE)
             for p, n in enumerate(counts)]
    lines = [proc.communicate(timeout=900)[0].count(b"\n") for proc in procs]
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert lines == counts, "every record of every partition"
    return sum(counts) * 1024 / 1e6 / elapsed, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _pids(proxy: ProxyProcess, workers: int) -> list[int]:
    if workers == 1:
        return [proxy.proc.pid]
    url = proxy.admin_url
    assert url is not None

    def up() -> list[int] | None:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        pids = [int(p) for p in re.findall(r'tierproxy_worker_up\{pid="(\d+)"', text)]
        return pids if len(pids) == workers and "tierproxy_ready 1.0" in text else None

    return wait_until(up, "every worker up and its tier loaded", timeout=90)


def _settled(proxy: ProxyProcess) -> float:
    """The pool's bytes read from storage once the other workers' exports (every 5 s) have caught up: the same
    value twice, 6 s apart."""
    last: list[float] = [-1.0]

    def same() -> float | None:
        now, before = proxy.metric("tierproxy_remote_storage_read_bytes_total"), last[0]
        last[0] = now
        return now if now == before else None

    return wait_until(same, "the workers' exports settled", timeout=60, interval=6)


@pytest.mark.timeout(3600)
def test_two_workers_against_one_on_eight_catch_ups_from_the_tier(kafka: KafkaCluster, kcat: str,
                                                                 tmp_path: Path) -> None:
    tiered, local = "workers-tiered", "workers-local"
    for topic in (tiered, local):
        create_topic(kafka.bootstrap, topic, partitions=PARTITIONS, config={"segment.bytes": str(8 << 20)})
        produce(kafka, topic, RECORDS * PARTITIONS)
    storage, metadata = f"file://{tmp_path}/tier", f"file://{tmp_path}/meta"
    assert tier_once(settings(kafka.bootstrap, tmp_path, tiered, storage=storage, metadata=metadata,
                              tier_segment_bytes=8 << 20)).failed == 0
    set_retention(kafka.bootstrap, tiered, 1000)  # the broker deletes every closed (tiered) segment
    wait_until(lambda: all(watermarks(kafka.bootstrap, tiered, p)[0] > 0 for p in range(PARTITIONS)),
               "the broker's closed segments deleted", timeout=180, interval=0.5)
    set_retention(kafka.bootstrap, tiered, 3_600_000)
    held = [watermarks(kafka.bootstrap, tiered, p)[0] for p in range(PARTITIONS)]  # the tier alone holds [0, held)
    gb = sum(held) * 1024 / 1e9
    whole = [watermarks(kafka.bootstrap, local, p)[1] for p in range(PARTITIONS)]  # the direct reads: every record
    mbps: dict[str, list[float]] = {"direct": [], "1": [], "2": []}
    cpu: dict[str, list[float]] = {"1": [], "2": []}
    split: dict[str, list[str]] = {"1": [], "2": []}
    amplification: dict[str, list[float]] = {"1": [], "2": []}  # bytes read from storage per byte served
    for _ in range(ROUNDS):
        mbps["direct"].append(_eight_reads(kcat, kafka.bootstrap, local, whole)[0])
        for workers in ("1", "2"):
            proxy = ProxyProcess(kafka.bootstrap, tmp_path, args=["--workers", workers], extra={
                "TIERPROXY_STORAGE": storage, "TIERPROXY_METADATA": metadata,
                "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{free_port()}",
                "TIERPROXY_REMOTE_FETCH_FILE_DIRECT_READS": "false", "TIERPROXY_REMOTE_FETCH_FILE_SENDFILE": "false"})
            try:
                pids = _pids(proxy, int(workers))
                if workers == "1":
                    wait_until(lambda p=proxy: p.metric("tierproxy_ready") == 1, "the tier loaded", timeout=90)
                c0, m0 = [cpu_seconds(p) for p in pids], machine_ticks()
                stored = proxy.metric("tierproxy_remote_storage_read_bytes_total")
                rate, kcat_cpu = _eight_reads(kcat, proxy.bootstrap, tiered, held)
                each_cpu = [cpu_seconds(p) - c for p, c in zip(pids, c0, strict=True)]
                proxy_cpu, elapsed = sum(each_cpu), sum(held) * 1024 / 1e6 / rate
                read = _settled(proxy) - stored
                amplification[workers].append(read / (sum(held) * 1024))
                mbps[workers].append(rate)
                cpu[workers].append(proxy_cpu / gb)
                split[workers].append(f"proxy {proxy_cpu:.1f} / kcat {kcat_cpu:.1f} core-s in {elapsed:.1f} s "
                                      f"(each worker {', '.join(f'{c / elapsed:.0%}' for c in each_cpu)} of a "
                                      f"core), machine {busy_share(m0, machine_ticks()):.0%} busy")
            finally:
                proxy.stop()

    def each(xs: list[float], unit: str = "") -> str:
        return " / ".join(f"{x:.2f}{unit}" for x in xs)

    speedup = [b / a for a, b in zip(mbps["1"], mbps["2"], strict=True)]
    cpu_ratio = [b / a for a, b in zip(cpu["1"], cpu["2"], strict=True)]
    report("serve --workers 2 vs 1, eight catch-ups from the tier read as S3",
           f"{PARTITIONS} x {RECORDS} x 1 KiB, {ROUNDS} rounds: 2 workers / 1 = {each(speedup, 'x')} (median "
           f"{statistics.median(speedup):.2f}x); MB/s 1 worker {each(mbps['1'])}, 2 workers {each(mbps['2'])}, "
           f"direct from the broker {each(mbps['direct'])}; proxy core-s/GB 1 worker {each(cpu['1'])}, 2 workers "
           f"{each(cpu['2'])} (2 / 1 = {each(cpu_ratio, 'x')}); storage bytes read per byte served 1 worker "
           f"{each(amplification['1'])}, 2 workers {each(amplification['2'])}; CPU split 1 worker: "
           f"{'; '.join(split['1'])}; "
           f"2 workers: {'; '.join(split['2'])}")
    assert all(x > 0 for x in speedup + cpu_ratio)
