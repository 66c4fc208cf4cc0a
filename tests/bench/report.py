"""Benchmark figures: printed and appended to $TIERPROXY_BENCH_REPORT (default /tmp/tierproxy-bench.txt)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def report(name: str, figure: str) -> None:
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {name}: {figure}"
    print(f"\nBENCH {line}")
    with open(os.environ.get("TIERPROXY_BENCH_REPORT", "/tmp/tierproxy-bench.txt"), "a") as f:
        f.write(line + "\n")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (/proc/PID/stat utime and stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far (/proc/stat): whether a run was CPU-bound."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of all the machine's cores busy between two `machine_ticks`."""
    return (after[0] - before[0]) / max(1, after[1] - before[1])


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident set so far (/proc/PID/status VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return -1.0
