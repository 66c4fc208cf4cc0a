"""A Fetch response rebuilt from the broker's own bytes: some partitions' entries replaced, every other byte as the
broker sent it (`splice_response`), and one partition's entry decoded from its bytes (`decode_entry`).

For an answer where the tier replaces a few partitions of a wide fetch: its cost follows the replaced partitions
(a copy of the bytes between them aside), not the response's partition count, which a decode and re-encode of every
partition would. The spans come from `fetch_scan` (each erring partition's entry); a partition entry carries no
count or length that an enclosing structure depends on beyond the topic's own partition count, which a
replacement does not change."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from protocol.apis.fetch import FETCH_RESPONSE
from protocol.framing import frame_header
from protocol.primitives import Chunk, Writer
from protocol.schema import F, Message, MessageIn

INT32 = struct.Struct(">i")  # the header's correlation_id, the body's throttle_time_ms (its first field)


def _partition_fields() -> list[F]:
    responses = next(f for f in FETCH_RESPONSE.fields if f.name == "responses")
    return next(f for f in responses.fields or [] if f.name == "partitions").fields or []


# one partition entry of a Fetch response, as a message of its own (same versions, same flexible versions)
PARTITION = Message("FetchResponsePartition", api_key=1, versions="4-18", flexible="12+", fields=_partition_fields())


def decode_entry(frame: memoryview, version: int, span: tuple[int, int]) -> dict[str, object]:
    """The partition entry at `span` of a Fetch response `frame`, decoded (unknown tagged fields kept)."""
    out: dict[str, object] = PARTITION.decode(frame, version, span[0], span[1])
    return out


def _as_is(w: Writer, view: memoryview) -> None:
    """The broker's bytes: a long run (its own records among them) as its own chunk, not copied, as `Writer`
    keeps record sets."""
    if len(view) > 256:
        w.chunks.append(w.buf)
        w.chunks.append(view)
        w.buf = bytearray()
    else:
        w.buf += view


def throttle_of(frame: memoryview, body_offset: int) -> int:
    return int(INT32.unpack_from(frame, body_offset)[0])


def splice_response(frame: memoryview, version: int, body_offset: int, correlation_id: int,
                    replacements: Iterable[tuple[tuple[int, int], MessageIn]], throttle_ms: int | None = None
                    ) -> list[Chunk]:
    """The whole response frame (size prefix, the broker's header and body) under `correlation_id`, with each
    `(span, entry)` of `replacements` (spans in the frame, in ascending order, not overlapping) encoded in place of
    the bytes at its span; `throttle_ms`, if given, as the body's throttle time. Record sets are not copied."""
    w = Writer()
    w.raw(INT32.pack(correlation_id))
    w.raw(frame[INT32.size:body_offset])
    at = body_offset
    if throttle_ms is not None:
        w.raw(INT32.pack(throttle_ms))
        at += INT32.size
    for (start, end), entry in replacements:
        if start < at or end > len(frame):
            raise ValueError(f"span {start}..{end} overlaps the one before it or leaves the frame")
        _as_is(w, frame[at:start])
        PARTITION.encode_into(w, entry, version)
        at = end
    _as_is(w, frame[at:])
    chunks = w.finish()
    return [frame_header(sum(len(c) for c in chunks)), *chunks]

