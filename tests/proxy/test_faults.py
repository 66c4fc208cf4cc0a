"""Faults and limits: malformed frames, max connections, idle timeout, SIGTERM drain, broker restart,
config errors, backpressure."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from protocol import registry
from protocol.connection import ClientConnection
from protocol.constants import ApiKey
from protocol.headers import RequestHeader, request_header_version
from protocol.requests import fetch_request
from tests.support.kafka import create_topic
from tests.support.parts import free_port_block
from tests.support.proxy import ProxyProcess
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port
from tierproxy.kafka.wireclient import WireClient

pytestmark = pytest.mark.kafka


def test_malformed_frame_closes_only_that_connection(proxy: ProxyProcess) -> None:
    good = WireClient(proxy.bootstrap)
    bad = socket.create_connection(("127.0.0.1", proxy.port))
    # a frame whose header claims ApiVersions v3 but whose client id length runs past the frame
    bad.sendall(struct.pack(">ihhih", 10, 18, 3, 1, 200) + b"xx")
    bad.settimeout(10)
    assert bad.recv(100) == b""  # closed by the proxy
    bad.close()
    resp = good.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert resp["error_code"] == 0
    good.close()
    wait_until(lambda: "malformed request, closing the connection" in proxy.log_text(), "log line", timeout=15)
    assert proxy.proc.poll() is None


def test_oversized_frame_is_rejected_before_buffering(proxy: ProxyProcess) -> None:
    s = socket.create_connection(("127.0.0.1", proxy.port))
    s.sendall(struct.pack(">i", 2**31 - 1))
    s.settimeout(10)
    assert s.recv(100) == b""
    s.close()
    assert proxy.proc.poll() is None


def test_api_versions_capped_to_the_codec(proxy: ProxyProcess, kafka: KafkaCluster) -> None:
    with WireClient(kafka.bootstrap) as direct, WireClient(proxy.bootstrap) as via:
        body = {"client_software_name": "t", "client_software_version": "1"}
        broker = {k["api_key"]: (k["min_version"], k["max_version"]) for k in direct.request(18, 3, body)["api_keys"]}
        proxied = {k["api_key"]: (k["min_version"], k["max_version"]) for k in via.request(18, 3, body)["api_keys"]}
    for key, (lo, hi) in broker.items():
        if key in registry.SUPPORTED and key != 0:
            s = registry.SUPPORTED[key]
            assert proxied[key] == (max(lo, s.min_version), min(hi, s.max_version))
        elif key != 0:
            assert proxied[key] == (lo, hi)  # not intercepted: as the broker says


def test_api_versions_beyond_the_codec_answered_like_a_broker(proxy: ProxyProcess) -> None:
    s = socket.create_connection(("127.0.0.1", proxy.port))
    header = RequestHeader(18, 99, 5, "t", request_header_version(18, 99), 0)
    frame = header.encode() + b"\x01\x01\x00"
    s.sendall(struct.pack(">i", len(frame)) + frame)
    conn = ClientConnection()
    conn.expect_response(header)
    while (ev := conn.next_event()) is None:
        conn.receive_data(s.recv(4096))
    s.close()
    data = registry.SUPPORTED[18].response.decode(ev.frame, 0, ev.body_offset)
    assert data["error_code"] == 35 and data["api_keys"][0]["max_version"] == 4


def _proxy(kafka: KafkaCluster, tmp_path: Path, **env: str) -> ProxyProcess:
    return ProxyProcess(kafka.bootstrap, tmp_path, extra={f"TIERPROXY_{k.upper()}": v for k, v in env.items()})


def test_max_connections(kafka: KafkaCluster, tmp_path: Path) -> None:
    p = _proxy(kafka, tmp_path, max_connections="2")
    try:
        a, b = WireClient(p.bootstrap), WireClient(p.bootstrap)
        c = socket.create_connection(("127.0.0.1", p.port))
        c.settimeout(10)
        assert c.recv(10) == b""  # refused: closed at once
        assert a.request(18, 3, {"client_software_name": "a", "client_software_version": "1"})["error_code"] == 0
        a.close()
        wait_until(lambda: _can_request(p.bootstrap), "a slot after closing one", timeout=15)
        b.close()
        c.close()
        assert "max.connections 2 reached" in p.log_text()
    finally:
        p.stop()


def _can_request(bootstrap: str) -> bool:
    try:
        with WireClient(bootstrap, timeout=2) as w:
            return bool(w.request(18, 0, {})["error_code"] == 0)
    except OSError:
        return False


def test_idle_connections_are_closed(kafka: KafkaCluster, tmp_path: Path) -> None:
    p = _proxy(kafka, tmp_path, connections_max_idle_ms="300")
    try:
        start = time.monotonic()  # before the connection: the proxy's idle clock starts at or after it
        s = socket.create_connection(("127.0.0.1", p.port))
        s.settimeout(10)
        assert s.recv(10) == b""
        assert 0.25 < time.monotonic() - start < 8
        s.close()
        assert "connections.max.idle.ms" in p.log_text()
    finally:
        p.stop()


def test_sigterm_drains_in_flight_requests(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    p = _proxy(kafka, tmp_path, **_admin())
    try:
        # the admin API starts after the Kafka port opens (0.35-0.4 s here, more on a loaded machine): the Fetch is
        # sent once it answers, so the in-flight gauge is seen well within the broker's 1.5 s wait
        wait_until(lambda: p.metric("tierproxy_requests_in_flight") == 0, "the admin API", timeout=30)
        w = WireClient(f"127.0.0.1:{p.base + 1}")
        body = fetch_request({topic_name: {0: 0}}, max_bytes=1 << 20, max_wait_ms=1500, min_bytes=1)
        w.sock.sendall(b"".join(bytes(c) for c in w.client.send(ApiKey.FETCH, 12, body)))
        wait_until(lambda: p.metric("tierproxy_requests_in_flight") >= 1, "the Fetch read by the proxy", timeout=15)
        start = time.monotonic()
        p.proc.send_signal(signal.SIGTERM)
        while (ev := w.client.next_event()) is None:
            data = w.sock.recv(65536)
            assert data, "connection closed before the in-flight Fetch was answered"
            w.client.receive_data(data)
        assert ev.correlation_id == 1 and time.monotonic() - start > 0.5  # it waited for the broker's answer
        assert p.proc.wait(20) == 0
        w.close()
    finally:
        p.stop()


def test_broker_restart_clients_recover(tmp_path: Path, topic_name: str) -> None:
    cluster = KafkaCluster(1, workdir=tmp_path / "k").start()
    p = ProxyProcess(cluster.bootstrap, tmp_path)
    try:
        create_topic(cluster.bootstrap, topic_name)
        prod = Producer({"bootstrap.servers": p.bootstrap})
        for i in range(100):
            prod.produce(topic_name, f"before-{i}".encode())
        prod.flush(30)
        # a short session: a member the restarted coordinator still holds is dropped in seconds, not 45
        c = Consumer({"bootstrap.servers": p.bootstrap, "group.id": "restart", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
        c.subscribe([topic_name])
        got: list[str] = []
        deadline = time.monotonic() + 30
        while len(got) < 100 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value().decode())
        c.commit(asynchronous=False)  # a rebalance after the restart resumes the group here, not at earliest
        cluster.stop_node(1)
        wait_until(lambda: "closed the connection of client" in p.log_text(), "the proxy seeing the broker gone",
                   timeout=30)
        cluster.start_node(1)
        for i in range(100):
            prod.produce(topic_name, f"after-{i}".encode())
        assert prod.flush(60) == 0
        deadline = time.monotonic() + 120  # the group may rejoin once the coordinator is back (loaded CI: ~60 s)
        while len(got) < 200 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value().decode())
        c.close()
        assert got == [f"before-{i}" for i in range(100)] + [f"after-{i}" for i in range(100)]
        assert "closed the connection of client" in p.log_text()
    finally:
        p.stop()
        cluster.stop()


@pytest.mark.parametrize(("args", "env", "key"), [
    (["--listen", "nonsense"], {}, "listen"),
    ([], {"TIERPROXY_BROKER_PORT_RANGE": "many"}, "broker.port.range"),
    ([], {"TIERPROXY_SOCKET_REQUEST_MAX_BYTES": "10"}, "socket.request.max.bytes"),
    ([], {"TIERPROXY_SSL_CERTFILE": "/nonexistent.pem", "TIERPROXY_SSL_KEYFILE": "/nonexistent.key"}, "ssl.certfile"),
    ([], {"TIERPROXY_EVENT_LOOP": "trio"}, "event.loop"),
])
def test_bad_config_fails_at_start_naming_the_key(args: list[str], env: dict[str, str], key: str) -> None:
    cmd = [sys.executable, "-m", "tierproxy.cli", "serve", "--bootstrap-server", "127.0.0.1:1",
           "--listen", f"127.0.0.1:{free_port()}", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert out.returncode == 2
    assert "config error" in out.stderr and key in out.stderr


def test_unknown_key_in_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "tp.properties"
    cfg.write_text("bootstrap.servers=127.0.0.1:1\nremote.fetch.max.wiat.ms=10\n")
    out = subprocess.run([sys.executable, "-m", "tierproxy.cli", "serve", "--config", str(cfg)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "remote.fetch.max.wiat.ms: unknown config key" in out.stderr


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _settled_rss_mib(pid: int, timeout: float = 20) -> float:
    """The process's RSS once it stops moving (two readings 0.25 s apart within 1 MiB): it has taken what it
    is going to take of what it was sent."""
    last = _rss_mib(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _rss_mib(pid)
        if abs(now - last) < 1:
            return now
        last = now
    raise AssertionError(f"RSS still moving after {timeout} s ({last:.0f} MiB)")


def _admin(**env: str) -> dict[str, str]:
    return {**env, "admin_listen": f"127.0.0.1:{free_port_block(1)}"}  # below the ephemeral range: no client
    # socket can take it before the proxy binds it


def test_slow_client_pauses_the_broker_side(kafka: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    prod = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 50, "batch.size": 1 << 20})
    value = os.urandom(10_000)
    for _ in range(6000):  # 60 MB
        prod.produce(topic_name, value)
    prod.flush(60)
    p = _proxy(kafka, tmp_path, **_admin())
    try:
        s = socket.create_connection(("127.0.0.1", p.base + 1))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        base_rss = _rss_mib(p.proc.pid)
        requests = 40
        for cid in range(requests):  # 40 x 60 MB asked for, nothing read yet
            header = RequestHeader(1, 12, cid, "slow", 2, 0)
            body = fetch_request({topic_name: {0: 0}}, max_bytes=64 << 20, min_bytes=1)
            s.sendall(b"".join(bytes(c) for c in registry.encode_request(header, body)))
        wait_until(lambda: p.metric("tierproxy_requests_in_flight") == requests, "every Fetch read", timeout=30)
        held = _settled_rss_mib(p.proc.pid) - base_rss
        assert held < 300, f"proxy buffered {held:.0f} MiB for a client that reads nothing"
        conn = ClientConnection()
        for cid in range(requests):
            conn.expect_response(RequestHeader(1, 12, cid, "slow", 2, 0))
        got = 0
        s.settimeout(30)
        while got < requests:
            ev = conn.next_event()
            if ev is None:
                region = conn.get_buffer()
                n = s.recv_into(region)
                del region
                assert n > 0
                conn.buffer_updated(n)
                continue
            got += 1
        s.close()
    finally:
        p.stop()


def test_announced_request_sizes_do_not_allocate_memory(kafka: KafkaCluster, tmp_path: Path) -> None:
    """Connections that announce 90 MiB requests, send 64 KiB of each and stall: the proxy holds what arrived,
    not what was claimed (at the announced size, 100 connections would hold 9 GiB), and a normal client keeps
    being served meanwhile."""
    p = _proxy(kafka, tmp_path)
    stalled: list[WireClient] = []
    try:
        wait_until(lambda: _can_request(p.bootstrap), "the proxy", timeout=30)
        base_rss = _rss_mib(p.proc.pid)
        header = RequestHeader(ApiKey.PRODUCE, 9, 99, "claims", 2, 0).encode()
        for _ in range(100):
            w = WireClient(f"127.0.0.1:{p.base + 1}")
            w.request(ApiKey.METADATA, 12, {"topics": [], "allow_auto_topic_creation": False})  # relaying now
            w.sock.sendall(struct.pack(">i", 90 << 20) + header + bytes(64 * 1024 - len(header)))
            stalled.append(w)
        assert _can_request(p.bootstrap)  # a normal client is served while they stall
        held = _rss_mib(p.proc.pid) - base_rss
        assert held < 100, f"the proxy holds {held:.0f} MiB for 100 x 64 KiB received of 100 x 90 MiB announced"
        assert p.proc.poll() is None
    finally:
        for w in stalled:
            w.close()
        p.stop()


def test_queued_max_request_bytes_bounds_what_clients_make_the_proxy_hold(kafka: KafkaCluster, kcat: str,
                                                                           tmp_path: Path, topic_name: str) -> None:
    """400 connections announce 90 MiB requests and send as much as they can (1 MiB each): with
    queued.max.request.bytes at 32 MiB the proxy stops reading them once its budget is spent (backpressure, no
    error), what it counts against the bound passes it by one growth and the oldest request's (a connection's
    buffer grows only once its growth is reserved; 1 MiB sent: no growth over 1 MiB), its RSS stays within the
    bound (plus 64 KiB per connection), and a normal client keeps producing and consuming meanwhile."""
    create_topic(kafka.bootstrap, topic_name)
    p = _proxy(kafka, tmp_path, **_admin(queued_max_request_bytes=str(32 << 20)))
    stalled: list[socket.socket] = []
    try:
        wait_until(lambda: _can_request(p.bootstrap), "the proxy", timeout=30)
        base_rss = _rss_mib(p.proc.pid)
        header = RequestHeader(ApiKey.PRODUCE, 9, 99, "claims", 2, 0).encode()
        chunk = bytes(64 * 1024)
        for _ in range(400):
            s = socket.create_connection(("127.0.0.1", p.port))
            s.setblocking(False)
            s.send(struct.pack(">i", 90 << 20) + header)
            stalled.append(s)
        wait_until(lambda: p.metric("tierproxy_client_connections") == len(stalled), "every connection accepted",
                   timeout=30)
        connected = _settled_rss_mib(p.proc.pid)  # 400 relayed connections, each with its buffers, holding no request
        sent = 0
        for _ in range(16):  # 16 x 64 KiB per connection, as far as the proxy keeps reading
            for s in stalled:
                with contextlib.suppress(BlockingIOError):
                    sent += s.send(chunk)
        held = _settled_rss_mib(p.proc.pid) - connected
        assert sent > 64 << 20  # the clients pushed far more than the bound
        counted = p.metric("tierproxy_queued_request_bytes")  # the proxy's own count, not the allocator's
        # ...plus the growth of the oldest request, which always grows (no hold-and-wait): 1 MiB and a header sent
        assert 32 << 20 <= counted <= 34 << 20, f"the proxy counts {counted / 2**20:.1f} MiB against the bound"
        assert held < 32 + 400 * 64 / 1024 + 16, f"requests hold {held:.0f} MiB (bound: 32 MiB + 400 x 64 KiB)"
        assert connected - base_rss < 400 * 0.5, "a relayed connection costs more than 512 KiB"
        lines = [f"m{i}" for i in range(20)]
        out = subprocess.run([kcat, "-b", p.bootstrap, "-P", "-t", topic_name], input="\n".join(lines) + "\n",
                             text=True, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr
        got = subprocess.run([kcat, "-b", p.bootstrap, "-C", "-t", topic_name, "-o", "beginning", "-e", "-q"],
                             capture_output=True, text=True, timeout=60)
        assert got.stdout.splitlines() == lines
        assert p.proc.poll() is None
    finally:
        for s in stalled:
            s.close()
        p.stop()


def test_sasl_handshake_v0_is_refused_with_a_log_line(proxy: ProxyProcess) -> None:
    s = socket.create_connection(("127.0.0.1", proxy.port))
    frame = RequestHeader(17, 0, 1, "old", 1, 0).encode() + struct.pack(">h", 5) + b"PLAIN"
    s.sendall(struct.pack(">i", len(frame)) + frame)
    s.settimeout(10)
    assert s.recv(100) == b""
    s.close()
    wait_until(lambda: "SaslHandshake v0" in proxy.log_text(), "log line", timeout=15)


def test_sigterm_stops_the_proxy_in_time_when_the_broker_is_dead(tmp_path: Path, kcat: str) -> None:
    """The broker is killed (-9) under a proxy with a consumer reading through it and the metadata topic on that
    broker: SIGTERM still stops the proxy within shutdown.drain.ms plus a few seconds."""
    from tests.support.parts import unavailable
    from tierproxy.dev.kafkadist import KafkaUnavailable

    try:
        kafka = KafkaCluster(1, workdir=tmp_path / "kafka").start()
    except KafkaUnavailable as exc:
        unavailable("Apache Kafka (1 node)", str(exc))
    proxy = None
    consumer = None
    try:
        create_topic(kafka.bootstrap, "doomed")
        proxy = ProxyProcess(kafka.bootstrap, tmp_path, extra={
            "TIERPROXY_METADATA": "topic:", "TIERPROXY_SHUTDOWN_DRAIN_MS": "2000",
            "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{free_port_block(1)}"})
        wait_until(lambda: _can_request(proxy.bootstrap), "the proxy", timeout=30)
        consumer = subprocess.Popen([kcat, "-b", proxy.bootstrap, "-C", "-t", "doomed", "-o", "beginning", "-q"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        live = proxy
        wait_until(lambda: live.metric("tierproxy_requests_in_flight") >= 1, "the consumer fetching through the proxy",
                   timeout=30)
        kafka.stop_node(1, kill=True)  # returns once the broker process is gone
        started = time.monotonic()
        proxy.proc.send_signal(signal.SIGTERM)
        proxy.proc.wait(2 + 20)  # raises TimeoutExpired if it hangs (the watchdog exits at 2 + 5 + 5 s, rc 1)
        assert time.monotonic() - started < 2 + 5 + 2  # drain + closing grace: a clean stop, not the watchdog
        assert proxy.proc.returncode == 0 and "tierproxy stopped" in proxy.log_text()
    finally:
        if consumer is not None:
            consumer.kill()
            consumer.wait(10)
        if proxy is not None:
            proxy.stop()
        kafka.stop()


LIVE_FUZZ = int(os.environ.get("TIERPROXY_LIVE_FUZZ_EXAMPLES", "60"))


@pytest.mark.parametrize("seed", range(3))
def test_fuzzed_frames_on_live_connections_leave_the_proxy_serving(proxy: ProxyProcess, seed: int) -> None:
    """The codec's fuzz, against the running proxy: request frames of every decoded API with mutated bodies (the
    header stays valid, so no other API is reached), each on its own connection. The proxy closes what it cannot
    read, stays up, and a normal client on another connection is answered after every frame."""
    import random

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests.protocol.test_fuzz import _mutate, mutation
    from tests.support.samples import sample

    requests = [(s.request, v) for s in registry.SUPPORTED.values() if s.request is not None
                for v in range(s.request.min_version, s.request.max_version + 1)]
    good = WireClient(proxy.bootstrap, timeout=10)

    @settings(max_examples=LIVE_FUZZ // 3, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                                   HealthCheck.function_scoped_fixture])
    @given(st.integers(0, len(requests) - 1), st.lists(mutation, min_size=1, max_size=4))
    def one(index: int, ops: list[tuple[str, int, int]]) -> None:
        msg, version = requests[index]
        header = RequestHeader(msg.api_key, version, 7, "fuzz", request_header_version(msg.api_key, version), 0)
        body = _mutate(msg.encode(sample(msg, version, seed=random.Random(seed * 1000 + index).randrange(99)),
                                  version), ops)
        frame = header.encode() + body
        s = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5)
        try:
            s.sendall(struct.pack(">i", len(frame)) + frame)
            with contextlib.suppress(OSError):
                s.recv(65536)  # an answer, a close, or nothing (the frame may announce more): all fine
        finally:
            s.close()
        assert good.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})["error_code"] == 0

    try:
        one()
    finally:
        good.close()
    assert proxy.proc.poll() is None
