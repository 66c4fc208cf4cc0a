"""The metadata records of an incremental tier snapshot (format 3): a chain of record objects a root names.

A `tier` pass does not write every live metadata record again (about 200 bytes per live segment: 200 MB a pass at
a million segments). It writes what changed since the snapshot before, as one object, and the root
(`tier.snapshot`) names the chain to replay: a base holding every live record when it was written, then the deltas
after it, oldest first. Replayed in order (a later record of a key replaces an earlier one, a tombstone removes
it) the chain gives the live records, latest write last, as one whole object would.

Record object, `snapshots/records/<taken ms>-<run id>.rec`, zlib-compressed:
    RecordObject => magic:b"TPSR" version:u8 count:u32 Entry*count crc:u32 (zlib.crc32 of everything before it)
    Entry        => key_length:u32 key value_length:i32 (-1: a tombstone) value
An object that does not parse whole (cut short, its CRC wrong, its count off) makes its root unreadable: the
reader takes the root before it (`tier.snapshot.newest`), never a part of one.

The chain stays short and its total bounded: after `MAX_DELTAS` deltas they are merged into one (the latest value
of every key they touched); once the deltas hold more records than half the base, a new base is written. Writing
costs what changed, plus a base now and then that amortizes over at least half its size in changes.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from tierproxy.tier.storage import ObjectMissing, ObjectStore

log = logging.getLogger("tierproxy.tier")

RECORDS = "snapshots/records/"
MAGIC = b"TPSR"
VERSION = 1
MAX_DELTAS = 16  # deltas after a base before they are merged into one
MIN_BASE = 1024  # a base this small is rewritten rather than followed by deltas bigger than half of it
_HEAD = struct.Struct(">4sBI")  # magic, version, count
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")

Records = list[tuple[bytes, bytes | None]]  # value None: a tombstone (the key was live before, not now)


class ChainBroken(ValueError):
    """A record object of a root's chain is missing or does not parse whole."""


def encode_records(records: Iterable[tuple[bytes, bytes | None]]) -> bytes:
    parts: list[bytes] = []
    n = 0
    for key, value in records:
        parts += [_U32.pack(len(key)), key]
        if value is None:
            parts.append(_I32.pack(-1))
        else:
            parts += [_I32.pack(len(value)), value]
        n += 1
    body = b"".join([_HEAD.pack(MAGIC, VERSION, n), *parts])
    return zlib.compress(body + _U32.pack(zlib.crc32(body)), 1)


def decode_records(raw: bytes) -> Records:
    """Raises ChainBroken for anything but a whole record object."""
    try:
        inflate = zlib.decompressobj()
        body = inflate.decompress(raw)
        if not inflate.eof or inflate.unused_data:
            raise ChainBroken("cut short" if not inflate.eof else "bytes after its end")
        magic, version, count = _HEAD.unpack_from(body)
        if magic != MAGIC or version != VERSION:
            raise ChainBroken(f"not a snapshot record object (magic {magic!r}, version {version})")
        if _U32.unpack_from(body, len(body) - 4)[0] != zlib.crc32(memoryview(body)[:-4]):
            raise ChainBroken("checksum mismatch")
        out: Records = []
        pos, end = _HEAD.size, len(body) - 4
        for _ in range(count):
            (klen,) = _U32.unpack_from(body, pos)
            key = body[pos + 4:pos + 4 + klen]
            pos += 4 + klen
            (vlen,) = _I32.unpack_from(body, pos)
            pos += 4
            if vlen < 0:
                out.append((key, None))
            else:
                out.append((key, body[pos:pos + vlen]))
                pos += vlen
        if pos != end:
            raise ChainBroken(f"{end - pos} bytes after its {count} records")
        return out
    except (zlib.error, struct.error) as exc:
        raise ChainBroken(f"not a whole record object: {exc}") from None


def replay(into: dict[bytes, bytes], records: Records) -> None:
    """Apply records in order to a live view (latest write last, as a compacted topic keeps them)."""
    for key, value in records:
        into.pop(key, None)
        if value is not None:
            into[key] = value


