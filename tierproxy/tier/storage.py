"""Object stores behind the RemoteStorageManager: the local filesystem and S3 (aiobotocore).

One error type leaves this module: `StorageError`, as `ObjectMissing` (the object is not there) or
`StorageUnavailable` (the store cannot be reached or failed); callers map them to Kafka error codes.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import random
import ssl
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs, urlparse

from cachetools import TTLCache

from tierproxy.tier.requests import StorageRequests
from tierproxy.tier.s3body import BodyBuffers, HttpStatus, RangedGets, Unsupported

_boto_lock = threading.Lock()
ReadBuffer = bytes | bytearray  # a range of a segment's log: bytes, or the buffer its body was received into
T = TypeVar("T")
# S3 error codes worth retrying besides 5xx: throttling and timeouts
PRESIGNED_VALID_S, PRESIGNED_REUSE_S = 900, 300  # a ranged GET's signed URL: valid 15 min, signed afresh after 5
RETRIABLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
                   "ServiceUnavailable", "InternalError", "TooManyRequests"}


def _boto() -> Any:
    """aiobotocore and botocore, imported on first use (half a second that file:// users, the proxy without S3
    and every Spark reader task would pay otherwise), under a lock: a first import racing on two threads (the
    tiering driver's RLMM loop and its main thread) can fail inside importlib."""
    with _boto_lock:
        import aiobotocore.config
        import aiobotocore.session
        import botocore.exceptions

        return aiobotocore, botocore


_loader: Any = None  # botocore's data loader, shared by every session this process makes


def _session() -> Any:
    """A new aiobotocore session (its credentials its own) reading botocore's service data through one loader per
    process: a session's first client otherwise parses the endpoint and S3 model JSON again (~0.15 s of CPU per
    store; the data is the installed botocore's, the same for every session)."""
    global _loader
    aiobotocore, _ = _boto()
    session = aiobotocore.session.get_session()
    with _boto_lock:
        if _loader is None:
            _loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _loader)
    return session


class StorageError(Exception):
    """Any failure of remote storage."""


class ObjectMissing(StorageError):
    """The object does not exist (deleted meanwhile, never written)."""


