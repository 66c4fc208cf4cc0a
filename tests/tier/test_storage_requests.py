"""The S3 store's request counts (`tier.requests`) are what the S3 server itself counted: SeaweedFS's own
Prometheus metrics (`SeaweedFS_s3_request_total{type}`, its bucket traffic in bytes), phase by phase, for every kind
of request the store sends (small and multipart uploads, whole and ranged GETs, a missing key, HEADs, listings past
a page, a multipart upload listing and abort, batch deletes)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest

from tests.support.s3 import S3Server
from tierproxy.tier.storage import ObjectMissing, S3Store

pytestmark = [pytest.mark.s3]
BUCKET = "counted"


def test_counts_equal_what_seaweedfs_counted(s3: S3Server) -> None:
    s3.create_bucket(BUCKET)
    st = S3Store(BUCKET, endpoint=s3.endpoint, region=s3.region, access_key=s3.access_key,
                 secret_key=s3.secret_key, part_size=5 << 20)
    big = bytes(range(256)) * (11 << 12)  # 11 MiB: three parts of at most 5 MiB

    # SeaweedFS's types are HTTP methods, coarser than our kinds: each phase says how its kinds map on to them
    async def phase(work: Callable[[], Awaitable[object]], ours_to_theirs: dict[str, str]) -> None:
        before, counted = await asyncio.to_thread(s3.counted, BUCKET), st.counts.as_dict()
        await work()
        after = st.counts.as_dict()
        expected: Counter[str] = Counter()
        for kind, n in after["requests"].items():
            if n > counted["requests"][kind]:
                expected[ours_to_theirs[kind]] += n - counted["requests"][kind]
        # SeaweedFS counts a request once its handler has returned, which may be after the client got the answer
        # (a DeleteObjects went uncounted for a moment once): its counts are read until they reach ours (bounded)
        for _ in range(100):
            theirs = await asyncio.to_thread(s3.counted, BUCKET) - before
            if all(theirs.requests[k] >= n for k, n in expected.items()):
                break
            await asyncio.sleep(0.05)
        assert theirs.requests == expected, work
        assert (after["bytes_read"] - counted["bytes_read"], after["bytes_written"] - counted["bytes_written"]) \
            == (theirs.sent, theirs.received), work

    async def writes() -> None:
        await asyncio.gather(*(st.put(f"p/{i:04d}.index", b"x" * i) for i in range(1, 1006)))
        await st.put("seg/0.log", big)

    async def reads() -> None:
        assert await st.get("seg/0.log") == big
        assert await st.get("seg/0.log", 10, 20) == big[10:20]
        assert bytes(await st.read_range("seg/0.log", 5 << 20, (5 << 20) + 4096)) == big[5 << 20:(5 << 20) + 4096]
        assert await st.size("seg/0.log") == len(big)
        with pytest.raises(ObjectMissing):
            await st.get("seg/never-written.log")
        await st.probe()

    async def killed_upload() -> None:  # a killed copy's multipart upload (begun, never completed)
        st.counts.count("multipart")
        await (await st._c()).create_multipart_upload(Bucket=BUCKET, Key="seg/killed.log")

    async def sweep() -> None:
        assert await st.clean_incomplete("seg/", older_than_s=-60) == 1

    async def listing_and_deletes() -> None:
        keys = await st.list("p/")
        assert len(keys) == 1005  # two pages
        await st.delete_many(keys)  # two DeleteObjects

    async def run() -> None:
        try:
            await phase(writes, {"put": "PUT", "part": "PUT", "multipart": "POST"})
            await phase(reads, {"get": "GET", "head": "GET"})
            await phase(killed_upload, {"multipart": "POST"})
            await phase(sweep, {"list": "GET", "multipart": "DELETE"})  # ListMultipartUploads, the abort
            await phase(listing_and_deletes, {"list": "LIST", "delete": "DELETE"})
        finally:
            await st.close()

    asyncio.run(run())
    counts = st.counts.as_dict()["requests"]
    assert (counts["put"], counts["part"], counts["get"], counts["head"], counts["list"], counts["delete"]) \
        == (1005, 3, 4, 2, 3, 2)
