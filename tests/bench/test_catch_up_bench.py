"""Catch-up at the speed of the tail: history read through tierproxy from the filesystem tier vs the same amount of
the same kind of data read directly from the broker's own log, interleaved in one run.

Every topic has a twin produced alike (ProducerPerformance, same record size, same batching): `tiered-*` is tiered
and then deleted from the broker, `local-*` stays on the broker. Each round starts a fresh proxy (the tier's files
in the page cache, as the broker's are) and reads, in turn: the history from the tier (cold), the twin directly,
the history again through the same proxy, both with kafka-consumer-perf-test. Ratios
are taken within a round, so the machine's drift between rounds (this 2-core machine's direct figure varies
1.5x between runs) cancels out. Each configuration of `remote.authorization.cache.ms` (0, the default: the broker
authorizes every remote fetch; 1000: a connection the broker authorized less than a second ago is not asked
again) gets its own rounds. Then eight consumers at once, one per partition of an eight-partition topic, with
another consumer's tail fetches through the proxy timed beside them (p99 alone, beside eight direct readers, beside
the eight catching up through the proxy).

    pytest -m bench tests/bench/test_catch_up_bench.py -s   (TIERPROXY_BENCH_CATCH_UP_MIB per topic, default 128;
                                                             TIERPROXY_BENCH_CATCH_UP_ROUNDS, default 3)
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import threading
import time
from pathlib import Path

import pytest

from protocol.constants import ApiKey
from protocol.requests import fetch_request
from tests.bench.clients import kcat_args, perf_test_mbps, produce
from tests.bench.report import busy_share, cpu_seconds, machine_ticks, peak_rss_mib, report
from tests.support.kafka import create_topic, set_retention, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark]
MIB = int(os.environ.get("TIERPROXY_BENCH_CATCH_UP_MIB", "128"))
ROUNDS = int(os.environ.get("TIERPROXY_BENCH_CATCH_UP_ROUNDS", "3"))
SIZES = (1024, 200)
WINDOWS = (0, 1000)
CONSUMERS = 8


def _forget(kafka: KafkaCluster, topic: str, partitions: int) -> list[int]:
    """The broker deletes every closed segment of `topic` (all of them tiered): each partition's log start."""
    set_retention(kafka.bootstrap, topic, 1000)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        starts = [watermarks(kafka.bootstrap, topic, p)[0] for p in range(partitions)]
        if all(starts):
            break
        time.sleep(0.5)
    set_retention(kafka.bootstrap, topic, 3_600_000)
    assert all(starts), starts
    return starts


def _kcat_cpu() -> float:
    """CPU seconds of the children waited for so far (the kcat runs)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _read(kcat: str, bootstrap: str, topic: str, count: int, size: int, partition: int = 0,
          load: dict[str, list[float]] | None = None) -> tuple[float, float]:
    """kcat reading `count` records of partition `partition` from offset 0: (ms to the first record, MB/s). With
    `load`, what the read cost the machine is appended to it: "busy" (the share of both cores busy meanwhile) and
    "kcat" (kcat's own CPU, core-s per GB)."""
    args = kcat_args(kcat, bootstrap, topic, count, partition)
    ticks, kcat_cpu = machine_ticks(), _kcat_cpu()
    start = time.perf_counter()
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        first_ms = (time.perf_counter() - start) * 1000
        n = 1 if first else 0
        while chunk := proc.stdout.read(1 << 20):  # bounded by `count` lines: kcat stops there
            n += chunk.count(b"\n")
        assert proc.wait(600) == 0
    took = time.perf_counter() - start
    assert n >= count, (topic, partition, n, count)
    if load is not None:
        load.setdefault("busy", []).append(busy_share(ticks, machine_ticks()))
        load.setdefault("kcat", []).append((_kcat_cpu() - kcat_cpu) / (count * size / 1e9))
    return first_ms, count * size / 1e6 / took


class TailProbe:
    """Another consumer's tail fetches through the proxy, timed on the wire while other work runs: 64 KiB fetches
    of the broker's own log (`topic`, kept locally), one after another, until stopped."""

    def __init__(self, address: str, topic: str, end: int) -> None:
        self.address, self.topic, self.end = address, topic, end
        self.stop = threading.Event()
        self.ms: list[float] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with WireClient(self.address, timeout=30) as w:
            offset = 0
            for _ in range(1_000_000):  # bounded; stopped long before
                if self.stop.is_set():
                    return
                body = fetch_request({self.topic: {0: offset}}, max_bytes=64 << 10)
                start = time.perf_counter()
                w.request(ApiKey.FETCH, 12, body)
                self.ms.append((time.perf_counter() - start) * 1000)
                offset = (offset + 4096) % max(1, self.end - 100)

    def __enter__(self) -> TailProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)

    def p99(self) -> float:
        """The 99th percentile (of fewer than 100 fetches: about their slowest)."""
        return statistics.quantiles(self.ms, n=100, method="inclusive")[98] if len(self.ms) >= 2 else float("nan")


