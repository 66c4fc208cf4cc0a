"""`tierproxy iceberg`: passes on their own (`--once`, `--interval`) or after each `tierproxy tier` pass, and
`snapshot-at`. Errors come out as one line naming the catalog, namespace, table or segment (exit codes in cli)."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from tierproxy.config import TierSettings
from tierproxy.config.values import partition_by_fields, typed_table_rules, typed_tables
from tierproxy.jobs.iceberg.catalog import (
    CatalogConfig,
    catalog_config,
    load_existing,
    name_key,
    open_catalog,
    safe_uri,
)
from tierproxy.jobs.iceberg.compaction import CompactionOptions
from tierproxy.jobs.iceberg.ledger import snapshot_at
from tierproxy.jobs.iceberg.registry import RegistryConfig
from tierproxy.jobs.iceberg.schema import TOPIC_ID
from tierproxy.jobs.iceberg.sync import IcebergOptions, IcebergSummary, IcebergSync, SegmentDataError
from tierproxy.jobs.iceberg.typed_tables import TypedOptions
from tierproxy.jobs.tiering.cluster import describe_cluster

log = logging.getLogger(__name__)
__all__ = ["SegmentDataError", "backfill_topic_ids", "catalog_of", "metadata_location", "options_of", "run_loop",
           "run_pass", "run_passes", "snapshot_for_offsets"]


def catalog_of(s: TierSettings) -> CatalogConfig:
    uri = None if s.iceberg_catalog in (None, "", "embedded") else s.iceberg_catalog
    return catalog_config(uri, s.storage, str(s.tier_state_dir), credential=s.iceberg_catalog_credential,
                          token=s.iceberg_catalog_token, warehouse=s.iceberg_warehouse)


def options_of(s: TierSettings) -> IcebergOptions:
    return IcebergOptions(catalog_of(s), s.iceberg_table, s.own_bootstrap, s.storage, s.metadata,
                          s.iceberg_topics or s.tier_topics, s.iceberg_isolation_level == "read_committed",
                          s.iceberg_retention == "keep", s.iceberg_orphan_min_age_ms, s.iceberg_writer_lease_ms,
                          compaction=CompactionOptions(s.iceberg_target_file_bytes,
                                                       s.iceberg_compaction_min_input_files),
                          partition_by=partition_by_fields(s.iceberg_partition_by))


def typed_options_of(s: TierSettings, topics: list[str]) -> list[IcebergOptions]:
    """One pass's options per typed table (`iceberg.tables`): each topic a rule's regex matches in full, by the
    first rule matching it."""
    if not s.iceberg_tables:
        return []
    registry = None if s.iceberg_schema_registry_url is None else RegistryConfig(
        s.iceberg_schema_registry_url, s.iceberg_schema_registry_basic_auth_user_info,
        s.iceberg_schema_registry_ssl_ca_location)  # the settings refuse the registry format without one
    raw = options_of(s)
    rules = typed_table_rules(s.iceberg_tables)
    key = name_key(raw.catalog, open_catalog(raw.catalog), sorted({p.rpartition(".")[0] for _, p in rules}))
    out = []
    for topic, table in typed_tables(rules, topics, key).items():
        out.append(dataclasses.replace(raw, table=table, topics=f"^{re.escape(topic)}$",
                                       typed=TypedOptions(registry, f"{topic}-value", upsert=s.iceberg_mode == "upsert",
                                                          value_format=s.iceberg_value_format)))
    return out


def run_passes(settings: TierSettings, spark: Callable[[], Any]) -> list[IcebergSummary]:
    """One pass of every table: the raw history table (unless typed tables alone are configured: `iceberg.tables`
    set and `iceberg.topics` not), then each typed table. The first failure stops the round (its exit code), but
    for a topic refused its table (TableCollision: made for another topic): that one table's own problem, it lets the
    others' passes run first, then fails the round (else every table after it would starve, round after round)."""
    from tierproxy.config.values import TableCollision

    out = []
    if not settings.iceberg_tables or settings.iceberg_topics:
        out.append(run_pass(IcebergSync(options_of(settings), spark)))
    if settings.iceberg_tables:
        topics = [p.topic for p in describe_cluster(settings.own_bootstrap).partitions]
        refused: TableCollision | None = None
        for options in typed_options_of(settings, topics):
            try:
                out.append(run_pass(IcebergSync(options, spark)))
            except TableCollision as exc:
                log.error("iceberg: %s", exc)
                refused = refused or exc
        if refused is not None:
            raise refused
    return out


