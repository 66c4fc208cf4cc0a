"""Issue 63, findings 6 and 7: a purge after the last pass stays purged through a restore, and no `tier` pass runs
on B while a restore into it is in progress.

The lost cluster here is the session's single broker (`kafka`): a topic of its own tiered into a tier of this
module's (one pass, a snapshot), then purged through a proxy after that pass. A "loss" needs no stopped broker: the
restore reads the tier alone. The target is the disaster's B (`tests/restore/conftest.py`), with a metadata topic
of this module's, so nothing of the disaster's tier or metadata is touched: no cluster is started here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from protocol.constants import OffsetSpec
from tests.support.cli import run_cli
from tests.support.kafka import (
    create_topic,
    delete_records,
    list_offsets_at_leaders,
    small_segment_producer,
    small_segments,
    watermarks,
)
from tests.support.proxy import ProxyProcess
from tests.support.restore import Disaster
from tests.support.tiering import settings, tier_once
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.jobs.tiering.job import RunSummary
from tierproxy.tier.ownership import RestoreInProgress, hand_over, recorded_owner
from tierproxy.tier.rsm import RemoteStorageManager

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.process]
RECORDS, PURGED_BELOW = 3000, 1000


@dataclass
class Source:
    topic: str
    storage: str
    metadata: str  # B's metadata topic for this tier
    work: Path
    tier_copy: Path  # the tier as the purge left it (still the lost cluster's)
    metadata_before: Path  # the lost cluster's metadata (a file store) before the purge


def _restore_args(b: KafkaCluster, src: Source) -> list[str]:
    return ["restore", "--bootstrap-server", b.bootstrap, "--storage", src.storage, "--metadata", src.metadata,
            "--topics", src.topic]


@pytest.fixture(scope="module")
def source(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Source:
    """The lost cluster's topic: tiered by one pass (its snapshot), then purged below PURGED_BELOW through a
    proxy; the purge is in that cluster's metadata only, after the snapshot."""
    work = tmp_path_factory.mktemp("interrupted")
    topic = f"purged-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1, 1, small_segments())
    prod = small_segment_producer(kafka.bootstrap)
    for i in range(RECORDS):
        prod.produce(topic, f"record-{i}-{'p' * 60}".encode(), partition=0)
    assert prod.flush(30) == 0
    s = settings(kafka.bootstrap, work, topic)
    summary = tier_once(s)
    assert summary.segments > 0 and summary.snapshot, summary
    shutil.copytree(work / "meta", work / "meta-before")
    p = ProxyProcess(kafka.bootstrap, work, extra={"TIERPROXY_STORAGE": s.storage,
                                                   "TIERPROXY_METADATA": s.metadata or ""})
    try:
        wait_until(lambda: list_offsets_at_leaders(p.bootstrap, OffsetSpec.EARLIEST, quiet=True, topic=topic),
                   "the proxy's tier loaded")
        assert delete_records(p.bootstrap, topic, {0: PURGED_BELOW}) == {0: (0, PURGED_BELOW)}
    finally:
        p.stop()
    shutil.copytree(work / "tier", work / "tier-copy")
    return Source(topic, s.storage, f"topic:__tp_meta_{topic.replace('-', '_')}", work, work / "tier-copy",
                  work / "meta-before")


@pytest.fixture(scope="module")
def killed(disaster: Disaster, source: Source) -> Source:
    """A restore of the source's topic into B killed -9 in its fill (one record per Produce: slow enough): the
    tier is handed over to B, the mounts are not written."""
    b = disaster.b
    env = {**os.environ, "TIERPROXY_RESTORE_FILL_BATCH_RECORDS": "1"}
    with open(source.work / "restore.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tierproxy.cli", *_restore_args(b, source)], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: proc.poll() is None and source.topic in AdminClient(
            {"bootstrap.servers": b.bootstrap}).list_topics(timeout=10).topics and
            watermarks(b.bootstrap, source.topic)[1] > 10, "the fill under way", timeout=120, interval=0.2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert 0 < watermarks(b.bootstrap, source.topic)[1] < RECORDS, "killed mid-fill"
    return source


def _b_tier_pass(disaster: Disaster, src: Source, state: Path) -> RunSummary:
    return tier_once(settings(disaster.b.bootstrap, src.work, src.topic, storage=src.storage, metadata=src.metadata,
                              tier_state_dir=state))


