"""Reading a remote partition: offset → segment → offset index → byte position → whole batches. Segment bytes come
through a chunk cache (`remote.fetch.chunk.bytes` chunks, LRU bounded by bytes) that reads ahead
`remote.fetch.prefetch.chunks` chunks for sequential readers, on into the following segments' first chunks near a
segment's end. The read-ahead doubles, up to `remote.fetch.prefetch.max.chunks`, each time a reader catches up with
a chunk still being read ahead (storage slower than the reader: S3 latency), and the read-ahead not yet read (in
flight or cached) takes half the chunk cache at most: the other half keeps the chunks readers are in, so read-ahead
is read before the cache evicts it (a worker of `serve --workers N` has 1/N of the cache). A sequential reader needs
no offset index: it goes on at the byte where its last read ended. Offset indexes and transaction indexes sit in a
bytes-bounded cache. Transient storage errors are retried with exponential backoff and jitter until the caller's
deadline. Records are returned exactly as stored: never decoded or re-encoded.
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache

from protocol.errors import ProtocolError
from protocol.primitives import FileRegion, RecordPieces
from protocol.records import HEADER_SIZE, LOG_ENTRY_PREFIX, RecordBatch, iter_batches
from tierproxy.remote.regions import BadHeader, OlderFormat, ShortFile, Walked, walk
from tierproxy.tier.indexes import (
    AbortedTxn,
    decode_producer_snapshot,
    decode_txn_index,
    index_positions,
    lookup_position,
)
from tierproxy.tier.model import RemoteLogSegmentMetadata, TransactionOutcome
from tierproxy.tier.rsm import IndexType, RemoteStorageManager
from tierproxy.tier.storage import ObjectMissing, ReadBuffer, S3Store, StorageUnavailable
from tierproxy.tier.transactions import followed_through, recorded_outcomes


class BrokerLogUnavailable(RuntimeError):
    """What a remote read needs from the broker's log (aborted transactions reaching into it) cannot be asked."""


@dataclass
class ReadResult:
    records: bytes | memoryview | FileRegion | RecordPieces
    aborted: list[AbortedTxn] = field(default_factory=list)
    # READ_COMMITTED: producer id → first offset of its transaction open at the end of the tier (its outcome is
    # recorded in the tier, or else in the broker's log: `tier.transactions.recorded_outcomes`)
    unresolved: dict[int, int] = field(default_factory=dict)
    # the segment holds no batch at or after the offset (the cleaner removed the end of a compacted log's segment):
    # the read goes on in the next segment, as Kafka's `RemoteLogManager.read` does
    past_end: bool = False


Recorded = Mapping[tuple[int, int], TransactionOutcome]  # (producer id, first offset) → the tier's recorded outcome


@dataclass
class Backoff:
    initial_ms: int = 500
    max_ms: int = 30_000
    jitter: float = 0.2

    def delay(self, attempt: int) -> float:
        base = min(self.max_ms, self.initial_ms * (2 ** attempt))
        return float(base * (1 + random.uniform(-self.jitter, self.jitter)) / 1000)


class CorruptData(StorageUnavailable):
    """Bytes from storage fail a batch CRC: dropped from the cache, never served; the client retries."""


def _checked_batches(mv: memoryview, md: RemoteLogSegmentMetadata, pos: int, reader: RemoteReader
                     ) -> Iterator[RecordBatch]:
    """The batches of `mv`; a batch that cannot be parsed (bad magic, impossible lengths) is corrupt data."""
    try:
        yield from iter_batches(mv)
    except ProtocolError as exc:
        reader._corrupt(md)
        raise CorruptData(f"segment {md.segment_id.id.hex()}: unreadable batch after position {pos}: {exc}; "
                          f"cached chunks dropped") from None


