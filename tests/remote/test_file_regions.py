"""A file tier's answers as regions of its segment files (`remote.fetch.file.sendfile`): found by the batch headers
alone, they are byte for byte the answers of the reader that reads and CRC-checks every batch, for any offset and
size (Hypothesis), transactions included; a bad header or a short file is never served; and on a real loopback
socket a region goes out after what the transport holds, in order, however slowly the client reads."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.primitives import FileRegion
from protocol.records import ABORT, COMMIT, Record, build_batch, build_control_batch
from tests.support.parts import unavailable
from tests.support.segments import file_tier
from tierproxy.proxy.sendfile import FileSender, can_send_files
from tierproxy.remote.reader import Backoff, CorruptData, RemoteReader
from tierproxy.remote.regions import walk
from tierproxy.tier.indexes import build_segment
from tierproxy.tier.model import RemoteLogSegmentMetadata
from tierproxy.tier.rsm import IndexType, RemoteStorageManager
from tierproxy.tier.storage import ObjectMissing, StorageUnavailable

SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # Linux socket options (root): buffer sizes past the system's maximum


def _segment(sizes: list[int], base: int) -> bytes:
    """Batches of 1..n records of varied sizes; every fifth of producer 7 in transactions, half of them aborted."""
    out, offset = [], base
    for j, n in enumerate(sizes):
        txn = j % 5 == 0
        out.append(build_batch([Record(offset + i, 0, None, os.urandom(50 + 37 * i)) for i in range(n)],
                               base_offset=offset, producer_id=7 if txn else -1, producer_epoch=0 if txn else -1,
                               transactional=txn))
        offset += n
        if txn:
            out.append(build_control_batch(ABORT if j % 10 == 0 else COMMIT, offset=offset, producer_id=7,
                                           producer_epoch=0, timestamp=0))
            offset += 1
    return b"".join(out)


async def _tiered(root: Path) -> tuple[RemoteStorageManager, list[RemoteLogSegmentMetadata]]:
    return await file_tier(root, "regions", _segment)


def _bytes(records: bytes | memoryview | FileRegion) -> bytes:
    if isinstance(records, FileRegion):
        return os.pread(records.fd, records.length, records.position)
    return bytes(records)


_TIER: dict[str, tuple[RemoteStorageManager, list[RemoteLogSegmentMetadata]]] = {}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 1), at=st.floats(0, 1), max_bytes=st.integers(1, 300_000), min_one=st.booleans(),
       committed=st.booleans(), indexed=st.booleans())
def test_a_region_holds_the_bytes_the_checking_reader_serves(tmp_path: Path, which: int, at: float, max_bytes: int,
                                                             min_one: bool, committed: bool, indexed: bool) -> None:
    """`indexed`: the segment's offset index and producer snapshot already read, so the walk skips from the first
    batch to the last index entry that fits (read_uncommitted here: these segments have aborted transactions)."""
    async def run() -> None:
        if str(tmp_path) not in _TIER:
            _TIER[str(tmp_path)] = await _tiered(tmp_path / "tier")
        rsm, mds = _TIER[str(tmp_path)]
        md = mds[which]
        offset = md.start_offset + int(at * (md.end_offset - md.start_offset))
        deadline = asyncio.get_running_loop().time() + 10
        regions = RemoteReader(rsm, direct=True, send_files=True)
        checking = RemoteReader(rsm, direct=True)
        following = mds[which + 1:]
        if indexed:
            for kind in (IndexType.OFFSET, IndexType.PRODUCER_SNAPSHOT):
                await regions.index(md, kind, deadline)
        a = await regions.read(md, offset, max_bytes, min_one, committed, deadline, following, as_file=True)
        b = await checking.read(md, offset, max_bytes, min_one, committed, deadline, following, as_file=True)
        assert isinstance(a.records, FileRegion) or not b.records
        assert not isinstance(b.records, FileRegion)  # a reader without send_files never answers a region
        assert _bytes(a.records) == _bytes(b.records)
        assert (a.aborted, a.unresolved) == (b.aborted, b.unresolved)
        if b.records:  # the next fetch starts where this one ended, found without the offset index
            assert len(regions.resume) == 1 and regions.resume == checking.resume
        await regions.close()
        await checking.close()

    asyncio.run(run())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=120), at=st.floats(0, 1),
       max_bytes=st.integers(1, 400_000), min_one=st.booleans())
def test_the_offset_index_skips_headers_and_changes_no_answer(tmp_path: Path, sizes: list[int], at: float,
                                                               max_bytes: int, min_one: bool) -> None:
    """`walk` with the offset index's batch starts: the same region, first and last offset as reading every header,
    with at most as many headers read — and for a 256 KiB answer of 4-40 KiB batches, a handful."""
    raw = b"".join(build_batch([Record(base + i, 0, None, os.urandom(1000)) for i in range(n)], base_offset=base)
                   for base, n in zip(itertools.accumulate([0, *sizes]), sizes, strict=False))
    files = build_segment(raw)
    path = tmp_path / "segment.log"
    path.write_bytes(raw)
    index = files.offset_index
    starts = [int.from_bytes(index[i + 4:i + 8], "big") for i in range(0, len(index), 8)]
    offset = int(at * files.end_offset)
    every = walk(str(path), len(raw), 0, offset, max_bytes, min_one)
    skipping = walk(str(path), len(raw), 0, offset, max_bytes, min_one, starts)
    assert (skipping.first_offset, skipping.last_offset) == (every.first_offset, every.last_offset)
    assert (every.region is None) == (skipping.region is None)
    if every.region is not None and skipping.region is not None:
        assert (skipping.region.position, skipping.region.length) == (every.region.position, every.region.length)
    assert skipping.headers <= every.headers
    if len(raw) > 512 << 10:
        few = walk(str(path), len(raw), 0, 0, 256 << 10, True, starts).headers
        assert few <= 6 < walk(str(path), len(raw), 0, 0, 256 << 10, True).headers


def test_a_read_committed_answer_skips_headers_only_where_no_transaction_is_aborted_or_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers of a segment with aborted transactions need each batch's transactional flag: read_committed, its
    headers are all read; read_uncommitted, and in a segment without transactions, the index is used once at hand.
    A small index of a tier of files is at hand at once (read on the loop, as the headers are); a bigger one is
    never waited for: a segment's first answer starts its read and reads every header."""
    async def run(small: bool) -> None:
        rsm, mds = await _tiered(tmp_path / f"tier-{small}")
        plain_rsm, plain = await file_tier(tmp_path / f"plain-{small}", "plain", lambda sizes, base: b"".join(
            build_batch([Record(base + sum(sizes[:j]) + i, 0, None, b"v" * 900) for i in range(n)],
                        base_offset=base + sum(sizes[:j])) for j, n in enumerate(sizes)))
        deadline = asyncio.get_running_loop().time() + 10
        reader, plain_reader = RemoteReader(rsm, direct=True, send_files=True), \
            RemoteReader(plain_rsm, direct=True, send_files=True)
        if small:  # read at once: no read left for later
            assert reader._index_starts(mds[0], True, deadline) is None
            assert plain_reader._index_starts(plain[0], True, deadline)
            assert not reader._index_tasks and not plain_reader._index_tasks
        else:
            assert reader._index_starts(mds[0], True, deadline) is None  # not at hand: its read starts
            assert plain_reader._index_starts(plain[0], True, deadline) is None
            assert reader._index_tasks and plain_reader._index_tasks
            for kind in (IndexType.OFFSET, IndexType.PRODUCER_SNAPSHOT):
                await reader.index(mds[0], kind, deadline)
                await plain_reader.index(plain[0], kind, deadline)
        assert reader._index_starts(mds[0], True, deadline) is None
        assert reader._index_starts(mds[0], False, deadline)
        assert plain_reader._index_starts(plain[0], True, deadline)
        await reader.close()
        await plain_reader.close()

    asyncio.run(run(small=True))
    monkeypatch.setattr("tierproxy.remote.reader.INDEX_READ_AT_ONCE_BYTES", 8)  # every index is "big"
    asyncio.run(run(small=False))


