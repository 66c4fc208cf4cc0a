"""Object-store requests and bytes, counted where the S3 store sends them: what S3 bills (per request, per
request class) and throttles (per key prefix), for serve's metrics and the jobs' summaries.

Kinds, each one HTTP request as the server sees it (a retried request counts again, as S3 bills it):

    get        GetObject (whole or ranged)            S3's GET class
    head       HeadObject, HeadBucket                 GET class
    put        PutObject                              PUT class
    part       UploadPart (a multipart upload's part) PUT class
    multipart  Create/Complete/AbortMultipartUpload   PUT class
    list       ListObjectsV2, ListMultipartUploads    LIST class (billed as PUT)
    delete     DeleteObjects (up to 1,000 keys)       free
"""

from __future__ import annotations

import threading
from typing import Any

KINDS = ("get", "head", "put", "part", "multipart", "list", "delete")


class StorageRequests:
    """Requests by kind and bytes each way (`read`: bodies received from the store, `written`: bodies sent to it),
    counted under a lock: a store may be used from several threads (the tiering driver, executors' readers)."""

    def __init__(self) -> None:
        self.requests = dict.fromkeys(KINDS, 0)
        self.read = 0
        self.written = 0
        self._lock = threading.Lock()

    def count(self, kind: str, *, written: int = 0) -> None:
        """One request of `kind` sent, with `written` body bytes."""
        with self._lock:
            self.requests[kind] += 1
            self.written += written

    def received(self, nbytes: int) -> None:
        """`nbytes` of an answer's body read."""
        with self._lock:
            self.read += nbytes

    def as_dict(self) -> dict[str, Any]:
        """The counts as JSON-able figures (a job's summary, a task's result to add up on the driver)."""
        with self._lock:
            return {"requests": dict(self.requests), "bytes_read": self.read, "bytes_written": self.written}

    def add(self, counts: dict[str, Any]) -> None:
        """Add counts of another store (`as_dict` of an executor's)."""
        with self._lock:
            for kind, n in counts.get("requests", {}).items():
                self.requests[kind] = self.requests.get(kind, 0) + int(n)
            self.read += int(counts.get("bytes_read", 0))
            self.written += int(counts.get("bytes_written", 0))

    def line(self) -> str:
        """`storage requests: 12 get, 3 put, ...; 1.2 MB read, 0.4 MB written` (kinds with none left out)."""
        with self._lock:
            kinds = ", ".join(f"{n} {kind}" for kind, n in self.requests.items() if n) or "none"
            return f"storage requests: {kinds}; {self.read / 1e6:.1f} MB read, {self.written / 1e6:.1f} MB written"


def added(total: dict[str, Any], counts: dict[str, Any]) -> dict[str, Any]:
    """`total` with `counts` added (both `as_dict` figures; an empty one is none)."""
    out = StorageRequests()
    out.add(total)
    out.add(counts)
    return out.as_dict()


def since(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What a store counted between two `as_dict` figures of it."""
    requests = after["requests"]
    return {"requests": {kind: n - before["requests"].get(kind, 0) for kind, n in requests.items()},
            "bytes_read": after["bytes_read"] - before["bytes_read"],
            "bytes_written": after["bytes_written"] - before["bytes_written"]}


def describe(counts: dict[str, Any]) -> str:
    """`as_dict` figures as `StorageRequests.line` says them."""
    out = StorageRequests()
    out.add(counts)
    return out.line()