async def read_object(store: ObjectStore, prefix: str, name: str) -> Records:
    """One record object of a chain. Raises ChainBroken when it is missing or not whole."""
    try:
        raw = await store.get(_key(prefix, name))
    except ObjectMissing:
        raise ChainBroken(f"{name} is missing") from None
    try:
        return decode_records(raw)
    except ChainBroken as exc:
        raise ChainBroken(f"{name}: {exc}") from None


async def load(store: ObjectStore, prefix: str, chain: list[str]) -> list[tuple[bytes, bytes]]:
    """The live records a chain replays to. Raises ChainBroken when one of its objects is missing or not whole."""
    live: dict[bytes, bytes] = {}
    for name in chain:
        replay(live, await read_object(store, prefix, name))
    return list(live.items())


def _key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


@dataclass(frozen=True)
class Step:
    """One pass's record object and the chain its root names."""

    name: str
    records: Records
    chain: list[str]
    base: bool
    merged: bool = False


@dataclass
class ChainState:
    """What the last root a writer wrote replays to, and how its chain is made: what the next delta is taken
    against. Either `written`, the records themselves (values the very bytes objects of the metadata view when this
    process wrote them: an unchanged record is found by identity), or, once `tracking`, nothing: the view says what
    changed since (`RemoteLogMetadataManager.take_changed`), and a pass costs what changed, not every record."""

    chain: list[str] = field(default_factory=list)
    written: dict[bytes, bytes] = field(default_factory=dict)
    tracking: bool = False
    base_records: int = 0  # records in the base
    delta_records: int = 0  # records in the deltas after it (tombstones included)
    touched: set[bytes] = field(default_factory=set)  # keys the deltas wrote or removed

    def next_step(self, live: list[tuple[bytes, bytes]], name: str,
                  changed: dict[bytes, bytes | None] | None = None) -> Step:
        """The record object a pass writes for `live` (named `name`; `changed`: what changed since the last write,
        when tracked) and the chain its root names. The state moves on only by `advance`, once the object and its
        root are written."""
        current: dict[bytes, bytes] | None = None
        if self.tracking and changed is None:  # nothing said what changed since: the whole again, as a base
            return Step(name, list(live), [name], base=True)
        if self.tracking and changed is not None:
            delta: Records = list(changed.items())
        else:
            current = dict(live)
            delta = [(k, v) for k, v in live if (w := self.written.get(k)) is not v and w != v]
            delta += [(k, None) for k in self.written if k not in current]
        if not self.chain or self.delta_records + len(delta) > max(self.base_records, MIN_BASE) // 2:
            return Step(name, list(live), [name], base=True)
        if not delta:  # nothing new: the root names the same chain, no object is written
            return Step(name, [], list(self.chain), base=False)
        if len(self.chain) - 1 >= MAX_DELTAS:  # merge the deltas: the latest value of every key they touched
            current = current if current is not None else dict(live)
            touched = self.touched | {k for k, _ in delta}
            merged: Records = [(k, v) for k, v in live if k in touched]
            merged += [(k, None) for k in touched if k not in current]
            return Step(name, merged, [self.chain[0], name], base=False, merged=True)
        return Step(name, delta, [*self.chain, name], base=False)

    def advance(self, live: list[tuple[bytes, bytes]], step: Step, tracked: bool) -> None:
        """`step` is written; `tracked`: every later pass says what changed (no copy of the records is kept)."""
        self.written, self.tracking = ({}, True) if tracked else (dict(live), False)
        if step.name not in step.chain:
            return
        keys = {k for k, _ in step.records}
        if step.base:
            self.base_records, self.delta_records, self.touched = len(step.records), 0, set()
        elif step.merged:
            self.delta_records, self.touched = len(step.records), keys
        else:
            self.delta_records += len(step.records)
            self.touched |= keys
        self.chain = step.chain

    @classmethod
    async def of_root(cls, store: ObjectStore, prefix: str, chain: list[str]) -> ChainState:
        """The state of a chain another process wrote (a tier loop restarted): read once, then continued."""
        state = cls(chain=list(chain))
        live: dict[bytes, bytes] = {}
        for i, name in enumerate(chain):
            records = await read_object(store, prefix, name)
            replay(live, records)
            if i == 0:
                state.base_records = len(records)
            else:
                state.delta_records += len(records)
                state.touched |= {k for k, _ in records}
        state.written = live
        return state
