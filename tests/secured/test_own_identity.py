"""tierproxy on a secured cluster: `tier --once` and `serve` with `--command-config` (PLAIN, SCRAM-SHA-512 over
SASL_SSL, OAUTHBEARER with a local token endpoint and JWKS), holding only docs/proxy.md's minimal ACLs; clients with
their own SASL credentials read the tiered history through the proxy; the broker authorizes every request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from protocol.constants import ApiKey, ErrorCode, OffsetSpec
from protocol.records import iter_batches
from protocol.requests import fetch_request, list_offsets_request
from tests.secured.conftest import OAUTH_SECRET, PASSWORDS, PRINCIPAL, Secured
from tests.support.acls import create_acls, delete_acls, reader_acls, tierproxy_acls
from tests.support.cli import run_cli
from tests.support.kafka import broker_forgets, create_topic, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.waiting import wait_until
from tierproxy.config.identity import load_command_config
from tierproxy.dev.ports import free_port
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.kafka, pytest.mark.kcat, pytest.mark.spark]
RECORDS = 3000
SECRETS = (PASSWORDS["tierproxy"], OAUTH_SECRET)


@dataclass(frozen=True)
class Mechanism:
    name: str
    listener: str  # the broker listener the clients are relayed to (and tierproxy's own, unless `own` is set)
    lines: tuple[str, ...]  # the command config, but for the security.protocol line
    own: str | None = None  # a listener for tierproxy's own connections (bootstrap.servers in the command config)
    protocol: str | None = None  # tierproxy's security.protocol when `own` is set


MECHANISMS = {
    "PLAIN": Mechanism("PLAIN", "SASL", (
        "sasl.mechanism=PLAIN",
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \\",
        f'    username="{PRINCIPAL}" password="{PASSWORDS[PRINCIPAL]}";')),
    "SCRAM-SHA-512": Mechanism("SCRAM-SHA-512", "SASLSSL", (
        "sasl.mechanism=SCRAM-SHA-512",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{PRINCIPAL}" password="{PASSWORDS[PRINCIPAL]}";',
        "ssl.truststore.type=PEM", "ssl.truststore.location={ca}")),
    "OAUTHBEARER": Mechanism("OAUTHBEARER", "SASL", (
        "sasl.mechanism=OAUTHBEARER",
        "sasl.login.callback.handler.class="
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        "sasl.oauthbearer.token.endpoint.url={token_url}",
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
        f'clientId="{PRINCIPAL}" clientSecret="{OAUTH_SECRET}" scope="kafka";')),
    # mTLS: tierproxy's certificate on an SSL listener requiring one (CN=tierproxy → User:tierproxy); clients keep
    # authenticating with SASL on their own listener (a certificate cannot pass through a TLS-terminating proxy)
    "mTLS": Mechanism("mTLS", "SASLSSL", (
        "ssl.truststore.type=PEM", "ssl.truststore.location={ca}", "ssl.keystore.type=PEM",
        "ssl.keystore.location={keystore}", "bootstrap.servers={own}"), own="MTLS", protocol="SSL"),
}


def command_config(secured: Secured, mech: Mechanism, path: Path, password: str | None = None) -> Path:
    protocol = mech.protocol or {"SASL": "SASL_PLAINTEXT", "SASLSSL": "SASL_SSL"}[mech.listener]
    keystore = path.parent / "tierproxy-keystore.pem"
    keystore.write_text(secured.client_key.read_text() + secured.client_cert.read_text())
    text = "\n".join([f"security.protocol={protocol}", *mech.lines]).format(
        ca=secured.certs.ca, token_url=secured.oauth.token_url, keystore=keystore,
        own=secured.listener(mech.own) if mech.own else "")
    if password is not None:
        text = text.replace(PASSWORDS[PRINCIPAL], password)
    path.write_text("# tierproxy's own identity\n" + text + "\n")
    return path


def sasl_client(user: str) -> list[str]:
    return ["-X", "security.protocol=sasl_plaintext", "-X", "sasl.mechanisms=PLAIN", "-X", f"sasl.username={user}",
            "-X", f"sasl.password={PASSWORDS[user]}"]


def kcat_read(kcat: str, bootstrap: str, topic: str, opts: list[str], offset: str = "beginning"
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kcat, "-b", bootstrap, *opts, "-C", "-t", topic, "-o", offset, "-e", "-q",
                           "-f", "%o %k %s\n"], capture_output=True, text=True, timeout=120)


@dataclass
class Served:
    secured: Secured
    mech: Mechanism
    topic: str
    expected: list[str]  # what the broker served before it deleted the history: "offset key value"
    log_start: int
    proxy: ProxyProcess
    admin_url: str
    tier_output: str
    env: dict[str, str]  # the proxy's settings: another proxy of the same tier starts with them


def _fill(bootstrap: str, topic: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        p.produce(topic, f"v{i:05d}-".encode() + os.urandom(60).hex().encode(), f"k{i}".encode())
    p.flush(60)


@pytest.fixture(scope="module", params=list(MECHANISMS))
def served(request: pytest.FixtureRequest, secured: Secured, kcat: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A topic tiered by `tier --once` and deleted from the broker, served by `serve`, both with
    `--command-config` for the mechanism; tierproxy holds only the minimal ACLs, alice may READ, bob not."""
    mech = MECHANISMS[request.param]
    d = tmp_path_factory.mktemp(f"own-{mech.name.lower()}")
    topic, meta = f"secured-{mech.name.lower()}", f"__tierproxy_meta_{mech.name.lower()}"
    create_topic(secured.admin, topic, config={"segment.ms": "2000"})  # ticks roll it, so retention can delete it
    create_acls(secured.admin, tierproxy_acls(PRINCIPAL, [topic], meta) + reader_acls("alice", topic))
    _fill(secured.admin, topic)
    direct = kcat_read(kcat, secured.admin, topic, [])
    expected = direct.stdout.splitlines()
    assert len(expected) == RECORDS, direct.stderr
    cfg = command_config(secured, mech, d / "client.properties")
    storage, metadata = f"file://{d}/tier", f"topic:{meta}?partitions=3&replication=1"
    (d / "spark-events").mkdir()
    tier = subprocess.run([sys.executable, "-m", "tierproxy.cli", "tier", "--once", "--no-progress",
                           "--bootstrap-server", secured.listener(mech.listener), "--command-config", str(cfg),
                           "--storage", storage, "--metadata", metadata, "--topics", topic,
                           "--spark-conf", "spark.eventLog.enabled=true",
                           "--spark-conf", f"spark.eventLog.dir=file://{d / 'spark-events'}",
                           "--spark-conf", "spark.eventLog.compress=false",
                           "--spark-conf", "spark.eventLog.rolling.enabled=false"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TIERPROXY_SPARK_MASTER": "local[1]",
                               "TIERPROXY_TIER_STATE_DIR": str(d / "state")})
    assert tier.returncode == 0, tier.stderr[-3000:]
    log_start = broker_forgets(secured.admin, topic, above=RECORDS // 2)
    admin_port = free_port()
    relay_tls = {"TIERPROXY_UPSTREAM_SSL_ENABLED": "true", "TIERPROXY_UPSTREAM_SSL_CAFILE": str(secured.certs.ca)}
    env = {"TIERPROXY_COMMAND_CONFIG": str(cfg), "TIERPROXY_STORAGE": storage, "TIERPROXY_METADATA": metadata,
           **(relay_tls if mech.own else {})}
    proxy = ProxyProcess(secured.listener(mech.listener), d,
                         extra={**env, "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{admin_port}"})
    try:
        yield Served(secured, mech, topic, expected, log_start, proxy, f"http://127.0.0.1:{admin_port}",
                     tier.stdout + tier.stderr, env)
    finally:
        proxy.stop()


def test_a_reader_gets_the_whole_history_through_the_proxy(served: Served, kcat: str) -> None:
    def history() -> bool:
        got = kcat_read(kcat, served.proxy.bootstrap, served.topic, sasl_client("alice"))
        return got.stdout.splitlines()[:RECORDS] == served.expected

    assert served.log_start > RECORDS // 2  # the broker has deleted the first half
    wait_until(history, "kcat (alice) reads the tiered history through the proxy", timeout=90, interval=1)
    c = Consumer({"bootstrap.servers": served.proxy.bootstrap, "group.id": "alice-reader",
                  "enable.auto.commit": False, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                  "sasl.username": "alice", "sasl.password": PASSWORDS["alice"]})
    try:
        c.assign([TopicPartition(served.topic, 0, 0)])
        got: list[str] = []
        for _ in range(600):
            if len(got) >= RECORDS:
                break
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                got.append(f"{m.offset()} {m.key().decode()} {m.value().decode()}")
    finally:
        c.close()
    assert got[:RECORDS] == served.expected


def test_tierproxy_keeps_its_secrets(served: Served) -> None:
    def config() -> str:
        with urllib.request.urlopen(served.admin_url + "/v1/config", timeout=10) as r:
            return str(r.read().decode())

    shown = wait_until(config, "the admin API", timeout=30, interval=0.2)
    identity = json.loads(shown)["identity"]
    assert identity["sasl.mechanism"] == (None if served.mech.own else served.mech.name) and identity["principal"]
    events = [f.read_text(errors="replace") for f in (served.proxy.log.parent / "spark-events").rglob("*")
              if f.is_file()]
    assert events and "SparkListenerTaskEnd" in "".join(events)  # the tier job's Spark event log was written
    for text in (shown, served.proxy.log_text(), served.tier_output, *events):
        for secret in SECRETS:
            assert secret not in text
    assert PASSWORDS[PRINCIPAL] not in repr(load_command_config(served.proxy.log.parent / "client.properties"))
    with urllib.request.urlopen(served.admin_url + "/readyz", timeout=10) as r:
        assert json.loads(r.read())["ready"] is True


def _client(served: Served, user: str, *, direct: bool = False) -> WireClient:
    """A raw client authenticated as `user` (PLAIN): of the proxy (relayed to the broker), or of the broker itself."""
    from tierproxy.config.identity.properties import identity_from_properties

    identity = identity_from_properties({
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{user}" '
                            f'password="{PASSWORDS[user]}";'})
    address = served.secured.listener("SASL") if direct else served.proxy.bootstrap
    return WireClient(address, client_id=user, timeout=30, identity=identity)


def _fetch(w: WireClient, topic: str, offset: int) -> tuple[int, int]:
    resp = w.request(ApiKey.FETCH, 12, fetch_request({topic: {0: offset}}, max_bytes=1 << 20))
    p = resp["responses"][0]["partitions"][0]
    return p["error_code"], sum(b.last_offset - b.base_offset + 1 for b in iter_batches(p["records"]))


def test_a_client_without_read_gets_nothing_from_the_tier(served: Served, kcat: str) -> None:
    def alice_reads() -> bool:
        with _client(served, "alice") as w:
            return _fetch(w, served.topic, 0)[1] > 0

    wait_until(alice_reads, "the tier serves alice", timeout=90, interval=1)
    for offset in ("beginning", str(served.log_start)):
        bob = kcat_read(kcat, served.proxy.bootstrap, served.topic, sasl_client("bob"), offset)
        assert bob.stdout == "" and "authorization failed" in bob.stderr.lower(), bob.stderr[-500:]
    with _client(served, "bob") as w:
        assert _fetch(w, served.topic, 0) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0)
        assert _fetch(w, served.topic, served.log_start) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0)
        specs = {OffsetSpec.EARLIEST: "earliest", OffsetSpec.LATEST_TIERED: "latest tiered", 0: "timestamp 0"}
        for spec in specs:
            resp = w.request(ApiKey.LIST_OFFSETS, 9, list_offsets_request({served.topic: {0: spec}}))
            p = resp["topics"][0]["partitions"][0]
            assert (p["error_code"], p["offset"]) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1), specs[spec]
        resp = w.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, {"replica_id": -1, "topics": [
            {"topic": served.topic, "partitions": [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]})
        p = resp["topics"][0]["partitions"][0]
        assert p["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED and p["end_offset"] == -1


def test_an_acl_removed_mid_read_refuses_the_very_next_fetch(served: Served) -> None:
    """Window 0 (the default): once the broker refuses alice (its authorizer learns the revocation from the
    metadata log; asked directly, as alice, until it does), the very next fetch of the tier through the proxy is
    refused, and every one after it: no tier read started before, or overlapping, the broker's answer is served."""
    acl = reader_acls("alice", served.topic)[:1]
    with _client(served, "alice") as w, _client(served, "alice", direct=True) as broker:
        wait_until(lambda: _fetch(w, served.topic, 0)[1] > 0, "the tier serves alice", timeout=90, interval=1)
        assert _fetch(w, served.topic, 100)[0] == ErrorCode.NONE  # reading the tier: the partition is known remote
        assert _fetch(w, served.topic, 150)[1] > 0
        delete_acls(served.secured.admin, acl)
        try:
            wait_until(lambda: _fetch(broker, served.topic, served.log_start)[0] != ErrorCode.NONE,
                       "the broker refuses alice", timeout=30, interval=0.05)
            for offset in (200, 0, 250, 100, 300):  # each of them tiered, each the next fetch answered
                assert _fetch(w, served.topic, offset) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0), offset
        finally:
            create_acls(served.secured.admin, acl)


def _fetch_v13(w: WireClient, topic: str, topic_id: bytes, offset: int, leader_epoch: int) -> dict[str, object]:
    body = fetch_request({topic: {0: offset}}, max_bytes=1 << 20, topic_ids={topic: topic_id})
    body["topics"][0]["partitions"][0]["current_leader_epoch"] = leader_epoch
    resp = w.request(ApiKey.FETCH, 13, body)
    part: dict[str, object] = resp["responses"][0]["partitions"][0]
    return {**part, "records": bytes(part["records"] or b"")}


@pytest.mark.parametrize("served", ["PLAIN"], indirect=True)
def test_an_error_of_the_authorizing_fetch_reaches_the_client_as_the_broker_answered_it(served: Served) -> None:
    """A fetch of tiered offsets that the broker refuses for another reason than the offset (a leader epoch from
    the future, an unknown topic id) is answered with the broker's answer, unchanged: the proxy's early read of
    the tier (started before the broker's answer) is dropped, never served."""
    with _client(served, "alice") as w, _client(served, "alice", direct=True) as broker:
        wait_until(lambda: _fetch(w, served.topic, 0)[1] > 0, "the tier serves alice", timeout=90, interval=1)
        md = broker.request(ApiKey.METADATA, 12, {"topics": [{"name": served.topic, "topic_id": bytes(16)}],
                                                  "allow_auto_topic_creation": False,
                                                  "include_topic_authorized_operations": False})
        topic_id = md["topics"][0]["topic_id"]
        read = _fetch_v13(w, served.topic, topic_id, 100, -1)  # known remote by id: read early from now on
        assert read["error_code"] == ErrorCode.NONE and read["records"]
        cases = {"UNKNOWN_LEADER_EPOCH": (topic_id, 1000), "UNKNOWN_TOPIC_ID": (os.urandom(16), -1)}
        for name, (tid, epoch) in cases.items():
            through = _fetch_v13(w, served.topic, tid, 100, epoch)
            direct = _fetch_v13(broker, served.topic, tid, 100, epoch)
            assert through["error_code"] == getattr(ErrorCode, name), (name, through)
            assert through == direct, name
        assert _fetch_v13(w, served.topic, topic_id, 100, -1)["records"] == read["records"]  # and reads on after


@pytest.mark.parametrize("served", ["PLAIN"], indirect=True)
def test_within_the_authorization_window_a_revoked_acl_stops_tier_reads_when_it_ends(served: Served) -> None:
    """remote.authorization.cache.ms=3000: alice reads on from the tier without the broker's round trip for 3 s
    after the broker last authorized her connection's fetch; her ACL revoked, she is refused within the window
    (and the broker's ACL propagation), and gets no tier record after that. Bob never gets one."""
    window_s = 3.0
    admin = f"127.0.0.1:{free_port()}"
    proxy = ProxyProcess(served.secured.listener(served.mech.listener), served.proxy.log.parent, extra={
        **served.env, "TIERPROXY_REMOTE_AUTHORIZATION_CACHE_MS": str(int(window_s * 1000)),
        "TIERPROXY_ADMIN_LISTEN": admin})
    acl = reader_acls("alice", served.topic)[:1]

    def windowed() -> float:
        with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as r:
            text = r.read().decode()
        line = next(x for x in text.splitlines()
                    if x.startswith("tierproxy_remote_fetches_within_authorization_window_total "))
        return float(line.split()[1])

    try:
        # the admin API starts after the Kafka port opens (0.35-0.4 s here): alice's first fetch may come sooner
        wait_until(lambda: windowed() >= 0, "the admin API", timeout=30)
        served_proxy, served.proxy = served.proxy, proxy  # _client connects to `served.proxy`
        try:
            with _client(served, "bob") as w:
                assert _fetch(w, served.topic, 0) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0)
                assert _fetch(w, served.topic, 0) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0)
            with _client(served, "alice") as w:
                wait_until(lambda: _fetch(w, served.topic, 0)[1] > 0, "the tier serves alice", timeout=90,
                           interval=1)
                before = windowed()
                assert _fetch(w, served.topic, 100)[0] == ErrorCode.NONE
                assert _fetch(w, served.topic, 150)[0] == ErrorCode.NONE
                assert windowed() >= before + 2  # both answered without the broker
                delete_acls(served.secured.admin, acl)
                revoked = time.monotonic()
                try:
                    served_after = 0
                    while time.monotonic() - revoked < window_s + 10:  # bounded: refused by then, or failed
                        code, n = _fetch(w, served.topic, 200)
                        if code != ErrorCode.NONE:
                            break
                        served_after += 1
                        time.sleep(0.1)
                    refused_after = time.monotonic() - revoked
                    assert (code, n) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0)
                    # the window, plus ACL propagation
                    assert refused_after < window_s + 5, (refused_after, served_after)
                    for _ in range(5):  # refused: every later fetch is the broker's to decide
                        assert _fetch(w, served.topic, 200) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0)
                finally:
                    create_acls(served.secured.admin, acl)
        finally:
            served.proxy = served_proxy
    finally:
        proxy.stop()


