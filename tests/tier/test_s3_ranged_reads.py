"""A remote read's ranged GET against a real S3 server (SeaweedFS): the body received straight into a buffer of its
size (`tier.s3body`), byte-exact at multipart boundaries, on kept-alive connections; broken on the way (reset,
cut short, throttled) an error, never short bytes; a missing object, refused credentials and a store that answers
in a shape the small client does not read, each as the full client answers them."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.relay import TcpRelay
from tests.support.s3 import S3Server, seaweedfs_server
from tests.support.s3_faults import fault_relay
from tierproxy.tier import s3body
from tierproxy.tier.storage import ObjectMissing, S3Store, StorageUnavailable

pytestmark = [pytest.mark.s3]
PART = 5 << 20
BUCKET = "ranged"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS for the module, its bucket made and written once (a new bucket's first write takes SeaweedFS
    seconds, growing its volumes): each test reads and writes keys of its own."""
    with seaweedfs_server(tmp_path_factory.mktemp("s3-ranged")) as server:
        server.create_bucket(BUCKET)

        async def first_write() -> None:
            st = _store(server)
            try:
                await st.put("warm.log", b"x")
            finally:
                await st.close()

        asyncio.run(first_write())
        yield server


def _store(s3: S3Server, endpoint: str | None = None, secret: str | None = None) -> S3Store:
    return S3Store(BUCKET, endpoint=endpoint or s3.endpoint, region=s3.region, access_key=s3.access_key,
                   secret_key=secret or s3.secret_key, part_size=PART)


class ConnectionCounter(TcpRelay):
    """Counts the TCP connections made to the store."""

    def __init__(self, port: int) -> None:
        self.connections = 0
        self._count = threading.Lock()
        super().__init__(("127.0.0.1", port))

    def _connection(self) -> Any:
        with self._count:
            self.connections += 1
        return None


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_ranged_reads_are_exact_into_their_own_buffer_on_kept_alive_connections(s3: S3Server, loop_kind: str) -> None:
    """On uvloop (what `serve` runs) and on asyncio's own loop."""
    import uvloop

    data = os.urandom(3 * PART + 12345)
    port = int(s3.endpoint.rsplit(":", 1)[1])
    counter = ConnectionCounter(port)
    ranges = [(0, 1), (0, PART), (PART - 3, PART + 3), (2 * PART - 1, 2 * PART), (3 * PART, 3 * PART + 1),
              (len(data) - 5, len(data)), (len(data) - 5, len(data) + 100), (len(data), len(data) + 10),
              (17, 17 + (8 << 20))]

    async def work() -> tuple[list[tuple[int, int, bool, str]], int]:
        writer, reader = _store(s3), _store(s3, endpoint=f"http://127.0.0.1:{counter.port}")
        try:
            await writer.put(f"exact-{loop_kind}.log", data)  # 4 parts
            got = []
            for _ in range(3):
                for lo, hi in ranges:
                    body = await reader.read_range(f"exact-{loop_kind}.log", lo, hi)
                    got.append((lo, hi, body == data[lo:hi], type(body).__name__))
            return got, reader.ranged_fallbacks
        finally:
            await writer.close()
            await reader.close()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop_kind == "uvloop" else None) as runner:
            got, fallbacks = runner.run(work())
    finally:
        counter.close()
    assert [g for g in got if not g[2]] == []
    assert {g[3] for g in got if g[0] < len(data)} == {"bytearray"}  # received in place, never by the full client
    assert fallbacks == 0
    assert counter.connections == 1  # 27 GETs, one after another, on one kept-alive connection


@pytest.mark.parametrize("mode", ["reset", "truncate", "slowdown"])
def test_a_ranged_read_broken_on_the_way_is_an_error_never_short_bytes(s3: S3Server, mode: str) -> None:
    data = os.urandom(2 << 20)
    with fault_relay(s3.endpoint) as relay:
        relay.mode, relay.every, relay.limit = mode, 2, 2

        async def work() -> list[str]:
            writer, reader = _store(s3), _store(s3, endpoint=relay.endpoint)
            try:
                await writer.put(f"{mode}.log", data)
                out = []
                for i in range(6):
                    lo = i * 1000
                    try:
                        body = await reader.read_range(f"{mode}.log", lo, lo + (1 << 20))
                        out.append("exact" if body == data[lo:lo + (1 << 20)] else f"WRONG {len(body)}")
                    except StorageUnavailable as exc:
                        out.append(f"unavailable retriable={exc.retriable}")
                return out
            finally:
                await writer.close()
                await reader.close()

        got = asyncio.run(work())
    assert relay.counts == {mode: 2}
    assert got == ["exact", "unavailable retriable=True"] * 2 + ["exact", "exact"], got


