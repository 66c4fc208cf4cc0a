"""A broker of this package's own (its tests restart it and stop replicas of the proxy), and the shared pieces
of a fleet: several `tierproxy serve` replicas on one tier and one metadata topic."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.parts import unavailable
from tests.support.proxy import ProxyProcess
from tierproxy.dev.kafkadist import KafkaCluster, KafkaUnavailable


@pytest.fixture(scope="package")
def fleet_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One KRaft broker+controller for this package (the session's broker is never restarted)."""
    cluster = KafkaCluster(1, workdir=tmp_path_factory.mktemp("fleet-kafka"))
    try:
        cluster.start()
    except KafkaUnavailable as exc:
        cluster.stop()
        unavailable("Apache Kafka (1 node, fleet)", str(exc))
    yield cluster
    cluster.stop()


def metadata_topic() -> str:
    """A metadata topic of the test's own (3 partitions: a few records each)."""
    return f"topic:__tp-meta-{uuid.uuid4().hex[:8]}?partitions=3&replication=1"


def replica(bootstrap: str, workdir: Path, storage: str, metadata: str, **extra: str) -> ProxyProcess:
    """One `serve` replica on the shared tier and metadata."""
    return ProxyProcess(bootstrap, workdir, {"TIERPROXY_STORAGE": storage, "TIERPROXY_METADATA": metadata, **extra})