def _median(load: dict[str, list[float]], what: str) -> float:
    return statistics.median(load[what])


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})"


def _proxy(kafka: KafkaCluster, tmp: Path, window_ms: int) -> ProxyProcess:
    proxy = ProxyProcess(kafka.bootstrap, tmp, extra={
        "TIERPROXY_STORAGE": f"file://{tmp}/tier", "TIERPROXY_METADATA": f"file://{tmp}/meta",
        "TIERPROXY_REMOTE_AUTHORIZATION_CACHE_MS": str(window_ms)})
    proxy.wait_tier_ready()
    return proxy


@pytest.mark.timeout(1800)
def test_catch_up_from_the_filesystem_tier_vs_direct_tail(kafka: KafkaCluster, kcat: str, tmp_path: Path) -> None:
    segment = {"segment.bytes": str(16 << 20)}
    for size in SIZES:
        for kind in ("local", "tiered"):
            create_topic(kafka.bootstrap, f"{kind}-{size}", config=segment)
            produce(kafka, f"{kind}-{size}", (MIB << 20) // size, size)
    for kind in ("local", "tiered"):
        create_topic(kafka.bootstrap, f"{kind}-{CONSUMERS}p", partitions=CONSUMERS, config=segment)
        produce(kafka, f"{kind}-{CONSUMERS}p", (2 * MIB << 20) // 1024, 1024)  # 32 MiB a partition
    assert tier_once(settings(kafka.bootstrap, tmp_path, "tiered-", tier_topics="tiered-.*",
                              tier_segment_bytes=16 << 20)).failed == 0
    held = {size: _forget(kafka, f"tiered-{size}", 1)[0] for size in SIZES}
    # per partition, what the tier alone holds, and no more than the twin has (the producer spreads records unevenly)
    held_8p = [min(start, watermarks(kafka.bootstrap, f"local-{CONSUMERS}p", p)[1])
               for p, start in enumerate(_forget(kafka, f"tiered-{CONSUMERS}p", CONSUMERS))]
    figures = []
    for window in WINDOWS:
        for size in SIZES:
            count, cold, cached, java, first_cold, first_direct = held[size], [], [], [], [], []
            cpu: list[float] = []
            load: dict[str, dict[str, list[float]]] = {"proxy": {}, "direct": {}}
            for _ in range(ROUNDS):
                proxy = _proxy(kafka, tmp_path, window)
                try:
                    c0 = cpu_seconds(proxy.proc.pid)
                    first_c, c = _read(kcat, proxy.bootstrap, f"tiered-{size}", count, size, load=load["proxy"])
                    cpu.append((cpu_seconds(proxy.proc.pid) - c0) / (count * size / 1e9))
                    first_d, d = _read(kcat, kafka.bootstrap, f"local-{size}", count, size, load=load["direct"])
                    _, again = _read(kcat, proxy.bootstrap, f"tiered-{size}", count, size)
                    jd = perf_test_mbps(kafka.libs, kafka.bootstrap, f"local-{size}", count)
                    jp = perf_test_mbps(kafka.libs, proxy.bootstrap, f"tiered-{size}", count)
                finally:
                    proxy.stop()
                cold.append(c / d)
                cached.append(again / d)
                java.append(jp / jd)
                first_cold.append(first_c)
                first_direct.append(first_d)
            added = [c - d for c, d in zip(first_cold, first_direct, strict=True)]
            figures.append(f"window {window} ms, {size} B records ({count * size >> 20} MiB): kcat cold "
                           f"{_spread(cold)}, cached {_spread(cached)}; kafka-consumer-perf-test {_spread(java)}; "
                           f"first record {statistics.median(first_cold):.0f} ms after kcat's start (direct "
                           f"{statistics.median(first_direct):.0f} ms: "
                           f"+{statistics.median(added):.0f} ms); proxy CPU {statistics.median(cpu):.2f} "
                           f"core-s/GB; machine busy cold {_median(load['proxy'], 'busy'):.0%} (direct "
                           f"{_median(load['direct'], 'busy'):.0%}), kcat itself "
                           f"{_median(load['proxy'], 'kcat'):.2f} core-s/GB (direct "
                           f"{_median(load['direct'], 'kcat'):.2f})")
            print(figures[-1], flush=True)
        # eight consumers at once, one partition each, against eight reading the twin directly
        # and another consumer tailing the broker's own log through the proxy meanwhile: its fetches' p99 alone,
        # beside 8 direct readers, beside the 8 catching up through the proxy
        proxy = _proxy(kafka, tmp_path, window)
        tail_end = watermarks(kafka.bootstrap, "local-1024", 0)[1]
        tail: dict[str, list[float]] = {"alone": [], "direct": [], "proxy": []}
        try:
            ratios, hwm = [], []
            for _ in range(ROUNDS):
                with TailProbe(f"127.0.0.1:{proxy.base + 1}", "local-1024", tail_end) as probe:
                    time.sleep(3)  # the probe alone runs this long: what is measured, not a wait
                tail["alone"].append(probe.p99())
                got = {}
                for name, bootstrap, topic in (("proxy", proxy.bootstrap, f"tiered-{CONSUMERS}p"),
                                               ("direct", kafka.bootstrap, f"local-{CONSUMERS}p")):
                    start, ticks = time.perf_counter(), machine_ticks()
                    with TailProbe(f"127.0.0.1:{proxy.base + 1}", "local-1024", tail_end) as probe:
                        procs = [subprocess.Popen(kcat_args(kcat, bootstrap, topic, held_8p[p], p),
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                                 for p in range(CONSUMERS)]
                        assert all(pr.wait(600) == 0 for pr in procs)
                    tail[name].append(probe.p99())
                    got[name] = sum(held_8p) * 1024 / 1e6 / (time.perf_counter() - start)
                    got[name + " busy"] = busy_share(ticks, machine_ticks())
                ratios.append(got["proxy"] / got["direct"])
                hwm.append(peak_rss_mib(proxy.proc.pid))
        finally:
            proxy.stop()
        p99 = {k: statistics.median(v) for k, v in tail.items()}
        figures.append(f"window {window} ms, {CONSUMERS} consumers at once: aggregate {_spread(ratios)} of "
                       f"{CONSUMERS} direct (last round {got['proxy']:.0f} vs {got['direct']:.0f} MB/s, machine "
                       f"{got['proxy busy']:.0%} / {got['direct busy']:.0%} busy); proxy peak RSS {max(hwm):.0f} MiB; "
                       f"another consumer's 64 KiB tail fetch p99 {p99['alone']:.2f} ms alone, "
                       f"{p99['direct']:.2f} ms beside {CONSUMERS} direct readers, {p99['proxy']:.2f} ms beside the "
                       f"{CONSUMERS} catching up (+{p99['proxy'] - p99['alone']:.2f} ms)")
    report("catch-up vs direct tail (filesystem tier, ratios per round: median (min-max))", "; ".join(figures))