def test_tail_passthrough_keeps_working_when_tierproxys_identity_is_refused(secured: Secured, kcat: str,
                                                                             tmp_path: Path) -> None:
    mech = MECHANISMS["SCRAM-SHA-512"]
    topic = "secured-tail"
    create_topic(secured.admin, topic, config={"segment.ms": "2000"})  # ticks roll it, so retention can delete it
    create_acls(secured.admin, reader_acls("alice", topic))
    _fill(secured.admin, topic)
    cfg = command_config(secured, mech, tmp_path / "client.properties", password="wrong-password")
    tier = run_cli("tier", "--once", "--no-progress", "--bootstrap-server", secured.listener(mech.listener),
                   "--command-config", str(cfg), "--storage", f"file://{tmp_path}/tier", "--metadata",
                   "topic:__tierproxy_meta_wrong", "--topics", topic,
                   env={"TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state")})
    assert tier.returncode == 3 and "SCRAM-SHA-512" in tier.stderr and "wrong-password" not in tier.stderr, \
        tier.stderr[-2000:]
    admin_port = free_port()
    proxy = ProxyProcess(secured.listener(mech.listener), tmp_path, extra={
        "TIERPROXY_COMMAND_CONFIG": str(cfg), "TIERPROXY_METADATA": "topic:__tierproxy_meta_wrong",
        "TIERPROXY_ADMIN_LISTEN": f"127.0.0.1:{admin_port}"})
    try:
        got = kcat_read(kcat, proxy.bootstrap, topic, sasl_client("alice"))
        assert len(got.stdout.splitlines()) == RECORDS == watermarks(secured.admin, topic)[1], got.stderr[-500:]

        def readyz() -> tuple[int, dict[str, Any]]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/readyz", timeout=10) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as refused:
                return refused.code, json.loads(refused.read())

        # the admin API starts after the Kafka port opens: a refused connection is "not yet", any answer is checked
        code, body = wait_until(readyz, "the admin API's readyz", timeout=30)
        assert code == 503 and any("SCRAM-SHA-512" in p for p in body["problems"]), body
        assert "SCRAM-SHA-512" in proxy.log_text() and "wrong-password" not in proxy.log_text()
    finally:
        proxy.stop()


