"""The status page `/ui` in a real browser (headless Chromium from Debian's package) against a proxy serving a tiered
topic with a purge and a gap: the page loads without a console message, shows each partition's numbers as
`/v1/topics/{t}/partitions` gives them, refreshes remote fetch activity live, and keeps a screenshot."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from tests.support.kafka import create_topic, delete_records, watermarks
from tests.support.parts import unavailable
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once, tiered
from tests.support.waiting import proxy_serves_tier, wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("TIERPROXY_ARTIFACTS", ROOT / ".pytest-artifacts"))


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        unavailable("Chromium", "no chromium binary (Debian package chromium; make install installs it)")
    return found


def browse(url: str, *extra: str) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran (a few seconds of virtual time), and the console messages."""
    out = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--v=0", "--virtual-time-budget=5000", *extra, url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, [line for line in out.stderr.splitlines() if ":CONSOLE" in line]


class Rows(HTMLParser):
    """data-field cells of each partition row, per data-topic section."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, dict[int, dict[str, str]]] = {}
        self.topic: str | None = None
        self.partition: int | None = None
        self.field: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section" and a.get("data-topic"):
            self.topic = a["data-topic"]
        elif tag == "tr" and a.get("data-partition") is not None and self.topic is not None:
            self.partition = int(a["data-partition"] or 0)
            self.rows.setdefault(self.topic, {})[self.partition] = {}
        elif tag == "td" and a.get("data-field") and self.partition is not None:
            self.field = a["data-field"]

    def handle_data(self, data: str) -> None:
        if self.field is not None and self.topic is not None and self.partition is not None:
            row = self.rows[self.topic][self.partition]
            row[self.field] = row.get(self.field, "") + data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self.field = None


def _shown(value: Any) -> str:
    return "-" if value is None else str(value)


def test_the_status_page_in_chromium(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.size": 16384})
    for _i in range(3000):
        p.produce(topic_name, os.urandom(200))
    p.flush(30)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=64 * 1024)
    assert tier_once(s).segments >= 4
    tier_end = tiered(s, topic_name)[0][-1].end_offset
    admin = f"127.0.0.1:{free_port()}"
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, {"TIERPROXY_STORAGE": s.storage, "TIERPROXY_METADATA":
                                                     str(s.metadata), "TIERPROXY_ADMIN_LISTEN": admin})
    try:
        wait_until(lambda: proxy_serves_tier(proxy.bootstrap, topic_name), "the proxy's tier", timeout=60)
        assert delete_records(proxy.bootstrap, topic_name, {0: 400}) == {0: (0, 400)}  # a purge, recorded
        for _i in range(1000):
            p.produce(topic_name, os.urandom(200))
        p.flush(30)
        hw = watermarks(kafka.bootstrap, topic_name)[1]
        gap_end = tier_end + 300  # the broker forgets beyond the tier: a gap
        assert delete_records(kafka.bootstrap, topic_name, {0: gap_end}) == {0: (0, gap_end)}
        url = f"http://{admin}/v1/topics/{topic_name}/partitions"
        api = wait_until(lambda: (got := httpx.get(url, timeout=30).json())[0]["gap"] and got,
                         "the proxy to see the broker's new log start")  # its offsets are cached for a second
        assert api[0]["purged_below"] == 400 and api[0]["gap"] == [tier_end + 1, gap_end - 1]
        assert api[0]["high_watermark"] == hw

        dom, console = browse(f"http://{admin}/ui", "--dump-dom")
        assert console == []
        rows = Rows()
        rows.feed(dom)
        shown = rows.rows[topic_name]
        assert set(shown) == {q["partition"] for q in api}
        for q in api:
            row = shown[q["partition"]]
            for field, text in row.items():
                if field == "gap":
                    assert text == (f"{q['gap'][0]}..{q['gap'][1]}" if q["gap"] else "")
                elif field == "holes":
                    assert text == " ".join(f"{a}..{b - 1}" for a, b in q["holes"])
                else:
                    assert text == _shown(q[field]), (field, text, q[field])
        assert 'id="rf-req-rate">' in dom and 'id="rf-req-rate">-<' not in dom  # the live figures refreshed

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "status-page.png"
        shot.unlink(missing_ok=True)
        _, console = browse(f"http://{admin}/ui", f"--screenshot={shot}", "--window-size=1500,700",
                            "--hide-scrollbars")
        assert console == [] and shot.stat().st_size > 10_000
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        proxy.stop()


def test_the_status_page_keeps_the_admin_token(kafka: KafkaCluster, tmp_path: Path) -> None:
    admin = f"127.0.0.1:{free_port()}"
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, {"TIERPROXY_ADMIN_LISTEN": admin,
                                                     "TIERPROXY_ADMIN_TOKEN": "ui-secret-31"})
    try:
        base = f"http://{admin}"
        wait_until(lambda: httpx.get(base + "/healthz", timeout=5).status_code == 200, "the admin API")
        refused = httpx.get(base + "/ui", timeout=30)
        assert refused.status_code == 401 and 'name="token"' in refused.text and "ui-secret-31" not in refused.text
        assert httpx.post(base + "/ui/login", content="token=wrong", timeout=30).status_code == 401
        with httpx.Client(base_url=base, timeout=30) as c:
            login = c.post("/ui/login", content="token=ui-secret-31",
                           headers={"content-type": "application/x-www-form-urlencoded"})
            assert login.status_code == 303 and "httponly" in login.headers["set-cookie"].lower()
            page = c.get("/ui")
            assert page.status_code == 200 and "Remote fetch" in page.text
            assert c.get("/v1/remote-fetch").status_code == 200  # the page's own polls
        assert httpx.get(base + "/v1/remote-fetch", timeout=30).status_code == 401
    finally:
        proxy.stop()
