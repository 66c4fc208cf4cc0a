"""In-process tests of the session's slot contract (no broker, no sockets, no sleeps): a deferred response either
fills its slot, in order, or the connection closes with a log line — never a hole that holds back every later
response of the connection."""

from __future__ import annotations

import asyncio
import logging

import pytest

from protocol.headers import RequestHeader
from tests.support.inprocess import InProcessProxy, RecordingTransport
from tierproxy.proxy.session import Session, Slot


def header(correlation_id: int, api_key: int = 1) -> RequestHeader:
    return RequestHeader(api_key, 12, correlation_id, "test", 2, 0)


async def session_with_client() -> tuple[Session, RecordingTransport, InProcessProxy]:
    proxy = InProcessProxy()
    session = Session(proxy, None)
    client = RecordingTransport()
    session.client = client
    return session, client, proxy


def test_a_deferred_response_is_written_in_order_when_its_work_fills_the_slot() -> None:
    async def run() -> None:
        session, client, _proxy = await session_with_client()
        deferred, ready = Slot(header(1)), Slot(header(2), [b"second"])
        session.add_slot(deferred)
        session.add_slot(ready)
        session.flush()
        assert client.written == []  # the ready response waits behind the deferred one

        async def fill() -> None:
            await asyncio.sleep(0)
            deferred.chunks = [b"first"]
            session.flush()

        await session.complete_later(deferred, fill())
        assert client.written == [b"first", b"second"] and not session.closed

    asyncio.run(run())


@pytest.mark.parametrize("failure", ["raises", "leaves the slot empty"])
def test_a_deferred_response_whose_work_fails_closes_the_connection(failure: str,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        session, client, proxy = await session_with_client()
        deferred, ready = Slot(header(1)), Slot(header(2), [b"second"])
        session.add_slot(deferred)
        session.add_slot(ready)

        async def broken() -> None:
            await asyncio.sleep(0)
            if failure == "raises":
                raise RuntimeError("injected failure in a remote completion")

        with caplog.at_level(logging.ERROR, logger="tierproxy"):
            await session.complete_later(deferred, broken())
        assert session.closed and client.closed and proxy.closed_sessions == [session]
        assert client.written == []  # nothing after the hole was sent out of order
        assert "closing the connection" in caplog.text
        if failure == "raises":
            assert "injected failure" in caplog.text

    asyncio.run(run())


@pytest.mark.parametrize("side", ["request", "response"])
def test_a_handler_that_raises_closes_only_its_connection_with_a_log_line(side: str,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """One error boundary for the synchronous path too: an exception in a handler (here a KeyError, as a bad key
    lookup would raise) closes that connection with a line naming the client, the API and the correlation id;
    it never reaches the transport's callback (before: only ProtocolError was caught there)."""
    from protocol.constants import ApiKey
    from tests.support.inprocess import Wire
    from tierproxy.proxy.handlers import REQUEST_HANDLERS, RESPONSE_HANDLERS

    def broken(*args: object) -> None:
        raise KeyError("partition_index")

    async def go() -> None:
        proxy = InProcessProxy()
        if side == "request":
            proxy.request_handlers = {**REQUEST_HANDLERS, ApiKey.METADATA: broken}
        else:
            proxy.response_handlers = {**RESPONSE_HANDLERS, ApiKey.METADATA: broken}
        wire = Wire(proxy)
        body = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
        with caplog.at_level(logging.ERROR, logger="tierproxy"):
            sent = wire.client_sends(ApiKey.METADATA, 12, body)
            if side == "response":
                ((got, _),) = wire.broker_receives()
                wire.broker_answers(got, {"throttle_time_ms": 0, "brokers": [], "cluster_id": "c",
                                          "controller_id": 1, "topics": []})
        assert wire.session.closed and wire.client.closed and proxy.closed_sessions == [wire.session]
        assert f"correlation id {sent.correlation_id}" in caplog.text and "partition_index" in caplog.text
        assert f"{int(ApiKey.METADATA)}" in caplog.text or "METADATA" in caplog.text

    asyncio.run(go())
