"""Parts for the Iceberg tests: `tierproxy iceberg` in process (killed in a process of its own), and the table read
three ways (DuckDB's iceberg extension, pyiceberg, `spark.read.format("tierproxy")`) as rows in the order and shape
of Spark's Kafka source, so they compare row for row with what Spark read from the broker."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.cli import run_cli
from tests.support.tiering import tiered

COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def iceberg_cli(workdir: Path, *args: str, env: dict[str, str] | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
    """`tierproxy iceberg ARGS` in this process (`cli.run_cli`), its state under `workdir`."""
    return run_cli("iceberg", *args, cwd=workdir, check=check,
                   env={"TIERPROXY_TIER_STATE_DIR": str(workdir / "state"), "TIERPROXY_ICEBERG_ORPHAN_MIN_AGE_MS": "0",
                        **(env or {})})


def killed_at(cmd: list[str], cwd: Path, env: dict[str, str], point: str) -> None:
    """Run `cmd` (a `tierproxy iceberg` pass) until it reaches the pause point `point`, then SIGKILL it and its
    Spark JVM (the whole process group)."""
    marker = cwd / f"at-{point}-{time.monotonic_ns()}"
    proc = subprocess.Popen(cmd, cwd=cwd, env={**env, "TIERPROXY_ICEBERG_PAUSE_AT": f"{point}:{marker}"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, f"the pass ended (rc {proc.returncode}) before reaching {point}"
            assert time.monotonic() < deadline, f"the pass never reached {point}"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _row(r: dict[str, Any]) -> tuple[Any, ...]:
    headers = r["headers"]
    if headers is not None:
        headers = [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in headers]
    ts = r["timestamp"]
    if getattr(ts, "tzinfo", None) is not None:  # Spark's rows are naive UTC (session time zone UTC)
        ts = ts.replace(tzinfo=None)
    return (None if r["key"] is None else bytes(r["key"]), None if r["value"] is None else bytes(r["value"]),
            r["topic"], r["partition"], r["offset"], ts, r["timestampType"], headers)


def as_rows(arrow: Any) -> list[tuple[Any, ...]]:
    return sorted((_row(r) for r in arrow.select(COLUMNS).to_pylist()), key=lambda r: (r[3], r[4]))


def duckdb_connect(s3: Any = None) -> Any:
    """DuckDB with its iceberg, avro and httpfs extensions loaded from their PyPI packages (no download at run
    time); with `s3` (an S3Server), a secret for it."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "allow_unsigned_extensions": False})
    for pkg, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_httpfs, "httpfs"),
                      (duckdb_extension_iceberg, "iceberg")):
        path = Path(pkg.__file__).parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
        con.execute(f"LOAD '{path}'")
    con.execute("SET TimeZone='UTC'")
    if s3 is not None:
        host = s3.endpoint.removeprefix("http://")
        con.execute(f"CREATE SECRET (TYPE s3, KEY_ID '{s3.access_key}', SECRET '{s3.secret_key}', REGION "
                    f"'{s3.region}', ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)")
    return con


def duckdb_rows(metadata_location: str, where: str = "", s3: Any = None) -> list[tuple[Any, ...]]:
    """A raw table's rows as DuckDB reads them from its metadata file."""
    return duckdb_raw_rows(duckdb_connect(s3), f"iceberg_scan('{metadata_location}')", where)


def duckdb_raw_rows(con: Any, source: str, where: str = "") -> list[tuple[Any, ...]]:
    """A raw table's rows as `con` reads them from `source` (`iceberg_scan(…)` or an attached catalog's table)."""
    # timestamptz as naive UTC (DuckDB's Python conversion of timestamptz needs pytz)
    cols = ', '.join('CAST("timestamp" AS TIMESTAMP) AS "timestamp"' if c == "timestamp" else f'"{c}"'
                     for c in COLUMNS)
    cur = con.execute(f"SELECT {cols} FROM {source} {where}")
    names = [d[0] for d in cur.description]
    return sorted((_row(dict(zip(names, r, strict=True))) for r in cur.fetchall()), key=lambda r: (r[3], r[4]))


