"""Fixtures for the real parts: a session Kafka broker, an on-demand 3-node cluster, S3 (SeaweedFS; moto for
contrast), kcat."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.parts import kcat_path, unavailable
from tests.support.proxy import ProxyProcess
from tests.support.registry import Registry, apicurio_registry
from tests.support.s3 import S3Server, moto_server, seaweedfs_server
from tierproxy.dev.kafkadist import KafkaCluster, KafkaUnavailable

_clusters: list[KafkaCluster] = []
_proxies: list[ProxyProcess] = []
_names = itertools.count()


def _start(nodes: int, tmp: Path) -> KafkaCluster:
    try:
        cluster = KafkaCluster(nodes, workdir=tmp)
        _clusters.append(cluster)
        return cluster.start()
    except KafkaUnavailable as exc:
        unavailable(f"Apache Kafka ({nodes} node)", str(exc))


def pytest_configure(config: pytest.Config) -> None:
    """Settle what the one JVM this process may start inherits, before any test starts it (the tiering tests start
    theirs first, and a later SparkSession reuses that JVM and its environment):
    - the test S3 credentials (SeaweedFS's identity, moto's pair), the usual AWS chain that Spark's Python workers
      read;
    - Spark's Kafka source on the classpath: a session made after an earlier one stopped cannot load new jars."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", S3Server.access_key)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", S3Server.secret_key)
    if "PYSPARK_SUBMIT_ARGS" in os.environ:
        return
    from tests.support.spark import spark_kafka_jars

    try:
        jars = spark_kafka_jars()
    except (Exception, pytest.fail.Exception, pytest.skip.Exception):
        return  # no Maven: the comparison tests fail with the reason; nothing else needs the jars
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(jars)} pyspark-shell"


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One combined KRaft broker+controller for the whole session."""
    cluster = _start(1, tmp_path_factory.mktemp("kafka"))
    yield cluster
    cluster.stop()


@pytest.fixture
def kafka_cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    """Three combined KRaft nodes, started for the one test that asks (leader-change tests)."""
    cluster = _start(3, tmp_path / "cluster")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def proxy(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """`tierproxy serve` in front of the session broker."""
    p = ProxyProcess(kafka.bootstrap, tmp_path_factory.mktemp("proxy"))
    _proxies.append(p)
    yield p
    p.stop()


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    """A real S3 implementation: SeaweedFS's S3 gateway (`weed server -s3`) on loopback, one per test (2 s)."""
    with seaweedfs_server(tmp_path) as server:
        yield server


@pytest.fixture
def moto_s3(tmp_path: Path) -> Iterator[S3Server]:
    """moto's S3 emulator: only for the benchmarks' contrast with the real server."""
    with moto_server(tmp_path) as server:
        yield server


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One Apicurio Registry for the session (in-memory: each test registers under its own subjects)."""
    with apicurio_registry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


@pytest.fixture(scope="session")
def kcat() -> str:
    return kcat_path()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique in the session, readable in broker logs."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"{base}-{os.getpid()}-{next(_names)}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if report.failed and _clusters:
        for cluster in _clusters:
            if any(n.proc is not None for n in cluster.nodes):
                report.sections.append((f"kafka logs {cluster.workdir}", cluster.tail_logs(lines=40)))
        for p in _proxies:
            if p.log.exists():
                report.sections.append((f"tierproxy log {p.log}", "\n".join(p.log_text().splitlines()[-60:])))
    return report
