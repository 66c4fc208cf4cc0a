"""RemoteStorageManager on the filesystem and on a real S3 server (SeaweedFS): exact byte ranges, idempotent
copy and delete, missing vs unavailable."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.records import Record, build_batch
from tests.support.s3 import S3Server
from tests.support.segments import seg, tp
from tierproxy.tier.indexes import build_segment
from tierproxy.tier.model import uuid_str
from tierproxy.tier.rsm import IndexType, RemoteStorageManager
from tierproxy.tier.storage import ObjectMissing, S3Store, StorageUnavailable


def _records(n: int = 200) -> bytes:
    return b"".join(build_batch([Record(i * 10 + j, 1_700_000_000_000 + i, None, os.urandom(300)) for j in range(10)],
                                base_offset=i * 10) for i in range(n // 10))


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def rsm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RemoteStorageManager]:
    if request.param == "file":
        r = RemoteStorageManager.from_uri(f"file://{tmp_path}/tier")
        yield r
        return
    s3: S3Server = request.getfixturevalue("s3")

    s3.create_bucket("tier")
    yield RemoteStorageManager(S3Store("tier", endpoint=s3.endpoint, region=s3.region, access_key=s3.access_key,
                                       secret_key=s3.secret_key, part_size=5 << 20), "cluster-a/tiered")


def test_copy_fetch_ranges_and_indexes_exact(rsm: RemoteStorageManager) -> None:
    raw = _records()
    files = build_segment(raw)
    md = seg(tp("orders", 2), files.start_offset, files.end_offset)

    async def run() -> None:
        await rsm.copy_segment(md, files)
        assert await rsm.fetch_log(md, 0) == raw
        for start, end in ((0, 1), (17, 4096), (len(raw) - 10, len(raw)), (1000, None), (len(raw), None)):
            assert await rsm.fetch_log(md, start, end) == raw[start:end]
        assert await rsm.fetch_index(md, IndexType.OFFSET) == files.offset_index
        assert await rsm.fetch_index(md, IndexType.LEADER_EPOCH) == files.leader_epoch_checkpoint
        await rsm.copy_segment(md, files)  # idempotent: a second copy overwrites in place
        assert await rsm.fetch_log(md, 0) == raw
        await rsm.delete_segment(md)
        await rsm.delete_segment(md)  # idempotent: already gone is fine
        with pytest.raises(ObjectMissing):
            await rsm.fetch_log(md, 0, 10)
        with pytest.raises(ObjectMissing):
            await rsm.fetch_index(md, IndexType.TIMESTAMP)
        await rsm.close()

    asyncio.run(run())


def test_object_layout(rsm: RemoteStorageManager) -> None:
    md = seg(tp("orders", 7, bytes(16)), 42, 99)
    key = rsm.key(md, "log")
    tail = key.split("/")[-3:]
    assert tail[0] == "orders-AAAAAAAAAAAAAAAAAAAAAA" and tail[1] == "7"
    assert tail[2] == f"00000000000000000042-{uuid_str(md.segment_id.id)}.log"
    assert key.startswith(rsm.prefix)


@pytest.mark.s3
def test_multipart_upload_of_a_big_segment(s3: S3Server) -> None:
    async def run() -> None:
        store = S3Store("big", endpoint=s3.endpoint, region=s3.region, access_key=s3.access_key,
                        secret_key=s3.secret_key, part_size=5 << 20)
        c = await store._c()
        await c.create_bucket(Bucket="big")
        data = os.urandom(12 << 20)
        await store.put("seg.log", data)
        assert await store.size("seg.log") == len(data)
        assert await store.get("seg.log", (5 << 20) - 3, (5 << 20) + 3) == data[(5 << 20) - 3:(5 << 20) + 3]
        await store.close()

    asyncio.run(run())


@pytest.mark.s3
def test_stopped_s3_is_unavailable_not_missing(s3: S3Server) -> None:
    s3.proc.kill()
    s3.proc.wait(10)

    async def run() -> None:
        store = S3Store("tier", endpoint=s3.endpoint, region=s3.region, access_key=s3.access_key,
                        secret_key=s3.secret_key)
        with pytest.raises(StorageUnavailable):
            await store.get("x.log", 0, 10)
        await store.close()

    asyncio.run(run())


def test_stores_share_botocores_service_data_not_their_sessions() -> None:
    """Each store's client comes from a session of its own (its credentials its own), all reading botocore's
    endpoint and S3 model data through one loader: a second store parses none of it again."""
    from tierproxy.tier import storage

    first, second = storage._session(), storage._session()
    assert first is not second
    assert second.get_component("data_loader") is first.get_component("data_loader")


def test_a_file_store_refuses_keys_that_leave_its_root_and_lists_by_prefix(tmp_path: Path) -> None:
    """Keys are checked by their text (no path resolution per read) and still never leave the root; a listing walks
    the prefix's directory only, and names every object under it."""
    from tierproxy.tier.storage import FileStore, StorageError

    store = FileStore(tmp_path / "root")
    (tmp_path / "outside").write_bytes(b"secret")
    for key in ["../outside", "a/../../outside", "/etc/passwd", ".", "a\0b"]:
        with pytest.raises(StorageError, match="escapes the store"):
            store.local_path(key)
    asyncio.run(store.put("a/b/one.log", b"1"))
    asyncio.run(store.put("a/b/two.log", b"2"))
    asyncio.run(store.put("a/c/three.log", b"3"))
    assert store.local_path("a/./b/one.log").read_bytes() == b"1"
    assert asyncio.run(store.list("a/b/")) == ["a/b/one.log", "a/b/two.log"]
    assert asyncio.run(store.list("a/b/t")) == ["a/b/two.log"]
    assert asyncio.run(store.list("a/")) == ["a/b/one.log", "a/b/two.log", "a/c/three.log"]
    assert asyncio.run(store.list("")) == ["a/b/one.log", "a/b/two.log", "a/c/three.log"]
    assert asyncio.run(store.list("nothing/here/")) == []
