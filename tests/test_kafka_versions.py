"""Every Kafka a user may run, kept tested: one small end-to-end test per release line beside the suite's default
(3.6, 3.9, 4.0, 4.3, 4.4; KRaft, one broker each): produce, tier, the broker forgets, kcat and confluent-kafka read
everything from offset 0 through the proxy byte-identical, ListOffsets -2 and -4, a group resumes from the tier;
and the API versions the proxy caps each broker's to are the ones docs/development.md lists.

Each version is its own test (its own broker), so xdist spreads them over the workers.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from protocol.constants import ApiKey, OffsetSpec
from tests.support.kafka import (
    broker_forgets,
    create_topic,
    list_offsets_at_leaders,
    small_segment_producer,
    small_segments,
)
from tests.support.proxy import ProxyProcess
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import OTHER_VERSIONS, KafkaCluster
from tierproxy.kafka.wireclient import WireClient
from tierproxy.proxy.rewrite import INTERCEPTED

pytestmark = [pytest.mark.kafka, pytest.mark.kcat, pytest.mark.spark, pytest.mark.process]
DOC = Path(__file__).resolve().parents[1] / "docs" / "development.md"  # "Kafka versions tested"
RECORDS = 600
# the columns of the table in docs/development.md: the APIs whose versions the proxy caps (`rewrite.cap_api_versions`)
CAPPED = (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.METADATA, ApiKey.OFFSET_FOR_LEADER_EPOCH,
          ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER, ApiKey.API_VERSIONS)


def _records() -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    return [(f"key-{i % 17}".encode(), f"value-{i}-{'v' * (i % 50)}".encode(), [("n", str(i).encode())])
            for i in range(RECORDS)]


def _capped_versions(bootstrap: str) -> dict[int, int]:
    with WireClient(bootstrap) as w:
        resp = w.request(ApiKey.API_VERSIONS, 3, {"client_software_name": "tierproxy-tests",
                                                 "client_software_version": "1"})
    return {k["api_key"]: k["max_version"] for k in resp["api_keys"] if k["api_key"] in CAPPED}


def readme_caps() -> dict[str, dict[int, int]]:
    """The table "Kafka versions tested" (docs/development.md): version → {api key: the highest version the proxy
    offers}."""
    text = DOC.read_text()
    table = text[text.index("| Kafka | Produce |"):].split("\n\n", 1)[0].splitlines()[2:]
    out = {}
    for row in table:
        cells = [c.strip() for c in row.strip("|").split("|")]
        out[cells[0]] = {int(k): int(v) for k, v in zip(CAPPED, cells[1:1 + len(CAPPED)], strict=True)}
    return out


def test_the_docs_list_every_version_tested_and_the_capped_apis() -> None:
    from tierproxy.dev.kafkadist import KAFKA_VERSION

    assert set(CAPPED) - {ApiKey.PRODUCE} == set(INTERCEPTED), "the table's columns: what the proxy caps"
    assert set(readme_caps()) == {KAFKA_VERSION, *OTHER_VERSIONS}


@pytest.mark.parametrize("version", OTHER_VERSIONS)
def test_the_proxy_serves_the_tier_in_front_of_kafka(version: str, tmp_path: Path, kcat: str) -> None:
    k = KafkaCluster(1, workdir=tmp_path / "kafka", version=version).start()
    try:
        topic = f"history-{version.replace('.', '-')}"
        create_topic(k.bootstrap, topic, config=small_segments(version=version))
        prod = small_segment_producer(k.bootstrap, **{"compression.type": "lz4"})
        for key, value, headers in _records():
            prod.produce(topic, value, key, partition=0, headers=headers)
        assert prod.flush(30) == 0
        s = settings(k.bootstrap, tmp_path, topic)
        assert tier_once(s).segments > 0
        log_start = broker_forgets(k.bootstrap, topic, above=RECORDS // 2)
        p = ProxyProcess(k.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": s.storage,
                                                       "TIERPROXY_METADATA": str(s.metadata)})
        try:
            _reads_and_resumes(p.bootstrap, topic, kcat, log_start)
            assert _capped_versions(p.bootstrap) == readme_caps()[version], "docs/development.md's row for this version"
        finally:
            p.stop()
    finally:
        k.stop()


def _reads_and_resumes(bootstrap: str, topic: str, kcat: str, log_start: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the proxy loading its tier answers a retriable error, as a broker would
        if list_offsets_at_leaders(bootstrap, OffsetSpec.EARLIEST, topic=topic, quiet=True,
                                   version=8).get(0, (-1, -1))[0] == 0:
            break
        time.sleep(0.2)

    def offset(spec: int) -> int:
        return list_offsets_at_leaders(bootstrap, spec, topic=topic, version=8)[0][0]

    assert offset(OffsetSpec.EARLIEST) == 0, "-2: the tier's start"
    assert offset(OffsetSpec.EARLIEST_LOCAL) == log_start, "-4: the broker's own"
    out = subprocess.run([kcat, "-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-c", str(RECORDS),
                          "-q", "-f", "%o %s\\n"], capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines() == [f"{i} {v.decode()}" for i, (_, v, _) in enumerate(_records())], \
        out.stderr[-1000:]
    group = f"resume-{uuid.uuid4().hex[:6]}"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "error",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    try:
        while len(got) < RECORDS and time.monotonic() < deadline + 60:
            m = c.poll(0.3)
            if m is not None:
                assert m.error() is None, m.error()
                got.append((m.key(), m.value(), list(m.headers() or [])))
                if len(got) == 100:
                    c.commit(offsets=[TopicPartition(topic, 0, 100)], asynchronous=False)
    finally:
        c.close()
    assert got == _records(), "confluent-kafka: keys, values and headers, byte-identical"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "error",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    try:
        first = None
        for _ in range(300):
            if (m := c.poll(0.2)) is not None and m.error() is None:
                first = m.offset()
                break
    finally:
        c.close()
    assert first == 100, "the group resumes at its committed offset, in the tier"
