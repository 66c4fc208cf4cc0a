"""MD5 (RFC 1321) compiled with numba, for the compaction kernel's key map (Kafka's SkimpyOffsetMap hashes keys with
MD5): a key hashed where it lies in the records section, no `bytes` made for it.

Words are held in uint64 and masked to 32 bits after each sum (numba widens small integers; the mask keeps MD5's
modulo 2**32 arithmetic exact).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numba
import numpy as np

F = TypeVar("F", bound=Callable[..., Any])


def jit(**options: Any) -> Callable[[F], F]:
    """numba.njit as the compaction kernel compiles (no GIL held; no bounds checks: its reads are checked by hand),
    cached on disk where numba finds a writable place (the package's __pycache__, NUMBA_CACHE_DIR, the user's
    cache dir), else compiled afresh in each process: numba raises at decoration, so at import, when it finds none
    (a read-only install run by a user without a writable home, as a Spark executor may be)."""
    def wrap(f: F) -> F:
        try:
            return numba.njit(cache=True, nogil=True, boundscheck=False, **options)(f)  # type: ignore[no-any-return]
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return numba.njit(cache=False, nogil=True, boundscheck=False, **options)(f)  # type: ignore[no-any-return]
    return wrap


_jit = jit()
_inline = jit(inline="always")

_M32 = np.uint64(0xFFFFFFFF)


@_inline
def _word(src: Any, at: int) -> Any:
    return (np.uint64(src[at]) | (np.uint64(src[at + 1]) << np.uint64(8)) | (np.uint64(src[at + 2]) << np.uint64(16))
            | (np.uint64(src[at + 3]) << np.uint64(24)))


@_inline
def _rotate(f: Any, a: Any, b: Any, x: Any, s: int, t: int) -> Any:
    f = (f + a + x + np.uint64(t)) & _M32
    return (b + (((f << np.uint64(s)) | (f >> np.uint64(32 - s))) & _M32)) & _M32


@_inline
def _ff(a: Any, b: Any, c: Any, d: Any, x: Any, s: int, t: int) -> Any:
    return _rotate((b & c) | ((~b & _M32) & d), a, b, x, s, t)


@_inline
def _gg(a: Any, b: Any, c: Any, d: Any, x: Any, s: int, t: int) -> Any:
    return _rotate((d & b) | ((~d & _M32) & c), a, b, x, s, t)


@_inline
def _hh(a: Any, b: Any, c: Any, d: Any, x: Any, s: int, t: int) -> Any:
    return _rotate(b ^ c ^ d, a, b, x, s, t)


@_inline
def _ii(a: Any, b: Any, c: Any, d: Any, x: Any, s: int, t: int) -> Any:
    return _rotate(c ^ (b | (~d & _M32)), a, b, x, s, t)


@_inline
def _block(src: Any, at: int, a0: Any, b0: Any, c0: Any, d0: Any) -> tuple[Any, Any, Any, Any]:
    """One 64-byte block at src[at:at + 64] (the caller guarantees the bytes) into the state: RFC 1321's 64 steps
    written out (generated; a loop over tables measured ~2x slower)."""
    x0 = _word(src, at + 0)
    x1 = _word(src, at + 4)
    x2 = _word(src, at + 8)
    x3 = _word(src, at + 12)
    x4 = _word(src, at + 16)
    x5 = _word(src, at + 20)
    x6 = _word(src, at + 24)
    x7 = _word(src, at + 28)
    x8 = _word(src, at + 32)
    x9 = _word(src, at + 36)
    x10 = _word(src, at + 40)
    x11 = _word(src, at + 44)
    x12 = _word(src, at + 48)
    x13 = _word(src, at + 52)
    x14 = _word(src, at + 56)
    x15 = _word(src, at + 60)
    a, b, c, d = a0, b0, c0, d0
    a = _ff(a, b, c, d, x0, 7, 0xD76AA478)
    d = _ff(d, a, b, c, x1, 12, 0xE8C7B756)
    c = _ff(c, d, a, b, x2, 17, 0x242070DB)
    b = _ff(b, c, d, a, x3, 22, 0xC1BDCEEE)
    a = _ff(a, b, c, d, x4, 7, 0xF57C0FAF)
    d = _ff(d, a, b, c, x5, 12, 0x4787C62A)
    c = _ff(c, d, a, b, x6, 17, 0xA8304613)
    b = _ff(b, c, d, a, x7, 22, 0xFD469501)
    a = _ff(a, b, c, d, x8, 7, 0x698098D8)
    d = _ff(d, a, b, c, x9, 12, 0x8B44F7AF)
    c = _ff(c, d, a, b, x10, 17, 0xFFFF5BB1)
    b = _ff(b, c, d, a, x11, 22, 0x895CD7BE)
    a = _ff(a, b, c, d, x12, 7, 0x6B901122)
    d = _ff(d, a, b, c, x13, 12, 0xFD987193)
    c = _ff(c, d, a, b, x14, 17, 0xA679438E)
    b = _ff(b, c, d, a, x15, 22, 0x49B40821)
    a = _gg(a, b, c, d, x1, 5, 0xF61E2562)
    d = _gg(d, a, b, c, x6, 9, 0xC040B340)
    c = _gg(c, d, a, b, x11, 14, 0x265E5A51)
    b = _gg(b, c, d, a, x0, 20, 0xE9B6C7AA)
    a = _gg(a, b, c, d, x5, 5, 0xD62F105D)
    d = _gg(d, a, b, c, x10, 9, 0x02441453)
    c = _gg(c, d, a, b, x15, 14, 0xD8A1E681)
    b = _gg(b, c, d, a, x4, 20, 0xE7D3FBC8)
    a = _gg(a, b, c, d, x9, 5, 0x21E1CDE6)
    d = _gg(d, a, b, c, x14, 9, 0xC33707D6)
    c = _gg(c, d, a, b, x3, 14, 0xF4D50D87)
    b = _gg(b, c, d, a, x8, 20, 0x455A14ED)
    a = _gg(a, b, c, d, x13, 5, 0xA9E3E905)
    d = _gg(d, a, b, c, x2, 9, 0xFCEFA3F8)
    c = _gg(c, d, a, b, x7, 14, 0x676F02D9)
    b = _gg(b, c, d, a, x12, 20, 0x8D2A4C8A)
    a = _hh(a, b, c, d, x5, 4, 0xFFFA3942)
    d = _hh(d, a, b, c, x8, 11, 0x8771F681)
    c = _hh(c, d, a, b, x11, 16, 0x6D9D6122)
    b = _hh(b, c, d, a, x14, 23, 0xFDE5380C)
    a = _hh(a, b, c, d, x1, 4, 0xA4BEEA44)
    d = _hh(d, a, b, c, x4, 11, 0x4BDECFA9)
    c = _hh(c, d, a, b, x7, 16, 0xF6BB4B60)
    b = _hh(b, c, d, a, x10, 23, 0xBEBFBC70)
    a = _hh(a, b, c, d, x13, 4, 0x289B7EC6)
    d = _hh(d, a, b, c, x0, 11, 0xEAA127FA)
    c = _hh(c, d, a, b, x3, 16, 0xD4EF3085)
    b = _hh(b, c, d, a, x6, 23, 0x04881D05)
    a = _hh(a, b, c, d, x9, 4, 0xD9D4D039)
    d = _hh(d, a, b, c, x12, 11, 0xE6DB99E5)
    c = _hh(c, d, a, b, x15, 16, 0x1FA27CF8)
    b = _hh(b, c, d, a, x2, 23, 0xC4AC5665)
    a = _ii(a, b, c, d, x0, 6, 0xF4292244)
    d = _ii(d, a, b, c, x7, 10, 0x432AFF97)
    c = _ii(c, d, a, b, x14, 15, 0xAB9423A7)
    b = _ii(b, c, d, a, x5, 21, 0xFC93A039)
    a = _ii(a, b, c, d, x12, 6, 0x655B59C3)
    d = _ii(d, a, b, c, x3, 10, 0x8F0CCC92)
    c = _ii(c, d, a, b, x10, 15, 0xFFEFF47D)
    b = _ii(b, c, d, a, x1, 21, 0x85845DD1)
    a = _ii(a, b, c, d, x8, 6, 0x6FA87E4F)
    d = _ii(d, a, b, c, x15, 10, 0xFE2CE6E0)
    c = _ii(c, d, a, b, x6, 15, 0xA3014314)
    b = _ii(b, c, d, a, x13, 21, 0x4E0811A1)
    a = _ii(a, b, c, d, x4, 6, 0xF7537E82)
    d = _ii(d, a, b, c, x11, 10, 0xBD3AF235)
    c = _ii(c, d, a, b, x2, 15, 0x2AD7D2BB)
    b = _ii(b, c, d, a, x9, 21, 0xEB86D391)
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
