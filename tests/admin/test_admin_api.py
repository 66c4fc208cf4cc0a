"""The admin API against a running proxy with the real broker and a tiered topic: every endpoint, the 404s, the
token, metrics that move when a remote read happens, `tier-now`, and schemathesis finding no 5xx."""

from __future__ import annotations

import itertools
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.remote.conftest import TieredTopic, make_tiered_topic
from tests.support.base_install import one_line, refused_imports, run_base
from tests.support.kafka import create_topic
from tests.support.proxy import ProxyProcess
from tests.support.waiting import wait_until
from tierproxy.admin.guard import COOKIE, session_value
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
TOKEN = "s3cr3t-admin-token"


@pytest.fixture(scope="module")
def admin(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TieredTopic, ProxyProcess,
                                                                                             str]]:
    tmp = tmp_path_factory.mktemp("admin")
    tt = make_tiered_topic(kafka, tmp, "admin-tiered", partitions=2, n=2000)
    port = free_port()
    proxy = ProxyProcess(kafka.bootstrap, tmp, extra={
        "TIERPROXY_STORAGE": f"file://{tmp}/tier", "TIERPROXY_METADATA": f"file://{tmp}/meta",
        "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{port}", "TIERPROXY_ADMIN_TOKEN": TOKEN})
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(url + "/readyz", timeout=5).status_code == 200, "the admin API's readyz")
    yield tt, proxy, url
    proxy.stop()


def _c(url: str, token: str | None = TOKEN) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"} if token else {})


def test_health_needs_no_token_everything_else_does(admin: tuple[TieredTopic, ProxyProcess, str]) -> None:
    _, _, url = admin
    with _c(url, None) as anon, _c(url, "wrong") as wrong, _c(url) as ok:
        assert anon.get("/healthz").json() == {"status": "ok"}
        assert anon.get("/readyz").status_code == 200
        for path in ("/v1/topics", "/metrics", "/v1/config", "/v1/remote-fetch"):
            assert anon.get(path).status_code == 401
            assert wrong.get(path).status_code == 401
            assert ok.get(path).status_code == 200
        assert anon.get("/v1/topics").json()["error"]


def test_topics_partitions_segments_and_404s(admin: tuple[TieredTopic, ProxyProcess, str]) -> None:
    tt, _, url = admin
    with _c(url) as c:
        topics = {t["topic"]: t for t in c.get("/v1/topics").json()}
        assert topics[tt.topic]["partitions"] == 2 and topics[tt.topic]["tiered_segments"] > 0
        parts = c.get(f"/v1/topics/{tt.topic}/partitions").json()
        assert [p["partition"] for p in parts] == [0, 1]
        for p in parts:
            assert p["tier_start"] == 0 and p["broker_log_start"] > 0 and p["segments"] > 0
            assert p["high_watermark"] == len(tt.produced[p["partition"]]) and p["gap"] is None
        segs = c.get(f"/v1/topics/{tt.topic}/partitions/0/segments").json()
        assert segs[0]["start_offset"] == 0 and all(s["state"] == "COPY_SEGMENT_FINISHED" for s in segs)
        assert all(b["start_offset"] == a["end_offset"] + 1 for a, b in itertools.pairwise(segs))
        for path in ("/v1/topics/no-such-topic/partitions", f"/v1/topics/{tt.topic}/partitions/7/segments",
                     "/v1/topics/no-such-topic/partitions/0/segments", "/v1/tiering/runs/nope"):
            r = c.get(path)
            assert r.status_code == 404 and "error" in r.json()
        cfg = c.get("/v1/config").json()
        assert cfg["admin_token"] == "***" and TOKEN not in str(cfg)
        rf = c.get("/v1/remote-fetch").json()
        assert rf["enabled"] and rf["ready"] and rf["pool_threads"] == 10


def _metric(text: str, name: str, topic: str) -> float:
    m = re.search(rf'^{name}{{topic="{re.escape(topic)}"}} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_metrics_move_when_a_remote_read_happens(admin: tuple[TieredTopic, ProxyProcess, str], kcat: str) -> None:
    tt, proxy, url = admin
    with _c(url) as c:
        before = c.get("/metrics").text
        subprocess.run([kcat, "-b", proxy.bootstrap, "-C", "-t", tt.topic, "-p", "0", "-o", "beginning", "-c", "50",
                        "-q"], check=True, capture_output=True, timeout=60)
        after = c.get("/metrics").text
    for name in ("tierproxy_remote_fetch_requests_total", "tierproxy_remote_fetch_bytes_total"):
        assert _metric(after, name, tt.topic) > _metric(before, name, tt.topic), name
    assert re.search(r'^tierproxy_fetch_latency_seconds_count\{path="remote"\} [1-9]', after, re.M)
    assert "tierproxy_client_connections" in after and "tierproxy_tier_segments" in after


def test_admin_cli_status_partitions_and_tier_now(admin: tuple[TieredTopic, ProxyProcess, str]) -> None:
    tt, _, url = admin
    env = {**os.environ, "TIERPROXY_ADMIN_URL": url, "TIERPROXY_ADMIN_TOKEN": TOKEN, "COLUMNS": "200"}
    base = [sys.executable, "-m", "tierproxy.cli", "admin"]
    status = subprocess.run([*base, "status"], capture_output=True, text=True, env=env, timeout=60)
    assert status.returncode == 0 and tt.topic in status.stdout, status.stderr
    parts = subprocess.run([*base, "partitions", tt.topic], capture_output=True, text=True, env=env, timeout=60)
    assert parts.returncode == 0 and "tier start" in parts.stdout
    segs = subprocess.run([*base, "segments", tt.topic, "0"], capture_output=True, text=True, env=env, timeout=60)
    assert segs.returncode == 0 and "COPY_SEGMENT_FINISHED" in segs.stdout
    missing = subprocess.run([*base, "partitions", "no-such-topic"], capture_output=True, text=True, env=env,
                             timeout=60)
    assert missing.returncode != 0 and "404" in missing.stderr


def test_admin_status_of_the_base_install_piped_leaves_internal_topics_out(
        admin: tuple[TieredTopic, ProxyProcess, str], kafka: KafkaCluster, tmp_path: Path) -> None:
    """`admin status` as the base install runs it, its output piped: each table at its full width (rich cut it to
    80 columns), internal topics (never tiered) only with --internal, a refused token one line (exit 1)."""
    tt, _, url = admin
    internal = "__tierproxy_admin_internal_probe"  # a `__*` topic, as tierproxy's metadata topic is
    create_topic(kafka.bootstrap, internal)
    env = {"TIERPROXY_ADMIN_URL": url, "COLUMNS": ""}
    with _c(url) as c:
        listed = [t["topic"] for t in c.get("/v1/topics").json()]
        assert tt.topic in listed and not [t for t in listed if t.startswith("__")], listed
        assert internal in [t["topic"] for t in c.get("/v1/topics", params={"internal": "true"}).json()]
    status = run_base(tmp_path, "admin", "--token", TOKEN, "status", env=env)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    header = next(line for line in lines if " topic " in line)
    assert "tier retention.bytes" in header and "restored from" in header, status.stdout  # one header line
    row = next(line for line in lines if f" {tt.topic} " in line)
    assert len(row) == len(header) > 80 and "__" not in status.stdout, status.stdout
    everything = run_base(tmp_path, "admin", "--token", TOKEN, "status", "--internal", env=env)
    assert everything.returncode == 0 and f" {internal} " in everything.stdout, everything.stderr
    line = one_line(run_base(tmp_path, "admin", "--token", "not-the-token", "status", env=env), 1)
    assert line.startswith("tierproxy: admin: /v1/remote-fetch: HTTP 401") and "not-the-token" not in line, line
    assert refused_imports(tmp_path) == []


def test_tier_now_is_picked_up_by_the_running_tier_job(admin: tuple[TieredTopic, ProxyProcess, str],
                                                       kafka: KafkaCluster) -> None:
    """`admin tier-now` asks the running `tier` job (its own configuration, its writer fence kept) for a pass
    through the metadata; the job runs it at once, though its interval is an hour, and the run turns succeeded.
    Before: the proxy started a second `tier --once` without the job's properties file, which fenced the job."""
    tt, _, url = admin
    with _c(url) as c:  # a request abandoned before the job starts: it expires, and the job never runs it
        stale = c.post("/v1/tiering/run", params={"wait_ms": 1000}).json()["run_id"]
        wait_until(lambda: c.get(f"/v1/tiering/runs/{stale}").json()["status"] == "expired", "the request expired")
    out = tt.tmp / "tier-job.out"
    with out.open("w") as sink:
        job = subprocess.Popen([sys.executable, "-m", "tierproxy.cli", "tier", "--no-progress", "--interval", "1h",
                                "--bootstrap-server", kafka.bootstrap, "--storage", f"file://{tt.tmp}/tier",
                                "--metadata", f"file://{tt.tmp}/meta", "--topics", re.escape(tt.topic)],
                               stdout=sink, stderr=subprocess.STDOUT, cwd=tt.tmp,
                               env={**os.environ, "TIERPROXY_TIER_STATE_DIR": str(tt.tmp / "state-job"),
                                    "TIERPROXY_SPARK_MASTER": "local[1]"})

    def passes() -> int:  # the job's summary lines, one a pass (its log line "run ...: tiered ..." is not one)
        return len(re.findall(r"^tiered ", out.read_text(), re.M))

    try:
        wait_until(lambda: passes() >= 1, "the tier job's first pass", timeout=180)
        with _c(url) as c:
            assert c.get(f"/v1/tiering/runs/{stale}").json()["status"] == "expired"
        env = {**os.environ, "TIERPROXY_ADMIN_URL": url, "TIERPROXY_ADMIN_TOKEN": TOKEN, "COLUMNS": "200"}
        run = subprocess.run([sys.executable, "-m", "tierproxy.cli", "admin", "tier-now", "--timeout", "120"],
                             capture_output=True, text=True, env=env, timeout=180)
        assert run.returncode == 0 and "succeeded" in run.stdout, run.stdout + run.stderr + out.read_text()[-3000:]
        # a second pass, the job still running; the job records a pass's outcome (what tier-now waits for) before it
        # prints the pass's summary line
        wait_until(lambda: passes() >= 2, "the second pass's summary line", timeout=30)
        assert job.poll() is None
    finally:
        job.terminate()
        job.wait(60)


def test_tier_now_with_no_tier_job_gives_up_withdraws_and_blocks_nothing(admin: tuple[TieredTopic, ProxyProcess,
                                                                                         str]) -> None:
    """Issue 64: with no `tierproxy tier` running, `admin tier-now` spun for ever and left a request pending that
    made every later `tier-now` and POST /v1/tiering/run answer 409. Now it gives up after `--wait` with one line
    and withdraws its request; a request abandoned by its asker (never withdrawn) expires."""
    _, _, url = admin
    env = {**os.environ, "TIERPROXY_ADMIN_URL": url, "TIERPROXY_ADMIN_TOKEN": TOKEN, "COLUMNS": "200"}
    with _c(url) as c:
        for _ in range(2):  # twice: the first withdrawn request does not block the second
            began = time.monotonic()
            run = subprocess.run([sys.executable, "-m", "tierproxy.cli", "admin", "tier-now", "--wait", "2s"],
                                 capture_output=True, text=True, env=env, timeout=120)
            assert run.returncode == 1 and time.monotonic() - began < 60, run.stdout + run.stderr
            assert run.stderr.splitlines() == ["tierproxy: admin: no tier job took the request in 2 s: is "
                                               "`tierproxy tier` running against this metadata?"], run.stderr
            run_id = re.findall(r"tiering run (\w+)", run.stdout)[-1]
            assert c.get(f"/v1/tiering/runs/{run_id}").json()["status"] == "withdrawn"
        abandoned = c.post("/v1/tiering/run", params={"wait_ms": 60_000})  # at once: the withdrawn one blocks nothing
        assert abandoned.status_code == 202, abandoned.text
        assert c.post("/v1/tiering/run").status_code == 409  # a live request still comes one at a time
        withdrawn = c.delete(f"/v1/tiering/runs/{abandoned.json()['run_id']}")
        assert withdrawn.status_code == 200 and withdrawn.json()["status"] == "withdrawn"
        short = c.post("/v1/tiering/run", params={"wait_ms": 1000})  # left behind by an asker that was killed
        assert short.status_code == 202
        wait_until(lambda: c.get(f"/v1/tiering/runs/{short.json()['run_id']}").json()["status"] == "expired",
                   "the abandoned request expired", timeout=30)
        later = c.post("/v1/tiering/run")
        assert later.status_code == 202, later.text
        assert c.delete(f"/v1/tiering/runs/{later.json()['run_id']}").json()["status"] == "withdrawn"


def test_tier_now_stopped_by_ctrl_c_withdraws_its_request(admin: tuple[TieredTopic, ProxyProcess, str],
                                                          tmp_path: Path) -> None:
    """Ctrl-C while `tier-now` waits for a job: one line, exit 130, and its request withdrawn (not left to block
    every later request until it expires)."""
    _, _, url = admin
    out = tmp_path / "tier-now.out"
    env = {**os.environ, "TIERPROXY_ADMIN_URL": url, "TIERPROXY_ADMIN_TOKEN": TOKEN, "FORCE_COLOR": "1"}
    with out.open("w") as sink:  # FORCE_COLOR: the spinner (and its run id) drawn as it goes, as on a terminal
        asker = subprocess.Popen([sys.executable, "-m", "tierproxy.cli", "admin", "tier-now", "--wait", "10m"],
                                 stdout=sink, stderr=subprocess.PIPE, text=True, env=env)
    try:
        run_id = wait_until(lambda: re.findall(r"tiering run (\w+)", out.read_text()), "tier-now's request")[0]
        with _c(url) as c:
            assert c.get(f"/v1/tiering/runs/{run_id}").json()["status"] == "requested"
            asker.send_signal(signal.SIGINT)
            _, err = asker.communicate(timeout=60)
            assert asker.returncode == 130 and err.splitlines() == ["tierproxy: stopped by a signal"], err
            assert c.get(f"/v1/tiering/runs/{run_id}").json()["status"] == "withdrawn"
            later = c.post("/v1/tiering/run")
            assert later.status_code == 202, later.text
            assert c.delete(f"/v1/tiering/runs/{later.json()['run_id']}").json()["status"] == "withdrawn"
    finally:
        if asker.poll() is None:
            asker.kill()
            asker.wait(10)


def test_the_cookie_reads_but_never_changes_and_bodies_are_bounded(admin: tuple[TieredTopic, ProxyProcess, str]
                                                                   ) -> None:
    _, proxy, url = admin
    with httpx.Client(base_url=url, timeout=30) as browser, _c(url) as bearer:
        login = browser.post("/ui/login", data={"token": TOKEN}, follow_redirects=False)
        assert login.status_code == 303
        cookie = browser.cookies.get(COOKIE)
        assert cookie == session_value(TOKEN) and TOKEN not in cookie  # derived, never the token itself
        assert browser.get("/v1/topics").status_code == 200  # the status page's reads
        refused = browser.post("/v1/tiering/run")
        assert refused.status_code == 401 and "bearer" in refused.json()["error"]
        asked = bearer.post("/v1/tiering/run")  # no tier job runs now: it stays pending
        assert asked.status_code == 202 and asked.json()["status"] == "requested", asked.text
        again = bearer.post("/v1/tiering/run")
        assert again.status_code == 409 and asked.json()["run_id"] in again.json()["error"]
        assert bearer.get(f"/v1/tiering/runs/{asked.json()['run_id']}").json()["status"] == "requested"
        assert browser.delete(f"/v1/tiering/runs/{asked.json()['run_id']}").status_code == 401
        assert bearer.delete(f"/v1/tiering/runs/{asked.json()['run_id']}").json()["status"] == "withdrawn"

    rss = _rss_kib(proxy)
    for chunked in (False, True):
        status = _huge_login_post(url, chunked)
        assert status == 413, chunked
    assert _rss_kib(proxy) - rss < 16 << 10  # 1 GiB offered twice, never held
    with _c(url) as c:
        assert c.get("/v1/topics").status_code == 200  # still serving


def _rss_kib(proxy: ProxyProcess) -> int:
    status = Path(f"/proc/{proxy.proc.pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


def _huge_login_post(url: str, chunked: bool) -> int:
    """POST /ui/login offering 1 GiB (declared, or chunked), sent until the server answers; its status code."""
    host, port = url.removeprefix("http://").split(":")
    head = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {1 << 30}"
    chunk = b"token=" + b"x" * ((1 << 20) - 6)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /ui/login HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded"
                     f"\r\n{head}\r\n\r\n".encode())
        for _ in range(1024):  # at most the whole 1 GiB
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        answer = sock.recv(4096).decode(errors="replace")
    return int(answer.split()[1])


def test_config_hides_a_password_inside_a_catalog_url(kafka: KafkaCluster, tmp_path: Path) -> None:
    secret = "pw-in-the-url-7f3"
    port = free_port()
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
        "TIERPROXY_STORAGE": f"file://{tmp_path}/tier", "TIERPROXY_METADATA": f"file://{tmp_path}/meta",
        "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{port}",
        "TIERPROXY_ICEBERG_CATALOG": f"postgresql+psycopg2://tierproxy:{secret}@127.0.0.1:1/catalog"})
    try:
        url = f"http://127.0.0.1:{port}"
        shown = wait_until(lambda: httpx.get(url + "/v1/config", timeout=5).text, "the admin API", timeout=30)
        assert "tierproxy:***@127.0.0.1:1/catalog" in shown and secret not in shown
        iceberg = httpx.get(url + "/v1/iceberg", timeout=30)
        assert secret not in iceberg.text
    finally:
        proxy.stop()
    assert secret not in proxy.log_text()


def test_schemathesis_finds_no_server_errors(admin: tuple[TieredTopic, ProxyProcess, str], tmp_path: Path) -> None:
    _, _, url = admin
    out = subprocess.run([sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json", "--checks",
                          "not_a_server_error", "-H", f"Authorization: Bearer {TOKEN}", "--max-examples", "25",
                          "--exclude-path", "/v1/tiering/run"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    # 13 operations: DELETE /v1/tiering/runs/{id} among them (a generated id is never the latest request: 404)
    assert "Tested: 13" in out.stdout and re.search(r"\d+ generated, \d+ passed", out.stdout)
