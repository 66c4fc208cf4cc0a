"""`spark.read.format("tierproxy")` against the real broker, compared row for row with Spark's own Kafka source
(spark-sql-kafka-0-10) reading the same offsets from the broker before the broker deleted them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.spark.read_job import digest
from tests.support.jvm import options as jvm_options
from tests.support.kafka import create_topic, watermarks
from tests.support.s3 import S3Server
from tests.support.spark import (
    delete_on_broker,
    kafka_source,
    read,
    spark_home,
    standalone_cluster,
    tier_once,
)
from tests.support.tiering import produce_everything
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.spark.options import parse_options
from tierproxy.jobs.spark.plan import Planner

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


class History:
    def __init__(self, bootstrap: str, topic: str, tmp: Path) -> None:
        self.bootstrap, self.topic, self.tmp = bootstrap, topic, tmp
        self.storage, self.metadata = f"file://{tmp}/tier", f"file://{tmp}/meta"

    def tier(self, **opts: str) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.bootstrap, "storage": self.storage, "metadata": self.metadata,
                "subscribe": self.topic, **opts}








@pytest.fixture(scope="module")
def history(kafka: KafkaCluster, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every codec, headers, null keys and values, transactions with aborts, on 2 partitions: what Spark's Kafka
    source reads from the broker (both isolation levels), then tiered, then deleted by the broker."""
    tmp = tmp_path_factory.mktemp("history")
    topic = f"spark-history-{os.getpid()}"
    create_topic(kafka.bootstrap, topic, partitions=2, config={"segment.ms": "500"})
    produce_everything(kafka.bootstrap, topic)
    h = History(kafka.bootstrap, topic, tmp)
    expected = {level: kafka_source(spark, kafka.bootstrap, topic, includeHeaders="true",
                                    **{"kafka.isolation.level": level})
                for level in ("read_uncommitted", "read_committed")}
    ends = [watermarks(kafka.bootstrap, topic, i)[1] for i in range(2)]
    tier_once(kafka.bootstrap, topic, h.storage, h.metadata, tmp)
    delete_on_broker(kafka.bootstrap, topic, 2, above=ends)  # and ticks after the tier's end: a hole
    return {"h": h, "expected": expected, "ends": ends}


@pytest.mark.parametrize("level", ["read_uncommitted", "read_committed"])
def test_tier_dataframe_equals_sparks_kafka_source_after_the_broker_deleted(spark: Any, history: dict[str, Any],
                                                                            level: str) -> None:
    h, expected = history["h"], history["expected"][level]
    assert all(watermarks(h.bootstrap, h.topic, i)[0] > 0 for i in range(2))  # the broker no longer has offset 0
    got = read(spark, "tierproxy", h.tier(includeHeaders="true", **{"kafka.isolation.level": level}))
    assert len(expected) > 1500
    for a, b in zip(got, expected, strict=False):
        assert a == b, [(i, x, y) for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    assert got == expected
    # what the test covers is really there
    keys = {r[0] is None for r in got}
    values = {r[1] is None for r in got}
    assert keys == {True, False} and values == {True, False}
    assert any(v is None for r in got for _, v in r[7] or []) and all(r[6] == 0 for r in got)
    assert any(r[7] is None for r in got)
    aborted = [r for r in got if r[1] is not None and r[1].startswith(b"abort-")]
    assert (aborted == []) == (level == "read_committed")


def test_default_schema_has_no_headers_and_matches_sparks_kafka_source(spark: Any, history: dict[str, Any]) -> None:
    h = history["h"]
    ours = spark.read.format("tierproxy").options(**h.tier()).load()
    theirs = spark.read.format("kafka").option("kafka.bootstrap.servers", h.bootstrap).option("subscribe", h.topic) \
        .load()
    assert ours.schema == theirs.schema
    assert ours.schema.fieldNames() == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    with_headers = spark.read.format("tierproxy").options(**h.tier(includeHeaders="true")).load()
    assert with_headers.schema == spark.read.format("kafka").option("kafka.bootstrap.servers", h.bootstrap) \
        .option("subscribe", h.topic).option("includeHeaders", "true").load().schema


def test_tier_plus_live_holds_every_offset_exactly_once(kafka: KafkaCluster, spark: Any, tmp_path: Path,
                                                        topic_name: str) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    create_topic(kafka.bootstrap, topic_name, partitions=2)
    # idempotent: a retried batch keeps its place, so offset order is production order (asserted on values below)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.num.messages": 50,
                  "enable.idempotence": True})
    for i in range(6000):
        p.produce(topic_name, f"v{i}".encode() * 20, f"k{i}".encode(), partition=i % 2)
        if i == 3999:
            p.flush(30)
            h = History(kafka.bootstrap, topic_name, tmp_path)
            tier_once(kafka.bootstrap, topic_name, h.storage, h.metadata, tmp_path)
    p.flush(30)
    tiered = read(spark, "tierproxy", h.tier())
    ends = {part: max(r[4] for r in tiered if r[3] == part) + 1 for part in (0, 1)}
    assert ends == {0: 2000, 1: 2000}
    # the broker drops what the tier holds (as retention would): from now on only tier + live has it all
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for fut in admin.delete_records([TopicPartition(topic_name, part, ends[part]) for part in (0, 1)]).values():
        fut.result(30)
    assert [watermarks(kafka.bootstrap, topic_name, part) for part in (0, 1)] == [(2000, 3000), (2000, 3000)]
    rows = read(spark, "tierproxy", h.tier(includeLive="true"))
    for part in (0, 1):
        assert [r[4] for r in rows if r[3] == part] == list(range(3000))  # every offset exactly once
        assert [r[1] for r in rows if r[3] == part] == [f"v{i}".encode() * 20 for i in range(part, 6000, 2)]
    live = kafka_source(spark, kafka.bootstrap, topic_name)  # the broker's own answer for what it still has
    assert len(live) == 2000 and [r for r in rows if r[4] >= 2000] == live
    # an aborted and a committed transaction in the live range: read_committed drops exactly the aborted one
    tx = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{topic_name}"})
    tx.init_transactions(30)
    for outcome in ("abort", "commit"):
        tx.begin_transaction()
        for i in range(10):
            tx.produce(topic_name, f"{outcome}-{i}".encode(), partition=0)
        tx.flush(30)  # on the broker before the abort (an abort purges what was not sent yet)
        tx.commit_transaction(30) if outcome == "commit" else tx.abort_transaction(30)
    committed = read(spark, "tierproxy", h.tier(includeLive="true", **{"kafka.isolation.level": "read_committed"}))
    assert watermarks(kafka.bootstrap, topic_name, 0)[1] == 3000 + 22  # 20 records and 2 markers were written
    values = [r[1] for r in committed if r[3] == 0]
    assert values[:3000] == [f"v{i}".encode() * 20 for i in range(0, 6000, 2)]
    assert values[3000:] == [f"commit-{i}".encode() for i in range(10)]
    assert [r for r in committed if r[4] >= 2000] == kafka_source(spark, kafka.bootstrap, topic_name, **{
        "kafka.isolation.level": "read_committed"})
    # only the live part, by offsets: one slice per partition from the brokers
    df = spark.read.format("tierproxy").options(**h.tier(includeLive="true", startingOffsets=json.dumps(
        {topic_name: {"0": 2500, "1": 2999}}))).load()
    assert df.rdd.getNumPartitions() == 2 and df.count() == 500 + 20 + 1  # read_uncommitted: the aborted ones too


