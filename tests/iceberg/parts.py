"""Parts for the Iceberg tests: `tierproxy iceberg` in its own process, and the table read three ways (DuckDB's
iceberg extension, pyiceberg, `spark.read.format("tierproxy")`) as rows in the order and shape of Spark's Kafka
source, so they compare row for row with what Spark read from the broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def iceberg_cli(workdir: Path, *args: str, env: dict[str, str] | None = None, check: bool = True,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "tierproxy.cli", "iceberg", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=workdir,
                          env={**os.environ, "TIERPROXY_TIER_STATE_DIR": str(workdir / "state"),
                               "TIERPROXY_ICEBERG_ORPHAN_MIN_AGE_MS": "0", **(env or {})})
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


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


def duckdb_connect() -> Any:
    """DuckDB with its iceberg and avro extensions loaded from their PyPI packages (no download at run time)."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "allow_unsigned_extensions": False})
    for pkg, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        path = Path(pkg.__file__).parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
        con.execute(f"LOAD '{path}'")
    con.execute("SET TimeZone='UTC'")
    return con


def duckdb_rows(metadata_location: str, where: str = "") -> list[tuple[Any, ...]]:

    con = duckdb_connect()
    # timestamptz as naive UTC (DuckDB's Python conversion of timestamptz needs pytz)
    cols = ', '.join('CAST("timestamp" AS TIMESTAMP) AS "timestamp"' if c == "timestamp" else f'"{c}"'
                     for c in COLUMNS)
    q = f"SELECT {cols} FROM iceberg_scan('{metadata_location}') {where}"
    cur = con.execute(q)
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
