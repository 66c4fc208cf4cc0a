"""A thousand client connections (issue 65): 900 idle, 100 consuming, through one proxy in front of the session
broker; the proxy's memory and another consumer's tail fetch latency beside them, against that consumer alone.

- **Idle**: raw connections that did what a client does first (ApiVersions, then Metadata) and then sit, half on
  the bootstrap port and half on the broker's port. Plain idle sockets, not consumers long-polling an empty
  partition: a long-polling consumer is a fetching connection with nothing to read (the 100 below are those), and
  what an idle connection costs the proxy while it sends nothing is what the goal bounds.
- **Consuming**: 100 librdkafka consumers in a process of their own (`tests/bench/consumers.py`), each on partition
  0 of the bench topic from its own offset, at a bounded rate (`TIERPROXY_BENCH_CONNS_RATE` records of 1 KiB a
  second each, 100 by default: ~10 MB/s together, 64 KiB fetches), so their own CPU leaves the proxy its core.
  librdkafka opens a bootstrap connection beside each consumer's fetching one: the proxy counts both.
- **The probe**: 64 KiB tail fetches through the proxy one after another (`TailProbe` of the catch-up bench), its
  p99 alone, then beside the 1,000 through the proxy, then beside the same 1,000 made directly to the broker (the
  machine as loaded, the proxy not: what of the difference is the proxy's), then alone again.

Reported: the proxy's RSS before, with the 900 idle (per idle connection), its peak (/proc VmHWM); the probe's
p99 in each phase; the machine's busy share and the proxy's and consumers' CPU in each loaded phase.

    flock /tmp/bench.lock pytest -m bench tests/bench/test_connections_bench.py -s
        (TIERPROXY_BENCH_CONNS_ROUNDS, default 5; TIERPROXY_BENCH_CONNS_PROBE_S per phase, default 10;
         TIERPROXY_BENCH_CONNS_RATE per consumer, default 100)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from protocol.constants import ApiKey
from tests.bench.report import busy_share, cpu_seconds, machine_ticks, peak_rss_mib, report
from tests.bench.test_catch_up_bench import TailProbe
from tests.bench.test_remote_fetch_bench import _hottest
from tests.support.kafka import watermarks
from tests.support.proxy import ProxyProcess
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.bench, pytest.mark.kafka]
IDLE, CONSUMING = 900, 100
PROBE_S = float(os.environ.get("TIERPROXY_BENCH_CONNS_PROBE_S", "10"))
RATE = float(os.environ.get("TIERPROXY_BENCH_CONNS_RATE", "100"))
ROUNDS = int(os.environ.get("TIERPROXY_BENCH_CONNS_ROUNDS", "5"))


def rss_mib(pid: int) -> float:
    """A process's resident set now (/proc/PID/status VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return -1.0


def _idle(addresses: list[str], topic: str, stack: ExitStack) -> None:
    """One connection per address that asks ApiVersions and Metadata, as a client's first requests, then sits."""
    for address in addresses:
        w = stack.enter_context(WireClient(address, client_id="bench-idle", timeout=30))
        w.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "bench", "client_software_version": "1"})
        md = w.request(ApiKey.METADATA, 12, {"topics": [{"name": topic, "topic_id": bytes(16)}],
                                             "allow_auto_topic_creation": False,
                                             "include_topic_authorized_operations": False})
        assert md["topics"][0]["error_code"] == 0


