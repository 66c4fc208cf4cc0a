"""kcat load test through tierproxy: N producers and tail consumers on a fresh topic, M catch-up consumers
reading a (tiered) topic from the beginning. Bounded in count and time; reports MB/s, produce→consume p50/p99
latency and errors.

    python -m tests.load.kcat_load --bootstrap PROXY:PORT --history-topic T --producers 4 --tail-consumers 4 \\
        --catchup-consumers 4 --messages 20000 --size 1024 --timeout 300
Every address is whatever --bootstrap names (loopback in the tests and the CI run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field


@dataclass
class LoadReport:
    producers: int = 0
    tail_consumers: int = 0
    catchup_consumers: int = 0
    produced_mb_s: float = 0.0
    tail_mb_s: float = 0.0
    catchup_mb_s: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    messages_produced: int = 0
    messages_consumed_tail: int = 0
    messages_consumed_catchup: int = 0
    errors: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.producers} producers {self.produced_mb_s:.1f} MB/s; {self.tail_consumers} tail consumers "
                f"{self.tail_mb_s:.1f} MB/s, produce→consume p50 {self.latency_p50_ms:.1f} ms p99 "
                f"{self.latency_p99_ms:.1f} ms; {self.catchup_consumers} catch-up consumers "
                f"{self.catchup_mb_s:.1f} MB/s; {len(self.errors)} errors")


def _errors(name: str, proc: subprocess.Popen[bytes], stderr: bytes) -> list[str]:
    bad = [line for line in stderr.decode(errors="replace").splitlines() if "ERROR" in line or "%3|" in line]
    if proc.returncode not in (0, None):
        bad.append(f"exit {proc.returncode}")
    return [f"{name}: {b}" for b in bad]


def run(bootstrap: str, history_topic: str | None, producers: int, tail_consumers: int, catchup_consumers: int,
        messages: int, size: int, timeout: float, history_messages: int | None = None) -> LoadReport:
    kcat = shutil.which("kcat") or "kcat"
    topic = f"load-{uuid.uuid4().hex[:8]}"
    report = LoadReport(producers, tail_consumers, catchup_consumers)
    deadline = time.monotonic() + timeout
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # created through the proxy too
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
    time.sleep(0.5)
    latencies: list[float] = []
    lock = threading.Lock()
    tail_counts: list[int] = []
    total = producers * messages

    def tail(i: int) -> None:
        p = subprocess.Popen([kcat, "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-c", str(total), "-q",
                              "-f", "%s\n"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        n = 0
        assert p.stdout is not None
        for line in p.stdout:
            now = time.time() * 1000
            sent = line.split(b":", 1)[0]
            if sent.isdigit():
                with lock:
                    latencies.append(now - int(sent) / 1000)
            n += 1
            if time.monotonic() > deadline:
                p.kill()
                break
        p.wait(30)
        p.stdout.close()
        err = p.stderr.read() if p.stderr else b""
        if p.stderr:
            p.stderr.close()
        with lock:
            tail_counts.append(n)
            report.errors += _errors(f"tail-{i}", p, err)

    def produce(i: int) -> None:
        p = subprocess.Popen([kcat, "-b", bootstrap, "-P", "-t", topic], stdin=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        assert p.stdin is not None
        pad = b"x" * max(0, size - 24)
        for _ in range(messages):
            if time.monotonic() > deadline:
                break
            p.stdin.write(b"%d:%s\n" % (int(time.time() * 1_000_000), pad))
        p.stdin.close()
        p.wait(max(1.0, deadline - time.monotonic()))
        err = p.stderr.read() if p.stderr else b""
        if p.stderr:
            p.stderr.close()
        with lock:
            report.errors += _errors(f"producer-{i}", p, err)

    catchup_counts: list[int] = []

    def catchup(i: int) -> None:
        assert history_topic is not None
        args = [kcat, "-b", bootstrap, "-C", "-t", history_topic, "-o", "beginning", "-e", "-q", "-f", "%S\n"]
        if history_messages:
            args += ["-c", str(history_messages)]
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        sizes = [int(x) for x in out.split() if x.isdigit()]
        with lock:
            catchup_counts.append(len(sizes))
            report.catchup_mb_s += sum(sizes) / 1e6
            report.errors += _errors(f"catchup-{i}", p, err)

    threads = [threading.Thread(target=tail, args=(i,)) for i in range(tail_consumers)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # consumers are positioned before the first record
    start = time.monotonic()
    workers = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    workers += [threading.Thread(target=catchup, args=(i,)) for i in range(catchup_consumers if history_topic else 0)]
    for t in workers:
        t.start()
    for t in workers + threads:
        t.join(max(1.0, deadline - time.monotonic() + 30))
    elapsed = time.monotonic() - start
    report.messages_produced = total
    report.produced_mb_s = total * size / 1e6 / elapsed
    report.messages_consumed_tail = sum(tail_counts)
    report.tail_mb_s = sum(tail_counts) * size / 1e6 / elapsed
    report.messages_consumed_catchup = sum(catchup_counts)
    report.catchup_mb_s = report.catchup_mb_s / elapsed
    if latencies:
        q = statistics.quantiles(latencies, n=100)
        report.latency_p50_ms, report.latency_p99_ms = q[49], q[98]
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--history-topic")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--tail-consumers", type=int, default=4)
    ap.add_argument("--catchup-consumers", type=int, default=4)
    ap.add_argument("--messages", type=int, default=20000, help="per producer")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    r = run(a.bootstrap, a.history_topic, a.producers, a.tail_consumers, a.catchup_consumers, a.messages, a.size,
            a.timeout)
    print(json.dumps(asdict(r), indent=1))
    print(r.line())


if __name__ == "__main__":
    main()
