"""The rate of a bare asyncio relay on this machine, against direct loopback in the same run: the ceiling any
user-space proxy's tail meets here (`relay_calibration.py`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.report import report

pytestmark = [pytest.mark.bench]
SCRIPT = Path(__file__).with_name("relay_calibration.py")


def _rate(mode: str, loop: str) -> float:
    best = 0.0
    for _ in range(3):
        out = subprocess.run([sys.executable, str(SCRIPT), mode, loop, "1024"], capture_output=True, text=True,
                             check=True, timeout=300)
        best = max(best, float(out.stdout.split()[2]))
    return best


def test_bare_relay_against_direct_loopback() -> None:
    direct = _rate("direct", "asyncio")
    for loop in ("asyncio", "uvloop"):
        relay = _rate("relay", loop)
        assert relay > 0
        report(f"bare relay ({loop}) vs direct loopback", f"{relay:.0f} vs {direct:.0f} MB/s = "
                                                          f"{relay / direct:.2f}x (best of 3, 1 GiB)")
