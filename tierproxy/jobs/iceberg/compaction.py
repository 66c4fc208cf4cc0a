"""Small-file compaction: a table partition's small data files merged into files near `iceberg.target.file.bytes`.

A pass writes one data file per tiered segment (or byte range of one), so a topic with small segments would end with
a file per segment. After its commits a pass looks at each table's live files: per table partition, the files under
3/4 of the target (Iceberg's `min-file-size-bytes` default) are taken in offset order and packed into groups of at
most the target, less a file larger than the rest of its group together (size-tiered: an earlier compaction's file
waits until as much has come beside it); a group of at least `iceberg.compaction.min.input.files` files is rewritten
as one file (on the executors, each file read as it is and cast to the table's current schema, rows kept in offset
order) and swapped for its inputs in one commit. The rows do not change: a group whose new file does not hold
exactly its inputs' row count is not committed. The commit carries the ledger unchanged (no row is added or removed,
so exactly-once is untouched) and `tierproxy.compaction` = the pass; pyiceberg 0.12 cannot write Iceberg's `replace`
operation, so its snapshot is an `overwrite` (a streaming reader of the table skips it with Spark's
`streaming-skip-overwrite-snapshots`). The replaced files stay on disk while an older snapshot references them (until
snapshots expire: `maintenance`).
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tierproxy.config.values import hide_url_passwords

log = logging.getLogger(__name__)
COMPACTION = "tierproxy.compaction"  # snapshot summary key: the pass whose compaction made the snapshot


@dataclass(frozen=True)
class CompactionOptions:
    target_bytes: int = 128 << 20  # iceberg.target.file.bytes (0: no compaction)
    min_input_files: int = 5  # iceberg.compaction.min.input.files

    @property
    def small_bytes(self) -> int:
        """A file under this size is small (Iceberg's `min-file-size-bytes` default: 75% of the target)."""
        return self.target_bytes * 3 // 4


@dataclass(frozen=True)
class Candidate:
    """A live data file as compaction sees it."""

    partition: tuple[Any, ...]  # spec id, then the partition's values: only files of one are merged
    first_offset: int  # the lower bound of its offset column: the order files are merged in
    size: int
    rows: int
    file: Any  # pyiceberg DataFile (None in planning tests)


def plan_groups(files: Sequence[Candidate], options: CompactionOptions) -> list[list[Candidate]]:
    """The groups to rewrite: per partition, the small files in offset order packed greedily into groups of at most
    the target's bytes; groups of fewer than the minimum files are left as they are."""
    if options.target_bytes <= 0:
        return []
    by_partition: dict[tuple[Any, ...], list[Candidate]] = defaultdict(list)
    for f in files:
        if f.size < options.small_bytes:
            by_partition[f.partition].append(f)
    groups: list[list[Candidate]] = []
    for key in sorted(by_partition, key=repr):
        group: list[Candidate] = []
        size = 0
        for f in sorted(by_partition[key], key=lambda c: c.first_offset):
            if group and size + f.size > options.target_bytes:
                groups.append(group)
                group, size = [], 0
            group.append(f)
            size += f.size
        groups.append(group)
    return [g for g in map(_size_tiered, groups) if len(g) >= options.min_input_files]


def _size_tiered(group: list[Candidate]) -> list[Candidate]:
    """The group without its largest file while that file is larger than all the others together: a file made by an
    earlier compaction is merged again only once as much has come beside it, so each byte is rewritten a few times
    (log of the sizes), not at every compaction while its file is small (what the replaced files of the snapshots
    kept would otherwise hold: the partition again at every compaction)."""
    group = list(group)
    while len(group) > 1:
        largest = max(group, key=lambda c: c.size)
        if largest.size <= sum(c.size for c in group) - largest.size:
            break
        group.remove(largest)
    return group


def candidates(table: Any, offset_column: str) -> list[Candidate]:
    """The table's live data files in its current partition spec (`offset_column`: the column their rows are
    ordered by)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    if table.current_snapshot() is None:
        return []
    field_id = table.schema().find_field(offset_column).field_id
    spec_id = table.spec().spec_id
    out = []
    for task in table.scan().plan_files():
        df = task.file
        if task.delete_files:  # never written by tierproxy; a file with deletes is not ours to rewrite
            continue
        if df.spec_id != spec_id:  # written before the spec evolved: its rows may span the new spec's partitions
            continue
        lower = (df.lower_bounds or {}).get(field_id)
        first = int(from_bytes(LongType(), lower)) if lower is not None else 0
        out.append(Candidate((df.spec_id, *df.partition), first, int(df.file_size_in_bytes), int(df.record_count),
                             df))
    return out


@dataclass(frozen=True)
class Rewritten:
    path: str | None
    rows: int
    error: str | None = None


def conform(rb: Any, target: Any) -> Any:
    """A batch of a data file in the table's current Arrow schema: columns by name, each cast to its current type
    (widened, or made optional, by an evolution), a column the file predates as nulls. Read straight from the file,
    so a null stays a null (pyiceberg's projection reads a null list as an empty one)."""
    import pyarrow as pa

    names = set(rb.schema.names)
    columns = []
    for f in target:
        if f.name in names:
            columns.append(rb.column(f.name).cast(f.type))
        elif f.nullable:
            columns.append(pa.nulls(rb.num_rows, f.type))
        else:
            raise ValueError(f"the file has no column {f.name}, which is required")
    return pa.RecordBatch.from_arrays(columns, schema=target)


def rewrite_group(io_properties: dict[str, str], metadata: Any, files: list[Any], path: str) -> Rewritten:
    """Run on an executor: the group's files (in order) read into one new file at `path` in the table's current
    schema (`conform`). A failure leaves no file."""
    import pyarrow.parquet as pq
    from pyiceberg.io import load_file_io
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    from tierproxy.jobs.iceberg.files import ROW_GROUP_ROWS, LazyParquet

    fileio = load_file_io(properties=io_properties, location=path)
    target = schema_to_pyarrow(metadata.schema())
    out = LazyParquet(fileio, path, target)
    try:
        for df in files:
            with fileio.new_input(df.file_path).open() as f:
                for rb in pq.ParquetFile(f).iter_batches(batch_size=ROW_GROUP_ROWS):
                    out.write(conform(rb, target))
    except Exception as exc:  # whatever pyarrow or the store raises: this group is not compacted
        out.close(discard=True)
        return Rewritten(None, 0, f"{type(exc).__name__}: {str(exc)[:300]}")
    return Rewritten(out.close(), out.rows)


def output_path(group: list[Candidate], pass_id: str) -> str:
    """Next to the group's first file (its partition's directory), named by its first offset and the pass (a
    killed pass's file is an orphan by that name)."""
    first = group[0]
    base = first.file.file_path.rsplit("/", 1)[0]
    return f"{base}/{first.first_offset:020d}-compacted-{uuid.uuid4().hex[:8]}-{pass_id}.parquet"


Runner = Callable[[Callable[[tuple[list[Any], str]], Rewritten], list[tuple[list[Any], str]]], list[Rewritten]]


@dataclass
class Compacted:
    files_in: int = 0
    files_out: int = 0
    rows: int = 0
    skipped: str | None = None  # why a planned compaction was not committed


def compact(table: Any, offset_column: str, options: CompactionOptions, pass_id: str, io_properties: dict[str, str],
            run: Runner, props: dict[str, str], before_commit: Callable[[], None] = lambda: None,
            groups: list[list[Candidate]] | None = None) -> Compacted:
    """Plan (unless the caller passes `groups` it planned), rewrite and commit a table's compaction (the caller holds
    the table's writer lease; the commit, which `props` go into as the snapshot summary, releases it). A group whose
    rewrite fails or does not hold its inputs' rows is left out; a commit that fails (another writer's commit came
    first) leaves the table as it was."""
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    from tierproxy.jobs.iceberg.ledger import WRITER
    from tierproxy.jobs.iceberg.writer import made_by, refused

    result = Compacted()
    if groups is None:
        groups = plan_groups(candidates(table, offset_column), options)
    if not groups:
        return result
    jobs = [([c.file for c in g], output_path(g, pass_id)) for g in groups]
    metadata = table.metadata
    outs = run(lambda job: rewrite_group(io_properties, metadata, job[0], job[1]), jobs)
    keep: list[tuple[list[Candidate], str]] = []
    for g, out in zip(groups, outs, strict=True):
        rows = sum(c.rows for c in g)
        if out.path is None or out.rows != rows:
            why = out.error or f"{out.rows} rows written for {rows} read"
            log.warning("iceberg: compaction of %d files of %s left out: %s", len(g), g[0].file.file_path, why)
            result.skipped = why
            if out.path:
                table.io.delete(out.path)
            continue
        keep.append((g, out.path))
    if not keep:
        return result
    before_commit()
    sent = False  # the swap was sent to the catalog: a failure then may hide a commit it applied
    try:
        with table.transaction() as tx:
            with tx.update_snapshot(snapshot_properties={**props, COMPACTION: pass_id}).overwrite() as ow:
                for g, path in keep:
                    for c in g:
                        ow.delete_data_file(c.file)
                    ow.append_data_file(parquet_file_to_data_file(table.io, tx.table_metadata, path))
            if WRITER in table.properties:
                tx.remove_properties(WRITER)
            sent = True
    except Exception as exc:
        if not sent or refused(exc) or not made_by(table, COMPACTION, pass_id):  # (else: applied, its answer lost)
            if not sent or refused(exc):  # else its outcome unknown: the new files stay, the orphan rule's later
                for _, path in keep:
                    table.io.delete(path)
            result.skipped = f"commit failed: {type(exc).__name__}: {hide_url_passwords(str(exc))[:300]}"
            log.warning("iceberg: compaction not committed (the table is as it was; the next pass tries again): %s",
                        result.skipped)
            return result
    result.files_in = sum(len(g) for g, _ in keep)
    result.files_out = len(keep)
    result.rows = sum(c.rows for g, _ in keep for c in g)
    return result