class StorageUnavailable(StorageError):
    """The store could not be reached or answered with an error. `retriable`: a server error, throttling
    (503 SlowDown), a timeout or a broken connection, worth retrying; not: the request itself was refused."""

    def __init__(self, message: str, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


class StorageRefused(StorageError):
    """The store answers, but refuses this configuration: the bucket does not exist, the credentials are refused."""


class ObjectStore(Protocol):
    counts: StorageRequests  # requests sent and their bytes (S3's; a file tier sends none)

    async def put(self, key: str, data: bytes) -> None: ...
    async def put_parts(self, key: str, parts: list[memoryview]) -> None: ...
    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes: ...
    async def read_range(self, key: str, start: int, end: int) -> ReadBuffer:
        """Bytes [start, end) of a segment's log (the remote reads' every read): `get`, or into a buffer of its own."""
    async def size(self, key: str) -> int: ...
    async def delete(self, key: str) -> None: ...
    async def delete_many(self, keys: list[str]) -> None: ...
    async def list(self, prefix: str) -> list[str]: ...
    async def clean_incomplete(self, prefix: str, older_than_s: float,
                               owned: Callable[[str], bool] = lambda key: True) -> int: ...
    async def probe(self) -> None: ...
    async def close(self) -> None: ...


class FileStore:
    """Objects as files under a root directory; writes are atomic (temp file + rename)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._resolved_root = str(root.resolve())
        self.counts = StorageRequests()  # stays at zero: reading files is no billed request

    def local_path(self, key: str) -> Path:
        """The file of `key` (StorageError for a key that would leave the root)."""
        return self._path(key)

    def _path(self, key: str) -> Path:
        # checked by its text, not resolved: resolving walks every component (a syscall each) on every read of a
        # catch-up, and a cache of resolved paths thrashed once a fetch read thousands of segments. The root is
        # the tier's own directory: a key never climbs out of it, whatever links the operator put inside
        norm = os.path.normpath(key)
        if norm in (".", "..") or os.path.isabs(norm) or norm.startswith("../") or "\0" in key:
            raise StorageError(f"object key escapes the store: {key!r}")
        return Path(self._resolved_root, norm)

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, key, [memoryview(data)])

    async def put_parts(self, key: str, parts: list[memoryview]) -> None:
        await asyncio.to_thread(self._put, key, parts)

    def _put(self, key: str, parts: list[memoryview]) -> None:
        """Durable when it returns: the file's bytes and its name (and any directory made for it) are fsynced, so
        metadata written afterwards (COPY_SEGMENT_FINISHED) never outlives the data in a power loss."""
        path = self._path(key)
        try:
            made = self._mkdirs(path.parent)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.writelines(parts)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            for directory in [path.parent, *made]:  # the new name, then each new directory's entry in its parent
                _fsync_dir(directory)
        except OSError as exc:
            raise StorageUnavailable(f"writing {key}: {exc}") from exc

    def _mkdirs(self, directory: Path) -> list[Path]:
        """Make `directory` and its missing parents; → the parents whose entries changed, deepest first."""
        missing = []
        while not directory.exists() and directory != self.root:
            missing.append(directory)
            directory = directory.parent
        for d in reversed(missing):
            d.mkdir(exist_ok=True)
        return [d.parent for d in missing]

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return await asyncio.to_thread(self.get_blocking, key, start, end)

    async def read_range(self, key: str, start: int, end: int) -> bytes:
        return await self.get(key, start, end)

    def get_blocking(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """`get` without an event loop (Spark reader tasks: a loop and its thread per task cost more than the read)."""
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(-1 if end is None else max(0, end - start))
        except FileNotFoundError:
            raise ObjectMissing(key) from None
        except OSError as exc:
            raise StorageUnavailable(f"reading {key}: {exc}") from exc

    def read_small(self, key: str, limit: int) -> bytes | None:
        """The whole object at once, on the caller's thread, if it is no bigger than `limit` bytes (a read of the page
        cache: microseconds, where `get`'s hop to a thread costs a loop under load milliseconds); None when it is
        bigger or cannot be read now — the caller reads it with `get`, which says why and is retried."""
        try:
            fd = os.open(self.local_path(key), os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, StorageError):
            return None
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                return None
            data = os.read(fd, size)
            return data if len(data) == size else None  # (objects are replaced whole, never grown: a short read is odd)
        except OSError:
            return None
        finally:
            os.close(fd)

    async def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise ObjectMissing(key) from None

    async def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    async def delete_many(self, keys: list[str]) -> None:
        for key in keys:
            await self.delete(key)

    async def list(self, prefix: str) -> list[str]:
        return await asyncio.to_thread(self._list, prefix)

    def _list(self, prefix: str) -> builtins.list[str]:
        # walked from the prefix's directory, not the root: a tier of a million segments holds millions of files
        base, folder = Path(self._resolved_root), os.path.dirname(prefix)
        start = self._path(folder) if folder else base
        if not start.is_dir():
            return []
        return sorted(str(p.relative_to(base)) for p in start.rglob("*") if p.is_file()
                      and not p.name.startswith(".tmp-") and str(p.relative_to(base)).startswith(prefix))

    async def clean_incomplete(self, prefix: str, older_than_s: float,
                               owned: Callable[[str], bool] = lambda key: True) -> int:
        """Remove temporary files of writes a killed process left behind (older than `older_than_s`; a temporary
        file has no final name yet, so `owned` cannot be asked: the root is the tier's own directory)."""
        cutoff = time.time() - older_than_s
        n = 0
        for p in self.root.rglob(".tmp-*"):
            with contextlib.suppress(FileNotFoundError):
                if str(p.relative_to(self.root)).startswith(prefix) and p.stat().st_mtime < cutoff:
                    p.unlink()
                    n += 1
        return n

    async def probe(self) -> None:
        """The root is a directory this process can write (created at start)."""
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StorageRefused(f"{self.root} is not writable by this user (uid {os.getuid()})")

    async def close(self) -> None:
        return None


class S3Store:
    """Objects in an S3 bucket (or any S3 API: MinIO, moto) with ranged GETs and multipart uploads."""

    def __init__(self, bucket: str, *, endpoint: str | None = None, region: str | None = None,
                 part_size: int = 8 << 20, access_key: str | None = None, secret_key: str | None = None,
                 checksums: str = "when_supported", write_attempts: int = 4) -> None:
        """`checksums`: botocore's request_checksum_calculation and response_checksum_validation
        (`when_supported`, AWS's default: CRC32 on every upload, checked on whole-object reads; `when_required`
        for S3-compatible stores that refuse the aws-chunked trailer). `write_attempts`: uploads, deletes and
        listings (idempotent) are retried with backoff on retriable errors; reads are not (their callers retry
        within their own deadlines)."""
        if checksums not in ("when_supported", "when_required"):
            raise ValueError(f"checksums={checksums!r}: when_supported or when_required")
        self.bucket = bucket
        self.endpoint = endpoint
        self.checksums = checksums
        self.write_attempts = max(1, write_attempts)
        self.retries = 0  # writes retried (throttling, server errors, broken connections)
        self.region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.part_size = max(part_size, 5 << 20)  # S3's minimum part size
        self.access_key, self.secret_key = access_key, secret_key
        _boto()  # in the constructing thread, before any other thread uses the client
        self._client: Any = None
        self._ctx: Any = None
        self._lock = asyncio.Lock()
        self._ranged: RangedGets | None = None  # ranged GETs read into their own buffer (`s3body`)
        self._urls: TTLCache[str, str] = TTLCache(maxsize=4096, ttl=PRESIGNED_REUSE_S)
        self.ranged_fallbacks = 0  # ranged GETs the full client answered (a response `s3body` does not read)
        # bodies' buffers kept to be received into again once nothing refers to them; none unless a reader with a
        # bounded chunk cache sets `bodies.keep_bytes` to that bound
        self.bodies = BodyBuffers()
        self.counts = StorageRequests()  # every request sent and its bytes (`tier.requests`)

    async def _c(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    aiobotocore, _ = _boto()
                    kw: dict[str, Any] = {"region_name": self.region, "config": aiobotocore.config.AioConfig(
                        # no botocore retries ("max_attempts": 1 still allowed one): writes retry in
                        # `_retrying`, reads in their callers, each within its own bounds
                        retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=30,
                        max_pool_connections=64,
                        request_checksum_calculation=self.checksums, response_checksum_validation=self.checksums)}
                    if self.endpoint:
                        kw["endpoint_url"] = self.endpoint
                    if self.access_key:
                        kw["aws_access_key_id"], kw["aws_secret_access_key"] = self.access_key, self.secret_key
                    self._ctx = _session().create_client("s3", **kw)
                    self._client = await self._ctx.__aenter__()
        return self._client

    def _map(self, key: str, exc: Exception) -> StorageError:
        errors = _boto()[1].exceptions
        if isinstance(exc, errors.ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            return _answered(key, status, code, exc)
        if isinstance(exc, errors.BotoCoreError | OSError | asyncio.TimeoutError):
            return StorageUnavailable(f"s3 unreachable for {key}: {exc}")
        return StorageUnavailable(f"s3 error on {key}: {exc!r}")

    async def _retrying(self, key: str, op: Callable[[], Awaitable[T]]) -> T:
        """`op` (idempotent), again after a retriable failure: backoff 0.2 s doubling to 5 s, full jitter."""
        for attempt in range(self.write_attempts):
            try:
                return await op()
            except StorageUnavailable as exc:
                if not exc.retriable or attempt + 1 == self.write_attempts:
                    raise
                self.retries += 1
                await asyncio.sleep(random.uniform(0, min(5.0, 0.2 * 2 ** attempt)))
        raise AssertionError("unreachable")

    async def put(self, key: str, data: bytes) -> None:
        await self._retrying(key, lambda: self._put_once(key, data))

    async def _put_once(self, key: str, data: bytes) -> None:
        try:
            c = await self._c()
            if len(data) <= self.part_size:
                self.counts.count("put", written=len(data))
                await c.put_object(Bucket=self.bucket, Key=key, Body=data)
                return
            self.counts.count("multipart")
            up = await c.create_multipart_upload(Bucket=self.bucket, Key=key)
            parts = []
            try:
                for n, pos in enumerate(range(0, len(data), self.part_size), 1):
                    self.counts.count("part", written=min(self.part_size, len(data) - pos))
                    r = await c.upload_part(Bucket=self.bucket, Key=key, UploadId=up["UploadId"], PartNumber=n,
                                            Body=data[pos:pos + self.part_size])
                    parts.append({"ETag": r["ETag"], "PartNumber": n})
                self.counts.count("multipart")
                await c.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=up["UploadId"],
                                                  MultipartUpload={"Parts": parts})
            except BaseException:
                with contextlib.suppress(Exception):
                    self.counts.count("multipart")
                    await c.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=up["UploadId"])
                raise
        except StorageError:
            raise
        except Exception as exc:
            raise self._map(key, exc) from exc

    async def put_parts(self, key: str, parts: list[memoryview]) -> None:
        await self.put(key, b"".join(parts))  # S3 takes one body (or multipart slices of it)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if end is not None and end <= start:
            return b""
        try:
            c = await self._c()
            kw: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
            if start or end is not None:
                kw["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
            self.counts.count("get")
            resp = await c.get_object(**kw)
            async with resp["Body"] as body:
                data: bytes = await body.read()
            self.counts.received(len(data))
            return data
        except Exception as exc:
            if _invalid_range(exc):
                return b""
            raise self._map(key, exc) from exc

    async def read_range(self, key: str, start: int, end: int) -> ReadBuffer:
        """Into one buffer of its size (`s3body`); by the full client when the answer is not one `s3body` reads."""
        if end <= start:
            return b""
        try:
            return await self._ranged_get(key, start, end)
        except Unsupported:
            self.ranged_fallbacks += 1
            return await self.get(key, start, end)

    async def _ranged_get(self, key: str, start: int, end: int) -> bytearray:
        try:
            url = self._urls.get(key)
            if url is None:
                c = await self._c()
                url = self._urls[key] = await c.generate_presigned_url(
                    "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=PRESIGNED_VALID_S)
            if self._ranged is None:
                self._ranged = RangedGets(_https_context, connect_timeout=5, read_timeout=30,
                                          bodies=self.bodies)
            self.counts.count("get")
            got = await self._ranged.get(url, start, end)
            self.counts.received(len(got))
            return got
        except Unsupported:
            raise
        except HttpStatus as exc:
            if exc.status == 416 or exc.code == "InvalidRange":
                return bytearray()
            if exc.status == 403:  # a presigned URL refused (clock, credentials rotated): signed afresh next time
                self._urls.pop(key, None)
            raise _answered(key, exc.status, exc.code, exc) from None
        except (OSError, ConnectionError, TimeoutError) as exc:
            raise StorageUnavailable(f"s3 unreachable for {key}: {exc!r}") from exc
        except Exception as exc:
            raise self._map(key, exc) from exc

    async def size(self, key: str) -> int:
        try:
            c = await self._c()
            self.counts.count("head")
            return int((await c.head_object(Bucket=self.bucket, Key=key))["ContentLength"])
        except Exception as exc:
            raise self._map(key, exc) from exc

    async def delete(self, key: str) -> None:
        await self.delete_many([key])

    async def delete_many(self, keys: list[str]) -> None:
        """DeleteObjects, 1,000 keys a request (S3 deletes are idempotent: missing keys are fine)."""
        for i in range(0, len(keys), 1000):
            batch = keys[i:i + 1000]
            await self._retrying(batch[0], lambda batch=batch: self._delete_once(batch))  # type: ignore[misc]

    async def _delete_once(self, keys: list[str]) -> None:
        try:
            c = await self._c()
            self.counts.count("delete")
            resp = await c.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys],
                                                                      "Quiet": True})
        except Exception as exc:
            err = self._map(keys[0], exc)
            if isinstance(err, ObjectMissing):
                return
            raise err from exc
        failed = [e for e in resp.get("Errors", []) if e.get("Code") not in ("NoSuchKey",)]
        if failed:
            e = failed[0]
            raise StorageUnavailable(f"s3 {e.get('Code')} deleting {e.get('Key')}: {e.get('Message')} "
                                     f"({len(failed)} of {len(keys)} keys not deleted)",
                                     e.get("Code") in RETRIABLE_CODES or e.get("Code") == "InternalError")

    async def clean_incomplete(self, prefix: str, older_than_s: float,
                               owned: Callable[[str], bool] = lambda key: True) -> int:
        """Abort multipart uploads under `prefix` whose key is `owned` (the tier's own objects: another
        application may share the bucket) started more than `older_than_s` ago by S3's own clock (its answer's
        Date; this machine's clock may be off): a killed copy's, whose parts S3 keeps, and bills, until then."""
        n = 0
        try:
            c = await self._c()
            paginator = c.get_paginator("list_multipart_uploads")
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                self.counts.count("list")
                cutoff = _server_time(page) - older_than_s
                for up in page.get("Uploads", []):
                    if owned(up["Key"]) and up["Initiated"].timestamp() < cutoff:
                        self.counts.count("multipart")
                        await c.abort_multipart_upload(Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"])
                        n += 1
        except Exception as exc:
            err = self._map(prefix, exc)
            if not isinstance(err, ObjectMissing):
                raise err from exc
        return n

    async def probe(self) -> None:
        """The bucket exists and the credentials are accepted (HeadBucket): StorageRefused naming which is not,
        StorageUnavailable when the endpoint cannot be reached."""
        try:
            c = await self._c()
            self.counts.count("head")
            await c.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            errors = _boto()[1].exceptions
            if isinstance(exc, errors.NoCredentialsError):
                raise StorageRefused("no S3 credentials found (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, "
                                     "or an instance role)") from None
            if isinstance(exc, errors.ClientError):
                code = str(exc.response.get("Error", {}).get("Code", ""))
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
                if code in ("NoSuchBucket", "404", "NotFound") or status == 404:
                    raise StorageRefused(f"bucket {self.bucket!r} does not exist") from None
                if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden") \
                        or status in (401, 403):
                    raise StorageRefused(f"bucket {self.bucket!r}: credentials refused or no access "
                                         f"({code or status})") from None
            raise self._map(self.bucket, exc) from exc

    async def _list_once(self, prefix: str) -> list[str]:
        try:
            c = await self._c()
            keys: list[str] = []
            paginator = c.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                self.counts.count("list")
                keys += [o["Key"] for o in page.get("Contents", [])]
            return sorted(keys)
        except Exception as exc:
            raise self._map(prefix, exc) from exc

    async def list(self, prefix: str) -> list[str]:  # (after the methods whose annotations say list[...])
        return await self._retrying(prefix, lambda: self._list_once(prefix))

    async def close(self) -> None:
        if self._ranged is not None:
            self._ranged.close()
            self._ranged = None
        if self._ctx is not None:
            with contextlib.suppress(Exception):
                await self._ctx.__aexit__(None, None, None)
        self._client = self._ctx = None


def _answered(key: str, status: int, code: str, exc: Exception) -> StorageError:
    """An S3 error answer (HTTP status, S3 error code) as the storage error callers handle."""
    if code in ("NoSuchKey", "404", "NotFound") or status == 404:
        return ObjectMissing(key)
    retriable = status >= 500 or status == 429 or code in RETRIABLE_CODES
    return StorageUnavailable(f"s3 {code or status} on {key}: {exc}", retriable)


def _https_context() -> ssl.SSLContext:
    """What botocore verifies an https endpoint with: AWS_CA_BUNDLE, else its default bundle."""
    from botocore.httpsession import get_cert_path

    return ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True))


