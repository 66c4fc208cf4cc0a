"""Object stores behind the RemoteStorageManager: the local filesystem and S3 (aiobotocore).

One error type leaves this module: `StorageError`, as `ObjectMissing` (the object is not there) or
`StorageUnavailable` (the store cannot be reached or failed); callers map them to Kafka error codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

_boto_lock = threading.Lock()


def _boto() -> Any:
    """aiobotocore and botocore, imported on first use (half a second that file:// users, the proxy without S3
    and every Spark reader task would pay otherwise), under a lock: a first import racing on two threads (the
    tiering driver's RLMM loop and its main thread) can fail inside importlib."""
    with _boto_lock:
        import aiobotocore.config
        import aiobotocore.session
        import botocore.exceptions

        return aiobotocore, botocore


class StorageError(Exception):
    """Any failure of remote storage."""


class ObjectMissing(StorageError):
    """The object does not exist (deleted meanwhile, never written)."""


class StorageUnavailable(StorageError):
    """The store could not be reached or answered with a server error: worth retrying."""


class StorageRefused(StorageError):
    """The store answers, but refuses this configuration: the bucket does not exist, the credentials are refused."""


class ObjectStore(Protocol):
    async def put(self, key: str, data: bytes) -> None: ...
    async def put_parts(self, key: str, parts: list[memoryview]) -> None: ...
    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes: ...
    async def size(self, key: str) -> int: ...
    async def delete(self, key: str) -> None: ...
    async def list(self, prefix: str) -> list[str]: ...
    async def probe(self) -> None: ...
    async def close(self) -> None: ...


class FileStore:
    """Objects as files under a root directory; writes are atomic (temp file + rename)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root.resolve() not in p.parents:
            raise StorageError(f"object key escapes the store: {key!r}")
        return p

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, key, [memoryview(data)])

    async def put_parts(self, key: str, parts: list[memoryview]) -> None:
        await asyncio.to_thread(self._put, key, parts)

    def _put(self, key: str, parts: list[memoryview]) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.writelines(parts)
            os.replace(tmp, path)
        except OSError as exc:
            raise StorageUnavailable(f"writing {key}: {exc}") from exc

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return await asyncio.to_thread(self.get_blocking, key, start, end)

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

    async def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise ObjectMissing(key) from None

    async def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    async def list(self, prefix: str) -> list[str]:
        base = self.root
        return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()
                      and not p.name.startswith(".tmp-") and str(p.relative_to(base)).startswith(prefix))

    async def probe(self) -> None:
        """The root is a directory this process can write (created at start)."""
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StorageRefused(f"{self.root} is not writable by this user (uid {os.getuid()})")

    async def close(self) -> None:
        return None


class S3Store:
    """Objects in an S3 bucket (or any S3 API: MinIO, moto) with ranged GETs and multipart uploads."""

    def __init__(self, bucket: str, *, endpoint: str | None = None, region: str | None = None,
                 part_size: int = 8 << 20, access_key: str | None = None, secret_key: str | None = None) -> None:
        self.bucket = bucket
        self.endpoint = endpoint
        self.region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.part_size = max(part_size, 5 << 20)  # S3's minimum part size
        self.access_key, self.secret_key = access_key, secret_key
        _boto()  # in the constructing thread, before any other thread uses the client
        self._client: Any = None
        self._ctx: Any = None
        self._lock = asyncio.Lock()

    async def _c(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    aiobotocore, _ = _boto()
                    kw: dict[str, Any] = {"region_name": self.region, "config": aiobotocore.config.AioConfig(
                        retries={"max_attempts": 1}, connect_timeout=5, read_timeout=30, max_pool_connections=64)}
                    if self.endpoint:
                        kw["endpoint_url"] = self.endpoint
                    if self.access_key:
                        kw["aws_access_key_id"], kw["aws_secret_access_key"] = self.access_key, self.secret_key
                    self._ctx = aiobotocore.session.get_session().create_client("s3", **kw)
                    self._client = await self._ctx.__aenter__()
        return self._client

    def _map(self, key: str, exc: Exception) -> StorageError:
        errors = _boto()[1].exceptions
        if isinstance(exc, errors.ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                return ObjectMissing(key)
            return StorageUnavailable(f"s3 {code or status} on {key}: {exc}")
        if isinstance(exc, errors.BotoCoreError | OSError | asyncio.TimeoutError):
            return StorageUnavailable(f"s3 unreachable for {key}: {exc}")
        return StorageUnavailable(f"s3 error on {key}: {exc!r}")

    async def put(self, key: str, data: bytes) -> None:
        try:
            c = await self._c()
            if len(data) <= self.part_size:
                await c.put_object(Bucket=self.bucket, Key=key, Body=data)
                return
            up = await c.create_multipart_upload(Bucket=self.bucket, Key=key)
            parts = []
            try:
                for n, pos in enumerate(range(0, len(data), self.part_size), 1):
                    r = await c.upload_part(Bucket=self.bucket, Key=key, UploadId=up["UploadId"], PartNumber=n,
                                            Body=data[pos:pos + self.part_size])
                    parts.append({"ETag": r["ETag"], "PartNumber": n})
                await c.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=up["UploadId"],
                                                  MultipartUpload={"Parts": parts})
            except BaseException:
                with contextlib.suppress(Exception):
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
            resp = await c.get_object(**kw)
            async with resp["Body"] as body:
                data: bytes = await body.read()
            return data
        except Exception as exc:
            if _invalid_range(exc):
                return b""
            raise self._map(key, exc) from exc

    async def size(self, key: str) -> int:
        try:
            c = await self._c()
            return int((await c.head_object(Bucket=self.bucket, Key=key))["ContentLength"])
        except Exception as exc:
            raise self._map(key, exc) from exc

    async def delete(self, key: str) -> None:
        try:
            c = await self._c()
            await c.delete_object(Bucket=self.bucket, Key=key)  # S3 deletes are idempotent
        except Exception as exc:
            err = self._map(key, exc)
            if not isinstance(err, ObjectMissing):
                raise err from exc

    async def probe(self) -> None:
        """The bucket exists and the credentials are accepted (HeadBucket): StorageRefused naming which is not,
        StorageUnavailable when the endpoint cannot be reached."""
        try:
            c = await self._c()
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

    async def list(self, prefix: str) -> list[str]:
        try:
            c = await self._c()
            keys: list[str] = []
            paginator = c.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                keys += [o["Key"] for o in page.get("Contents", [])]
            return sorted(keys)
        except Exception as exc:
            raise self._map(prefix, exc) from exc

    async def close(self) -> None:
        if self._ctx is not None:
            with contextlib.suppress(Exception):
                await self._ctx.__aexit__(None, None, None)
        self._client = self._ctx = None


def _invalid_range(exc: Exception) -> bool:
    resp = getattr(exc, "response", None)
    return isinstance(resp, dict) and resp.get("Error", {}).get("Code") == "InvalidRange"


def open_store(uri: str) -> tuple[ObjectStore, str]:
    """(store, key prefix) for `file:///path` or `s3://bucket/prefix?endpoint=URL&region=R`."""
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
                        region=q.get("region"), part_size=int(q.get("part_size", 8 << 20)))
        return store, u.path.strip("/")
    raise ValueError(f"unsupported storage URI {uri!r}: use file:///path or s3://bucket/prefix")
