"""`TierSettings`: everything `tierproxy tier` (and `iceberg`) reads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from tierproxy.config.common import CommonSettings
from tierproxy.config.values import (
    SPARK_MASTER,
    check_writable_dir,
    hide_url_password,
    parse_duration_ms,
    partition_by_fields,
)


class TierSettings(CommonSettings):
    """Everything `tierproxy tier` reads (shares the cluster, storage and metadata keys with `serve`)."""

    tier_topics: str = Field(r"^(?!__).*", description="regex of topics to tier (internal topics never)")
    tier_topics_exclude: str = Field(r".*-repartition$", description="regex of topics never tiered (default: "
                                     "Kafka Streams repartition topics, which Streams purges as it consumes)")
    tier_retention_max_delete_fraction: float = Field(
        0.5, gt=0, le=1, description="a pass refuses to delete more than this share of a partition's tiered bytes "
        "by retention (of a partition of three or more segments), or of the whole tier's bytes by topic deletions, "
        "at once, unless confirm.retention (--confirm-retention)")
    confirm_retention: bool = Field(False, description="apply tier retention even where it deletes more than "
                                    "tier.retention.max.delete.fraction at once (--confirm-retention)")
    tier_segment_bytes: int = Field(16 << 20, ge=1024, description="target size of a remote segment")
    tier_interval_ms: int = Field(30_000, ge=100, description="pause between tiering passes (--interval)")
    tier_orphan_timeout_ms: int = Field(600_000, ge=0,
                                        description="STARTED without FINISHED for this long = orphan")
    tier_task_max_attempts: int = Field(3, ge=1, description="copy attempts per segment (each with a new id)")
    tier_segment_delete_delay_ms: int = Field(
        60_000, ge=0, description="a tier segment marked for deletion (replaced by a tier compaction, or a deletion "
        "cut short) keeps its objects this long first, as Kafka's log.segment.delete.delay.ms: a proxy whose metadata "
        "view lags still reads them")
    tier_cleaner_enable: bool = Field(True, description="the tier compacts the tiered partitions of compacted topics "
                                      "after each pass's copies (Kafka's log.cleaner.enable)")
    tier_cleaner_dedupe_buffer_size: int = Field(
        128 << 20, ge=1 << 20, le=(1 << 31) - 1, description="bytes of the key map of one tier compaction task "
        "(Kafka's log.cleaner.dedupe.buffer.size): a partition whose dirty keys need more is cleaned as far as the "
        "map reaches and the rest at the next pass; Spark runs one task per core at once")
    tier_topic_delete_delay_ms: int = Field(
        600_000, ge=0, description="a tiered topic leaves the tier only once the cluster has answered UNKNOWN_TOPIC_ID "
        "for its id in passes at least this far apart (docs/tiering.md 'What deletes history')")
    spark_master: str = Field("local[*]", description="Spark master (local[*] by default)")
    restore_fill_max_offsets: int = Field(
        100_000_000, ge=0, description="`restore` fills at most this many offsets per partition through the protocol "
        "(filler records, purged as it goes); beyond it, it refuses and names the offline method")
    restore_fill_batch_records: int = Field(50_000, ge=1, le=1_000_000,
                                            description="filler records per Produce of a `restore` (one gzip batch)")

    @field_validator("spark_master")
    @classmethod
    def _master(cls, v: str) -> str:
        if not SPARK_MASTER.fullmatch(v.strip()):
            raise ValueError(f"{hide_url_password(v)!r} is not a Spark master URL (local, local[N], local[*], "
                             "local[N,F], spark://HOST:PORT, k8s://https://HOST:PORT, yarn)")
        return v.strip()
    iceberg_topics: str | None = Field(None, description="regex of topics in the table (default: tier.topics)")
    iceberg_warehouse: str | None = Field(None, description="where data files go (default: iceberg/ under "
                                          "storage)")
    iceberg_isolation_level: str = Field("read_committed", pattern="^(read_committed|read_uncommitted)$",
                                         description="read_committed: aborted transactions never become rows")
    iceberg_retention: str = Field("follow", pattern="^(follow|keep)$",
                                   description="follow: rows leave the table when the tier deletes or purges them; "
                                   "keep: the table keeps them")
    iceberg_orphan_min_age_ms: int = Field(3_600_000, ge=0, description="files nothing live in a table refers to "
                                           "(a killed pass's, expired snapshots') are deleted once this old")
    iceberg_writer_lease_ms: int = Field(30_000, ge=1000, description="a pass writing a table holds it while it "
                                         "renews its lease (every third of this); a lease not renewed this long, "
                                         "or of a process gone on this host, is taken over")
    iceberg_mode: str = Field("append", pattern="^(append|upsert)$",
                              description="typed tables: append (every record a row) or upsert (the latest value "
                              "per Kafka key; a tombstone deletes the key's row)")
    iceberg_value_format: str = Field("registry", pattern="^(registry|string|bytes)$",
                                      description="typed tables: how values become columns: registry (Confluent's "
                                      "wire format, decoded with the schema registry), string (one UTF-8 `value` "
                                      "column) or bytes (one binary `value` column)")
    iceberg_partition_by: str = Field("partition", description="what the tables are partitioned by, after the "
                                      "topic (raw and dead-letter tables): `partition`, `hour(timestamp)` and/or "
                                      "`day(timestamp)`, comma-separated; an existing table's spec evolves to it")
    iceberg_target_file_bytes: int = Field(128 << 20, ge=0, description="compaction: a table partition's data "
                                           "files under 3/4 of this are merged towards it (0: no compaction)")
    iceberg_compaction_min_input_files: int = Field(5, ge=2, description="compaction merges a partition's small "
                                                    "files once at least this many are there")
    iceberg_schema_registry_url: str | None = Field(None, description="the schema registry typed tables read "
                                                    "(Confluent's REST API)")
    iceberg_schema_registry_basic_auth_user_info: str | None = Field(
        None, repr=False, description="user:password for the schema registry (secret)")
    iceberg_schema_registry_ssl_ca_location: str | None = Field(
        None, description="PEM file of CAs verifying an https schema registry (default: the system's)")
    tier_state_dir: Path = Field(Path("tierproxy-data/state"), validate_default=True,
                                 description="run summaries (gaps, last run)")

    @field_validator("tier_state_dir")
    @classmethod
    def _check_state_dir(cls, v: Path) -> Path:
        return check_writable_dir(v)

    @field_validator("tier_interval_ms", "tier_orphan_timeout_ms", "tier_segment_delete_delay_ms",
                     "iceberg_orphan_min_age_ms",
                     "iceberg_writer_lease_ms", "tier_topic_delete_delay_ms", mode="before")
    @classmethod
    def _durations(cls, v: Any) -> int:
        return parse_duration_ms(v)

    @model_validator(mode="after")
    def _typed_tables_need_a_registry(self) -> TierSettings:
        if self.iceberg_tables and self.iceberg_value_format == "registry" and not self.iceberg_schema_registry_url:
            raise ValueError("iceberg.tables is set but iceberg.schema.registry.url is not: typed tables decode "
                             "values with the schema registry (iceberg.value.format=registry)")
        return self

    @field_validator("iceberg_schema_registry_url")
    @classmethod
    def _registry_url(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", v.strip()):
            raise ValueError("not an http(s) URL")
        return v.strip() if v is not None else v

    @field_validator("iceberg_schema_registry_ssl_ca_location")
    @classmethod
    def _ca(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_file():
            raise ValueError("no such file")
        return v

    @field_validator("iceberg_partition_by")
    @classmethod
    def _partition_by(cls, v: str) -> str:
        return ",".join(partition_by_fields(v))

    @field_validator("tier_topics", "tier_topics_exclude", "iceberg_topics")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return v