def _chunks_in(md: RemoteLogSegmentMetadata, chunk: int) -> int:
    return -(-md.segment_size_in_bytes // chunk)


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Read-ahead nobody ends up waiting for may fail (it is retried by the read that needs it): no warning."""
    if not task.cancelled():
        task.exception()


# a direct reader reads an index this small on the loop (the offset index of a 512 MiB segment at Kafka's default
# index.interval.bytes; a producer snapshot of thousands of producers): at most ~100 us of the loop, once a segment
Chunk = ReadBuffer  # a log read from storage (from S3: received into a buffer of its own, never written)
INDEX_READ_AT_ONCE_BYTES = 1 << 20


class RemoteReader:
    def __init__(self, rsm: RemoteStorageManager, *, chunk_bytes: int = 8 << 20, cache_bytes: int = 256 << 20,
                 prefetch_chunks: int = 2, max_prefetch_chunks: int = 8, index_cache_bytes: int = 64 << 20,
                 backoff: Backoff | None = None, direct: bool = False, send_files: bool = False) -> None:
        self.rsm = rsm
        # a direct reader may answer with regions of segment files (`read(as_file=True)`), sent with sendfile
        self.send_files = direct and send_files
        # direct: each read takes exactly the bytes it needs from storage, no chunk cache and no read-ahead of
        # ours: for a tier of files, whose pages the OS caches and reads ahead already (a chunk cache there copied
        # every chunk into fresh memory: a page fault and a zeroed page each 4 KiB)
        self.direct = direct
        # a direct reader's next read, started when the last one ended: (segment id, start) → (end, bytes task);
        # oldest first, their bytes within `cache_bytes` in all
        self._next: OrderedDict[tuple[bytes, int], tuple[int, asyncio.Task[Chunk]]] = OrderedDict()
        self._next_bytes = 0
        self.chunk = chunk_bytes
        self.prefetch = prefetch_chunks
        self.max_prefetch = max(prefetch_chunks, max_prefetch_chunks)
        self.depth: LRUCache[bytes, int] = LRUCache(maxsize=4096)  # learned read-ahead per segment id
        # (segment id, next offset) → byte position where a read ended: where its reader's next fetch starts
        self.resume: LRUCache[tuple[bytes, int], int] = LRUCache(maxsize=16384)
        self._ahead: set[tuple[bytes, int]] = set()  # chunks being read ahead (no reader waits for them yet)
        self._unread: set[tuple[bytes, int]] = set()  # chunks read ahead that no reader asked for yet
        self.ahead_peak = 0  # most chunks read ahead at once
        self._index_tasks: dict[tuple[bytes, str], asyncio.Task[bytes]] = {}
        self.backoff = backoff or Backoff()
        self.chunks: LRUCache[tuple[bytes, int], Chunk] = LRUCache(maxsize=max(1, cache_bytes), getsizeof=len)
        self.indexes: LRUCache[tuple[bytes, str], bytes] = LRUCache(maxsize=max(1, index_cache_bytes),
                                                                     getsizeof=len)
        self._inflight: dict[tuple[bytes, int], asyncio.Task[Chunk]] = {}
        self.hits = self.misses = 0
        self.short_reads = 0  # chunks storage returned shorter than asked (retried)
        self.corrupt_batches = 0  # batches that failed their CRC (answered KAFKA_STORAGE_ERROR, chunks dropped)
        self.bytes_read = 0
        # per segment: the offset index's batch starts (for `regions.walk` to skip headers with), and whether no
        # transaction is aborted in it or open at its end (then its answers need no per-batch transactional flag)
        self._starts: LRUCache[bytes, Sequence[int]] = LRUCache(maxsize=max(1, index_cache_bytes // 8),
                                                                 getsizeof=len)
        self._txn_free: LRUCache[bytes, bool] = LRUCache(maxsize=16384)
        # chunks received into buffers of evicted chunks: the cache's worth, and one more for the chunk that comes
        # in while the cache is full (the one it evicts is free only once the new one is in)
        if isinstance(rsm.store, S3Store) and not direct:
            rsm.store.bodies.keep_bytes = cache_bytes + chunk_bytes

    async def close(self) -> None:
        """Stop the reads in flight (read-ahead nobody waits for), before the storage they use is closed."""
        tasks = [*self._inflight.values(), *self._index_tasks.values(), *(t for _, t in self._next.values())]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _retrying(self, what: str, fn, deadline: float):  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            try:
                return await fn()
            except StorageUnavailable:
                delay = self.backoff.delay(attempt)
                if loop.time() + delay >= deadline:
                    raise
                attempt += 1
                await asyncio.sleep(delay)

    async def index(self, md: RemoteLogSegmentMetadata, kind: IndexType, deadline: float) -> bytes:
        key = (md.segment_id.id, kind.value)
        data = self.indexes.get(key)
        if data is None and key not in self._index_tasks:
            data = self._read_at_once(md, kind)
        if data is not None:
            return data
        return await asyncio.shield(self._index_task(md, kind, deadline))

    def _read_at_once(self, md: RemoteLogSegmentMetadata, kind: IndexType) -> bytes | None:
        """A direct reader's index of a tier of files, read here on the loop when small, as the log's batch headers
        are (one read of the page cache, tens of microseconds; the thread `fetch_index` hops to costs a loop under
        load milliseconds, and a segment's first answer read every header while it waited). None: read it as
        from S3 (bigger, not there now, or not a direct reader)."""
        if not self.direct:
            return None
        data = self.rsm.small_index(md, kind, INDEX_READ_AT_ONCE_BYTES)
        if data is not None and len(data) <= self.indexes.maxsize:
            self.indexes[(md.segment_id.id, kind.value)] = data
        return data

    def _index_task(self, md: RemoteLogSegmentMetadata, kind: IndexType, deadline: float) -> asyncio.Task[bytes]:
        """One read of an index at a time, however many readers ask for it at once."""
        key = (md.segment_id.id, kind.value)
        task = self._index_tasks.get(key)
        if task is None:
            async def load() -> bytes:
                try:
                    data: bytes = await self._retrying(kind.value, lambda: self.rsm.fetch_index(md, kind), deadline)
                    if len(data) <= self.indexes.maxsize:  # bigger than the whole cache: serve it uncached
                        self.indexes[key] = data
                    return data
                finally:
                    self._index_tasks.pop(key, None)

            task = asyncio.get_running_loop().create_task(load())
            task.add_done_callback(_retrieved)
            self._index_tasks[key] = task
        return task

    def _chunk_task(self, md: RemoteLogSegmentMetadata, n: int, deadline: float,
                    ahead: bool = False) -> asyncio.Task[Chunk]:
        key = (md.segment_id.id, n)
        task = self._inflight.get(key)
        if task is None:
            start, end = n * self.chunk, min((n + 1) * self.chunk, md.segment_size_in_bytes)

            async def fetch() -> Chunk:
                got = await self.rsm.read_log(md, start, end)
                if len(got) != end - start:  # a truncated body that still looked complete: never served
                    self.short_reads += 1
                    raise StorageUnavailable(f"segment {md.segment_id.id.hex()} bytes {start}..{end}: storage "
                                             f"returned {len(got)} bytes")
                return got

            async def load() -> Chunk:
                try:
                    data: Chunk = await self._retrying("log", fetch, deadline)
                    if len(data) <= self.chunks.maxsize:
                        self.chunks[key] = data
                    self.bytes_read += len(data)
                    return data
                finally:
                    self._inflight.pop(key, None)
                    self._ahead.discard(key)

            task = asyncio.get_running_loop().create_task(load())
            task.add_done_callback(_retrieved)
            self._inflight[key] = task
            if ahead:
                self._ahead.add(key)
                self.ahead_peak = max(self.ahead_peak, len(self._ahead))
        return task

    def _corrupt(self, md: RemoteLogSegmentMetadata) -> None:
        self.corrupt_batches += 1
        seg = md.segment_id.id
        for key in [k for k in self.chunks if k[0] == seg]:
            self.chunks.pop(key, None)
        for rkey in [k for k in self.resume if k[0] == seg]:  # positions found in bad bytes are not trusted
            self.resume.pop(rkey, None)

    async def _chunk(self, md: RemoteLogSegmentMetadata, n: int, deadline: float) -> Chunk:
        self._unread.discard((md.segment_id.id, n))
        data = self.chunks.get((md.segment_id.id, n))
        if data is not None:
            self.hits += 1
            return data
        self.misses += 1
        key = (md.segment_id.id, n)
        if key in self._ahead:  # read ahead, and still not here: storage is slower than this reader
            self._ahead.discard(key)
            seg = md.segment_id.id
            self.depth[seg] = min(max(2 * self.depth.get(seg, self.prefetch), 1), self.max_prefetch)
        return await asyncio.shield(self._chunk_task(md, n, deadline))

    async def read_bytes(self, md: RemoteLogSegmentMetadata, start: int, end: int, deadline: float,
                         following: Sequence[RemoteLogSegmentMetadata] = ()) -> memoryview:
        """Bytes [start, end) of the segment: a view of one cached chunk, or the wanted parts of several joined
        once (only those: joining whole chunks copied up to 16 MiB for a 4 MiB answer). The read-ahead runs on
        into the `following` segments when this one ends within it."""
        end = min(end, md.segment_size_in_bytes)
        if self.direct:
            ahead = self._taken((md.segment_id.id, start), end)
            if ahead is not None:
                try:
                    data = await ahead
                    self.hits += 1
                    return memoryview(data)[:end - start]
                except StorageUnavailable:
                    pass  # read again, with retries, within this read's own deadline
            return memoryview(await self._retrying("log", lambda: self._exactly(md, start, end), deadline))
        first, last = start // self.chunk, max(start, end - 1) // self.chunk
        parts = await asyncio.gather(*(self._chunk(md, n, deadline) for n in range(first, last + 1)))
        self._read_ahead(md, last, deadline + 30, following)  # it outlives this fetch: it warms the cache
        base = first * self.chunk
        if len(parts) == 1:
            return memoryview(parts[0])[start - base:end - base]
        views = [memoryview(p) for p in parts]
        views[-1] = views[-1][:end - last * self.chunk]
        views[0] = views[0][start - base:]
        return memoryview(b"".join(views))

    def _taken(self, key: tuple[bytes, int], end: int) -> asyncio.Task[Chunk] | None:
        """The read started ahead from this position, if it covers up to `end` (dropped either way)."""
        found = self._next.pop(key, None)
        if found is None:
            return None
        ahead_end, task = found
        self._next_bytes -= ahead_end - key[1]
        if ahead_end >= end:
            return task
        task.cancel()
        return None

    def _read_next(self, md: RemoteLogSegmentMetadata, start: int, size: int,
                   following: Sequence[RemoteLogSegmentMetadata]) -> None:
        """A direct reader's next read, from where its last one ended (on in the following segment at its end):
        its bytes come while the client takes in this answer. Bounded by `cache_bytes` in all, oldest dropped."""
        if start >= md.segment_size_in_bytes:
            if not following:
                return
            md, start = following[0], 0
        key, end = (md.segment_id.id, start), min(start + size, md.segment_size_in_bytes)
        if key in self._next or end <= start or end - start > self.chunks.maxsize:
            return
        while self._next and self._next_bytes + end - start > self.chunks.maxsize:
            (_, old_start), (old_end, old) = self._next.popitem(last=False)
            self._next_bytes -= old_end - old_start
            old.cancel()
        task = asyncio.get_running_loop().create_task(self._exactly(md, start, end))
        task.add_done_callback(_retrieved)
        self._next[key] = (end, task)
        self._next_bytes += end - start

    async def _exactly(self, md: RemoteLogSegmentMetadata, start: int, end: int) -> Chunk:
        """Bytes [start, end) of the segment straight from storage (a direct reader's every read)."""
        self.misses += 1
        got = await self.rsm.read_log(md, start, end)
        if len(got) != end - start:  # a file shorter than its metadata says: never served
            self.short_reads += 1
            raise StorageUnavailable(f"segment {md.segment_id.id.hex()} bytes {start}..{end}: storage returned "
                                     f"{len(got)} bytes")
        self.bytes_read += len(got)
        return got

    def _read_ahead(self, md: RemoteLogSegmentMetadata, last: int, deadline: float,
                    following: Sequence[RemoteLogSegmentMetadata]) -> None:
        """`depth` chunks after chunk `last` of `md`, on through as many following segments as it takes (each with
        the depth learned so far: the reader goes on there, from its start, which needs no offset index)."""
        depth = self.depth.get(md.segment_id.id, self.prefetch)
        wanted = [(md, n) for n in range(last + 1, min(last + 1 + depth, _chunks_in(md, self.chunk)))]
        for nxt in following:
            if len(wanted) >= depth:
                break
            self.depth[nxt.segment_id.id] = max(depth, self.depth.get(nxt.segment_id.id, 0))
            wanted += [(nxt, n) for n in range(min(depth - len(wanted), _chunks_in(nxt, self.chunk)))]
        for seg, n in wanted:
            key = (seg.segment_id.id, n)
            if key in self.chunks or key in self._inflight:  # there, or a reader's read brings it
                continue
            if (self._unread_ahead() + 1) * self.chunk > self.chunks.maxsize // 2:
                return  # however many readers there are (see the module's docstring)
            self._chunk_task(seg, n, deadline, ahead=True)
            self._unread.add(key)

    def _unread_ahead(self) -> int:
        """Chunks read ahead and not asked for yet, still in flight or in the cache (one evicted unread no longer
        counts: it was read for nothing)."""
        gone = [k for k in self._unread if k not in self._inflight and k not in self.chunks]
        self._unread.difference_update(gone)
        return len(self._unread)

    async def _start(self, md: RemoteLogSegmentMetadata, offset: int, deadline: float) -> int:
        """A batch start at or before the batch holding `offset`. A sequential reader needs no offset index (a
        storage round trip before its first byte): from the segment's start the position is 0, and where an
        earlier read ended its position is known."""
        pos = 0 if offset <= md.start_offset else self.resume.get((md.segment_id.id, offset))
        if pos is None:
            pos = lookup_position(await self.index(md, IndexType.OFFSET, deadline), md.start_offset, offset)
        return pos

    async def read(self, md: RemoteLogSegmentMetadata, offset: int, max_bytes: int, min_one: bool,
                   read_committed: bool, deadline: float,
                   following: list[RemoteLogSegmentMetadata] | None = None, as_file: bool = False,
                   joined: bool = True, recorded: Recorded | None = None) -> ReadResult:
        """Whole batches from the one containing `offset`, up to `max_bytes` (at least one batch if `min_one`).

        The batches are contiguous in the segment, so the answer is one slice of what storage returned — or, with
        `as_file` on a direct reader of a tier of files (`send_files`), a region of the segment file that the
        transport sends itself (`regions`). An answer that straddles cached chunks is copied into one buffer only
        if `joined`; else it is `RecordPieces`, a view of each chunk (and a copy of the one batch that crosses
        from one into the next, if any). `recorded`: the partition's recorded transaction outcomes (read_committed
        takes them first, `_result`)."""
        if as_file and self.send_files:
            path = self.rsm.log_file(md)
            if path is not None:
                return await self._read_region(md, path, offset, max_bytes, min_one, read_committed, deadline,
                                               following, recorded)
        seg = md.segment_id.id
        pos = await self._start(md, offset, deadline)
        window = max_bytes + 256 * 1024  # the offset index is sparse: the wanted batch may start a bit later
        pieces: list[memoryview] = []
        total, resume_at = 0, -1
        while pos < md.segment_size_in_bytes and total < max_bytes:
            mv = await self._span(md, pos, window, deadline, following or ())
            consumed, first, end, full = 0, -1, -1, False
            for b in _checked_batches(mv, md, pos, self):
                consumed = b.pos + b.size
                if b.last_offset < offset:
                    continue
                grown = consumed - (first if first >= 0 else b.pos)
                if total + grown > max_bytes and (total or first >= 0 or not min_one):
                    full = True  # (the batch that does not fit is checked by the fetch that serves it)
                    break
                if not b.crc_ok():  # what is served is what the broker wrote, or nothing
                    self._corrupt(md)
                    raise CorruptData(f"segment {md.segment_id.id.hex()}: batch at offset {b.base_offset} "
                                      f"fails its CRC (position {pos + b.pos}); cached chunks dropped")
                if first < 0:
                    first = b.pos
                end, last = consumed, b.last_offset
            if first >= 0:
                pieces.append(mv[first:end])
                total += end - first
                resume_at = pos + end
            if full:
                break
            if consumed == 0 and pos + window >= md.segment_size_in_bytes:
                # no whole batch before the segment's end: a batch header that lies (a flipped length)
                self._corrupt(md)
                raise CorruptData(f"segment {md.segment_id.id.hex()}: no whole batch from position {pos} to its "
                                  f"end; cached chunks dropped")
            if consumed == 0:  # a batch bigger than the window: widen it
                window *= 2
                continue
            pos += consumed
        if resume_at >= 0:  # where this reader's next fetch (at the offset after the last batch) starts
            self.resume[(seg, last + 1)] = resume_at
            if self.direct:
                self._read_next(md, resume_at, max_bytes + 256 * 1024, following or ())
        if not pieces and pos >= md.segment_size_in_bytes:  # walked to its end: no batch at or after `offset`
            return ReadResult(b"", past_end=True)
        records: bytes | memoryview | RecordPieces = (
            pieces[0] if len(pieces) == 1 else b"".join(pieces) if joined or not pieces else RecordPieces(pieces))
        return await self._result(md, records, read_committed, deadline, following, recorded=recorded)

    async def _span(self, md: RemoteLogSegmentMetadata, pos: int, window: int, deadline: float,
                    following: Sequence[RemoteLogSegmentMetadata]) -> memoryview:
        """The bytes `read` walks next, from `pos`: up to `window`, but cut where `pos`'s cached chunk ends (a view
        of that chunk, never a copy), unless the batch at `pos` itself crosses into the next chunk: then exactly that
        batch, its two parts joined (a copy of one batch, not of the window). The walk goes on from where its whole
        batches end, in the next chunk."""
        end = min(pos + window, md.segment_size_in_bytes)
        boundary = (pos // self.chunk + 1) * self.chunk
        if self.direct or end <= boundary:
            return await self.read_bytes(md, pos, end, deadline, following)
        prefix = LOG_ENTRY_PREFIX.size
        if pos + prefix <= boundary:
            here = await self.read_bytes(md, pos, boundary, deadline, following)
            size = LOG_ENTRY_PREFIX.unpack_from(here)[1] + prefix
            if size <= len(here) or size < HEADER_SIZE:  # a batch ending in this chunk, or none (the walk says so)
                return here
        else:  # the batch's length itself crosses the chunks' boundary
            head = await self.read_bytes(md, pos, pos + prefix, deadline, following)
            if len(head) < prefix:  # the segment ends first: no batch here (the walk says so)
                return head
            size = LOG_ENTRY_PREFIX.unpack_from(head)[1] + prefix
        return await self.read_bytes(md, pos, min(end, pos + max(size, prefix)), deadline, following)

    async def _read_region(self, md: RemoteLogSegmentMetadata, path: str, offset: int, max_bytes: int,
                           min_one: bool, read_committed: bool, deadline: float,
                           following: list[RemoteLogSegmentMetadata] | None, recorded: Recorded | None = None
                           ) -> ReadResult:
        """`read` as a region of the segment file: its batches found by their headers, read here on the loop (a few
        small reads from the page cache, microseconds; in a thread, the hop and the wait for the interpreter lock
        cost a cold catch-up's first answer 2-4 ms). A tier on a slow or network filesystem reads as S3 does
        (`remote.fetch.file.direct.reads=false`)."""
        pos = await self._start(md, offset, deadline)
        starts = self._index_starts(md, read_committed, deadline)
        try:
            found = await self._walked(md, path, pos, offset, max_bytes, min_one, deadline, starts)
        except OlderFormat:  # magic 0/1 batches: read and checked as bytes, as the broker's older segments were
            return await self.read(md, offset, max_bytes, min_one, read_committed, deadline, following,
                                   recorded=recorded)
        self.misses += 1
        if found.region is None:
            return ReadResult(b"", past_end=found.past_end)
        self.bytes_read += found.region.length
        self.resume[(md.segment_id.id, found.last_offset + 1)] = found.region.position + found.region.length
        span = (found.first_offset, found.last_offset) if found.transactional else None
        return await self._result(md, found.region, read_committed, deadline, following, span, recorded)

    def _index_starts(self, md: RemoteLogSegmentMetadata, read_committed: bool,
                      deadline: float) -> Sequence[int] | None:
        """The offset index's batch starts for `walk` to skip the headers in between, when the index is at hand
        (cached, or small and read at once; else its read starts, for the next fetch: an answer never waits for
        it) and the answer
        needs no flag of each batch: read_uncommitted, or a segment with no transaction aborted or left open."""
        seg = md.segment_id.id
        free = not read_committed or self._no_transactions(md, deadline)  # (both reads start at once)
        starts = self._starts.get(seg)
        if starts is None:
            data = self._at_hand(md, IndexType.OFFSET, deadline)
            if data is None:
                return None
            starts = self._starts[seg] = index_positions(data)
        return starts if free else None

    def _no_transactions(self, md: RemoteLogSegmentMetadata, deadline: float) -> bool:
        """No transaction aborted in the segment nor open at its end (its txn index and producer snapshot): no
        answer from it has an aborted transaction. False while the snapshot is not at hand."""
        seg = md.segment_id.id
        known = self._txn_free.get(seg)
        if known is None:
            if not md.txn_index_empty:
                known = False
            else:
                data = self._at_hand(md, IndexType.PRODUCER_SNAPSHOT, deadline)
                if data is None:
                    return False
                known = all(e.current_txn_first_offset < 0 for e in decode_producer_snapshot(data).values())
            self._txn_free[seg] = known
        return known

    def _at_hand(self, md: RemoteLogSegmentMetadata, kind: IndexType, deadline: float) -> bytes | None:
        """An index if cached or read at once (`_read_at_once`); else None, its read started (once) for later."""
        key = (md.segment_id.id, kind.value)
        data = self.indexes.get(key)
        if data is None and key not in self._index_tasks:
            data = self._read_at_once(md, kind)
            if data is None:
                self._index_task(md, kind, deadline).add_done_callback(_retrieved)
        return data

    async def _walked(self, md: RemoteLogSegmentMetadata, path: str, pos: int, offset: int, max_bytes: int,
                      min_one: bool, deadline: float, starts: Sequence[int] | None = None) -> Walked:
        """`regions.walk` with the reader's errors and retries."""
        async def walked() -> Walked:
            try:
                return walk(path, md.segment_size_in_bytes, pos, offset, max_bytes, min_one, starts)
            except FileNotFoundError:
                raise ObjectMissing(path) from None
            except BadHeader as exc:
                self._corrupt(md)
                raise CorruptData(f"segment {md.segment_id.id.hex()}: {exc}") from None
            except ShortFile as exc:  # never served (retried: a file being replaced)
                self.short_reads += 1
                raise StorageUnavailable(str(exc)) from None
            except OSError as exc:
                raise StorageUnavailable(f"reading {path}: {exc}") from exc

        found: Walked = await self._retrying("log", walked, deadline)
        return found

    async def _result(self, md: RemoteLogSegmentMetadata, records: bytes | memoryview | FileRegion | RecordPieces,
                      read_committed: bool, deadline: float, following: list[RemoteLogSegmentMetadata] | None,
                      span: tuple[int, int] | None = None, recorded: Recorded | None = None) -> ReadResult:
        """For READ_COMMITTED, the aborted transactions overlapping the records: from this segment's txn index,
        and for transactions still open at its end (its producer snapshot) their `recorded` outcome, else from the
        following segments' (those that follow on: `tier.transactions.followed_through`). Those still open where
        the tier stops following them are `unresolved`: their markers are in the broker's log.

        Records with no transactional batch need none of it: a client applies the aborted list only to
        transactional batches (Java `CompletedFetch.isBatchAborted`, librdkafka likewise), so the indexes are not
        read (for a segment's first fetch, one storage round trip less)."""
        if not read_committed or not records:
            return ReadResult(records)
        if isinstance(records, FileRegion):  # the headers told (`span`: set when a batch is transactional)
            if span is None:
                return ReadResult(records)
            lo, hi = span
        else:
            parts = records.parts if isinstance(records, RecordPieces) else [records]
            batches = [b for part in parts for b in iter_batches(part)]  # each piece holds whole batches
            if not any(b.is_transactional for b in batches):
                return ReadResult(records)
            lo, hi = batches[0].base_offset, batches[-1].last_offset
        found: list[AbortedTxn] = []
        if not md.txn_index_empty:
            txns = decode_txn_index(await self.index(md, IndexType.TRANSACTION, deadline))
            found += [a for a in txns if a.last_offset >= lo and a.first_offset <= hi]
        snapshot = decode_producer_snapshot(await self.index(md, IndexType.PRODUCER_SNAPSHOT, deadline))
        open_at = {pid: e.current_txn_first_offset for pid, e in snapshot.items()
                   if 0 <= e.current_txn_first_offset <= hi}
        settled, open_at = recorded_outcomes(recorded or {}, open_at)  # a recorded outcome is final
        found += settled
        still_open = set(open_at)
        # as far as it takes (RemoteLogManager.collectAbortedTransactions), never past a gap
        for nxt in followed_through(md.end_offset, following or []):
            if not still_open:
                break
            if not nxt.txn_index_empty:
                for a in decode_txn_index(await self.index(nxt, IndexType.TRANSACTION, deadline)):
                    if a.producer_id in still_open and a.first_offset <= hi:
                        found.append(a)
                        still_open.discard(a.producer_id)
            if still_open:  # in another transaction (or none) at nxt's end: decided inside nxt, not aborted: committed
                later = decode_producer_snapshot(await self.index(nxt, IndexType.PRODUCER_SNAPSHOT, deadline))
                still_open = {pid for pid in still_open
                              if (e := later.get(pid)) is None or e.current_txn_first_offset == open_at[pid]}
        return ReadResult(records, found, {pid: open_at[pid] for pid in still_open})
