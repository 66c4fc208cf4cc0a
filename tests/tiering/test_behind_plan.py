"""A copy whose leader answers a stable end below the planned range — what a partition's new leader does until its
high watermark has caught up with what the old one committed. The copy is retried once the leader's stable end
reaches the plan's; it is never taken for "nothing to copy" or cut short.

With one broker the leader cannot fall behind, so the plan is made to run ahead of it instead: the last planned
range ends past the broker's stable end, and the records that make it whole are produced while the job waits."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support.kafka import create_topic, watermarks
from tests.support.spark import worker_session
from tests.support.tiering import offsets_of, settings, tiered
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.tiering.copy import BehindPlan, fetch_range, iter_fetch
from tierproxy.jobs.tiering.job import RunSummary, TieringJob
from tierproxy.jobs.tiering.plan import Range

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
AHEAD = 500


def _produce(bootstrap: str, topic: str, first: int, n: int) -> None:
    # batches of 100 records: several planned ranges, none holding a batch that straddles the next
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                  "batch.num.messages": 100})
    for i in range(first, first + n):
        p.produce(topic, f"v{i}".encode().ljust(100, b"x"), f"k{i}".encode())
    assert p.flush(30) == 0


class _PlanAhead(TieringJob):
    """A real job whose last planned range ends AHEAD offsets past the broker's stable end; `on_behind` runs when
    the first copy round has come back."""

    def __init__(self, *args: Any, on_behind: Any = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.on_behind = on_behind
        self.rounds = 0

    def _copy(self, ranges: list[Range], summary: RunSummary) -> None:
        last = max(ranges, key=lambda r: r.end)
        super()._copy([replace(r, end=r.end + AHEAD) if r is last else r for r in ranges], summary)

    def _run_tasks(self, tasks: Any) -> Any:
        out = super()._run_tasks(tasks)
        self.rounds += 1
        if self.rounds == 1 and self.on_behind is not None:
            self.on_behind()
        return out


def test_a_copy_behind_the_plan_waits_for_the_leader_and_copies_the_whole_range(
        kafka: KafkaCluster, tmp_path: Path, topic_name: str, caplog: pytest.LogCaptureFixture) -> None:
    create_topic(kafka.bootstrap, topic_name)
    _produce(kafka.bootstrap, topic_name, 0, 2000)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=64 * 1024,
                 remote_log_manager_task_retry_backoff_ms=200, remote_log_manager_task_retry_backoff_max_ms=20_000)
    # the leader catches up while the job waits to retry (a new leader's high watermark, moving on)
    catch_up = threading.Thread(target=_produce, args=(kafka.bootstrap, topic_name, 2000, AHEAD))
    job = _PlanAhead(s, progress=False, spark=worker_session(), on_behind=catch_up.start)
    try:
        with caplog.at_level(logging.WARNING, logger="tierproxy"):
            summary = job.run_once()
    finally:
        job.close()
        if catch_up.is_alive():
            catch_up.join(30)
    assert job.rounds == 2, "the behind copy was not retried"
    assert summary.failed == 1 and "BehindPlan" in summary.errors[0] and "2000" in summary.errors[0], summary
    assert any("failed (attempt 1)" in r.getMessage() for r in caplog.records)
    _, raw, _ = tiered(s, topic_name)
    assert offsets_of(raw) == list(range(2000 + AHEAD))  # the whole planned range: not short, not dropped


def test_a_leader_that_never_catches_up_leaves_a_hole_not_a_short_segment(
        kafka: KafkaCluster, tmp_path: Path, topic_name: str, caplog: pytest.LogCaptureFixture) -> None:
    create_topic(kafka.bootstrap, topic_name)
    _produce(kafka.bootstrap, topic_name, 0, 2000)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=64 * 1024, tier_task_max_attempts=2,
                 remote_log_manager_task_retry_backoff_ms=100, remote_log_manager_task_retry_backoff_max_ms=600)
    job = _PlanAhead(s, progress=False, spark=worker_session())
    try:
        with caplog.at_level(logging.WARNING, logger="tierproxy"):
            summary = job.run_once()
    finally:
        job.close()
    assert summary.failed == 2 and all("BehindPlan" in e for e in summary.errors), summary
    assert any("behind the plan" in r.getMessage() for r in caplog.records)
    assert any("left as a hole" in r.getMessage() for r in caplog.records)
    segs, raw, _ = tiered(s, topic_name)
    got = offsets_of(raw)
    assert got == list(range(len(got))) and 0 < len(got) < 2000  # the ranges before it; nothing past the plan's
    assert all(md.end_offset < 2000 for md in segs)


def test_a_planned_fetch_past_the_stable_end_raises_and_a_plain_one_ends_short(
        kafka: KafkaCluster, topic_name: str) -> None:
    create_topic(kafka.bootstrap, topic_name)
    _produce(kafka.bootstrap, topic_name, 0, 300)
    low, high = watermarks(kafka.bootstrap, topic_name)
    assert (low, high) == (0, 300)
    with pytest.raises(BehindPlan, match="stable end is 300, below the planned range's end 400"):
        fetch_range(kafka.bootstrap, topic_name, 0, 0, 400, True)
    # the DataFrame reader's live range reads what there is (its end is an estimate, not a plan)
    got = [o for batches, _ in iter_fetch(kafka.bootstrap, topic_name, 0, 0, 400)
           for b in batches for o in range(b.base_offset, b.last_offset + 1)]
    assert got == list(range(300))
    batches, _ = fetch_range(kafka.bootstrap, topic_name, 0, 0, 300, True)  # within the stable end: whole
    assert batches
