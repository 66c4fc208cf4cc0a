"""MD5 (RFC 1321) compiled with numba, for the compaction kernel's key map (Kafka's SkimpyOffsetMap hashes keys with
MD5): a key hashed where it lies in the records section, no `bytes` made for it.

Words are held in uint64 and masked to 32 bits after each sum (numba widens small integers; the mask keeps MD5's
modulo 2**32 arithmetic exact).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True, boundscheck=False)
_inline = numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")

_M32 = np.uint64(0xFFFFFFFF)
_K = np.array([int(abs(math.sin(i + 1)) * 2**32) & 0xFFFFFFFF for i in range(64)], dtype=np.uint64)
_S = np.array([7, 12, 17, 22] * 4 + [5, 9, 14, 20] * 4 + [4, 11, 16, 23] * 4 + [6, 10, 15, 21] * 4, dtype=np.uint64)
_G = np.array([i for i in range(16)] + [(5 * i + 1) % 16 for i in range(16, 32)]
              + [(3 * i + 5) % 16 for i in range(32, 48)] + [(7 * i) % 16 for i in range(48, 64)], dtype=np.int64)


@_inline
def _word(src: Any, at: int) -> Any:
    return (np.uint64(src[at]) | (np.uint64(src[at + 1]) << np.uint64(8)) | (np.uint64(src[at + 2]) << np.uint64(16))
            | (np.uint64(src[at + 3]) << np.uint64(24)))


@_jit
def _block(src: Any, at: int, a0: Any, b0: Any, c0: Any, d0: Any) -> tuple[Any, Any, Any, Any]:
    """One 64-byte block at src[at:at + 64] (the caller guarantees the bytes) into the state."""
    a, b, c, d = a0, b0, c0, d0
    for i in range(64):
        if i < 16:
            f = (b & c) | ((~b & _M32) & d)
        elif i < 32:
            f = (d & b) | ((~d & _M32) & c)
        elif i < 48:
            f = b ^ c ^ d
        else:
            f = c ^ (b | (~d & _M32))
        f = (f + a + _K[i] + _word(src, at + 4 * _G[i])) & _M32
        a, d, c = d, c, b
        s = _S[i]
        b = (b + (((f << s) | (f >> (np.uint64(32) - s))) & _M32)) & _M32
    return (a0 + a) & _M32, (b0 + b) & _M32, (c0 + c) & _M32, (d0 + d) & _M32


@_jit
def md5_into(src: Any, start: int, n: int, tail: Any, out: Any) -> None:
    """out[0:16] = MD5(src[start:start + n]); `tail`: a scratch of 128 bytes for the padded last blocks. The caller
    guarantees start + n ≤ len(src)."""
    a, b, c, d = np.uint64(0x67452301), np.uint64(0xEFCDAB89), np.uint64(0x98BADCFE), np.uint64(0x10325476)
    whole = n // 64 * 64
    for at in range(start, start + whole, 64):
        a, b, c, d = _block(src, at, a, b, c, d)
    rest = n - whole
    for i in range(rest):
        tail[i] = src[start + whole + i]
    tail[rest] = 0x80
    size = 64 if rest < 56 else 128  # the length must fit after the 0x80 in the last block
    for i in range(rest + 1, size - 8):
        tail[i] = 0
    bits = np.uint64(n) * np.uint64(8)
    for i in range(8):
        tail[size - 8 + i] = (bits >> np.uint64(8 * i)) & np.uint64(0xFF)
    for at in range(0, size, 64):
        a, b, c, d = _block(tail, at, a, b, c, d)
    for j, w in enumerate((a, b, c, d)):
        for i in range(4):
            out[4 * j + i] = (w >> np.uint64(8 * i)) & np.uint64(0xFF)


def md5(data: bytes) -> bytes:
    """MD5 of `data` by the compiled loop (for tests: hashlib is the reference)."""
    src = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(1, dtype=np.uint8)
    out = np.zeros(16, dtype=np.uint8)
    md5_into(src, 0, len(data), np.zeros(128, dtype=np.uint8), out)
    return out.tobytes()