def test_a_hole_is_data_loss_unless_allowed(spark: Any, history: dict[str, Any]) -> None:
    """The ticks the broker deleted after the pass were never tiered: tier + live has a hole there."""
    h = history["h"]
    with pytest.raises(Exception, match="neither tiered nor on the brokers"):
        read(spark, "tierproxy", h.tier(includeLive="true"))
    rows = read(spark, "tierproxy", h.tier(includeLive="true", failOnDataLoss="false"))
    for part in (0, 1):
        start, hw = watermarks(h.bootstrap, h.topic, part)
        offsets = [r[4] for r in rows if r[3] == part]
        hole = set(range(history["ends"][part], start))
        assert offsets[0] == 0 and offsets[-1] < hw and len(offsets) == len(set(offsets))
        assert not hole & set(offsets)  # the hole, skipped
        assert len(set(range(hw)) - hole - set(offsets)) < 20  # otherwise only transaction markers are missing


def test_tier_only_range_beyond_the_tier_is_data_loss_unless_allowed(spark: Any, history: dict[str, Any]) -> None:
    h = history["h"]
    beyond = json.dumps({h.topic: {"0": history["ends"][0] + 5}})
    with pytest.raises(Exception, match="neither tiered nor on the brokers"):
        read(spark, "tierproxy", h.tier(endingOffsets=beyond, assign=json.dumps({h.topic: [0]}), subscribe=""))
    rows = read(spark, "tierproxy", h.tier(endingOffsets=beyond, failOnDataLoss="false",
                                           assign=json.dumps({h.topic: [0]}), subscribe=""))
    assert rows and max(r[4] for r in rows) < history["ends"][0]


