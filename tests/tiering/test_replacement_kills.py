"""Replacing tier segments killed -9 at each step (`tiering.replace`'s pause points), with a rewrite that keeps the
bytes: meanwhile every offset is served once with the broker's bytes; the next pass finishes or rolls back, and
leaves no object the metadata does not name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.fetchraw import fetch_raw
from tests.support.kafka import create_topic
from tests.support.replacing import killed_at, objects_against_metadata, served_as
from tests.support.tiering import settings, tier_once
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.model import SegmentState
from tierproxy.tier.replacement import generation

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_kill_9_at_each_step_of_a_replacement_then_a_pass(kafka: KafkaCluster, tmp_path: Path,
                                                          topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "batch.size": 16 * 1024})
    for i in range(3000):
        p.produce(topic_name, os.urandom(150), f"k{i % 300}".encode())
    p.flush(60)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_orphan_timeout_ms=0, tier_segment_delete_delay_ms=0)
    tier_once(s)
    raw, _ = fetch_raw(kafka.bootstrap, topic_name)
    assert len(served_as(s, topic_name, raw)) >= 6
    # point → (what the rerun does, how many; the generation served first while killed: rolled back or not)
    rerun = {"started": ("orphans_cleaned", 1, 0), "uploaded": ("orphans_cleaned", 1, 0),
             "finished": ("retired", 2, 1), "retired": ("retired_deleted", 2, 2), "deleting": ("retired_deleted", 2, 3)}
    for point, (what, count, gen) in rerun.items():
        killed_at(s, topic_name, point, tmp_path)
        before = served_as(s, topic_name, raw)  # killed there: every offset still served once, the broker's bytes
        assert generation(before[0]) == gen, point
        summary = tier_once(s)  # the next pass finishes the replacement or rolls it back
        assert getattr(summary, what) == count, (point, summary)
        assert served_as(s, topic_name, raw) == before, point
        found, named, states = objects_against_metadata(s, topic_name)
        assert found == named, (point, found ^ named)  # nothing leaked, nothing the metadata names is missing
        assert states == {SegmentState.COPY_SEGMENT_FINISHED}, point  # nothing left half way
