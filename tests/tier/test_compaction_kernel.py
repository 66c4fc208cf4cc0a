"""The compaction engine's compiled kernel against the Python reference: generated partitions cleaned round after
round by both give the same CleanedSegments, byte for byte; corrupt records raise the same error class; the
compiled MD5 is hashlib's."""

from __future__ import annotations

import hashlib
import os
import struct
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import compression
from protocol.errors import ProtocolError
from protocol.records import BATCH_HEADER, HEADER_SIZE, LENGTH_OVERHEAD, RecordBatch
from tests.support.compaction import PLAIN, History, Tier
from tierproxy.jobs.tiering.compact import best_kernel
from tierproxy.jobs.tiering.compaction_kernel import CompiledKernel
from tierproxy.jobs.tiering.md5 import md5
from tierproxy.tier.compaction import BYTES_PER_ENTRY, CleanedSegment, CleanerConfig, MapTooSmall, OffsetMap
from tierproxy.tier.compaction.kernel import PYTHON

RETENTION = 100
EXPIRATION = 120  # producer.id.expiration.ms: producers expire between rounds (advances of up to 150 ms)
# null, empty, prefixes of one another, and the lengths around MD5's padding boundaries
KEYS = [None, b"", b"k", b"k1", b"k10", b"k1\x00", b"a" * 55, b"b" * 56, b"c" * 63, b"d" * 64, b"e" * 119,
        b"f" * 120, b"g" * 200]
CODECS = [compression.NONE, compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD]

