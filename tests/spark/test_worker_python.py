"""Spark's Python workers run `PYSPARK_PYTHON`, not the interpreter that made the session: `register(spark)`
checks once that they can import tierproxy, and otherwise names their interpreter and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
from pyspark.sql import SparkSession
from tierproxy.jobs.spark import register
from tierproxy.jobs.spark.workers import WorkerPythonError

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
try:
    register(spark)
    print("REGISTERED")
except WorkerPythonError as exc:
    print("ERROR", exc)
    sys.exit(3)
finally:
    spark.stop()
"""


def _run(worker_python: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": worker_python, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_workers_without_tierproxy_fail_with_the_fix(tmp_path: Path) -> None:
    """Slow (~50-80 s): a second virtualenv and a Spark application of its own whose workers must fail."""
    bare = tmp_path / "bare"  # a second venv, without tierproxy or its dependencies
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    out = _run(str(bare / "bin" / "python"))
    assert out.returncode == 3, out.stdout[-2000:] + out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("ERROR"))
    # (tierproxy itself may import from the working directory; its dependencies cannot)
    assert f"Spark's Python workers ({bare}/bin/python) cannot import" in line
    assert "crc32c (ModuleNotFoundError" in line
    assert f"PYSPARK_PYTHON={sys.executable}" in line
    ok = _run(sys.executable)
    assert ok.returncode == 0 and "REGISTERED" in ok.stdout, ok.stderr[-3000:]
