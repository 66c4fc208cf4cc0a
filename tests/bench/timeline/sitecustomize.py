"""A bench-only timeline of the proxy's fetches (issue 65, item 4): put this directory on the proxy's PYTHONPATH and
name a file in TIERPROXY_BENCH_TIMELINE; every step of a Fetch is stamped (`time.perf_counter_ns`) and written there
when the process exits. The product's code is wrapped here, from outside: nothing of it runs in a normal proxy.

Events, one a line `<ns> <event> <session>`: `in` client bytes arrived, `req`/`fwd` the Fetch handler's start and end
(the request decoded, planned, forwarded), `brk`/`ans` the broker's answer handled, `s0`/`s1` the answer's file
regions sent (its header written just before `s0`), `w0`/`w1` a wait for the socket to drain inside them."""

from __future__ import annotations

import atexit
import os
import time
from typing import Any

_out = os.environ.get("TIERPROXY_BENCH_TIMELINE")
_events: list[tuple[int, str, int]] = []


def _dump() -> None:
    assert _out is not None
    with open(_out, "w") as f:
        f.writelines(f"{t} {e} {s}\n" for t, e, s in _events)


def _install() -> None:
    from tierproxy.proxy import sendfile, session
    from tierproxy.proxy.intercept import fetch
    from tierproxy.proxy.intercept.fetch import handler

    stamp, now = _events.append, time.perf_counter_ns

    def around(name: str, f: Any, first: str, last: str, who: Any) -> Any:
        def wrapped(*a: Any, **k: Any) -> Any:
            stamp((now(), first, id(who(a))))
            try:
                return f(*a, **k)
            finally:
                stamp((now(), last, id(who(a))))
        wrapped.__name__ = name
        return wrapped

    def around_async(f: Any, first: str, last: str, who: Any) -> Any:
        async def wrapped(*a: Any, **k: Any) -> Any:
            stamp((now(), first, id(who(a))))
            try:
                return await f(*a, **k)
            finally:
                stamp((now(), last, id(who(a))))
        return wrapped

    # the handlers are taken from the package when the proxy's tables are made (after this runs)
    fetch.fetch_request = around("fetch_request", handler.fetch_request, "req", "fwd", lambda a: a[0])
    fetch.fetch_response = around("fetch_response", handler.fetch_response, "brk", "ans", lambda a: a[0])
    cp = session.ClientProtocol
    cp.buffer_updated = around("buffer_updated", cp.buffer_updated, "in", "in1", lambda a: a[0].session)
    session.Session._send_rest = around_async(session.Session._send_rest, "s0", "s1", lambda a: a[0])
    sendfile.FileSender._writable = around_async(sendfile.FileSender._writable, "w0", "w1", lambda a: a[0])
    atexit.register(_dump)


if _out:
    _install()