step = st.one_of(
    st.tuples(st.just("put"), st.sampled_from([PLAIN, 100, 101]),
              st.one_of(st.lists(st.tuples(st.integers(0, len(KEYS) - 1), st.booleans()), min_size=1, max_size=3),
                        st.lists(st.tuples(st.integers(0, len(KEYS) - 1), st.booleans()), min_size=10, max_size=40)),
              st.sampled_from(CODECS)),
    st.tuples(st.just("txn"), st.sampled_from([200, 201]), st.integers(0, 3), st.booleans()),
)
# a round's clock advance; RETENTION ± 1 lands a cleaning on, just before and just after the horizons the last one
# set (a kernel comparing `now <= horizon` passed 150 examples without them)
advance = st.one_of(st.sampled_from([RETENTION - 1, RETENTION, RETENTION + 1]), st.integers(0, 3 * RETENTION // 2))
rounds = st.lists(st.tuples(st.lists(step, min_size=1, max_size=6), advance, st.integers(1, 3)), min_size=1,
                  max_size=4)


def _facts(out: list[CleanedSegment] | None) -> object:
    """Everything a cleaning answers, its logs as bytes."""
    if out is None:
        return None
    return [(c, b"".join(bytes(p) for p in c.files.log_parts) if c.files else None) for c in out]


def _clean(tier: Tier, now: int, map_bytes: int) -> object:
    try:
        return _facts(tier.clean(now, map_bytes=map_bytes))
    except MapTooSmall as exc:
        return type(exc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds, st.one_of(st.none(), st.integers(2, 40)))
def test_compiled_and_python_kernels_clean_alike(history: list, map_keys: int | None) -> None:  # type: ignore[type-arg]
    config = CleanerConfig(delete_retention_ms=RETENTION, min_cleanable_dirty_ratio=0.0, segment_bytes=4000,
                           producer_id_expiration_ms=EXPIRATION)
    map_bytes = 1 << 16 if map_keys is None else BYTES_PER_ENTRY * (map_keys * 10 // 9 + 1)
    reference, compiled = Tier(config, kernel=PYTHON), Tier(config, kernel=CompiledKernel())
    h, now = History(KEYS), 1_000  # type: ignore[arg-type]  # None: a null key
    for steps, advance, parts in history:
        batches = h.chunk(steps, now)
        size = max(1, -(-len(batches) // parts))
        for i in range(0, len(batches), size):
            reference.append(batches[i:i + size])
            compiled.append(batches[i:i + size])
        now += advance
        for _ in range(2):  # a second cleaning meets the first's horizons, empty batches and rebuilt batches
            expected = _clean(reference, now, map_bytes)
            assert _clean(compiled, now, map_bytes) == expected
            assert compiled.log() == reference.log()
            if expected is MapTooSmall:
                return


def _batch(section: bytes, count: int, codec: int = compression.NONE) -> RecordBatch:
    body = section if codec == compression.NONE else compression.compress(codec, section)
    out = bytearray(HEADER_SIZE + len(body))
    BATCH_HEADER.pack_into(out, 0, 10, len(out) - LENGTH_OVERHEAD, 0, 2, 0, codec, max(count - 1, 0), 1000, 1000,
                           -1, -1, -1, count)
    out[HEADER_SIZE:] = body
    return RecordBatch(memoryview(bytes(out)))


GOOD = b"\x14\x00\x00\x00\x02k\x06abc\x00"  # one record: length 10, key b"k", value b"abc", no headers
HUGE = b"\xfe" + b"\xff" * 8 + b"\x01"  # a 10-byte varint: zigzag 2**63 - 1 (a position plus it wraps in int64)
CORRUPT = {
    "truncated record": (GOOD[:-3], 1),
    "more records than bytes": (GOOD, 50),
    "a second record missing": (GOOD, 2),
    "record length past the section": (b"\x7e" + GOOD[1:], 1),
    "varint too long": (b"\xff" * 11 + GOOD[1:], 1),
    "varint past 64 bits": (b"\x14\x00" + b"\xff" * 9 + b"\x7f" + GOOD[3:], 1),
    "key length past the section": (b"\x14\x00\x00\x00\x7e" + GOOD[5:], 1),
    # a record of 4 bytes whose 2-byte key would be the next record's first bytes
    "key length past its record": (b"\x08\x00\x00\x00\x04" + GOOD, 2),
    "negative record length": (b"\x03" + GOOD[1:], 1),
    # a null key, so no key check stops it: the compiled scan read on past the wrapped end
    "record length near 2**63": (HUGE + b"\x00\x00\x00\x01\x01\x00" + bytes(8), 1),
    # the compiled scan read the value's length 2**63 bytes back (a segfault)
    "key length near 2**63": (b"\x14\x00\x00\x00" + HUGE + b"abcdefghijkl", 1),
    # base + delta wrapped negative in the compiled loop: the reference kept the record, the kernel dropped it
    # a record of length 0 (a null key: no key check): its fields are the next bytes; rebuilt, it lost them
    "record length 0": (b"\x00\x00\x00\x00\x01\x01\x00", 1),
    "value length past its record": (b"\x0a\x00\x00\x00\x02k" + GOOD, 2),
    "offset delta past an int": (b"\x26\x00\x00" + HUGE + b"\x02k\x06abc\x00", 1),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
@pytest.mark.parametrize("codec", [compression.NONE, compression.LZ4])
def test_corrupt_records_raise_the_same_error_on_both_paths(name: str, codec: int) -> None:
    section, count = CORRUPT[name]
    batch = _batch(section, count, codec)
    h = batch.header()
    for call in (lambda k, m: k.map_batch(batch, h, 0, m), lambda k, m: k.retain(batch, h, m, 0)):
        errors = []
        for kernel in (PYTHON, CompiledKernel()):
            offsets = OffsetMap(1 << 12)
            offsets.latest_offset = 100
            with pytest.raises((ProtocolError, ValueError)) as info:
                call(kernel, offsets)
            errors.append(type(info.value))
        assert errors[0] is errors[1], name


def test_a_good_record_reads_alike() -> None:
    batch = _batch(GOOD, 1)
    for kernel in (PYTHON, CompiledKernel()):
        offsets = OffsetMap(1 << 12)
        assert kernel.map_batch(batch, batch.header(), 0, offsets) == 1
        assert offsets.get(b"k") == 10 and offsets.entries == 1


def test_compiled_md5_is_rfc_1321() -> None:
    lengths = [*range(201), 55, 56, 63, 64, 119, 120, 1000, 4096 + 7]
    for n in lengths:
        for data in (os.urandom(n), bytes(n), b"\xff" * n):
            assert md5(data) == hashlib.md5(data).digest(), n
    assert struct.unpack(">4I", md5(b"abc")) == struct.unpack(">4I", bytes.fromhex("900150983cd24fb0d6963f7d28e17f72"))


def test_the_job_falls_back_to_the_python_reference_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(best_kernel(), CompiledKernel) and best_kernel(False) is PYTHON
    for name in ("compaction_kernel", "compaction_loops", "md5"):  # imported again, as in a process without numba
        monkeypatch.delitem(sys.modules, f"tierproxy.jobs.tiering.{name}")
        monkeypatch.delattr(sys.modules["tierproxy.jobs.tiering"], name)
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    assert best_kernel() is PYTHON
    with pytest.raises(ImportError):
        best_kernel(True)


def test_the_kernel_compiles_uncached_where_numba_can_write_no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    # a read-only install run by a user without a writable home (a Spark executor may be one): numba finds no
    # place for its cache, which it says by a RuntimeError when the function is decorated, at import
    import numba.core.config

    for name in ("compaction_kernel", "compaction_loops", "md5"):
        monkeypatch.delitem(sys.modules, f"tierproxy.jobs.tiering.{name}")
        monkeypatch.delattr(sys.modules["tierproxy.jobs.tiering"], name)
    monkeypatch.setattr(numba.core.config, "CACHE_LOCATOR_CLASSES", "ZipCacheLocator")  # none outside a zip
    assert type(best_kernel()).__name__ == "CompiledKernel"  # (not compiled here: seconds, no new risk)


@pytest.mark.parametrize("horizon", [-1, 5_000])
def test_timestamps_past_int64_wrap_alike_as_in_java(horizon: int) -> None:
    # base + delta past 2**63 (a record at Long.MAX - 2 + 4): Kafka's long sum wraps; the compiled loop wrapped,
    # the reference's Python ints did not (a struct.error packing the header, or a delta Java reads otherwise)
    keep, drop = b"\x14\x00\x08\x00\x02k\x06abc\x00", b"\x14\x00\x00\x02\x02j\x06abc\x00"
    section = drop + keep  # the first record (key j, ts delta 0) superseded: the batch is rebuilt
    out = bytearray(HEADER_SIZE + len(section))
    BATCH_HEADER.pack_into(out, 0, 10, len(out) - LENGTH_OVERHEAD, 0, 2, 0, 0, 1, 2**63 - 3, 2**63 - 1, -1, -1, -1,
                           2)
    out[HEADER_SIZE:] = section
    batch = RecordBatch(memoryview(bytes(out)))
    rebuilt = []
    for kernel in (PYTHON, CompiledKernel()):
        offsets = OffsetMap(1 << 12)
        assert kernel.map_batch(batch, batch.header(), 0, offsets) == 2
        offsets.put(b"j", 20)
        retained = kernel.retain(batch, batch.header(), offsets, 0)
        assert retained.kept == 1
        rebuilt.append(kernel.rebuild(batch.header(), retained, horizon))
    assert rebuilt[0] == rebuilt[1]
    [record] = RecordBatch(memoryview(rebuilt[0])).records()
    assert record.key == b"k" and _long(record.timestamp) == _long(2**63 - 3 + 4)  # the Java long the source held


def _long(v: int) -> int:
    return (v + 2**63) % 2**64 - 2**63


def test_a_base_offset_whose_records_pass_a_long_raises_on_both_paths() -> None:
    # base + delta past 2**63 wrapped negative in the compiled loop (below the map's latest: the record dropped)
    # while the reference's Python int stayed above it (kept)
    out = bytearray(_batch(GOOD[:3] + b"\x02" + GOOD[4:], 1).view())  # offset delta 1
    BATCH_HEADER.pack_into(out, 0, 2**63 - 1, *BATCH_HEADER.unpack_from(out)[1:])
    batch = RecordBatch(memoryview(bytes(out)))
    for kernel in (PYTHON, CompiledKernel()):
        offsets = OffsetMap(1 << 12)
        offsets.latest_offset = 100
        with pytest.raises(ProtocolError):
            kernel.retain(batch, batch.header(), offsets, 0)
        with pytest.raises(ProtocolError):
            kernel.map_batch(batch, batch.header(), 0, offsets)
