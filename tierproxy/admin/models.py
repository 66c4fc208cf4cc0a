"""The admin API's response models (its OpenAPI schema)."""

from __future__ import annotations

from pydantic import BaseModel


class PartitionStatus(BaseModel):
    partition: int
    leader: int
    broker_log_start: int | None
    high_watermark: int | None
    last_stable_offset: int | None
    tier_start: int | None
    purged_below: int  # the recorded log start (DeleteRecords through a proxy): nothing below it is served
    tier_end: int
    segments: int
    tier_bytes: int
    tiering_lag: int | None
    gap: list[int] | None
    holes: list[list[int]]  # [first missing, next start) between tiered segments (the next pass refills them)


class Segment(BaseModel):
    segment_id: str
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    size_bytes: int
    state: str
    leader_epochs: dict[str, int]


class TopicSummary(BaseModel):
    topic: str
    topic_id: str
    partitions: int
    tiered_segments: int
    tiered_bytes: int
    tier_retention_ms: int  # the tier's own retention for this topic (-1: keep forever)
    tier_retention_bytes: int
    # a restored topic (`tierproxy restore`): the id its history is kept under and the cluster it came from
    history_topic_id: str | None = None
    restored_from_cluster: str | None = None


class IcebergPartition(BaseModel):
    topic: str
    partition: int
    tier_end: int  # the offset after the tier's last one
    table_end: int  # the table holds every committed record below it
    lag: int


class TypedTableStatus(BaseModel):
    table: str
    topic: str
    exists: bool
    snapshot_id: int | None = None
    last_commit_ms: int | None = None
    files: int = 0
    rows: int = 0
    live_bytes: int = 0  # the current snapshot's data files and the metadata reading it needs
    disk_bytes: int = 0  # every file under the table's location (older snapshots', orphans)
    snapshots: int = 0
    manifests: int = 0  # the current snapshot's
    dead_letters: int = 0  # rows of its dead-letter table (`<table>_dlq`)
    lag_offsets: int
    partitions: list[IcebergPartition]


class IcebergStatus(BaseModel):
    table: str
    catalog: str  # its URI, any password hidden
    exists: bool
    snapshot_id: int | None = None
    last_commit_ms: int | None = None
    files: int = 0
    rows: int = 0
    live_bytes: int = 0  # the current snapshot's data files and the metadata reading it needs
    disk_bytes: int = 0  # every file under the table's location (older snapshots', orphans)
    snapshots: int = 0
    manifests: int = 0  # the current snapshot's
    lag_offsets: int
    partitions: list[IcebergPartition]
    typed: list[TypedTableStatus] | None = None  # with iceberg.tables: each typed table of a tiered topic


class RemoteFetchStatus(BaseModel):
    enabled: bool
    ready: bool
    purgatory: int
    pool_running: int
    pool_queued: int
    pool_threads: int
    rejected: int
    expired: int
    cache_hit_ratio: float | None
    cache_bytes: int
    requests_total: int  # remote reads, bytes served and failed reads since start (all topics)
    bytes_total: int
    errors_total: int


class TieringRun(BaseModel):
    run_id: str
    status: str  # requested, expired, withdrawn, running, succeeded, failed
    started_ms: int
    finished_ms: int | None
    summary: str | None
    returncode: int | None
    expires_ms: int | None = None  # when a request no tier job took expires (None: a request of an older version)
