"""Issue 63, finding 1: a transaction decided above the pass's stable offset, across a restore.

On A (`tests/support/restore.py`, topic TXNS): P1 wrote TXN_RECORDS in a transaction, P2 opened one after them, P1
aborted; the stable offset stopped at P2's first record, so A's pass copied P1's records but not its marker; then A
was lost. B's log begins at S and knows nothing of P1: the tier's recorded outcome is all that says it aborted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from protocol.constants import ApiKey
from protocol.records import Record, build_batch
from tests.support.cli import run_cli
from tests.support.iceberg import iceberg_cli, pyiceberg_rows, pyiceberg_table
from tests.support.kafka import read_to_end, watermarks
from tests.support.proxy import ProxyProcess
from tests.support.restore import TXN_RECORDS, TXNS, Disaster, tier_settings
from tests.support.tiering import tier_once
from tierproxy.jobs.tiering.cluster import describe_cluster
from tierproxy.kafka.wireclient import WireClient

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.process]

ON_B = [f"on-b-{i}" for i in range(20)]
ABORTED = [f"p1-aborted-{i}" for i in range(TXN_RECORDS)]
SAME_PID = "on-b-from-p1s-producer-id"
B_ALL = [*ON_B, SAME_PID]


def produce_as(bootstrap: str, producer_id: int, value: str) -> None:
    """One idempotent record in TXNS-0 from `producer_id` (B hands out producer ids from 0 again: any of B's
    producers may hold one of A's), sent to its leader as a new producer's first batch."""
    view = describe_cluster(bootstrap)
    part = next(p for p in view.partitions if (p.topic, p.partition) == (TXNS, 0))
    batch = build_batch([Record(0, 0, None, value.encode())], producer_id=producer_id, producer_epoch=0,
                        base_sequence=0)
    with WireClient(view.leader_address(part), client_id="test-same-pid") as w:
        resp = w.request(ApiKey.PRODUCE, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 30_000,
                                             "topic_data": [{"name": TXNS, "partition_data": [
                                                 {"index": 0, "records": batch}]}]})
    assert resp["responses"][0]["partition_responses"][0]["error_code"] == 0, resp


def _outcomes(bootstrap: str) -> dict[tuple[int, int], Any]:
    """The transaction outcomes B's metadata holds for TXNS (under A's id: the history it continues)."""
    from tierproxy.tier.open import open_metadata

    async def read() -> dict[tuple[int, int], Any]:
        rlmm = open_metadata("topic:", bootstrap)
        await rlmm.start()
        try:
            pc = rlmm.cache.find(TXNS, 0)
            return {} if pc is None else {k: o.outcome.name for k, o in pc.outcomes.items()}
        finally:
            await rlmm.close()

    return asyncio.run(read())


def test_an_abort_above_the_stable_offset_stays_an_abort_after_the_restore(disaster: Disaster, tmp_path: Path,
                                                                          spark: Any) -> None:
    """Through a proxy in front of B, in the tier's DataFrame and in the Iceberg step on B, read_committed never
    sees P1's records, and B's own records after S are not held back behind P1's marker, which no segment will
    ever bring (before: P1's records were served as committed, and the Iceberg step held the partition back for
    good)."""
    b, tier = disaster.b, disaster.tier
    out = run_cli("restore", "--bootstrap-server", b.bootstrap, "--storage", f"file://{tier}", "--metadata",
                  "topic:", "--topics", TXNS)
    assert out.returncode == 0, out.stdout + out.stderr
    s = watermarks(b.bootstrap, TXNS, 0)[1]
    assert s >= TXN_RECORDS + 2, f"P2's record and P1's marker lie in the lost range [N, S): S = {s}"

    prod = Producer({"bootstrap.servers": b.bootstrap})  # B goes on after S, and B's pass tiers it
    for value in ON_B:
        prod.produce(TXNS, value.encode(), partition=0)
    assert prod.flush(30) == 0
    # and one of B's producers has P1's id: its tiered segment's producer snapshot holds P1's id with no
    # transaction open (before: the proxy took that as P1's transaction decided inside it, committed)
    [(p1_id, _first)] = list(_outcomes(b.bootstrap))
    produce_as(b.bootstrap, p1_id, SAME_PID)
    assert tier_once(tier_settings(b.bootstrap, tier, tmp_path / "state-b")).segments > 0

    p = ProxyProcess(b.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{tier}",
                                                   "TIERPROXY_METADATA": "topic:"})
    try:
        assert read_to_end(p.bootstrap, TXNS, "read_uncommitted") == [*ABORTED, *B_ALL], "P1's records are tiered"
        proxied = read_to_end(p.bootstrap, TXNS, "read_committed")
    finally:
        p.stop()

    df = spark.read.format("tierproxy").options(**{
        "kafka.bootstrap.servers": b.bootstrap, "storage": f"file://{tier}", "metadata": "topic:",
        "subscribe": TXNS, "failOnDataLoss": "false", "kafka.isolation.level": "read_committed"}).load()
    dataframe = [bytes(r.value).decode() for r in df.orderBy("offset").collect()]

    iceberg_cli(tmp_path, "--bootstrap-server", b.bootstrap, "--storage", f"file://{tier}", "--metadata", "topic:",
                "--topics", TXNS, "--table", "kafka.txns", "--master", "local[2]", "--once")
    table = pyiceberg_table(f"sqlite:///{tier}/iceberg/catalog.db", f"file://{tier}/iceberg", "kafka.txns")
    rows = sorted(bytes(r[1]).decode() for r in pyiceberg_rows(table))

    # the three readers, each: P1's records never, B's records not held back behind P1's lost marker
    assert {"proxy": proxied, "dataframe": dataframe, "iceberg": rows} == {
        "proxy": B_ALL, "dataframe": B_ALL, "iceberg": sorted(B_ALL)}
    assert list(_outcomes(b.bootstrap).values()) == ["ABORTED"], "A's pass recorded P1's outcome"