@pytest.fixture(scope="module")
def restored(disaster: Disaster, killed: Source) -> Iterator[Source]:
    """The killed restore run again to its end."""
    out = run_cli(*_restore_args(disaster.b, killed))
    assert out.returncode == 0, out.stdout + out.stderr
    yield killed


def test_tier_on_b_is_refused_between_the_hand_over_and_the_mounts(disaster: Disaster, killed: Source,
                                                                   tmp_path: Path) -> None:
    """Finding 7: between the hand-over and the mounts a pass on B would tier the restored topic under B's own
    id; it is refused, naming the restore, until a rerun has written the mounts."""
    with pytest.raises(RestoreInProgress, match=f"into cluster {disaster.b.cluster_id} is in progress"):
        _b_tier_pass(disaster, killed, tmp_path / "state")
    out = run_cli(*_restore_args(disaster.b, killed))
    assert out.returncode == 0, out.stdout + out.stderr
    summary = _b_tier_pass(disaster, killed, tmp_path / "state")
    assert summary.failed == 0 and not summary.errors, summary


def test_a_purge_after_the_last_pass_is_not_served_after_the_restore(disaster: Disaster, restored: Source,
                                                                     tmp_path: Path) -> None:
    """Finding 6: DeleteRecords through the proxy after the last pass; after the restore, the purged offsets are
    not served again: the purge was in the tier (a purge record), not only in the lost cluster's metadata."""
    p = ProxyProcess(disaster.b.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": restored.storage,
                                                            "TIERPROXY_METADATA": restored.metadata})
    try:
        wait_until(lambda: list_offsets_at_leaders(p.bootstrap, OffsetSpec.EARLIEST, quiet=True,
                                                   topic=restored.topic), "the proxy's tier loaded")
        assert list_offsets_at_leaders(p.bootstrap, OffsetSpec.EARLIEST, topic=restored.topic)[0][0] == PURGED_BELOW
        c = Consumer({"bootstrap.servers": p.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.assign([TopicPartition(restored.topic, 0, 0)])
        try:
            first = None
            for _ in range(300):
                if (m := c.poll(0.2)) is not None and m.error() is None:
                    first = m.offset()
                    break
        finally:
            c.close()
        assert first == PURGED_BELOW, "reading from 0 begins at the purge, never below it"
    finally:
        p.stop()


def test_a_proxy_whose_metadata_lacks_the_purge_serves_from_the_purge_record(kafka: KafkaCluster, source: Source,
                                                                            tmp_path: Path) -> None:
    """Finding 6, the proxy's side: the purge record is read by a proxy whose metadata does not hold the purge
    (here the lost cluster's metadata as it was before the purge): it never serves below it."""
    p = ProxyProcess(kafka.bootstrap, tmp_path, extra={"TIERPROXY_STORAGE": f"file://{source.tier_copy}",
                                                       "TIERPROXY_METADATA": f"file://{source.metadata_before}"})
    try:
        wait_until(lambda: list_offsets_at_leaders(p.bootstrap, OffsetSpec.EARLIEST, quiet=True,
                                                   topic=source.topic), "the proxy's tier loaded")
        assert list_offsets_at_leaders(p.bootstrap, OffsetSpec.EARLIEST, topic=source.topic)[0][0] == PURGED_BELOW
    finally:
        p.stop()


def test_a_run_killed_after_its_mounts_leaves_no_restore_in_progress_once_run_again(disaster: Disaster,
                                                                                    restored: Source,
                                                                                    tmp_path: Path) -> None:
    """A run killed after its last topic's mounts and before it said the restore had ended (the ownership record
    still says in progress; the state says every topic finished, and no group is left): the rerun finds nothing to
    do and ends the restore, so `tier` on B runs again (before: every rerun said "nothing to do" and every pass on
    B was refused for good, naming a restore that would never finish)."""
    rsm = RemoteStorageManager.from_uri(restored.storage)

    async def as_a_killed_run_left_it() -> None:
        try:
            await hand_over(rsm, await recorded_owner(rsm), disaster.b.cluster_id, "the lost cluster")
        finally:
            await rsm.close()

    asyncio.run(as_a_killed_run_left_it())
    with pytest.raises(RestoreInProgress):
        _b_tier_pass(disaster, restored, tmp_path / "state")
    out = run_cli(*_restore_args(disaster.b, restored))
    assert out.returncode == 0 and "nothing to do" in out.stdout, out.stdout + out.stderr
    summary = _b_tier_pass(disaster, restored, tmp_path / "state")
    assert summary.failed == 0 and not summary.errors, summary
