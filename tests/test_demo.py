"""`make demo` (= `tierproxy demo`): the walk-through runs against a real broker and ends with kcat reading the
deleted history from offset 0 through the proxy; SIGTERM (as `timeout`, systemd or a container runtime send it)
stops it with every process it started, the broker's JVM and Spark's included."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.parts import descendants

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.kcat]
OPERATIONS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_demo_walk_through_then_sigterm_leaves_no_process(kcat: str, tmp_path: Path) -> None:
    log = tmp_path / "demo.out"
    with open(log, "w") as out:
        demo = subprocess.Popen([sys.executable, "-m", "tierproxy.cli", "demo", "--duration", "0"], stdout=out,
                                stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600
        while "records are there from offset 0" not in log.read_text() and demo.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        text = log.read_text()
        assert "OK: through tierproxy all 1000 records are there from offset 0" in text, text[-3000:]
        assert "    0 record-0" in text and "$ " in text  # the commands are printed
        printed = re.search(r"^Logs: (/\S+)$", text, re.M)  # where docs/operations.md says the logs are
        said = next(item for item in OPERATIONS.read_text().split("\n- ") if item.startswith("`make demo`"))
        assert printed and Path(printed[1]).name.startswith("tierproxy-demo-"), text[-2000:]
        assert "`Logs: /tmp/tierproxy-demo-*`" in said and len(re.findall(r"`([\w/]+\.log)`", said)) == 4, said
        assert all((Path(printed[1]) / f).is_file() for f in re.findall(r"`([\w/]+\.log)`", said)), said
        started = set(descendants(demo.pid))
        names = {Path(f"/proc/{p}/comm").read_text().strip() for p in started if _alive(p)}
        assert "java" in names, names  # the broker (and the tier loop's Spark) run under the demo
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(120) == 0
        deadline = time.monotonic() + 30
        while (left := [p for p in started if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], [(p, Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")[:200]) for p in left]
        assert "Stopped." in log.read_text()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
        for p in set(descendants(demo.pid)):
            os.kill(p, signal.SIGKILL)