def run_pass(sync: IcebergSync) -> IcebergSummary:
    """One pass; its summary line printed and logged."""
    summary = sync.run_once()
    log.info("%s", summary.line())
    print(summary.line(), flush=True)
    return summary


def run_loop(settings: TierSettings, spark: Callable[[], Any], *, once: bool,
             max_passes: int | None = None) -> list[IcebergSummary]:
    out: list[IcebergSummary] = []
    rounds = 0
    while True:
        out += run_passes(settings, spark)
        rounds += 1
        if once or (max_passes is not None and rounds >= max_passes):
            return out
        time.sleep(settings.tier_interval_ms / 1000)


def metadata_location(settings: TierSettings) -> str:
    """The table's current metadata file: DuckDB's `iceberg_scan(...)` and other catalog-less readers start there."""
    table = _existing_table(settings)
    location: str = table.metadata_location
    return location


def backfill_topic_ids(settings: TierSettings) -> tuple[str, bool]:
    """`backfill-topic-ids`: the one-time fill of the topic id column of `iceberg.table`'s older rows (`backfill`);
    (its line, whether every row now has its id)."""
    from tierproxy.jobs.iceberg.backfill import backfill

    table, cfg = _existing_table(settings), catalog_of(settings)
    done = backfill(table, settings.iceberg_table, cfg.io, settings.iceberg_writer_lease_ms,
                    lambda: open_catalog(cfg).load_table(settings.iceberg_table), cfg.redact)
    return done.line(settings.iceberg_table), not done.left


def _existing_table(settings: TierSettings) -> Any:
    """The table (a typed table or a dead-letter table too), never created by asking: LookupError naming it."""
    cfg = catalog_of(settings)
    table = load_existing(open_catalog(cfg), cfg, settings.iceberg_table)
    if table is None:
        raise LookupError(f"no Iceberg table {settings.iceberg_table} in the catalog ({safe_uri(cfg.uri)}): "
                          "`tierproxy iceberg` (or a tier pass with iceberg.catalog set) creates it")
    return table


def snapshot_for_offsets(settings: TierSettings, topic: str, offsets_json: str,
                         topic_id: str | None = None) -> dict[str, Any]:
    """`snapshot-at`: {"snapshot_id", "timestamp_ms", "topic_id", "ends", "filter"} of the first snapshot holding every
    record of `topic` below the given offsets ({"partition": offset}, or Spark's {"topic": {"partition": offset}}),
    of its incarnation `topic_id` (default: the table's current one; `--retention keep` keeps older ones)."""
    wanted = f'--offsets {offsets_json!r}: expected a JSON object {{"partition": offset, ...}}'
    try:
        raw = json.loads(offsets_json)
        if isinstance(raw, dict) and topic in raw and isinstance(raw[topic], dict):
            raw = raw[topic]
        if not isinstance(raw, dict) or not raw:
            raise ValueError(wanted)
        offsets = {int(p): int(o) for p, o in raw.items()}
    except (ValueError, TypeError) as exc:
        raise ValueError(wanted if str(exc) == wanted else f"{wanted} ({exc})") from None
    if topic_id is not None and not re.fullmatch(r"[A-Za-z0-9_-]{22}", topic_id):
        raise ValueError(f"--topic-id {topic_id!r}: expected a Kafka topic id (22 characters of URL-safe base64)")
    table = _existing_table(settings)
    snap, tid = snapshot_at(table, topic, offsets, topic_id)
    if snap is None:
        of = f" (incarnation {tid})" if tid else ""
        return {"snapshot_id": None, "topic_id": tid, "reason": f"no snapshot holds {topic}{of} up to {offsets} yet"}
    from tierproxy.jobs.iceberg.ledger import ledger_of
    from tierproxy.jobs.iceberg.typed import PREFIX

    led = ledger_of(snap)
    assert led is not None
    names = {f.name for f in table.schema().fields}
    prefix = PREFIX if f"{PREFIX}offset" in names else ""  # a typed table's Kafka columns
    where = " OR ".join(f"({prefix}partition = {p} AND {prefix}offset < {o})" for p, o in sorted(offsets.items()))
    if len(led.incarnations(topic)) > 1:  # the rows of each incarnation told apart by their id
        where = f"{prefix}{'topic_id' if prefix else TOPIC_ID} = '{tid}' AND ({where})"
    return {"snapshot_id": snap.snapshot_id, "timestamp_ms": snap.timestamp_ms, "topic_id": tid,
            "ends": {str(p): led.ends[f"{tid}:{p}"] for p in offsets}, "filter": where}
