"""TLS on the client listener and toward the brokers; SASL/PLAIN passed through to a broker that checks it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.certs import Certs, make_certs
from tests.support.kafka import create_topic
from tests.support.parts import unavailable
from tests.support.proxy import ProxyProcess
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster, KafkaUnavailable

pytestmark = pytest.mark.kafka
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[KafkaCluster]:
    """A broker with an SSL listener (PEM keystore) and a SASL_PLAINTEXT listener (PLAIN)."""
    config = {
        "listener.name.ssl.ssl.keystore.type": "PEM",
        "listener.name.ssl.ssl.keystore.location": str(certs.keystore_pem),
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl.plain.sasl.jaas.config": JAAS,
    }
    try:
        cluster = KafkaCluster(1, workdir=tmp_path_factory.mktemp("secure-kafka"), broker_config=config,
                               extra_listeners={"SSL": "SSL", "SASL": "SASL_PLAINTEXT"}).start()
    except KafkaUnavailable as exc:
        unavailable("Apache Kafka with SSL and SASL listeners", str(exc))
    yield cluster
    cluster.stop()


def _kcat_round_trip(kcat: str, bootstrap: str, topic: str, opts: list[str], n: int = 50) -> list[str]:
    lines = [f"{topic}-{i}" for i in range(n)]
    subprocess.run([kcat, "-b", bootstrap, *opts, "-P", "-t", topic], input="\n".join(lines) + "\n", text=True,
                   check=True, timeout=60, capture_output=True)
    out = subprocess.run([kcat, "-b", bootstrap, *opts, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                         capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.splitlines()


def test_tls_client_listener(kafka: KafkaCluster, kcat: str, certs: Certs, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    p = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_SSL_CERTFILE": str(certs.cert),
                                                       "TIERPROXY_SSL_KEYFILE": str(certs.key)})
    try:
        tls = ["-X", "security.protocol=ssl", "-X", f"ssl.ca.location={certs.ca}"]
        assert _kcat_round_trip(kcat, p.bootstrap, topic_name, tls) == [f"{topic_name}-{i}" for i in range(50)]
        # a client that does not trust the CA cannot connect
        bad = subprocess.run([kcat, "-b", p.bootstrap, "-X", "security.protocol=ssl", "-L", "-m", "5"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0
    finally:
        p.stop()


def test_tls_toward_the_brokers(secure_kafka: KafkaCluster, kcat: str, certs: Certs, tmp_path: Path,
                                topic_name: str) -> None:
    create_topic(secure_kafka.bootstrap, topic_name)
    p = ProxyProcess(secure_kafka.bootstrap_for("SSL"), tmp_path, extra={
        "TIERPROXY_UPSTREAM_SSL_ENABLED": "true", "TIERPROXY_UPSTREAM_SSL_CAFILE": str(certs.ca)})
    try:
        assert _kcat_round_trip(kcat, p.bootstrap, topic_name, []) == [f"{topic_name}-{i}" for i in range(50)]
        meta = subprocess.run([kcat, "-b", p.bootstrap, "-L"], capture_output=True, text=True, timeout=30).stdout
        assert str(secure_kafka.nodes[0].listener_ports["SSL"]) not in meta
    finally:
        p.stop()


def test_sasl_plain_passes_through(secure_kafka: KafkaCluster, kcat: str, tmp_path: Path, topic_name: str) -> None:
    create_topic(secure_kafka.bootstrap, topic_name)
    p = ProxyProcess(secure_kafka.bootstrap_for("SASL"), tmp_path)
    sasl = ["-X", "security.protocol=sasl_plaintext", "-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=alice"]
    try:
        good = _kcat_round_trip(kcat, p.bootstrap, topic_name, [*sasl, "-X", "sasl.password=alice-secret"])
        assert good == [f"{topic_name}-{i}" for i in range(50)]
        bad = subprocess.run([kcat, "-b", p.bootstrap, *sasl, "-X", "sasl.password=wrong", "-L", "-m", "5"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "Authentication failed" in bad.stderr
    finally:
        p.stop()


def test_requests_are_limited_until_sasl_authentication_completes(secure_kafka: KafkaCluster, kcat: str,
                                                                  tmp_path: Path, topic_name: str) -> None:
    """After SaslHandshake, a request over sasl.server.max.receive.size (512 KiB) closes the connection before the
    proxy buffers it; once authenticated, a client sends 900 KiB records as usual."""
    import socket
    import struct

    from protocol.constants import ApiKey
    from protocol.headers import RequestHeader

    create_topic(secure_kafka.bootstrap, topic_name)
    p = ProxyProcess(secure_kafka.bootstrap_for("SASL"), tmp_path)
    try:
        s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
        body = RequestHeader(ApiKey.SASL_HANDSHAKE, 1, 1, "x", 1, 0).encode() + struct.pack(">h", 5) + b"PLAIN"
        s.sendall(struct.pack(">i", len(body)) + body)
        size, = struct.unpack(">i", s.recv(4))
        assert size > 0 and len(s.recv(size)) > 0  # the broker's handshake answer
        big = RequestHeader(ApiKey.SASL_AUTHENTICATE, 2, 2, "x", 2, 0).encode()
        s.sendall(struct.pack(">i", 1 << 20) + big)  # announces 1 MiB before authenticating
        assert s.recv(100) == b""  # closed without reading it
        s.close()
        wait_until(lambda: "outside 0..524288" in p.log_text(), "the log line", timeout=15)
        sasl = ["-X", "security.protocol=sasl_plaintext", "-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=alice",
                "-X", "sasl.password=alice-secret"]
        value = "v" * (900 * 1024)
        subprocess.run([kcat, "-b", p.bootstrap, *sasl, "-P", "-t", topic_name, "-X", "message.max.bytes=2000000"],
                       input=value + "\n", text=True, check=True, timeout=60, capture_output=True)
        out = subprocess.run([kcat, "-b", p.bootstrap, *sasl, "-C", "-t", topic_name, "-o", "beginning", "-e", "-q"],
                             capture_output=True, text=True, check=True, timeout=60)
        assert out.stdout.splitlines() == [value]
    finally:
        p.stop()


def test_own_plaintext_listener_apart_from_a_tls_relayed_one(secure_kafka: KafkaCluster, kcat: str, certs: Certs,
                                                              tmp_path: Path, topic_name: str) -> None:
    """Clients are relayed over TLS (upstream.ssl.*) while tierproxy's own connections go to another listener, in
    plaintext (command config bootstrap.servers): each uses its own transport; readyz (own connections) is green
    and clients read through the proxy."""
    import json
    import urllib.request

    from tierproxy.dev.ports import free_port

    create_topic(secure_kafka.bootstrap, topic_name)
    own = tmp_path / "own.properties"
    own.write_text(f"security.protocol=PLAINTEXT\nbootstrap.servers={secure_kafka.bootstrap}\n")
    admin = free_port()
    p = ProxyProcess(secure_kafka.bootstrap_for("SSL"), tmp_path, extra={
        "TIERPROXY_UPSTREAM_SSL_ENABLED": "true", "TIERPROXY_UPSTREAM_SSL_CAFILE": str(certs.ca),
        "TIERPROXY_COMMAND_CONFIG": str(own), "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{admin}"})
    try:
        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=10) as r:
                return bool(json.loads(r.read())["ready"])

        wait_until(ready, "readyz", timeout=60, interval=0.5)
        assert _kcat_round_trip(kcat, p.bootstrap, topic_name, []) == [f"{topic_name}-{i}" for i in range(50)]
    finally:
        p.stop()
