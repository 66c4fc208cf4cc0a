"""Keep the memory of freed chunks for the next ones (glibc's malloc, where it is the allocator).

A remote read allocates a chunk (`remote.fetch.chunk.bytes`, 8 MiB) for each read from the tier and an answer
for each join; glibc serves allocations that large with their own mmap and gives them back to the kernel when
freed, or trims the heap top once more than twice that is free, so the next chunk is fresh memory again: a page
fault and a zeroed page every 4 KiB. Measured with `perf` on a catch-up from the filesystem tier, that was a
quarter of the proxy's CPU (clear_page, do_anonymous_page, exc_page_fault). Serving them from the heap, and
keeping the freed top up to `keep_bytes`, reuses pages already faulted in. RSS still never exceeds the peak the
bounds allow (chunk cache, queued.max.request.bytes); it just does not shrink below it between bursts."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("tierproxy.remote.allocator")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)


def keep_freed_memory(largest_block: int, keep_bytes: int) -> bool:
    """Allocations up to `largest_block` (capped at glibc's 32 MiB) from the heap, and up to `keep_bytes` of freed
    heap kept for reuse. False (nothing changed) where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl has no mallopt tuning of this kind
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, min(largest_block + 4096, MMAP_THRESHOLD_MAX)) == 1
    ok = mallopt(M_TRIM_THRESHOLD, min(keep_bytes, 2**31 - 1)) == 1 and ok
    if not ok:
        log.debug("mallopt refused the chunk-friendly thresholds; freed chunks go back to the kernel")
    return bool(ok)
