"""Packages by role: `pip install kafka-tierproxy` is the proxy, its admin API and the restore; the PySpark jobs
come with the `tier` and `iceberg` extras; the developer tools (`tierproxy.dev`: the Kafka distribution, the demo)
stay in the checkout. Here the job dependencies are made unimportable in the process
(`tests.support.base_install`, as a venv without them would): `serve` still serves the tier's history and its
admin API answers; every command of the base install helps, and fails in one line with its documented exit code
(docs/operations.md), without reaching for a job dependency; `tier` and `iceberg` say in one line which extra to
install (exit 2)."""

from __future__ import annotations

import http.server
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.base_install import one_line, refused_imports, run_base, without_job_dependencies
from tests.support.certs import make_certs
from tests.support.kafka import broker_forgets, create_topic, small_segment_producer, small_segments
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port


@pytest.mark.parametrize(("command", "says"), [
    (["tier", "--once", "--bootstrap-server", "127.0.0.1:1"], "pip install 'kafka-tierproxy[tier]'"),
    (["iceberg", "metadata-location", "--bootstrap-server", "127.0.0.1:1"], "pip install 'kafka-tierproxy[iceberg]'"),
    (["demo", "--duration", "-1"], "runs from a source checkout (make demo)"),  # tierproxy.dev is not in the wheel
])
def test_a_command_without_its_extra_names_it(tmp_path: Path, command: list[str], says: str) -> None:
    assert says in one_line(run_base(tmp_path, *command), 2)


# admin's subcommands share one parser module: `admin status --help` stands for them
BASE_COMMANDS = [["--help"], ["serve", "--help"], ["restore", "--help"], ["admin", "--help"],
                 ["admin", "status", "--help"]]


@pytest.mark.process
@pytest.mark.parametrize("command", BASE_COMMANDS, ids=" ".join)
def test_each_base_command_helps_without_the_job_dependencies(tmp_path: Path, command: list[str]) -> None:
    out = run_base(tmp_path, *command)
    assert out.returncode == 0 and out.stdout.startswith("usage: tierproxy") and out.stderr == "", out.stderr
    assert refused_imports(tmp_path) == []


def _restore_case(tmp: Path, case: str) -> tuple[list[str], int, str]:
    """A `restore` that fails: its arguments, its exit code and what its one line says."""
    tier, down = f"file://{tmp}/tier", f"127.0.0.1:{free_port()}"  # a port of this worker's share no one serves
    if case == "unreachable broker":
        return ["--bootstrap-server", down, "--storage", tier], 6, f"the brokers at {down} cannot be reached"
    if case == "bad bootstrap.servers":
        return ["--bootstrap-server", "brokers", "--storage", tier], 2, "bootstrap.servers must be HOST:PORT"
    if case == "unknown key":
        (tmp / "restore.properties").write_text(f"bootstrap.servers={down}\nstorage={tier}\nbootstrap.server=x\n")
        return ["-c", str(tmp / "restore.properties")], 2, "did you mean bootstrap.servers?"
    assert case == "unsupported storage"
    return ["--bootstrap-server", down, "--storage", "ftp://nas/tier"], 2, "storage: 'ftp://nas/tier' is not"


@pytest.mark.process
@pytest.mark.parametrize("case", ["unreachable broker", "bad bootstrap.servers", "unknown key", "unsupported storage"])
def test_restore_without_the_job_dependencies_fails_in_one_line(tmp_path: Path, case: str) -> None:
    """Before: an unreachable broker was a 40-line traceback (exit 1): the error handler imported the Iceberg job
    (numpy). Refused authentication and TLS: tests/secured/test_base_install.py."""
    args, code, says = _restore_case(tmp_path, case)
    line = one_line(run_base(tmp_path, "restore", *args), code)
    assert line.startswith("tierproxy: ") and says in line, line
    assert refused_imports(tmp_path) == []


@pytest.fixture
def untrusted_https(tmp_path: Path) -> Iterator[str]:
    """An https server whose certificate chains to a CA no client trusts (a TLS ingress in front of the admin API
    with a private CA, say)."""
    certs = make_certs(tmp_path / "certs")
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.cert, certs.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.process
def test_admin_without_the_job_dependencies_fails_in_one_line(tmp_path: Path, untrusted_https: str) -> None:
    """No admin API at the URL (6), TLS toward it refused (6), a URL that is not one (2: was exit 6 as "no admin
    API answers"). A refused token: tests/admin/test_admin_api.py."""
    down = f"http://127.0.0.1:{free_port()}"
    line = one_line(run_base(tmp_path, "admin", "--url", down, "status"), 6)
    assert line.startswith(f"tierproxy: admin: no admin API answers at {down}"), line
    line = one_line(run_base(tmp_path, "admin", "--url", untrusted_https, "status"), 6)
    assert line.startswith(f"tierproxy: admin: TLS toward {untrusted_https} failed: CERTIFICATE_VERIFY_FAILED"), line
    line = one_line(run_base(tmp_path, "admin", "--url", "127.0.0.1:9180", "partitions", "t"), 2)
    assert line.startswith("tierproxy: config error: --url (TIERPROXY_ADMIN_URL) '127.0.0.1:9180'"), line
    assert refused_imports(tmp_path) == []


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
        **without_job_dependencies(tmp_path)})
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
    assert refused_imports(tmp_path) == [], "serve never reaches for a job dependency"


def test_a_proxy_without_an_admin_listener_imports_neither_fastapi_nor_httpx() -> None:
    """What `serve` imports before it serves: FastAPI and its models (~0.4 s) come only with `admin.listen`, httpx
    only when an OAuth token endpoint is asked (each proxy of a fleet, each restart, starts sooner)."""
    code = ("import sys, tierproxy.cli, tierproxy.config, tierproxy.proxy.server, tierproxy.remote.allocator; "
            "print(' '.join(m for m in ('fastapi', 'httpx', 'uvicorn', 'starlette') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == []
