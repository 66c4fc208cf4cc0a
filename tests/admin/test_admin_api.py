"""The admin API against a running proxy with the real broker and a tiered topic: every endpoint, the 404s, the
token, metrics that move when a remote read happens, `tier-now`, and schemathesis finding no 5xx."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.realparts import ProxyProcess
from tests.remote.conftest import TieredTopic, make_tiered_topic
from tests.waiting import wait_until
from tierproxy.kafkadist import KafkaCluster, free_port

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
    run = subprocess.run([*base, "tier-now"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0 and "succeeded" in run.stdout, run.stdout + run.stderr
    missing = subprocess.run([*base, "partitions", "no-such-topic"], capture_output=True, text=True, env=env,
                             timeout=60)
    assert missing.returncode != 0 and "404" in missing.stderr


def test_schemathesis_finds_no_server_errors(admin: tuple[TieredTopic, ProxyProcess, str], tmp_path: Path) -> None:
    _, _, url = admin
    out = subprocess.run([sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json", "--checks",
                          "not_a_server_error", "-H", f"Authorization: Bearer {TOKEN}", "--max-examples", "25",
                          "--exclude-path", "/v1/tiering/run"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Tested: 12" in out.stdout and re.search(r"\d+ generated, \d+ passed", out.stdout)
