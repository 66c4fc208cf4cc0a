"""Free loopback ports for the local Kafka, S3 servers and proxies the demo and the tests start.

A port the kernel picks (bind to port 0) lies in its ephemeral range, from which every client socket also takes
its local port: between the pick and the server's own bind, a connection opened anywhere on the machine may take
it, and the server then fails with "Address already in use". So ports come from below that range, where only
explicit binds land. Runs in parallel (pytest-xdist workers) each get a share of that space through
``TIERPROXY_DEV_PORTS`` ("low-high", set per worker by the test suite), so two of them never pick the same port
between a check and a bind; within one process, a port handed out is not handed out again for a while.
"""

from __future__ import annotations

import os
import random
import socket
import time
from pathlib import Path

# below this, system services' well-known ports; the kernel's ephemeral range starts above it on Linux by default
FIRST_PORT = 10000
ENV = "TIERPROXY_DEV_PORTS"
_REUSE_AFTER_S = 300.0  # a handed-out port is assumed taken (or about to be) for this long
_handed: dict[int, float] = {}


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def port_space() -> tuple[int, int]:
    """The ports [low, high) this process picks from: its share given in `TIERPROXY_DEV_PORTS`, else everything
    from 10000 up to the ephemeral range (or 10000-20000 where that range starts lower)."""
    spec = os.environ.get(ENV, "")
    if spec:
        try:
            low, high = (int(x) for x in spec.split("-"))
        except ValueError:
            raise ValueError(f"{ENV}={spec!r}: expected low-high, e.g. 10000-17000") from None
        if not 1024 <= low < high <= 65536:
            raise ValueError(f"{ENV}={spec!r}: expected 1024 <= low < high <= 65536")
        return low, high
    top = _ephemeral_low()
    return FIRST_PORT, top if top > FIRST_PORT + 1000 else FIRST_PORT + 10000


def worker_share(index: int, count: int) -> str:
    """The `TIERPROXY_DEV_PORTS` value for parallel run `index` of `count` (disjoint, contiguous shares)."""
    low, high = FIRST_PORT, max(_ephemeral_low(), FIRST_PORT + 1000 * count)
    size = (high - low) // count
    return f"{low + index * size}-{low + (index + 1) * size}"


def _bindable(port: int, reuse_addr: bool) -> bool:
    with socket.socket() as s:
        if reuse_addr:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(n: int, *, reuse_addr: bool = True) -> int:
    """The first of `n` consecutive free loopback ports from this process's space, none handed out before in the
    last few minutes. `reuse_addr` binds the check as servers bind (SO_REUSEADDR). A server that would open more
    ports of its own is given them all from here (SeaweedFS's gRPC ports, `tests.support.s3`)."""
    low, high = port_space()
    if high - low < n:
        raise RuntimeError(f"no block of {n} ports in {low}-{high}")
    now = time.monotonic()
    for p, at in list(_handed.items()):
        if now - at > _REUSE_AFTER_S:
            del _handed[p]
    for _ in range(500):
        base = random.randrange(low, high - n + 1)
        ports = range(base, base + n)
        if any(p in _handed for p in ports):
            continue
        if all(_bindable(p, reuse_addr) for p in ports):
            for p in ports:
                _handed[p] = now
            return base
    raise RuntimeError(f"no block of {n} free ports in {low}-{high}")


def free_port() -> int:
    """One free loopback port (see the module's docstring for where it comes from)."""
    return free_port_block(1, reuse_addr=False)
