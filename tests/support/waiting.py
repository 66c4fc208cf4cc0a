"""One way for end-to-end tests to wait: poll a condition until it holds or a deadline passes (no fixed sleeps
used as synchronisation)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from protocol.constants import ApiKey, ErrorCode, OffsetSpec
from protocol.requests import list_offsets_request
from tierproxy.kafka.wireclient import WireClient

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.05) -> T:
    """The condition's first truthy value; AssertionError naming `what` after `timeout` seconds. Exceptions from
    the condition count as "not yet" (a server still starting) and the last one is reported."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f" (last error: {last!r})" if last else ""))
        time.sleep(interval)


def proxy_serves_tier(address: str, topic: str, partitions: int = 1) -> bool:
    """The proxy at `address` answers ListOffsets LATEST_TIERED from its tier for every partition (its segment
    metadata has caught up with what was tiered)."""
    with WireClient(address, timeout=5) as w:
        resp = w.request(ApiKey.LIST_OFFSETS, 9, list_offsets_request(
            {topic: dict.fromkeys(range(partitions), OffsetSpec.LATEST_TIERED)}))
    parts = resp["topics"][0]["partitions"]
    return len(parts) == partitions and all(p["error_code"] == ErrorCode.NONE and p["offset"] >= 0 for p in parts)


def connected_ports(pid: int) -> set[int]:
    """Remote loopback ports of the process's established TCP connections (its socket descriptors matched with
    the kernel's table): shows that a client process has reached a server, with no log line to wait for."""
    import os

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "01" and cols[9] in inodes:  # 01: ESTABLISHED
                    ports.add(int(cols[2].rsplit(":", 1)[1], 16))
    return ports