def _server_time(answer: dict[str, Any]) -> float:
    """The time an S3 answer was sent, by the server's clock (its Date header); this machine's when it has none."""
    from email.utils import parsedate_to_datetime

    date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        return parsedate_to_datetime(date).timestamp() if date else time.time()
    except (TypeError, ValueError):
        return time.time()


def _invalid_range(exc: Exception) -> bool:
    resp = getattr(exc, "response", None)
    return isinstance(resp, dict) and resp.get("Error", {}).get("Code") == "InvalidRange"


def open_store(uri: str) -> tuple[ObjectStore, str]:
    """(store, key prefix) for `file:///path` or `s3://bucket/prefix?endpoint=URL&region=R&part_size=N&checksums=C`."""
    u = urlparse(uri)
    if u.scheme == "file":
        if not u.path:
            raise ValueError(f"file storage URI needs a path: {uri!r}")
        return FileStore(Path(u.path)), ""
    if u.scheme == "s3":
        if not u.netloc:
            raise ValueError(f"s3 storage URI needs a bucket: {uri!r}")
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        store = S3Store(u.netloc, endpoint=q.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL"),
                        region=q.get("region"), part_size=int(q.get("part_size", 8 << 20)),
                        checksums=q.get("checksums", "when_supported"))
        return store, u.path.strip("/")
    raise ValueError(f"unsupported storage URI {uri!r}: use file:///path or s3://bucket/prefix")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
