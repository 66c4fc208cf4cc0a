"""Record-batch compression codecs (attributes bits 0-2): 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.

Snappy comes raw or in the xerial framing the Java client writes (magic ``\\x82SNAPPY\\x00``, version, compat,
then blocks of int32 length + raw snappy); LZ4 is the LZ4 frame format; zstd and gzip their usual frames.
Used where records themselves are read: the record-level timestamp lookup of ListOffsets and the Spark
DataFrame reader. Forwarding, remote reads and tiering never decompress (batches travel as the broker wrote them).
"""

from __future__ import annotations

import struct

import cramjam

from protocol.errors import ProtocolError

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
XERIAL_MAGIC = b"\x82SNAPPY\x00"
# magic:8 bytes, version:int32, compatible_version:int32
XERIAL_HEADER = struct.Struct(">8sii")
# block length:int32
XERIAL_BLOCK = struct.Struct(">i")


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    """Decompress a batch's records section; any corrupt input raises `ProtocolError`."""
    try:
        if codec == GZIP:
            return bytes(cramjam.gzip.decompress(bytes(data)))
        if codec == SNAPPY:
            return _snappy_decompress(bytes(data))
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(bytes(data)))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(bytes(data)))
    except (cramjam.DecompressionError, ValueError, struct.error) as exc:
        raise ProtocolError(f"{NAMES[codec]} decompression failed: {exc}") from None
    raise ProtocolError(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes) -> bytes:
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == LZ4:
        # Kafka's Lz4BlockInputStream refuses linked blocks ("Dependent block stream is unsupported")
        c = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        c.compress(data)
        return bytes(c.finish())
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ProtocolError(f"unknown compression codec {codec}")


def _snappy_decompress(data: bytes) -> bytes:
    if not data.startswith(XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    pos = XERIAL_HEADER.size
    out = bytearray()
    while pos < len(data):
        (n,) = XERIAL_BLOCK.unpack_from(data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise ProtocolError("truncated xerial snappy block")
        out += bytes(cramjam.snappy.decompress_raw(data[pos:pos + n]))
        pos += n
    return bytes(out)
