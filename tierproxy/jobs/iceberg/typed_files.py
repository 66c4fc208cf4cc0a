"""The executors' half of a typed table: one tier slice → a Parquet file of typed rows and one of dead letters.

The slice's records are read as for the raw table (`files.table_batches`: the tier's exact bytes, CRC-checked,
aborted transactions dropped under read_committed); each value is decoded (`typed.ValueDecoder`); a record whose value
decodes is a row of the typed table, any other is a row of the dead-letter table with the reason. Both files are
named like the raw table's (segment, byte range, pass), under their own table's location.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import ProtocolError
from tierproxy.jobs.iceberg.files import (
    SliceWritten,
    SplitParquet,
    TransactionTracker,
    checked,
    data_file_path,
    peak_rss_kb,
    table_batches,
)
from tierproxy.jobs.iceberg.registry import RegistryUnavailable
from tierproxy.jobs.iceberg.typed import KAFKA_COLUMNS, PREFIX, DecodePlan, ValueDecoder, arrow_raw_type, value_columns
from tierproxy.jobs.iceberg.upsert import split_for_upsert, tombstone_schema, tombstones_location
from tierproxy.jobs.spark.slices import Slice
from tierproxy.jobs.spark.source import read_tier_slice
from tierproxy.tier.model import uuid_str


def split_batch(rb: Any, decoder: ValueDecoder, typed_target: Any, dlq_target: Any) -> tuple[Any, Any]:
    """A raw table batch → (typed rows, dead letters), each in its table's Arrow schema, in offset order.

    Only the values are decoded (`ValueDecoder.decode_batch`: into columns of Arrow's raw types, then one cast per
    batch); the Kafka columns are taken from the raw batch as they are. The collector is paused meanwhile: values
    decoded in Python make no cycles, and collecting while a batch's values pile up costs more than the decoding."""
    import gc

    import pyarrow as pa

    names = [f.name for f in typed_target if not f.name.startswith(PREFIX)]
    struct = pa.struct([typed_target.field(n) for n in names])
    collecting = gc.isenabled()
    gc.disable()
    try:
        ok, decoded, dead, reasons = decoder.decode_batch(rb.column("value"), arrow_raw_type(struct))
    finally:
        if collecting:
            gc.enable()
    decoded = decoded.cast(struct)
    taken = rb.take(pa.array(ok, pa.int64()))
    typed = pa.RecordBatch.from_arrays([decoded.field(n) for n in names] +
                                       [taken.column(raw) for raw, _ in KAFKA_COLUMNS],
                                       names=names + [typed for _, typed in KAFKA_COLUMNS])
    letters = rb.take(pa.array(dead, pa.int64()))
    letters = pa.RecordBatch.from_arrays([*letters.columns, pa.array(reasons, pa.large_string())],
                                         names=[*letters.schema.names, "error"])
    # (a dead-letter table that gained a column by evolution has it after `error`)
    return typed.select(typed_target.names).cast(typed_target), letters.select(dlq_target.names).cast(dlq_target)


def write_typed_slice(storage: str, locations: tuple[str, str], io_properties: dict[str, str], s: Slice,
                      read_committed: bool, pass_id: str, targets: tuple[Any, Any, Any], plan: DecodePlan,
                      table_schema: Any, buckets: tuple[tuple[str, int] | None, tuple[str, int] | None] = (None, None),
                      upsert: bool = False) -> SliceWritten:
    """Run on an executor: the slice's records → typed rows and dead letters. `locations` = (typed table, dead-letter
    table); `targets` = the Arrow schemas (raw rows as read, typed table, dead-letter table); `table_schema` the
    typed table's Iceberg schema after this pass's evolution (what a schema id met here must fit). `upsert`: the
    slice's tombstones go to a file of their own, records without a key are dead letters (`upsert`)."""
    import pyarrow as pa
    from pyiceberg.io import load_file_io

    assert s.segment is not None
    rss_before = peak_rss_kb()
    raw_target, typed_target, dlq_target = targets
    decoder = ValueDecoder(plan, value_columns(table_schema))
    tracker = TransactionTracker()
    fileio = load_file_io(properties=io_properties, location=locations[0])
    typed = SplitParquet(fileio, data_file_path(locations[0], s, pass_id), typed_target, buckets[0])
    dead = SplitParquet(fileio, data_file_path(locations[1], s, pass_id), dlq_target, buckets[1])
    tombs = SplitParquet(fileio, data_file_path(tombstones_location(locations[0]), s, pass_id), tombstone_schema(),
                         None)
    error, kind, done = None, "", False
    try:
        for rb in table_batches(tracker.see(checked(read_tier_slice(storage, s), s)), s, read_committed, raw_target):
            if upsert:
                rb, tombstones, no_key = split_for_upsert(rb, dlq_target)
                tombs.write(tombstones)
            rows, letters = split_batch(rb, decoder, typed_target, dlq_target)
            typed.write(rows)
            if upsert and no_key.num_rows:  # the dead letters in offset order
                letters = pa.Table.from_batches([letters, no_key]).sort_by("offset").combine_chunks().to_batches()
                for b in letters:
                    dead.write(b)
            else:
                dead.write(letters)
        done = True
    except ProtocolError as exc:
        error, kind = str(exc), "data"
    except RegistryUnavailable as exc:
        error, kind = str(exc), "registry"
    finally:  # a failed slice leaves no file behind (a retried task writes its own)
        typed_paths, dead_paths = typed.close(discard=not done), dead.close(discard=not done)
        tomb_paths = tombs.close(discard=not done)
    if error is not None:
        return SliceWritten((), error=error, error_kind=kind)
    return SliceWritten(typed_paths + tomb_paths, typed.rows, s.topic, s.partition,
                        uuid_str(s.segment.segment_id.tp.topic_id),
                        uuid_str(s.segment.segment_id.id), s.start, s.end, s.segment.end_offset,
                        s.byte_range[0] if s.byte_range else 0, dict(tracker.opens), sorted(tracker.closes),
                        None, peak_rss_kb(), rss_before, dlq_paths=dead_paths, dlq_rows=dead.rows)