def test_a_narrow_range_reads_only_the_segments_that_hold_it(kafka: KafkaCluster, spark: Any,
                                                            tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.num.messages": 20})
    t0 = int(time.time() * 1000) - 3_600_000  # an hour ago: inside the broker's retention
    for i in range(20000):
        p.produce(topic_name, f"value-{i:06d}-".encode() * 4, f"k{i}".encode(), timestamp=t0 + i)
    p.flush(30)
    h = History(kafka.bootstrap, topic_name, tmp_path)
    tier_once(kafka.bootstrap, topic_name, h.storage, h.metadata, tmp_path)
    logs = sorted((tmp_path / "tier").rglob("*.log"))
    assert len(logs) > 20
    narrow = h.tier(startingOffsets=json.dumps({topic_name: {"0": 5000}}),
                    endingOffsets=json.dumps({topic_name: {"0": 6000}}))
    df = spark.read.format("tierproxy").options(**narrow).load()
    parts = df.rdd.getNumPartitions()
    rows = read(spark, "tierproxy", narrow)
    assert [r[4] for r in rows] == list(range(5000, 6000))
    assert rows[0][1] == b"value-005000-" * 4 and round(rows[0][5].timestamp() * 1000) == t0 + 5000

    def holds(log: Path) -> bool:
        first = int(log.name.split("-")[0])
        nxt = [int(o.name.split("-")[0]) for o in logs if int(o.name.split("-")[0]) > first]
        return first < 6000 and (not nxt or min(nxt) > 5000)

    # a slice per segment holding the range, none for the others; small segments share an input partition
    planned = Planner(parse_options(narrow)).plan()
    held = sorted(int(log.name.split("-")[0]) for log in logs if holds(log))
    assert [s.segment.start_offset for s in planned if s.segment] == held and len(held) < len(logs) / 4
    assert parts == 1
    # prove it: hide every other segment's log; the narrow read still works, a full read no longer does
    hidden = [log for log in logs if not holds(log)]
    for log in hidden:
        log.rename(log.with_suffix(".hidden"))
    assert read(spark, "tierproxy", narrow) == rows
    with pytest.raises(Exception, match=r"ObjectMissing"):
        read(spark, "tierproxy", h.tier())
    for log in hidden:
        log.with_suffix(".hidden").rename(log)
    # timestamps resolve through the time index to the same range
    by_time = read(spark, "tierproxy", h.tier(startingTimestamp=str(t0 + 5000), endingTimestamp=str(t0 + 6000)))
    assert by_time == rows
    # a segment larger than maxBytesPerPartition is split into byte ranges, every offset once (over the first
    # fifth of the topic: a Spark task per range)
    fifth = h.tier(maxBytesPerPartition="8192", endingOffsets=json.dumps({topic_name: {"0": 4000}}))
    split = spark.read.format("tierproxy").options(**fifth).load()
    assert split.rdd.getNumPartitions() > len([log for log in logs if int(log.name.split("-")[0]) < 4000])
    assert sorted(r.offset for r in split.select("offset").collect()) == list(range(4000))
    # small segments pack ~31 to an input partition (16 KiB + the 4 MiB open cost each, 128 MiB); minPartitions
    # asks for more, as in Spark's Kafka source
    packed = spark.read.format("tierproxy").options(**h.tier()).load().rdd.getNumPartitions()
    assert 1 <= packed <= len(logs) // 30 + 1
    spread = spark.read.format("tierproxy").options(**h.tier(minPartitions=str(packed + 5))).load()
    assert spread.rdd.getNumPartitions() >= packed + 5
    assert sorted(r.offset for r in spread.select("offset").collect()) == list(range(20000))


def test_it_runs_on_a_spark_standalone_cluster(history: dict[str, Any], spark: Any, tmp_path: Path) -> None:
    """Slow (~60-100 s): a Spark standalone master and worker start, and spark-submit runs the read on them (JVM
    starts dominate)."""
    h = history["h"]
    local = read(spark, "tierproxy", h.tier(includeHeaders="true"))
    out = tmp_path / "result.json"
    with standalone_cluster(tmp_path) as master:
        proc = subprocess.run([str(spark_home() / "bin" / "spark-submit"), "--master", master,
                               "--conf", f"spark.pyspark.python={sys.executable}",
                               "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false",
                               "--conf", "spark.sql.session.timeZone=UTC",
                               "--conf", f"spark.executor.extraJavaOptions={' '.join(jvm_options)}",
                               str(Path(__file__).parent / "read_job.py"), h.bootstrap, h.storage, h.metadata,
                               h.topic, str(out)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"})
        assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["master"] == master and result["executors"] == 2
    assert result["rows"] == len(local) and result["digest"] == digest(local)


@pytest.mark.s3
def test_reads_an_s3_tier(kafka: KafkaCluster, spark: Any, s3: S3Server, tmp_path: Path, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.num.messages": 100,
                  "compression.type": "lz4"})
    for i in range(3000):
        p.produce(topic_name, f"s3-{i}".encode() * 20, f"k{i}".encode(), headers=[("i", str(i).encode())])
    p.flush(30)
    expected = kafka_source(spark, kafka.bootstrap, topic_name, includeHeaders="true")
    s3.create_bucket("tier")
    storage = f"s3://tier/history?endpoint={s3.endpoint}&region={s3.region}"
    tier_once(kafka.bootstrap, topic_name, storage, f"file://{tmp_path}/meta", tmp_path)
    h = History(kafka.bootstrap, topic_name, tmp_path)
    h.storage = storage
    assert read(spark, "tierproxy", h.tier(includeHeaders="true")) == expected
    narrow = read(spark, "tierproxy", h.tier(startingOffsets=json.dumps({topic_name: {"0": 1234}}),
                                            endingOffsets=json.dumps({topic_name: {"0": 1300}})))
    assert [r[4] for r in narrow] == list(range(1234, 1300))
