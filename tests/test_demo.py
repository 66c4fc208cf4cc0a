"""`make demo` (= `tierproxy demo`): the walk-through runs against a real broker and ends with kcat reading the
deleted history from offset 0 through the proxy."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.kcat]


def test_demo_walk_through(kcat: str) -> None:
    out = subprocess.run([sys.executable, "-m", "tierproxy.cli", "demo", "--duration", "-1"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "OK: through tierproxy all 1000 records are there from offset 0" in out.stdout
    assert "    0 record-0" in out.stdout and "$ " in out.stdout  # the commands are printed
