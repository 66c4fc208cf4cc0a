"""A recorded abort hides its own records only (review of issue 63, finding 1), against the session's broker, real
PySpark and the embedded catalog: a long-lived transactional producer's later transactions reach the table and the
DataFrame when they are read from past the aborted one's marker."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support.iceberg import iceberg_cli, pyiceberg_rows, pyiceberg_table
from tests.support.kafka import create_topic
from tests.support.spark import tier_once
from tierproxy.dev.kafkadist import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_a_producers_commit_after_its_recorded_abort_reaches_the_table(kafka: KafkaCluster, spark: Any,
                                                                        tmp_path: Path) -> None:
    """P1 aborts T1 while P2 has a transaction open: pass 1 copies T1 and records it aborted, its marker above the
    stable offset; pass 2 tiers the marker; the Iceberg step's ledger moves past it; P1 (the same producer id)
    commits T2 and pass 3 tiers it. The next Iceberg pass and a DataFrame from inside T2's segment hold T2 (before:
    T1 was planned open above the tier, so every later transaction of P1 was dropped, and the ledger moved past
    them for good)."""
    topic = f"recorded-abort-{os.getpid()}"
    create_topic(kafka.bootstrap, topic, partitions=1)
    storage, metadata = f"file://{tmp_path}/tier", f"file://{tmp_path}/meta"
    p1, p2 = (Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"{n}-{uuid.uuid4().hex[:6]}"})
              for n in ("p1", "p2"))
    for p in (p1, p2):
        p.init_transactions(30)

    def write(p: Producer, values: list[str]) -> None:
        p.begin_transaction()
        for v in values:
            p.produce(topic, v.encode(), partition=0)
        p.flush(30)

    write(p1, [f"t1-{i}" for i in range(5)])
    write(p2, ["p2"])
    p1.abort_transaction(30)  # its marker lies above P2's open transaction: above the stable offset
    tier_once(kafka.bootstrap, topic, storage, metadata, tmp_path)  # T1's records, recorded aborted
    p2.commit_transaction(30)
    tier_once(kafka.bootstrap, topic, storage, metadata, tmp_path)  # T1's marker, P2's record and marker
    args = ["--bootstrap-server", kafka.bootstrap, "--storage", storage, "--metadata", metadata, "--topics", topic,
            "--table", "kafka.recorded_abort", "--master", "local[2]", "--once"]
    iceberg_cli(tmp_path, *args)  # the ledger moves past T1's marker
    t2 = [f"t2-{i}" for i in range(5)]
    write(p1, t2)
    p1.commit_transaction(30)
    tier_once(kafka.bootstrap, topic, storage, metadata, tmp_path)  # T2 and its marker
    iceberg_cli(tmp_path, *args)

    table = pyiceberg_table(f"sqlite:///{tmp_path}/tier/iceberg/catalog.db", f"file://{tmp_path}/tier/iceberg",
                            "kafka.recorded_abort")
    rows = sorted(bytes(r[1]).decode() for r in pyiceberg_rows(table))
    t2_start = 5 + 1 + 1 + 1  # T1, its marker, P2's record and marker
    df = spark.read.format("tierproxy").options(**{
        "kafka.bootstrap.servers": kafka.bootstrap, "storage": storage, "metadata": metadata, "subscribe": topic,
        "kafka.isolation.level": "read_committed", "startingOffsets": json.dumps({topic: {"0": t2_start}})}).load()
    dataframe = [bytes(r.value).decode() for r in df.orderBy("offset").collect()]
    assert {"iceberg": rows, "dataframe": dataframe} == {"iceberg": sorted(["p2", *t2]), "dataframe": t2}
