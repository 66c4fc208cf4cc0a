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
