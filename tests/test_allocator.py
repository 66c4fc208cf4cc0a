"""The allocator tuning `serve` applies at start (`tierproxy.remote.allocator`): glibc accepts it, elsewhere a no-op."""

from __future__ import annotations

import platform

from tierproxy.remote.allocator import MMAP_THRESHOLD_MAX, keep_freed_memory


def test_glibc_takes_the_thresholds() -> None:
    assert platform.libc_ver()[0] == "glibc"  # Debian, as in the image: the tuning must take effect here
    assert keep_freed_memory(8 << 20, 256 << 20) is True
    assert keep_freed_memory(64 << 20, 1 << 40) is True  # capped at glibc's ceilings, not refused
    assert MMAP_THRESHOLD_MAX == 32 << 20
