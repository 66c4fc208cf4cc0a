"""A tier of a million segments (issue 65, item 1): what a `tier` pass writes of its snapshot when it adds 100
segments, against the same pass on a tier of a thousand (the ratio, in the same run), and what a restore's plan
costs from that snapshot (load the chain, choose the facts, replay the records: time and peak RSS). Each side in a
fresh process (`tests/bench/metadata_scale.py`).

    pytest -m bench tests/bench/test_metadata_scale_bench.py -s      # TIERPROXY_BENCH_SEGMENTS (default 1000000)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench.report import report

pytestmark = [pytest.mark.bench]

SEGMENTS = int(os.environ.get("TIERPROXY_BENCH_SEGMENTS", "1000000"))
PARTITIONS = 1000


def _step(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "tests.bench.metadata_scale", *args], capture_output=True,
                         text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_pass_on_a_million_segments_writes_what_changed(tmp_path: Path) -> None:
    small = _step("write", str(tmp_path / "small"), "1000", str(PARTITIONS // 10))
    big = _step("write", str(tmp_path / "big"), str(SEGMENTS), str(PARTITIONS))
    plan = _step("plan", str(tmp_path / "big"))
    assert big["live"] >= SEGMENTS and plan["segments"] >= SEGMENTS * 0.99
    report("tier snapshot, incremental", (
        f"{big['live']:,} live records ({SEGMENTS:,} segments, {PARTITIONS} partitions): the base "
        f"{big['base_bytes'] / 1e6:.1f} MB in {big['base_s']:.1f}s; a pass adding 100 segments writes "
        f"{big['pass_bytes'] / 1e3:.0f} kB in {big['pass_s'] * 1000:.0f} ms (median of 10) against "
        f"{small['pass_bytes'] / 1e3:.0f} kB in {small['pass_s'] * 1000:.0f} ms on {small['live']:,} records "
        f"({big['pass_s'] / small['pass_s']:.1f}x; writer peak RSS {big['rss_mib']:.0f} MiB); a restore's plan "
        f"from it {plan['seconds']:.1f}s (chain loaded in {plan['load_s']:.1f}s), peak RSS {plan['rss_mib']:.0f} MiB"))
    assert big["pass_bytes"] < 1_000_000, "a pass adding 100 segments writes under 1 MB of snapshot"
