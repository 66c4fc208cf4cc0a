"""RemoteStorageManager (KIP-405): copy, fetch and delete a segment and its indexes on an object store.

Object layout: {prefix}/{topic}-{topicId}/{partition}/{startOffset:020d}-{segmentId}.{ext}
    ext: log (raw record batches exactly as the broker served them), index (offset), timeindex,
    leader-epoch-checkpoint, txnindex, snapshot (producer snapshot)
Copies overwrite whatever a failed attempt left (idempotent); deletes ignore missing objects.
"""

from __future__ import annotations

import asyncio
import enum
import re

from tierproxy.tier.indexes import SegmentFiles
from tierproxy.tier.model import RemoteLogSegmentMetadata, TopicIdPartition, uuid_str
from tierproxy.tier.storage import FileStore, ObjectStore, ReadBuffer, open_store


class IndexType(enum.Enum):
    OFFSET = "index"
    TIMESTAMP = "timeindex"
    LEADER_EPOCH = "leader-epoch-checkpoint"
    TRANSACTION = "txnindex"
    PRODUCER_SNAPSHOT = "snapshot"


LOG_EXT = "log"
# a segment object's name under the prefix: {topic}-{topicId}/{partition}/{startOffset:020d}-{segmentId}.{ext}
SEGMENT_OBJECT = re.compile(r"[^/]+-[A-Za-z0-9_-]{22}/\d+/\d{20}-[A-Za-z0-9_-]{22}\.[a-z-]+")


class RemoteStorageManager:
    """Segments on an `ObjectStore` under a key prefix."""

    def __init__(self, store: ObjectStore, prefix: str = "") -> None:
        self.store = store
        self.prefix = prefix.strip("/")

    @classmethod
    def from_uri(cls, uri: str) -> RemoteStorageManager:
        store, prefix = open_store(uri)
        return cls(store, prefix)

    def object_key(self, name: str) -> str:
        """The key of one of the tier's own objects (not a segment's) under the prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def key(self, md: RemoteLogSegmentMetadata, ext: str) -> str:
        tp = md.tp
        name = f"{tp.topic}-{uuid_str(tp.topic_id)}/{tp.partition}/{md.start_offset:020d}-{uuid_str(md.segment_id.id)}"
        return f"{self.prefix}/{name}.{ext}" if self.prefix else f"{name}.{ext}"

    async def copy_segment(self, md: RemoteLogSegmentMetadata, files: SegmentFiles) -> None:
        """Upload the indexes, then the log (a reader finding the log finds its indexes too)."""
        await asyncio.gather(
            self.store.put(self.key(md, IndexType.OFFSET.value), files.offset_index),
            self.store.put(self.key(md, IndexType.TIMESTAMP.value), files.time_index),
            self.store.put(self.key(md, IndexType.LEADER_EPOCH.value), files.leader_epoch_checkpoint),
            self.store.put(self.key(md, IndexType.TRANSACTION.value), files.txn_index),
            self.store.put(self.key(md, IndexType.PRODUCER_SNAPSHOT.value), files.producer_snapshot))
        await self.store.put_parts(self.key(md, LOG_EXT), files.log_parts)

    async def fetch_log(self, md: RemoteLogSegmentMetadata, start: int, end: int | None = None) -> bytes:
        """Bytes [start, end) of the segment's log (to its end when `end` is None)."""
        return await self.store.get(self.key(md, LOG_EXT), start, end)

    async def read_log(self, md: RemoteLogSegmentMetadata, start: int, end: int) -> ReadBuffer:
        """Bytes [start, end) of the segment's log for a remote read (from S3: into a buffer of its own size)."""
        return await self.store.read_range(self.key(md, LOG_EXT), start, end)

    def log_file(self, md: RemoteLogSegmentMetadata) -> str | None:
        """The segment's log as a local file (a tier of files), which a reader may send from; None on S3."""
        if isinstance(self.store, FileStore):
            return str(self.store.local_path(self.key(md, LOG_EXT)))
        return None

    async def fetch_index(self, md: RemoteLogSegmentMetadata, index: IndexType) -> bytes:
        return await self.store.get(self.key(md, index.value))

    def small_index(self, md: RemoteLogSegmentMetadata, index: IndexType, limit: int) -> bytes | None:
        """The segment's index read at once from a tier of files, if no bigger than `limit` bytes; None on S3, for
        a bigger one or one that cannot be read now (`fetch_index` reads it then)."""
        if isinstance(self.store, FileStore):
            return self.store.read_small(self.key(md, index.value), limit)
        return None

    async def delete_segment(self, md: RemoteLogSegmentMetadata) -> None:
        """Delete the log and every index; objects already gone are fine."""
        await self.store.delete_many([self.key(md, ext) for ext in [LOG_EXT, *(i.value for i in IndexType)]])

    async def delete_by_id(self, tp: TopicIdPartition, segment_id: bytes) -> int:
        """Delete every object of a segment id in its partition, whatever start offset named them (orphans of
        interrupted copies); returns how many objects were deleted."""
        part_prefix = f"{tp.topic}-{uuid_str(tp.topic_id)}/{tp.partition}/"
        prefix = f"{self.prefix}/{part_prefix}" if self.prefix else part_prefix
        marker = f"-{uuid_str(segment_id)}."
        keys = [k for k in await self.store.list(prefix) if marker in k.rsplit("/", 1)[-1]]
        await self.store.delete_many(keys)
        return len(keys)

    def is_segment_object(self, key: str) -> bool:
        """Whether `key` names one of this tier's segment objects (under its prefix, in its layout)."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        return key.startswith(prefix) and SEGMENT_OBJECT.fullmatch(key[len(prefix):]) is not None

    async def clean_incomplete(self, older_than_s: float) -> int:
        """Uploads a killed copy left unfinished (multipart uploads, temporary files), older than given: only this
        tier's segment objects, never another application's upload in the same bucket."""
        return await self.store.clean_incomplete(f"{self.prefix}/" if self.prefix else "", older_than_s,
                                                 self.is_segment_object)

    async def close(self) -> None:
        await self.store.close()
