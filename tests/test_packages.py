"""Packages by role: `pip install kafka-tierproxy` is the proxy, its admin API and the restore; the PySpark jobs
come with the `tier` and `iceberg` extras; the developer tools (`tierproxy.dev`: the Kafka distribution, the demo)
stay in the checkout. Here the job dependencies are made unimportable in the process (a `sitecustomize` on
PYTHONPATH refuses them, as a venv without them would): `serve` still serves the tier's history and its admin
API answers; `tier` and `iceberg` say in one line which extra to install (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.kafka import broker_forgets, create_topic, small_segment_producer, small_segments
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tests.support.waiting import wait_until
from tierproxy.cli import EXTRAS
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

JOB_MODULES = sorted({m.split(".")[0] for _, modules in EXTRAS.values() for m in modules} | {"py4j", "duckdb"})
BLOCKER = '''\
import os, sys
_BLOCKED = {blocked!r}
_LOG = os.environ["BLOCKED_IMPORTS_LOG"]
open(_LOG, "a").write("loaded\\n")
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED or name == "tierproxy.dev" or name.startswith("tierproxy.dev."):
            open(_LOG, "a").write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Refuse())
'''


def _without_job_dependencies(tmp: Path) -> dict[str, str]:
    """The environment of a process in which the job dependencies cannot be imported."""
    site = tmp / "no-jobs"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=JOB_MODULES))
    return {"PYTHONPATH": str(site), "BLOCKED_IMPORTS_LOG": str(tmp / "blocked-imports.log")}


@pytest.mark.parametrize(("command", "says"), [
    (["tier", "--once", "--bootstrap-server", "127.0.0.1:1"], "pip install 'kafka-tierproxy[tier]'"),
    (["iceberg", "metadata-location", "--bootstrap-server", "127.0.0.1:1"], "pip install 'kafka-tierproxy[iceberg]'"),
    (["demo", "--duration", "-1"], "runs from a source checkout (make demo)"),  # tierproxy.dev is not in the wheel
])
def test_a_command_without_its_extra_names_it(tmp_path: Path, command: list[str], says: str) -> None:
    env = {**os.environ, **_without_job_dependencies(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "tierproxy.cli", *command], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_serve_without_the_job_dependencies_serves_the_tiers_history(kafka: KafkaCluster, tmp_path: Path,
                                                                     topic_name: str, kcat: str) -> None:
    create_topic(kafka.bootstrap, topic_name, config=small_segments())
    prod = small_segment_producer(kafka.bootstrap)
    for i in range(600):
        prod.produce(topic_name, f"record-{i}".encode())
    assert prod.flush(30) == 0
    s = settings(kafka.bootstrap, tmp_path, topic_name)
    assert tier_once(s).segments > 0  # the tier job, in this process (with its extra)
    log_start = broker_forgets(kafka.bootstrap, topic_name, above=300)
    admin = f"127.0.0.1:{free_port()}"
    p = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": s.storage, "TIERPROXY_METADATA": str(s.metadata), "TIERPROXY_ADMIN_LISTEN": admin,
        **_without_job_dependencies(tmp_path)})
    try:
        def topics() -> list[dict[str, object]] | None:
            got = httpx.get(f"http://{admin}/v1/topics", timeout=5).json()
            return got if any(t["topic"] == topic_name for t in got) else None

        wait_until(topics, "the admin API listing the tiered topic")
        out = subprocess.run([kcat, "-b", p.bootstrap, "-C", "-t", topic_name, "-o", "beginning", "-c", "600",
                              "-q", "-f", "%o %s\\n"], capture_output=True, text=True, timeout=120)
        assert out.stdout.splitlines() == [f"{i} record-{i}" for i in range(600)], out.stderr[-1000:]
        assert log_start > 300, "the first half came from the tier"
    finally:
        p.stop()
    attempts = (tmp_path / "blocked-imports.log").read_text().split()
    assert "loaded" in attempts, "the proxy ran without the job dependencies"
    assert [a for a in attempts if a != "loaded"] == [], "serve never reaches for a job dependency"


def test_a_proxy_without_an_admin_listener_imports_neither_fastapi_nor_httpx() -> None:
    """What `serve` imports before it serves: FastAPI and its models (~0.4 s) come only with `admin.listen`, httpx
    only when an OAuth token endpoint is asked (each proxy of a fleet, each restart, starts sooner)."""
    code = ("import sys, tierproxy.cli, tierproxy.config, tierproxy.proxy.server, tierproxy.remote.allocator; "
            "print(' '.join(m for m in ('fastapi', 'httpx', 'uvicorn', 'starlette') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []
