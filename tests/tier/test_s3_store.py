"""S3Store against a real S3 server (SeaweedFS): listings past one page, batch deletes, multipart objects read back
at their part boundaries, unfinished uploads cleaned, uploads retried through throttling (never what the server
refused), checksum settings, and bad buckets or credentials named at start."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support.s3 import S3Server
from tests.support.s3_faults import fault_relay
from tierproxy.tier.model import uuid_str
from tierproxy.tier.rsm import RemoteStorageManager
from tierproxy.tier.storage import S3Store, StorageRefused, StorageUnavailable

pytestmark = [pytest.mark.s3]
T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


def store(s3: S3Server, bucket: str, **kw: object) -> S3Store:
    return S3Store(bucket, endpoint=kw.pop("endpoint", s3.endpoint), region=s3.region,  # type: ignore[arg-type]
                   access_key=s3.access_key, secret_key=s3.secret_key, **kw)  # type: ignore[arg-type]


def run(s: S3Store, work: Callable[[S3Store], Awaitable[T]]) -> T:
    async def go() -> T:
        try:
            return await work(s)
        finally:
            await s.close()

    return asyncio.run(go())


def test_listing_and_deleting_more_than_a_page(s3: S3Server) -> None:
    s3.create_bucket("many")
    keys = [f"p/{i:05d}.index" for i in range(1100)]

    async def work(st: S3Store) -> tuple[list[str], list[str]]:
        sem = asyncio.Semaphore(32)

        async def put(k: str) -> None:
            async with sem:
                await st.put(k, k.encode())

        await asyncio.gather(*(put(k) for k in keys))
        listed = await st.list("p/")
        await st.delete_many([*keys, "p/never-written"])  # two DeleteObjects requests; a missing key is fine
        return listed, await st.list("p/")

    listed, after = run(store(s3, "many"), work)
    assert listed == keys  # past the 1,000-key page
    assert after == []


def test_multipart_objects_read_back_exactly_at_part_boundaries(s3: S3Server) -> None:
    s3.create_bucket("parts")
    part = 5 << 20
    data = os.urandom(3 * part + 12345)

    async def work(st: S3Store) -> list[bool]:
        await st.put("seg.log", data)  # 4 parts
        checks = [await st.size("seg.log") == len(data), await st.get("seg.log") == data]
        for edge in (part, 2 * part, 3 * part):
            for lo, hi in ((edge - 3, edge + 3), (edge - 1, edge), (edge, edge + 1), (edge - part // 2, edge + 7)):
                checks.append(await st.get("seg.log", lo, hi) == data[lo:hi])
        checks.append(await st.get("seg.log", len(data) - 5, len(data) + 100) == data[-5:])
        checks.append(await st.get("seg.log", len(data), len(data) + 10) == b"")
        return checks

    assert all(run(store(s3, "parts", part_size=part), work))


def test_unfinished_multipart_uploads_are_aborted(s3: S3Server) -> None:
    """Only the tier's own: another application's upload in the same bucket stays, with the tier's prefix or none
    (before: an empty prefix aborted every upload in the bucket)."""
    s3.create_bucket("killed")
    seg = f"t-{uuid_str(os.urandom(16))}/0/{0:020d}-{uuid_str(os.urandom(16))}.log"

    async def work(st: S3Store) -> tuple[int, int, list[str]]:
        c = await st._c()
        for key in (f"tier/{seg}", seg, "other-app/big.bin", "tier/other-app.bin"):
            up = await c.create_multipart_upload(Bucket="killed", Key=key)
            await c.upload_part(Bucket="killed", Key=key, UploadId=up["UploadId"], PartNumber=1,
                                Body=os.urandom(5 << 20))  # a copy killed here leaves billed parts
        young = await RemoteStorageManager(st, "tier").clean_incomplete(older_than_s=3600)
        await asyncio.sleep(1.1)  # their age is judged by S3's clock, whose Date header counts whole seconds
        aborted = await RemoteStorageManager(st, "tier").clean_incomplete(older_than_s=0)
        aborted += await RemoteStorageManager(st, "").clean_incomplete(older_than_s=0)
        left = (await c.list_multipart_uploads(Bucket="killed")).get("Uploads", [])
        return young, aborted, sorted(u["Key"] for u in left)

    assert run(store(s3, "killed"), work) == (0, 2, ["other-app/big.bin", "tier/other-app.bin"])


def test_uploads_are_retried_through_slowdown_and_not_when_refused(s3: S3Server) -> None:
    s3.create_bucket("busy")
    with fault_relay(s3.endpoint) as relay:
        relay.method, relay.mode, relay.every, relay.limit = "PUT", "slowdown", 1, 3
        throttled = store(s3, "busy", endpoint=relay.endpoint)

        async def work(st: S3Store) -> bytes:
            await st.put("a.index", b"abc" * 1000)  # 503 SlowDown three times, then stored
            return await st.get("a.index")

        assert run(throttled, work) == b"abc" * 1000
        assert relay.counts == {"slowdown": 3} and throttled.retries == 3

        relay.mode = "none"
        wrong = S3Store("busy", endpoint=relay.endpoint, region=s3.region, access_key=s3.access_key,
                        secret_key="not-the-secret")

        async def refused(st: S3Store) -> StorageUnavailable:
            with pytest.raises(StorageUnavailable) as err:
                await st.put("b.index", b"x")
            return err.value

        err = run(wrong, refused)
        assert not err.retriable and wrong.retries == 0  # a refusal is not retried


@pytest.mark.parametrize("checksums", ["when_supported", "when_required"])
def test_checksum_settings_round_trip(s3: S3Server, checksums: str) -> None:
    s3.create_bucket("sums")

    async def work(st: S3Store) -> bytes:
        await st.put("big.log", b"z" * (6 << 20))  # multipart
        await st.put("small.index", b"q" * 100)
        return await st.get("big.log", (5 << 20) - 2, (5 << 20) + 2) + await st.get("small.index", 0, 3)

    assert run(store(s3, "sums", checksums=checksums, part_size=5 << 20), work) == b"zzzzqqq"
    with pytest.raises(ValueError, match="when_supported or when_required"):
        S3Store("sums", checksums="sometimes")


def test_a_missing_bucket_or_refused_credentials_stop_serve_at_start(s3: S3Server) -> None:
    s3.create_bucket("there")

    async def probe(st: S3Store) -> str:
        with pytest.raises(StorageRefused) as err:
            await st.probe()
        return str(err.value)

    assert run(store(s3, "not-there"), probe) == "bucket 'not-there' does not exist"
    assert "credentials refused" in run(S3Store("there", endpoint=s3.endpoint, region=s3.region,
                                                access_key=s3.access_key, secret_key="wrong"), probe)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": "wrong"}
    out = subprocess.run([sys.executable, "-m", "tierproxy.cli", "serve", "--bootstrap-server", "127.0.0.1:9",
                          "--listen", "127.0.0.1:0", "--storage", f"s3://there/t?endpoint={s3.endpoint}"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"tierproxy: config error: storage: s3://there/t?endpoint={s3.endpoint}: bucket 'there': credentials "
        "refused or no access (403)"]
