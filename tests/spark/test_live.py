"""The DataFrame reader's and Iceberg planner's live look-ups against a real broker (`tierproxy.jobs.spark.live`)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from tests.support.kafka import create_topic, delete_records
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.spark.live import live_aborted_reaching

pytestmark = [pytest.mark.kafka]


def test_aborted_transactions_are_asked_at_the_log_start_the_leader_has_now(kafka: KafkaCluster,
                                                                            topic_name: str) -> None:
    """Retention moved the log start after the plan read it (a CI pass met this): the look-up asks again at the
    leader's log start instead of failing the pass; an offset beyond the log's end is still an error."""
    create_topic(kafka.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(100):
        p.produce(topic_name, f"v{i}".encode(), partition=0)
    p.flush(30)
    assert delete_records(kafka.bootstrap, topic_name, {0: 50})[0] == (0, 50)
    assert live_aborted_reaching(kafka.bootstrap, topic_name, 0, 10) == []
    with pytest.raises(RuntimeError, match="error 1"):
        live_aborted_reaching(kafka.bootstrap, topic_name, 0, 1000)
