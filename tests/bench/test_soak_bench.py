"""Soak: tail consumers, catch-up consumers, a producer, the tier loop and S3 faults switched on and off, for
TIERPROXY_SOAK_SECONDS (30 minutes by default). Every 5 s it samples records/s of the tail consumers through the
proxy and of the same consumers straight on the broker (the baseline, same run), records/s of the catch-up
readers, p99 fetch latency (tail and remote, from the proxy's own histogram) and the proxy's RSS; it writes a PNG
plot ($TIERPROXY_SOAK_PLOT, default /tmp/tierproxy-soak.png) and prints the figures. Each catch-up pass must read
its partition from offset 0 with no gap and no duplicate; the proxy must survive every fault window.

    TIERPROXY_SOAK_SECONDS=1800 pytest -m bench tests/bench/test_soak_bench.py -s
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.bench.report import report
from tests.support.kafka import create_topic, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.s3 import S3Server
from tests.support.s3_faults import fault_relay
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

pytestmark = [pytest.mark.bench, pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]

SECONDS = float(os.environ.get("TIERPROXY_SOAK_SECONDS", "1800"))
SAMPLE = 5.0
PARTITIONS = 4
RATE = 1000  # records/s of 1 KiB produced through the proxy
WARMUP = 120.0  # no fault before the broker's 60 s retention has moved every partition's history to the tier
FAULTS = ("slowdown", "reset", "truncate", "corrupt")
MIB = 1 << 20


@dataclass
class Counter:
    n: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, k: int = 1) -> None:
        with self.lock:
            self.n += k

    def take(self) -> int:
        with self.lock:
            n, self.n = self.n, 0
            return n


def _follow(cmd: list[str], counter: Counter, stop: threading.Event) -> tuple[subprocess.Popen[str], threading.Thread]:
    """A consumer whose output lines are counted as they come."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for _ in proc.stdout:
                counter.add()
                if stop.is_set():
                    break

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return proc, t