@contextmanager
def _consumers(bootstrap: str, topic: str, end: int) -> Iterator[subprocess.Popen[str]]:
    """The 100 consuming connections, each with its first record taken, until the block ends."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.bench.consumers", bootstrap, topic, str(CONSUMING),
                             str(RATE), str(end)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.stdin.close()
        out = proc.stdout.read()
        proc.stdout.close()
        proc.wait(60)
    assert int(out.split()[-1]) > 0, out


def _probe(address: str, topic: str, end: int) -> list[float]:
    with TailProbe(address, topic, end) as probe:
        time.sleep(PROBE_S)  # the probe runs this long: what is measured, not a wait for a condition
    assert len(probe.ms) > 100, "the probe fetched"
    return probe.ms


def _p99(ms: list[float]) -> float:
    return statistics.quantiles(ms, n=100, method="inclusive")[98]


@contextmanager
def _load(proxy: ProxyProcess, broker: str, name: str, topic: str, end: int,
          figures: dict[str, float]) -> Iterator[None]:
    """The 1,000: through the proxy (idle ones on the bootstrap and the broker port) or directly to `broker`."""
    bootstrap = proxy.bootstrap if name == "proxy" else broker
    idle_at = [proxy.bootstrap, f"127.0.0.1:{proxy.base + 1}"] * (IDLE // 2) if name == "proxy" else [bootstrap] * IDLE
    with ExitStack() as stack:
        _idle(idle_at, topic, stack)
        if name == "proxy" and "rss idle" not in figures:  # the first round's: before any round's load
            figures["rss idle"] = rss_mib(proxy.proc.pid)
            figures["idle conns"] = proxy.metric("tierproxy_client_connections")
        with _consumers(bootstrap, topic, end) as consumers:
            if name == "proxy":
                figures["conns"] = proxy.metric("tierproxy_client_connections")
            figures["consumers pid"] = consumers.pid
            yield


@pytest.mark.timeout(1800)
def test_a_thousand_connections(kafka: KafkaCluster, bench_topic: str, tmp_path: Path) -> None:
    topic, end = bench_topic, watermarks(kafka.bootstrap, bench_topic)[1]
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{free_port()}"})
    pid, probe_at = proxy.proc.pid, f"127.0.0.1:{proxy.base + 1}"
    figures: dict[str, float] = {}
    p99: dict[str, list[float]] = {"alone": [], "proxy": [], "direct": []}
    load: dict[str, list[float]] = {}
    spy, raw = None, tmp_path / "pyspy.txt"
    try:
        wait_until(lambda: proxy.metric("tierproxy_ready") == 1, "the proxy ready", 60)
        with TailProbe(probe_at, topic, end):
            time.sleep(2)  # a warm-up left out: the first fetches of a fresh proxy and a cold probe
        figures["rss before"] = rss_mib(pid)
        if pyspy := os.environ.get("TIERPROXY_BENCH_PYSPY"):
            spy = subprocess.Popen([pyspy, "record", "--pid", str(pid), "--rate", "1000", "--format", "raw", "-o",
                                    str(raw), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(ROUNDS):
            p99["alone"].append(_p99(_probe(probe_at, topic, end)))
            for name in ("proxy", "direct"):
                with _load(proxy, kafka.bootstrap, name, topic, end, figures):
                    consumers = int(figures["consumers pid"])
                    ticks, c0, cc0, t0 = machine_ticks(), cpu_seconds(pid), cpu_seconds(consumers), \
                        time.perf_counter()
                    p99[name].append(_p99(_probe(probe_at, topic, end)))
                    took = time.perf_counter() - t0
                    load.setdefault(f"{name} busy", []).append(busy_share(ticks, machine_ticks()))
                    load.setdefault(f"{name} proxy", []).append((cpu_seconds(pid) - c0) / took)
                    load.setdefault(f"{name} consumers", []).append((cpu_seconds(consumers) - cc0) / took)
                    load.setdefault(f"{name} rss", []).append(rss_mib(pid))
        figures["peak"] = peak_rss_mib(pid)
    finally:
        if spy is not None:
            spy.send_signal(2)  # py-spy writes what it sampled on SIGINT
            spy.wait(60)
        proxy.stop()
    per_idle = (figures["rss idle"] - figures["rss before"]) * 1024 / IDLE
    ratios = [b / a for a, b in zip(p99["alone"], p99["proxy"], strict=True)]
    direct = [b / a for a, b in zip(p99["alone"], p99["direct"], strict=True)]
    profile = f"; the proxy's hottest frames: {_hottest(raw)}" if raw.exists() else ""
    med = statistics.median
    report(f"a thousand connections (900 idle, 100 consuming at {RATE:.0f} x 1 KiB/s each), {ROUNDS} rounds", (
        f"proxy RSS {figures['rss before']:.0f} MiB before, {figures['rss idle']:.0f} MiB with "
        f"{figures['idle conns']:.0f} idle connections ({per_idle:.1f} KiB each), "
        f"{max(load['proxy rss']):.0f} MiB with {figures['conns']:.0f} connections, peak {figures['peak']:.0f} MiB; "
        f"a 64 KiB tail fetch's p99 alone {_ms(p99['alone'])} ms, beside the 1,000 through the proxy "
        f"{_ms(p99['proxy'])} ms = {_x(ratios)} of alone in the same round, beside the 1,000 made directly to the "
        f"broker {_ms(p99['direct'])} ms = {_x(direct)}; machine busy {med(load['proxy busy']):.0%} / "
        f"{med(load['direct busy']):.0%} (through the proxy / direct), proxy {med(load['proxy proxy']):.2f} / "
        f"{med(load['direct proxy']):.2f} cores (the probe's fetches included), consumers "
        f"{med(load['proxy consumers']):.2f} / {med(load['direct consumers']):.2f} cores{profile}"))
    assert figures["conns"] >= IDLE + CONSUMING


def _ms(xs: list[float]) -> str:
    return " / ".join(f"{x:.2f}" for x in xs)


def _x(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}x ({' / '.join(f'{x:.2f}' for x in xs)})"