def test_an_index_read_at_once_is_the_stored_one_and_a_missing_one_is_read_as_from_s3(tmp_path: Path) -> None:
    """The index a direct reader reads on the loop is byte for byte what `fetch_index` returns; one that is not
    there is left to `fetch_index`, whose error (the object missing) is what the caller sees; a reader that is not
    direct never reads on the loop."""
    async def run() -> None:
        rsm, mds = await _tiered(tmp_path / "tier")
        direct, indirect = RemoteReader(rsm, direct=True, send_files=True), RemoteReader(rsm)
        for kind in (IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.PRODUCER_SNAPSHOT):
            assert direct._read_at_once(mds[0], kind) == await rsm.fetch_index(mds[0], kind)
            assert indirect._read_at_once(mds[0], kind) is None
        gone = mds[1]
        os.unlink(rsm.store.local_path(rsm.key(gone, IndexType.OFFSET.value)))  # type: ignore[attr-defined]
        assert direct._read_at_once(gone, IndexType.OFFSET) is None
        with pytest.raises(ObjectMissing):
            await direct.index(gone, IndexType.OFFSET, asyncio.get_running_loop().time() + 0.5)
        await direct.close()
        await indirect.close()

    asyncio.run(run())


def test_transactions_are_told_from_the_headers(tmp_path: Path) -> None:
    async def run() -> None:
        rsm, mds = await _tiered(tmp_path / "tier")
        deadline = asyncio.get_running_loop().time() + 10
        reader = RemoteReader(rsm, direct=True, send_files=True)
        got = await reader.read(mds[0], 0, 10 << 20, True, True, deadline, mds[1:], as_file=True)
        assert isinstance(got.records, FileRegion) and got.records.length == mds[0].segment_size_in_bytes
        assert got.aborted and all(a.producer_id == 7 for a in got.aborted)  # every tenth batch was aborted

    asyncio.run(run())