def _catch_up_loop(kcat: str, bootstrap: str, broker: str, topic: str, partition: int, counter: Counter,
                   stop: threading.Event, passes: list[tuple[int, float]], problems: list[str]) -> None:
    """Read the partition from offset 0 up to the broker's log start at the pass's start (the part only the tier
    holds, so the rate is the tier's, not a mix that shifts as the tier grows), again and again; each pass must be
    gapless from 0."""
    while not stop.is_set():
        began = time.monotonic()
        hw = watermarks(broker, topic, partition)[0]
        if hw == 0:  # the broker has not deleted anything yet
            time.sleep(1)
            continue
        proc = subprocess.Popen([kcat, "-b", bootstrap, "-C", "-t", topic, "-p", str(partition), "-o", "0", "-c",
                                 str(hw), "-q", "-f", "%o\n"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
        assert proc.stdout is not None
        expected = 0
        with proc.stdout:
            for line in proc.stdout:
                offset = int(line)
                if offset != expected:
                    problems.append(f"partition {partition}: offset {offset} after {expected - 1}")
                    break
                expected += 1
                counter.add()
                if stop.is_set():
                    break
            proc.kill()
            proc.wait(10)
        if expected == hw:
            passes.append((expected, time.monotonic() - began))


def _histogram(text: str) -> dict[str, list[tuple[float, float]]]:
    """tierproxy_fetch_latency_seconds buckets by path: [(le, cumulative count)]."""
    out: dict[str, list[tuple[float, float]]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "tierproxy_fetch_latency_seconds":
            continue
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                out.setdefault(s.labels["path"], []).append((float(s.labels["le"]), s.value))
    return {k: sorted(v) for k, v in out.items()}


def _p99(now: list[tuple[float, float]], before: list[tuple[float, float]]) -> float | None:
    prev = dict(before)
    delta = [(le, c - prev.get(le, 0.0)) for le, c in now]
    total = delta[-1][1] if delta else 0
    if total <= 0:
        return None
    for le, c in delta:
        if c >= 0.99 * total:
            return le
    return None


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _plot(rows: list[dict[str, float]], windows: list[tuple[float, float, str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t"] / 60 for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(12, 9), sharex=True)
    axes[0].plot(t, [r["tail"] for r in rows], label="tail through the proxy")
    axes[0].plot(t, [r["direct"] for r in rows], label="tail direct (baseline)", alpha=0.7)
    axes[0].plot(t, [r["catchup"] for r in rows], label="catch-up through the proxy")
    axes[0].set_ylabel("records/s")
    axes[1].plot(t, [r["p99_tail"] * 1e3 for r in rows], label="tail fetch p99")
    axes[1].plot(t, [r["p99_remote"] * 1e3 for r in rows], label="remote fetch p99")
    axes[1].set_ylabel("ms (bucket bound)")
    axes[1].set_yscale("log")
    axes[2].plot(t, [r["rss"] / MIB for r in rows], label="proxy RSS")
    axes[2].set_ylabel("MiB")
    axes[2].set_xlabel("minutes")
    for ax in axes:
        for a, b, mode in windows:
            ax.axvspan(a / 60, b / 60, color="red", alpha=0.08)
            if ax is axes[0]:
                ax.text(a / 60, 0, mode, fontsize=7, va="bottom")
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle("tierproxy soak: shaded = S3 faults on")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@pytest.mark.timeout(SECONDS + 900)
def test_soak(kafka: KafkaCluster, s3: S3Server, tmp_path: Path, kcat: str) -> None:
    topic = f"soak-{os.getpid()}"
    s3.create_bucket("soak")
    # the broker keeps a minute; the tier loop copies every 10 s; catch-up readers read the tier, then the log
    create_topic(kafka.bootstrap, topic, partitions=PARTITIONS,
                 config={"segment.ms": "10000", "retention.ms": "60000"})
    creds = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
    admin_port = free_port()
    stop = threading.Event()
    procs: list[subprocess.Popen[str]] = []
    threads: list[threading.Thread] = []
    problems: list[str] = []
    with fault_relay(s3.endpoint) as relay:
        relay.every, relay.limit = 3, 10**9
        proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
            "TIERPROXY_STORAGE": f"s3://soak/p?endpoint={relay.endpoint}&region={s3.region}",
            "TIERPROXY_METADATA": "topic:", "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{admin_port}",
            "TIERPROXY_REMOTE_FETCH_CACHE_BYTES": str(8 * MIB), "TIERPROXY_REMOTE_FETCH_CHUNK_BYTES": str(MIB),
            **creds})  # a small cache: catch-up passes read storage again, through the faults
        tier_log = open(tmp_path / "tier.log", "w")  # noqa: SIM115 - closed below
        tier = subprocess.Popen([sys.executable, "-m", "tierproxy.cli", "tier", "--bootstrap-server",
                                 kafka.bootstrap, "--storage", f"s3://soak/p?endpoint={s3.endpoint}&region={s3.region}",
                                 "--topics", topic, "--interval", "10s", "--no-progress", "--master", "local[1]"],
                                stdout=tier_log, stderr=subprocess.STDOUT, text=True, env={
                                    **os.environ, **creds,  # the tier keeps everything: catch-up starts at 0
                                    "TIERPROXY_TIER_TOPIC_OVERRIDES": json.dumps({topic: {"retention.ms": -1}})})
        tail, direct, catchup = Counter(), Counter(), Counter()
        passes: list[tuple[int, float]] = []  # (records, seconds) of each complete catch-up pass
        try:
            for q in range(PARTITIONS):
                for bootstrap, counter in ((proxy.bootstrap, tail), (kafka.bootstrap, direct)):
                    proc, t = _follow([kcat, "-b", bootstrap, "-C", "-t", topic, "-p", str(q), "-o", "end", "-u",
                                       "-q", "-X", "fetch.wait.max.ms=100", "-f", "%o\n"], counter, stop)
                    procs.append(proc)
                    threads.append(t)
            procs.append(subprocess.Popen(
                ["java", "-Xmx256m", "-cp", f"{kafka.libs}/*", "org.apache.kafka.tools.ProducerPerformance",
                 "--topic", topic, "--num-records", str(int(RATE * (SECONDS + 60))), "--record-size", "1024",
                 "--throughput", str(RATE), "--producer-props", f"bootstrap.servers={proxy.bootstrap}", "acks=1",
                 "linger.ms=5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True))
            for q in range(2):
                threads.append(threading.Thread(target=_catch_up_loop, daemon=True, args=(
                    kcat, proxy.bootstrap, kafka.bootstrap, topic, q, catchup, stop, passes, problems)))
                threads[-1].start()
            rows: list[dict[str, float]] = []
            windows: list[tuple[float, float, str]] = []
            period = max(SAMPLE * 2, SECONDS / 12)
            start = time.monotonic()
            hist = _histogram(wait_until(lambda: httpx.get(f"http://127.0.0.1:{admin_port}/metrics").text,
                                         "the admin listener", timeout=30))
            fault_started = 0.0
            while (now := time.monotonic() - start) < SECONDS:
                time.sleep(SAMPLE)  # the sampling tick: a measurement window, not a wait for a condition
                now = time.monotonic() - start
                phase = int(now // period)
                mode = FAULTS[(phase // 2) % len(FAULTS)] if phase % 2 and phase * period >= WARMUP else "none"
                if mode != relay.mode:
                    if relay.mode != "none":
                        windows.append((fault_started, now, relay.mode))
                    relay.mode, fault_started = mode, now
                assert proxy.proc.poll() is None, "the proxy died"
                got = _histogram(httpx.get(f"http://127.0.0.1:{admin_port}/metrics").text)
                rows.append({"t": now, "tail": tail.take() / SAMPLE, "direct": direct.take() / SAMPLE,
                             "catchup": catchup.take() / SAMPLE, "rss": _rss(proxy.proc.pid),
                             "p99_tail": _p99(got.get("tail", []), hist.get("tail", [])) or 0.0,
                             "p99_remote": _p99(got.get("remote", []), hist.get("remote", [])) or 0.0})
                hist = got
            if relay.mode != "none":
                windows.append((fault_started, SECONDS, relay.mode))
            relay.mode = "none"
        finally:
            stop.set()
            for p in procs:
                p.kill()
                p.wait(10)
            for t in threads:
                t.join(30)
            tier.terminate()
            tier.wait(60)
            tier_log.close()
            proxy.stop()
    plot = Path(os.environ.get("TIERPROXY_SOAK_PLOT", "/tmp/tierproxy-soak.png"))
    _plot(rows, windows, plot)
    warm = [r for r in rows if r["t"] > 30] or rows
    ratio = [r["tail"] / r["direct"] for r in warm if r["direct"] > 0]
    tail_p99 = [r["p99_tail"] for r in warm if r["p99_tail"] > 0]
    remote_p99 = [r["p99_remote"] for r in warm if r["p99_remote"] > 0]
    rss = [r["rss"] / MIB for r in rows]
    pass_rate = statistics.median(n / max(sec, 1e-3) for n, sec in passes) if passes else 0.0
    # catch-up between fault windows vs before the first one, once the broker's retention has run (the catch-up
    # readers read the tier from then on); the first sample after a window is its recovery, left out
    settled = 90.0
    clear = list(zip([0.0, *(w[1] for w in windows)], [w[0] for w in windows] + [SECONDS], strict=True))
    means = []
    for a, b in clear:
        xs = [r["catchup"] for r in rows if max(a, settled) + SAMPLE < r["t"] <= b]
        means.append(statistics.mean(xs) if xs else 0.0)
    baseline = means[0] if means else 0.0
    ratios = [m / baseline for m in means[1:] if m] if baseline else []
    report(f"soak {SECONDS / 60:.0f} min", (
        f"tail through the proxy {statistics.mean(r['tail'] for r in warm):.0f} rec/s vs direct "
        f"{statistics.mean(r['direct'] for r in warm):.0f} rec/s (ratio per 5 s: median "
        f"{statistics.median(ratio) if ratio else 0:.2f}, min {min(ratio, default=0):.2f}); catch-up "
        f"{statistics.mean(r['catchup'] for r in warm):.0f} rec/s, {len(passes)} whole passes from offset 0 "
        f"(longest {max(passes, default=(0, 0.0))[0]} records, each at {pass_rate:.0f} rec/s median), "
        f"{len(problems)} gaps or duplicates; catch-up between fault windows vs before the first "
        f"({baseline:.0f} rec/s): {', '.join(f'{x:.2f}' for x in ratios)}; p99 tail median "
        f"{statistics.median(tail_p99) * 1e3 if tail_p99 else 0:.1f} ms max {max(tail_p99, default=0) * 1e3:.1f} ms, "
        f"remote median {statistics.median(remote_p99) * 1e3 if remote_p99 else 0:.1f} ms max "
        f"{max(remote_p99, default=0) * 1e3:.1f} ms; RSS start {rss[0]:.0f} MiB max {max(rss):.0f} MiB end "
        f"{rss[-1]:.0f} MiB; S3 faults injected {dict(relay.counts)}; plot {plot}"))
    assert not problems, problems[:5]
    assert ratios and min(ratios) > 0.5, f"catch-up did not come back after a fault window: {ratios}"
    assert passes and max(passes)[0] > 0
    assert min(r["tail"] for r in warm) > 0, "a 5 s window with no tail record through the proxy"
    assert max(rss) < 1024, "RSS beyond 1 GiB"