def test_a_flipped_byte_is_returned_as_sent_for_the_batch_checks_to_find(s3: S3Server) -> None:
    """The store does not judge bytes (the reader checks every batch's CRC on S3 reads): what came is what it gives,
    whole and the same length."""
    data = os.urandom(1 << 20)
    with fault_relay(s3.endpoint) as relay:
        relay.mode, relay.every, relay.limit = "corrupt", 1, 1

        async def work() -> tuple[bytes | bytearray, bytes | bytearray]:
            writer, reader = _store(s3), _store(s3, endpoint=relay.endpoint)
            try:
                await writer.put("flipped.log", data)
                whole = await reader.read_range("flipped.log", 0, len(data))
                return whole, await reader.read_range("flipped.log", 0, 100)
            finally:
                await writer.close()
                await reader.close()

        flipped, after = asyncio.run(work())
    assert len(flipped) == len(data) and sum(a != b for a, b in zip(flipped, data, strict=True)) == 1
    assert after == data[:100]


def test_a_missing_object_refused_credentials_and_an_unread_shape(s3: S3Server) -> None:

    async def work() -> tuple[type[Exception], bool, bytes | bytearray, int]:
        writer = _store(s3)
        wrong = _store(s3, secret="not-the-secret")
        try:
            await writer.put("shapes.log", b"x" * 1000)
            with pytest.raises(StorageUnavailable) as refused:
                await wrong.read_range("shapes.log", 0, 10)
            try:
                await writer.read_range("gone.log", 0, 10)
                missing: type[Exception] = type(None)  # type: ignore[assignment]
            except ObjectMissing as exc:
                missing = type(exc)
            return missing, refused.value.retriable, await writer.read_range("shapes.log", 990, 1000), \
                writer.ranged_fallbacks
        finally:
            await writer.close()
            await wrong.close()

    missing, retriable, tail, fallbacks = asyncio.run(work())
    assert missing is ObjectMissing
    assert retriable is False  # refused credentials: not a failure to retry (as the full client says)
    assert tail == b"x" * 10 and fallbacks == 0


def test_a_head_the_small_client_does_not_read_goes_to_the_full_client(s3: S3Server,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer in a shape the small client does not read (here a head longer than its limit, the limit lowered
    below what SeaweedFS sends) is read again by the full client, exactly, and counted."""
    data = os.urandom(100_000)
    monkeypatch.setattr(s3body, "HEAD_LIMIT", 64)

    async def work() -> tuple[bytes | bytearray, int]:
        st = _store(s3)
        try:
            await st.put("padded.log", data)
            return await st.read_range("padded.log", 10, 90_000), st.ranged_fallbacks
        finally:
            await st.close()

    body, fallbacks = asyncio.run(work())
    assert body == data[10:90_000] and type(body) is bytes and fallbacks == 1


def test_a_bodys_buffer_is_received_into_again_only_once_nothing_refers_to_it(s3: S3Server) -> None:
    """Bodies of one size reuse buffers (`BodyBuffers`), never one a view (an answer being sent) still holds."""
    size = 1 << 20
    data = os.urandom(8 * size)

    async def work() -> None:
        store = _store(s3)
        store.bodies.keep_bytes = 3 * size
        try:
            await store.put("reused.log", data)
            first = await store.read_range("reused.log", 0, size)
            held = memoryview(first)[100:200]  # an answer still being sent: its chunk must stay as it is
            del first
            bodies = []
            for i in range(1, 8):
                body = await store.read_range("reused.log", i * size, (i + 1) * size)
                assert body == data[i * size:(i + 1) * size]
                bodies.append(body)
            assert bytes(held) == data[100:200]
            pool = store.bodies
            assert pool.reused == 0 and pool.kept_bytes == 3 * size  # all held: none reused, three kept
            assert all(b is not held.obj for b in bodies)
            bodies.clear()  # the cache evicted them; `held` still refers to the first
            again = [await store.read_range("reused.log", i * size, (i + 1) * size) for i in (5, 6)]
            assert pool.reused == 2
            assert all(b is not held.obj for b in again)  # the two kept ones nobody holds, not the held one
            assert [bytes(b) for b in again] == [data[5 * size:6 * size], data[6 * size:7 * size]]
            assert bytes(held) == data[100:200]
            held.release()
            last = await store.read_range("reused.log", 0, size)  # now the first one's buffer is free too
            assert pool.reused == 3 and last == data[:size]
        finally:
            await store.close()

    asyncio.run(work())