@pytest.mark.parametrize("damage", ["magic", "length", "short"])
def test_a_bad_header_or_a_short_file_is_never_served(tmp_path: Path, damage: str) -> None:
    async def run() -> None:
        rsm, mds = await _tiered(tmp_path / "tier")
        md = mds[0]
        [path] = [p for p in sorted((tmp_path / "tier").rglob("*.log")) if p.name.startswith(f"{0:020d}")]
        data = bytearray(path.read_bytes())
        if damage == "magic":
            data[16] = 7
        elif damage == "length":
            data[8:12] = (len(data) * 2).to_bytes(4, "big")
        else:
            del data[-1]
        path.write_bytes(bytes(data))
        reader = RemoteReader(rsm, direct=True, send_files=True, backoff=Backoff(10, 20))
        deadline = asyncio.get_running_loop().time() + 0.3
        with pytest.raises(StorageUnavailable) as caught:
            await reader.read(md, md.start_offset, 10 << 20, True, False, deadline, as_file=True)
        if damage == "short":
            assert "metadata says" in str(caught.value) and reader.short_reads >= 1
        else:
            assert isinstance(caught.value, CorruptData) and reader.corrupt_batches >= 1

    asyncio.run(run())


def test_an_older_message_format_is_answered_as_the_checking_reader_answers_it(tmp_path: Path) -> None:
    """A batch that says message format v1 (magic 1): its header says too little for a region, so the answer is
    read as bytes, the checking reader's own answer."""
    async def run() -> None:
        rsm, mds = await _tiered(tmp_path / "tier")
        md = mds[0]
        [path] = [p for p in sorted((tmp_path / "tier").rglob("*.log")) if p.name.startswith(f"{0:020d}")]
        data = bytearray(path.read_bytes())
        data[16] = 1
        path.write_bytes(bytes(data))
        deadline = asyncio.get_running_loop().time() + 10
        got = await RemoteReader(rsm, direct=True, send_files=True).read(md, 0, 1 << 20, True, False, deadline,
                                                                         as_file=True)
        want = await RemoteReader(rsm, direct=True).read(md, 0, 1 << 20, True, False, deadline)
        assert not isinstance(got.records, FileRegion) and bytes(got.records) == bytes(want.records)  # type: ignore[arg-type]

    asyncio.run(run())


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_a_region_goes_out_after_what_the_transport_holds(tmp_path: Path, loop_kind: str) -> None:
    """A real loopback connection: 6 MiB written through the transport (more than the socket takes at once), then a
    region of 20 MiB, then bytes again, to a client that reads slowly at first; it receives them in that order.
    On uvloop (what `serve` runs) and asyncio's own loop."""
    path = tmp_path / "file"
    body = os.urandom(20 << 20)
    path.write_bytes(b"x" * 1000 + body)
    before, after = os.urandom(6 << 20), b"after"

    async def run() -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()

        tasks: list[asyncio.Task[None]] = []
        held: list[int] = []  # what the transport held when the region was sent: the drain is exercised

        class Server(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                tasks.append(loop.create_task(self.serve(transport)))  # type: ignore[arg-type]

            async def serve(self, transport: asyncio.WriteTransport) -> None:
                assert can_send_files(transport)
                sender = FileSender(transport, loop)
                fd = os.open(path, os.O_RDONLY)
                try:
                    transport.write(before)
                    held.append(transport.get_write_buffer_size())
                    await sender.send(FileRegion(fd, 1000, len(body)))
                    transport.write(after)
                    done.set_result(sender.sent)
                finally:
                    os.close(fd)
                    sender.close()

        server = await loop.create_server(Server, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        client.setblocking(False)
        got = bytearray()
        for _ in range(500):  # the client reads nothing until the server has written: its transport holds the rest
            if held:
                break
            await asyncio.sleep(0.01)
        want = len(before) + len(body) + len(after)
        for _ in range(100_000):
            if len(got) >= want:
                break
            try:
                got += await loop.sock_recv(client, 1 << 16)
            except BlockingIOError:
                continue
        client.close()
        server.close()
        assert await done == len(body)
        assert held[0] > 0, "the socket took everything at once: the drain before the region was not exercised"
        assert bytes(got) == before + body + after

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop_kind == "uvloop" else None) as runner:
        runner.run(run())


@asynccontextmanager
async def _a_send_waiting_on_a_full_socket(path: Path, senders: list[FileSender]
                                           ) -> AsyncIterator[tuple[FileSender, asyncio.Future[BaseException | None]]]:
    """A loopback connection whose client reads nothing, and the server's send of a 64 MiB region from `path`
    waiting for the socket: (its sender, the send's outcome: None or the ConnectionError it ended with)."""
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[BaseException | None] = loop.create_future()
    tasks: list[asyncio.Task[None]] = []

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            tasks.append(loop.create_task(self.serve(transport)))  # type: ignore[arg-type]

        async def serve(self, transport: asyncio.WriteTransport) -> None:
            sender = FileSender(transport, loop)
            senders.append(sender)
            fd = os.open(path, os.O_RDONLY)
            try:
                await sender.send(FileRegion(fd, 0, 64 << 20))
                outcome.set_result(None)
            except ConnectionError as exc:
                outcome.set_result(exc)
            finally:
                os.close(fd)

    server = await loop.create_server(Server, "127.0.0.1", 0)
    client = socket.create_connection(("127.0.0.1", server.sockets[0].getsockname()[1]))
    try:
        for _ in range(200):  # until the send waits on a full socket
            await asyncio.sleep(0.01)
            if senders and senders[0].waiter is not None:
                break
        assert senders and senders[0].waiter is not None and 0 < senders[0].sent < 64 << 20
        yield senders[0], outcome
    finally:
        client.close()
        server.close()


def test_a_send_waiting_on_a_client_that_does_not_read_ends_when_the_connection_closes(tmp_path: Path) -> None:
    """The client takes nothing: the region's send waits for the socket; closing the sender ends it at once with
    ConnectionError (no task left waiting forever)."""
    path = tmp_path / "file"
    path.write_bytes(os.urandom(64 << 20))

    async def run() -> None:
        async with _a_send_waiting_on_a_full_socket(path, []) as (sender, outcome):
            sender.close()
            assert isinstance(await asyncio.wait_for(outcome, 5), ConnectionError)

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_connection_closed_after_its_socket_turned_writable_is_never_written_to(
        tmp_path: Path, loop_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket turns writable (the send's waiter resolves) and the connection closes before the send task runs
    again, while new connections are accepted: the send ends with ConnectionError and never calls sendfile after
    the close, and its descriptor stays its own until it has stopped (no other connection can get its number and
    segment bytes). The order is forced: writable, close, new sockets, then the task."""
    path = tmp_path / "file"
    path.write_bytes(os.urandom(64 << 20))
    calls: list[tuple[int, bool]] = []  # (descriptor, closed already) of every sendfile call
    senders: list[FileSender] = []
    real_sendfile = os.sendfile

    def recording(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        calls.append((out_fd, any(s.closed for s in senders if s.fd == out_fd)))
        return real_sendfile(out_fd, in_fd, offset, count)

    monkeypatch.setattr(os, "sendfile", recording)

    async def run() -> None:
        async with _a_send_waiting_on_a_full_socket(path, senders) as (sender, outcome):
            assert sender.waiter is not None
            number, inode = sender.fd, os.fstat(sender.fd).st_ino
            sender.waiter.set_result(None)  # the socket turned writable ...
            sender.close()  # ... and the connection closed before the send ran again
            newcomers = [socket.socket() for _ in range(8)]  # a new socket takes the lowest free number
            assert os.fstat(number).st_ino == inode, "the descriptor was closed while its send still held it"
            before = len(calls)
            assert isinstance(await asyncio.wait_for(outcome, 5), ConnectionError)
            assert calls[before:] == [] and not any(closed for _, closed in calls)
            with contextlib.suppress(OSError):  # OSError: closed, and nobody took the number
                assert os.fstat(number).st_ino != inode, "the send stopped and left its descriptor open"
            for s in newcomers:
                s.close()

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop_kind == "uvloop" else None) as runner:
        runner.run(run())


def test_a_large_region_goes_out_in_slices_with_the_loop_running_between_them(tmp_path: Path) -> None:
    """8 MiB to a client that reads as fast as it can, over a connection whose buffers take all of it at once (as a
    socket's grow to megabytes): the sender still hands the loop back after every slice, so another connection's
    ready work (a tail fetch's answer) waits for one slice's copy, not for the whole region. (Root: the buffers are
    forced past the system's maximum.)"""
    from tierproxy.proxy.sendfile import SLICE

    if os.geteuid() != 0:
        unavailable("root", "the socket buffers are forced past net.core.wmem_max / rmem_max")
    path = tmp_path / "file"
    body = os.urandom(8 << 20)
    path.write_bytes(body)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        sending = asyncio.Event()
        ticks_during: list[int] = []
        tasks: list[asyncio.Task[None]] = []

        class Server(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                tasks.append(loop.create_task(self.serve(transport)))  # type: ignore[arg-type]

            async def serve(self, transport: asyncio.WriteTransport) -> None:
                transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 32 << 20)
                sender = FileSender(transport, loop)
                fd = os.open(path, os.O_RDONLY)
                try:
                    sending.set()
                    await sender.send(FileRegion(fd, 0, len(body)))
                    sending.clear()
                finally:
                    os.close(fd)
                    sender.close()

        async def ticker() -> None:
            await sending.wait()
            n = 0
            for _ in range(1_000_000):
                if not sending.is_set():
                    break
                n += 1
                await asyncio.sleep(0)
            ticks_during.append(n)

        server = await loop.create_server(Server, "127.0.0.1", 0)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
        client.connect(("127.0.0.1", server.sockets[0].getsockname()[1]))
        got = bytearray()

        def read_all() -> None:
            while len(got) < len(body):
                chunk = client.recv(1 << 20)
                if not chunk:
                    return
                got.extend(chunk)

        tick = loop.create_task(ticker())
        await asyncio.gather(asyncio.to_thread(read_all), tick)
        client.close()
        server.close()
        assert bytes(got) == body
        assert ticks_during[0] >= len(body) // SLICE - 1, ticks_during

    asyncio.run(run())