def pyiceberg_table(catalog_uri: str, warehouse: str, name: str) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("tierproxy", uri=catalog_uri, warehouse=warehouse).load_table(name)


def pyiceberg_rows(table: Any, snapshot_id: int | None = None, row_filter: str = "True") -> list[tuple[Any, ...]]:
    """pyiceberg 0.12 reads a null list as an empty one (DuckDB reads the same files' nulls as nulls): a record
    without headers is null, as in Spark's Kafka source, either way."""
    rows = as_rows(table.scan(snapshot_id=snapshot_id, row_filter=row_filter).to_arrow())
    return [(*r[:7], r[7] or None) for r in rows]


class Step:
    """`tierproxy iceberg` on one topic's file:// tier and metadata, the embedded catalog beside the tier."""

    def __init__(self, bootstrap: str, tmp: Path, topic: str) -> None:
        self.bootstrap, self.tmp, self.topic = bootstrap, tmp, topic
        self.storage, self.metadata = f"file://{tmp}/tier", f"file://{tmp}/meta"
        self.uri, self.warehouse = f"sqlite:///{tmp}/tier/iceberg/catalog.db", f"file://{tmp}/tier/iceberg"

    def cmd(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "tierproxy.cli", "iceberg", "--once", "--bootstrap-server", self.bootstrap,
                "--storage", self.storage, "--metadata", self.metadata, "--topics", re.escape(self.topic),
                "--master", "local[2]", *extra]

    def env(self, **extra: str) -> dict[str, str]:
        # these tests count a pass's files: compaction (its own test below) off unless a test turns it on
        return {"TIERPROXY_TIER_STATE_DIR": str(self.tmp / "state"), "TIERPROXY_ICEBERG_ORPHAN_MIN_AGE_MS": "0",
                "TIERPROXY_ICEBERG_TARGET_FILE_BYTES": "0", **extra}

    def run(self, *extra: str, **env: str) -> str:
        """One pass in this process: what it printed."""
        return run_cli(*self.cmd(*extra)[3:], env=self.env(**env), cwd=self.tmp, check=True).stdout

    def killed_at(self, point: str, **env: str) -> None:
        """Run in a process of its own until the step reaches `point`, then SIGKILL it (and its Spark JVM: the
        whole process group)."""
        killed_at(self.cmd(), self.tmp, {**os.environ, **self.env(**env)}, point)

    def table(self, name: str = "kafka.history") -> Any:
        return pyiceberg_table(self.uri, self.warehouse, name)

    def data_files_on_disk(self, name: str = "kafka.history") -> set[str]:
        location = Path(self.table(name).location().removeprefix("file://"))
        return {f"file://{p}" for p in (location / "data").rglob("*.parquet")}


def referenced(table: Any) -> list[str]:
    """Data files of the current snapshot (a list: a file referenced twice shows twice)."""
    return [f.file.file_path for f in table.scan().plan_files()]


def reads_whole(table: Any) -> None:
    """Every snapshot the table keeps reads every row its summary counts, and every file it refers to exists."""
    from tierproxy.jobs.iceberg.orphans import referenced as everything

    for snap in table.metadata.snapshots:
        rows = table.scan(snapshot_id=snap.snapshot_id).to_arrow().num_rows
        assert rows == int(snap.summary.additional_properties["total-records"]), snap
    assert all(Path(p.removeprefix("file://")).exists() for p in everything(table))


def unreferenced(table: Any) -> set[str]:
    """Files under the table's location that nothing live refers to (`orphans`)."""
    from tierproxy.jobs.iceberg.orphans import list_files
    from tierproxy.jobs.iceberg.orphans import referenced as everything

    return {p for p, _, _ in list_files(table, "")} - everything(table)


def tier_offsets(s: Any, topic: str) -> list[int]:
    segments = tiered(s, topic)[0]
    return list(range(segments[0].start_offset, segments[-1].end_offset + 1)) if segments else []
