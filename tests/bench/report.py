"""Benchmark figures: printed and appended to $TIERPROXY_BENCH_REPORT (default /tmp/tierproxy-bench.txt)."""

from __future__ import annotations

import os
import time


def report(name: str, figure: str) -> None:
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {name}: {figure}"
    print(f"\nBENCH {line}")
    with open(os.environ.get("TIERPROXY_BENCH_REPORT", "/tmp/tierproxy-bench.txt"), "a") as f:
        f.write(line + "\n")