def test_a_pass_whose_principal_may_not_describe_a_tiered_topic_deletes_nothing_of_it(secured: Secured,
                                                                                      tmp_path: Path) -> None:
    """The topic drops out of tierproxy's all-topics Metadata answer when its DESCRIBE is revoked, and a by-id
    Metadata answers TOPIC_AUTHORIZATION_FAILED, not UNKNOWN_TOPIC_ID: no proof of deletion, nothing deleted
    (before: "id gone from the cluster", the whole topic deleted from the tier)."""
    mech = MECHANISMS["PLAIN"]
    topic, meta = "secured-undescribed", "__tierproxy_meta_undescribed"
    create_topic(secured.admin, topic, config={"segment.ms": "2000"})
    grants = tierproxy_acls(PRINCIPAL, [topic], meta)
    create_acls(secured.admin, grants)
    _fill(secured.admin, topic)
    cfg = command_config(secured, mech, tmp_path / "client.properties")

    def tier() -> subprocess.CompletedProcess[str]:  # deletions as eager as they can be: no delay, confirmed
        return run_cli("tier", "--once", "--no-progress", "--confirm-retention", "--bootstrap-server",
                       secured.listener(mech.listener), "--command-config", str(cfg), "--storage",
                       f"file://{tmp_path}/tier", "--metadata", f"topic:{meta}?partitions=3&replication=1",
                       "--topics", ".*", env={"TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state"),
                                              "TIERPROXY_TIER_TOPIC_DELETE_DELAY_MS": "0"})

    def segments() -> list[Path]:
        return sorted((tmp_path / "tier").rglob("*.log"))

    first = tier()
    assert first.returncode == 0 and segments(), first.stderr[-3000:]
    # without DESCRIBE on the cluster (or the groups) the pass says the tier snapshot may lack group offsets
    assert "group offsets not fully recorded in the tier snapshot" in first.stderr, first.stderr[-3000:]
    assert "may not DESCRIBE the cluster" in first.stderr
    tiered = [p.read_bytes() for p in segments()]
    revoked = [b for b in grants if b.name == topic]
    delete_acls(secured.admin, revoked)
    try:
        again = tier()
        assert again.returncode == 0, again.stderr[-3000:]
        assert "0 partitions deleted" in again.stdout and "deleting partition" not in again.stderr, again.stdout
        assert [p.read_bytes() for p in segments()] == tiered
    finally:
        create_acls(secured.admin, revoked)


