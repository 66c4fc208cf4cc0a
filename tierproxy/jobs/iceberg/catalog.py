"""Opening the catalog and the table, with errors that name what is wrong (exceptions translated here, once).

Catalog URIs: `sqlite:///path/catalog.db` (pyiceberg's SQL catalog; the embedded default lives next to the tier),
any other SQLAlchemy URL (`postgresql+psycopg2://...`) for the SQL catalog on a shared database, and
`rest:http(s)://host/path` for an Iceberg REST catalog. The warehouse (where data files go) defaults to `iceberg/`
under the tier's own storage, `file://` or `s3://`, with the tier's S3 endpoint and credentials.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

from tierproxy.config import hide_url_password, redact
from tierproxy.config.values import TableCollision
from tierproxy.jobs.iceberg.schema import ADDED, iceberg_schema, partition_spec, same_columns, sort_order


class CatalogError(RuntimeError):
    """The catalog cannot be reached or refuses, the namespace is missing, or the table is not ours: the message
    names the catalog, the namespace or the table."""


@dataclass(frozen=True)
class CatalogConfig:
    uri: str
    warehouse: str
    io: dict[str, str] = field(default_factory=dict)  # FileIO properties (S3 endpoint, region, credentials)
    credential: str | None = None  # REST: client_id:secret for OAuth2 (never logged)
    token: str | None = None  # REST: a bearer token (never logged)
    embedded: bool = False  # the default SQLite catalog next to the tier: its namespace is created on first use

    def __repr__(self) -> str:  # secrets stay out of logs and tracebacks
        return f"CatalogConfig(uri={safe_uri(self.uri)!r}, warehouse={self.warehouse!r})"

    def redact(self, text: str) -> str:
        """`text` (an error from the catalog's client, which may quote the URI) without this catalog's secrets."""
        from tierproxy.config.values import url_password

        return redact(text, url_password(self.uri), self.credential, self.token,
                      self.io.get("s3.secret-access-key"))


def warehouse_for(storage: str) -> tuple[str, dict[str, str]]:
    """The default warehouse under the tier's storage and the FileIO properties that reach it."""
    u = urlparse(storage)
    if u.scheme == "file":
        return f"file://{u.path.rstrip('/')}/iceberg", {}
    q = {k: v[-1] for k, v in parse_qs(u.query).items()}
    io: dict[str, str] = {"s3.region": q.get("region") or os.environ.get("AWS_REGION")
                          or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"}
    endpoint = q.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        io["s3.endpoint"] = endpoint
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        io["s3.access-key-id"] = os.environ["AWS_ACCESS_KEY_ID"]
        io["s3.secret-access-key"] = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    prefix = u.path.strip("/")
    return f"s3://{u.netloc}/{prefix + '/' if prefix else ''}iceberg", io


def catalog_config(uri: str | None, storage: str, state_dir: str, *, credential: str | None = None,
                   token: str | None = None, warehouse: str | None = None) -> CatalogConfig:
    default_wh, io = warehouse_for(storage)
    if uri is None:
        u = urlparse(storage)
        base = u.path.rstrip("/") + "/iceberg" if u.scheme == "file" else os.path.abspath(state_dir)
        os.makedirs(base, exist_ok=True)
        return CatalogConfig(f"sqlite:///{base}/catalog.db", warehouse or default_wh, io, embedded=True)
    return CatalogConfig(uri, warehouse or default_wh, io, credential, token)


def open_catalog(cfg: CatalogConfig) -> Any:
    props: dict[str, str] = {"warehouse": cfg.warehouse, **cfg.io}
    try:
        if cfg.uri.startswith("rest:"):
            from pyiceberg.catalog.rest import RestCatalog

            if cfg.credential:
                props["credential"] = cfg.credential
            if cfg.token:
                props["token"] = cfg.token
            return RestCatalog("tierproxy", uri=cfg.uri.removeprefix("rest:"), **props)
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog("tierproxy", uri=cfg.uri, **props)
    except Exception as exc:
        raise CatalogError(f"catalog {safe_uri(cfg.uri)} cannot be used: {_reason(exc, cfg)}") from None

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableShape:
    """What a table of ours is: its schema, partition spec and sort order when created, and whether an existing
    table with `schema` is one (a table of the same name and other columns is refused, never altered)."""

    schema: Callable[[], Any]
    spec: Callable[[Any], Any]  # the schema → the partition spec
    order: Callable[[Any], Any]  # the schema → the sort order
    matches: Callable[[Any], bool]
    description: str
    source: str | None = None  # the one topic the table is made for (a typed or dead-letter table; None: many)
    source_id: str | None = None  # that topic's id when the table is made (recorded beside its name)
    added: tuple[str, ...] = ()  # columns of `schema` an existing table may lack: added (optional) when opened


def raw_shape(by: tuple[str, ...] = ("partition",)) -> TableShape:
    """The raw history table partitioned by `topic` and `iceberg.partition.by`."""
    return TableShape(iceberg_schema, lambda _: partition_spec(by), lambda _: sort_order(),
                      lambda s: same_columns(s, iceberg_schema(), ADDED), "kafka history from the tier", added=ADDED)


RAW = raw_shape()


def open_table(catalog: Any, cfg: CatalogConfig, name: str, shape: TableShape = RAW, *,
               evolve_spec: bool = False) -> Any:
    """The table `NS.NAME`, created with the shape's schema when it does not exist; refused when it exists with
    other columns or its namespace does not exist (created only in the embedded catalog). `evolve_spec`: an existing
    table partitioned otherwise than the shape says is moved to the shape's spec (a metadata commit: its data files
    keep theirs; new ones are written in the new)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    if "." not in name.strip(".") or not all(name.split(".")):
        raise CatalogError(f"iceberg.table {name!r}: name it NAMESPACE.TABLE")
    namespace = name.rpartition(".")[0]
    try:
        try:
            table = catalog.load_table(name)
        except NoSuchTableError:
            table = None
        if table is not None:
            if shape.source is not None:
                table = _one_source(table, name, shape.source)
            if not shape.matches(table.schema()):
                raise CatalogError(f"table {name} exists with another schema ({_columns(table.schema())}); "
                                   f"tierproxy writes ({_columns(shape.schema())}): choose another "
                                   "table name or drop that one")
            table = _add_columns(table, name, shape)
            return _evolve_spec(table, name, shape.spec(table.schema())) if evolve_spec else table
        if not _namespace_exists(catalog, namespace):
            if not cfg.embedded:
                raise CatalogError(f"namespace {namespace!r} does not exist in catalog {safe_uri(cfg.uri)} "
                                   "(create it, or name another in iceberg.table)")
            catalog.create_namespace(namespace)
        schema = shape.schema()
        return catalog.create_table(name, schema=schema, partition_spec=shape.spec(schema),
                                    sort_order=shape.order(schema),
                                    properties={"write.parquet.compression-codec": "zstd",
                                                "tierproxy.table": shape.description,
                                                **({} if shape.source is None else
                                                   {SOURCE: _source(shape.source, shape.source_id)})})
    except (CatalogError, TableCollision):
        raise
    except NoSuchNamespaceError:
        raise CatalogError(f"namespace {namespace!r} does not exist in catalog {safe_uri(cfg.uri)}") from None
    except Exception as exc:
        raise CatalogError(f"catalog {safe_uri(cfg.uri)}: table {name}: {_reason(exc, cfg)}") from None


SOURCE = "tierproxy.source"  # the table property naming the topic a one-topic table is made for


def _source(topic: str, topic_id: str | None) -> str:
    return json.dumps({"topic": topic, "id": topic_id}, sort_keys=True)


def _one_source(table: Any, name: str, topic: str) -> Any:
    """`table` when it was made for `topic`; TableCollision when for another (`a-b` tabled as `a_b`, `a.b` later;
    `Orders` and `orders` in a catalog that folds case answers both names with one table), whenever it appears.
    A table from before the property: its ledger's topics say whose rows it holds, and the property is recorded."""
    from tierproxy.jobs.iceberg.ledger import current_ledger

    if SOURCE in table.properties:
        owners = [json.loads(table.properties[SOURCE])["topic"]]
    else:
        owners = sorted(current_ledger(table).topics)
    other = next((o for o in owners if o != topic), None)
    if other is not None:
        raise TableCollision(f"table {name} holds topic {other!r}, and topic {topic!r} maps to it too: a table "
                             "holds one topic, forever (give one of them a rule of its own, or another table)")
    if SOURCE not in table.properties:
        with table.transaction() as tx:
            tx.set_properties({SOURCE: _source(topic, current_ledger(table).topics.get(topic))})
        table = table.refresh()
    return table


def _add_columns(table: Any, name: str, shape: TableShape) -> Any:
    """A table made before the shape's `added` columns gains them, optional, in a metadata commit (its data files
    stay as they are: readers read null for them there; new rows fill them)."""
    have = {f.name for f in table.schema().fields}
    missing = [c for c in shape.added if c not in have]
    if not missing:
        return table
    wanted = shape.schema()
    with table.update_schema() as update:
        for column in missing:
            update.add_column(column, wanted.find_field(column).field_type, doc=wanted.find_field(column).doc)
    log.info("iceberg: table %s gained the column(s) %s (rows written before them hold null)", name,
             ", ".join(missing))
    return table.refresh()


def name_key(cfg: CatalogConfig, catalog: Any = None, namespaces: Iterable[str] = ()) -> Callable[[str], str]:
    """How the catalog compares table names, the one rule of it. Asked of `catalog` when it can tell: one of
    `namespaces` exists, and the catalog answers its name in another case (one it does not list) as existing too —
    it folds case — or not. Otherwise by its kind: exactly in the SQL catalog on SQLite or PostgreSQL (their text
    comparisons are exact by default), case-folded in any other (MySQL's and MariaDB's default collations fold case;
    a REST catalog may be Glue, Hive or another that folds: refusing two names that differ in case costs a rule,
    merging them would cost a table)."""
    folds = None
    if catalog is not None:
        folds = next((f for f in (_folds_case(catalog, ns) for ns in namespaces) if f is not None), None)
    if folds is None:
        folds = not cfg.uri.startswith(("sqlite", "postgresql"))
    return str.casefold if folds else _exact


def _exact(name: str) -> str:
    return name


def _folds_case(catalog: Any, namespace: str) -> bool | None:
    """Whether the catalog folds the case of names, from how it answers a namespace of ours in another case (a
    top-level one: what `list_namespaces` lists); None when it cannot tell (no letter, no such namespace, both
    exist, or the catalog did not answer: then the catalog's kind decides)."""
    namespace = namespace.split(".")[0]
    other = namespace.swapcase()
    try:
        if other == namespace or not _namespace_exists(catalog, namespace):
            return None
        if other in {".".join(n) for n in catalog.list_namespaces()}:
            return None
        return _namespace_exists(catalog, other)
    except Exception:
        return None


def _evolve_spec(table: Any, name: str, wanted: Any) -> Any:
    from tierproxy.jobs.iceberg.schema import spec_fields

    have, want = spec_fields(table.spec(), table.schema()), spec_fields(wanted, table.schema())
    if set(have) == set(want):  # the fields' order does not change which rows a file may hold
        return table
    with table.update_spec() as update:
        for field in set(have) - set(want):
            update.remove_field(field[2])
        for column, _, field_name in (f for f in want if f not in have):
            update.add_field(column, next(f.transform for f in wanted.fields if f.name == field_name), field_name)
    log.info("iceberg: table %s now partitioned by %s (was %s); its existing files keep theirs", name,
             ", ".join(f"{t}({c})" for c, t, _ in want), ", ".join(f"{t}({c})" for c, t, _ in have))
    return table.refresh()


def load_existing(catalog: Any, cfg: CatalogConfig, name: str) -> Any | None:
    """The table `name` as it is (any of ours: raw, typed, dead letters), None when it does not exist."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(name)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    except Exception as exc:
        raise CatalogError(f"catalog {safe_uri(cfg.uri)}: table {name}: {_reason(exc, cfg)}") from None


def _namespace_exists(catalog: Any, namespace: str) -> bool:
    from pyiceberg.exceptions import NoSuchNamespaceError

    try:
        catalog.load_namespace_properties(namespace)
        return True
    except NoSuchNamespaceError:
        return False


_IDS = re.compile(r"\b\d+: ")  # nested field ids, which each catalog assigns its own way


def _columns(schema: Any) -> str:
    return ", ".join(f"{f.name} {_IDS.sub('', str(f.field_type))}" for f in schema.fields)


def safe_uri(uri: str) -> str:
    """A catalog URI without its password."""
    return hide_url_password(uri)


def _reason(exc: BaseException, cfg: CatalogConfig) -> str:
    """An exception's first line, without the catalog's secrets (a client's error may quote its URI whole)."""
    text = cfg.redact(str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__
