"""A `file://` tier is durable before its metadata says so: each object's bytes and name are fsynced before
`put` returns (so before COPY_SEGMENT_FINISHED); a segment recorded finished whose file is short (written by a
version without that, or a disk that lied) is copied again while the broker holds it, reported lost when not."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.support.kafka import broker_forgets, create_topic, small_segment_producer, small_segments, watermarks
from tests.support.tiering import offsets_of, settings, tier_once, tiered
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.storage import FileStore

RECORDS = 2000


def test_a_put_returns_once_the_file_and_every_new_directory_entry_are_fsynced(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    synced: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    store = FileStore(tmp_path / "tier")
    asyncio.run(store.put("t-1/0/00000000000000000000-x.log", b"bytes"))
    root = (tmp_path / "tier").resolve()
    data = [p for p in synced if Path(p).name.startswith(".tmp-")]
    assert data and Path(data[0]).parent == root / "t-1" / "0", synced  # the bytes, before the rename
    assert {str(root / "t-1" / "0"), str(root / "t-1"), str(root)} <= set(synced), synced  # the names
    assert synced.index(data[0]) < synced.index(str(root / "t-1" / "0"))


def _produce(kafka: KafkaCluster, topic: str) -> None:
    create_topic(kafka.bootstrap, topic, config={**small_segments(16 * 1024), "segment.ms": "300"})
    p = small_segment_producer(kafka.bootstrap)
    for i in range(RECORDS):
        p.produce(topic, f"value-{i}".encode() * 5)
    assert p.flush(30) == 0
    assert watermarks(kafka.bootstrap, topic)[1] == RECORDS


def _truncate(s_storage: str, md: object, keep: int) -> Path:
    rsm = RemoteStorageManager.from_uri(s_storage)
    path = Path(rsm.log_file(md))  # type: ignore[arg-type]
    with open(path, "r+b") as f:
        f.truncate(keep)
    return path


@pytest.mark.spark
def test_a_short_segment_file_is_copied_again_while_the_broker_holds_it(kafka: KafkaCluster, tmp_path: Path,
                                                                        topic_name: str) -> None:
    _produce(kafka, topic_name)
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=16 * 1024)
    assert tier_once(s).segments >= 3
    segs, raw, _ = tiered(s, topic_name)
    path = _truncate(s.storage, segs[1], 0)  # as a power loss left it: named, empty
    again = tier_once(s)  # a new job: it checks the files of what is recorded finished
    assert again.recopied == 1 and again.errors == [], again
    assert not path.exists()  # its objects deleted with it; the copy is a new segment (a new id)
    segs2, raw2, _ = tiered(s, topic_name)
    assert raw2 == raw and offsets_of(raw2) == offsets_of(raw)  # every byte as before
    rsm = RemoteStorageManager.from_uri(s.storage)
    assert all(Path(str(rsm.log_file(md))).stat().st_size == md.segment_size_in_bytes for md in segs2)

    log_start = broker_forgets(kafka.bootstrap, topic_name, above=segs2[0].end_offset + 1)
    assert log_start > segs2[0].end_offset
    _truncate(s.storage, segs2[0], 10)
    lost = tier_once(s)  # the broker no longer holds it: kept, reported
    assert lost.recopied == 0 and len(lost.errors) == 1 and "LOST" in lost.errors[0], lost
    assert f"offsets {segs2[0].start_offset}..{segs2[0].end_offset}" in lost.errors[0]
    assert segs2[0].segment_id in {md.segment_id for md in tiered(s, topic_name)[0]}
