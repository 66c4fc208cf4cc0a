"""What `tier.s3body` takes from a response head before it takes in a body: memory follows the range asked, never
the Content-Length a store claims; a body the small client does not read is refused before a byte of it is kept
(the caller then asks the full client)."""

from __future__ import annotations

import asyncio

import pytest

from tierproxy.tier import s3body


def _answer(head: bytes, ranged: bool, most: int | None) -> tuple[s3body._Connection, BaseException | None]:
    loop = asyncio.new_event_loop()
    try:
        conn = s3body._Connection()
        done = conn.expect(loop, ranged, most)
        buf = conn.get_buffer(-1)
        buf[:len(head)] = head
        conn.buffer_updated(len(head))
        return conn, done.exception() if done.done() else None
    finally:
        loop.close()


@pytest.mark.parametrize(("head", "ranged", "most", "refused"), [
    (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 999999999999\r\n\r\n", True, 100,
     "a body of 999999999999 bytes for a range of 100"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n", True, 100, "the store ignored the Range header"),
    (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 10485760\r\n\r\n", True, 100, "an HTTP 403 body of 10485760 bytes"),
    (b"HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\r\n", True, 100,
     "a response body without a Content-Length"),
])
def test_a_body_larger_than_asked_or_not_read_here_is_refused_before_it_is_received(
        head: bytes, ranged: bool, most: int | None, refused: str) -> None:
    conn, exc = _answer(head, ranged, most)
    assert isinstance(exc, s3body.Unsupported) and str(exc) == refused
    assert conn.body is None and not conn.reusable


@pytest.mark.parametrize(("head", "ranged", "most", "length"), [
    (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 100\r\n\r\n", True, 100, 100),
    (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 40\r\n\r\n", True, 100, 40),  # the object ends first
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", False, None, 5000),  # the whole object, asked whole
    (b"HTTP/1.1 404 Not Found\r\nContent-Length: 300\r\n\r\n", True, 100, 300),  # an error's XML
    (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 8388608\r\n\r\n", True, 8 << 20, 8 << 20),
])
def test_a_body_within_what_was_asked_is_received_in_a_buffer_of_its_size(
        head: bytes, ranged: bool, most: int | None, length: int) -> None:
    conn, exc = _answer(head, ranged, most)
    assert exc is None and conn.body is not None and len(conn.body) == length and conn.filled == 0