def test_a_certificate_refused_is_a_tls_failure(secured: Secured, tmp_path: Path) -> None:
    """The SSL listener requires a client certificate: without one, `tier` says TLS failed (exit 3)."""
    topic, meta = "secured-mtls", "__tierproxy_meta_mtls"
    bare = tmp_path / "no-cert.properties"
    bare.write_text(f"security.protocol=SSL\nssl.truststore.location={secured.certs.ca}\n")
    refused = run_cli("tier", "--once", "--no-progress", "--bootstrap-server", secured.listener("MTLS"),
                      "--command-config", str(bare), "--storage", f"file://{tmp_path}/tier2", "--metadata",
                      f"topic:{meta}", "--topics", topic, env={"TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state2")})
    assert refused.returncode == 3 and "TLS toward the brokers failed" in refused.stderr, refused.stderr[-2000:]


def _refused_write(secured: Secured, topic: str) -> bool:
    """tierproxy's principal is refused a write to `topic` now (the broker has applied the ACL change). The probe
    is a tombstone of a key no metadata reader knows (skipped by every reader, compacted away)."""
    errors: list[int] = []
    p = Producer({"bootstrap.servers": secured.listener("SASL"), "security.protocol": "SASL_PLAINTEXT",
                  "sasl.mechanisms": "PLAIN", "sasl.username": PRINCIPAL, "sasl.password": PASSWORDS[PRINCIPAL],
                  "message.timeout.ms": 5000})
    p.produce(topic, None, b"acl-probe", partition=0, on_delivery=lambda err, _m: errors.append(
        err.code() if err is not None else 0))
    p.flush(10)
    return errors == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_a_purge_that_cannot_be_recorded_is_a_storage_error_and_changes_nothing(served: Served) -> None:
    """tierproxy's principal without WRITE on the metadata topic cannot record a purge: the tier part of a
    DeleteRecords is answered KAFKA_STORAGE_ERROR (retriable), its log names the missing right, and the proxy
    serves exactly what it served before."""
    meta = f"__tierproxy_meta_{served.mech.name.lower()}"
    write = [b for b in tierproxy_acls(PRINCIPAL, [], meta) if b.restype == ResourceType.TOPIC
             and b.operation == AclOperation.WRITE]
    alice_deletes = [AclBinding(ResourceType.TOPIC, served.topic, ResourcePatternType.LITERAL, "User:alice", "*",
                                AclOperation.DELETE, AclPermissionType.ALLOW)]
    with _client(served, "alice") as w:
        wait_until(lambda: _fetch(w, served.topic, 0)[1] > 0, "the tier serves alice", timeout=90, interval=1)
        create_acls(served.secured.admin, alice_deletes)
        delete_acls(served.secured.admin, write)
        try:
            wait_until(lambda: _refused_write(served.secured, meta), "the broker refuses tierproxy's writes",
                       timeout=30, interval=0.2)
            resp = w.request(ApiKey.DELETE_RECORDS, 2, {"topics": [{"name": served.topic, "partitions": [
                {"partition_index": 0, "offset": 10}]}], "timeout_ms": 10_000})
            p = resp["topics"][0]["partitions"][0]
            assert (p["error_code"], p["low_watermark"]) == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
            assert "WRITE on the metadata topic" in served.proxy.log_text()
            tier = Path(served.env["TIERPROXY_STORAGE"].removeprefix("file://"))
            assert not list((tier / "purges").rglob("*.json")), "no purge record left: a restore must not apply it"
            listed = w.request(ApiKey.LIST_OFFSETS, 9, list_offsets_request({served.topic: {0: OffsetSpec.EARLIEST}}))
            assert listed["topics"][0]["partitions"][0]["offset"] == 0
            assert _fetch(w, served.topic, 0)[0] == ErrorCode.NONE and _fetch(w, served.topic, 0)[1] > 0
        finally:
            create_acls(served.secured.admin, write)
            delete_acls(served.secured.admin, alice_deletes)
