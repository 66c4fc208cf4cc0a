"""A real Iceberg REST catalog for the tests: Apache Iceberg's own REST catalog server
(`org.apache.iceberg.rest.RESTCatalogServer`, what the `apache/iceberg-rest-fixture` image runs), its jars resolved
from Maven Central on first use as the Kafka jars and Apicurio are, on a free loopback port; and the engines a user
points at it: pyiceberg, DuckDB (`ATTACH … (TYPE iceberg)`) and Spark with Iceberg's runtime (a `SparkCatalog` of
`type=rest`). A server that cannot start fails the test in CI (`parts.unavailable`), never skips it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.support.jvm import java_command
from tests.support.parts import stop_process, unavailable
from tierproxy.dev.maven import Artifact, MavenUnavailable, resolve
from tierproxy.dev.ports import free_port

# 1.10.0: the newest release whose test fixtures Maven Central holds beside the jars the server needs (1.12.0 has no
# `iceberg-open-api:test-fixtures`); the server speaks the REST spec the 1.12 clients (Spark's runtime) speak
ICEBERG_VERSION = "1.10.0"
# what the server needs at run time: Jetty 11, a JDBC catalog on SQLite behind it, Hadoop's Configuration (shaded
# client jars)
_REST_DEPS = [("org.apache.iceberg", "iceberg-open-api", ICEBERG_VERSION, "test-fixtures"),
              ("org.apache.iceberg", "iceberg-open-api", ICEBERG_VERSION, None),
              ("org.apache.iceberg", "iceberg-core", ICEBERG_VERSION, None),
              ("org.apache.iceberg", "iceberg-core", ICEBERG_VERSION, "tests"),  # RESTCatalogServlet, the adapter
              ("org.eclipse.jetty", "jetty-servlet", "11.0.25", None),
              ("org.apache.hadoop", "hadoop-client-api", "3.4.1", None),
              ("org.apache.hadoop", "hadoop-client-runtime", "3.4.1", None),
              ("org.xerial", "sqlite-jdbc", "3.49.1.0", None),
              ("org.slf4j", "slf4j-simple", "2.0.17", None)]


def rest_catalog_jars() -> str:
    """The REST catalog server's classpath, resolved once with Maven into the project cache."""
    try:
        libs = resolve(f"iceberg-rest-{ICEBERG_VERSION}", [Artifact(*d) for d in _REST_DEPS])
    except MavenUnavailable as exc:
        unavailable("Iceberg REST catalog", str(exc))
    return f"{libs}/*"


class RestCatalogServer:
    """Apache Iceberg's REST catalog server on a free port (its JDBC catalog on SQLite in `workdir`, its warehouse
    under `workdir`: the server, not the client, places tables)."""

    def __init__(self, workdir: Path, timeout: float = 60) -> None:
        self.port = free_port()
        self.warehouse = f"file://{workdir}/rest-warehouse"
        self.log = workdir / "rest-catalog.log"
        env = {**os.environ, "CATALOG_WAREHOUSE": self.warehouse, "CATALOG_URI": f"jdbc:sqlite:file:{workdir}/rest.db",
               "CATALOG_JDBC_SCHEMA__VERSION": "V1", "CATALOG_REST_PORT": str(self.port)}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([*java_command(), "-cp", rest_catalog_jars(),
                                          "org.apache.iceberg.rest.RESTCatalogServer"],
                                         stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while "Started Server" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                unavailable("Iceberg REST catalog", self.log.read_text(errors="replace")[-3000:])
            time.sleep(0.3)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def catalog(self) -> Any:
        """pyiceberg's client of this catalog."""
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog("check", uri=self.uri)

    def namespace(self, name: str) -> str:
        """`name`, created if missing, as the catalog's owner would (tierproxy creates none in a catalog not its
        own); tests sharing the server each use a namespace of their own."""
        from pyiceberg.exceptions import NamespaceAlreadyExistsError

        with contextlib.suppress(NamespaceAlreadyExistsError):
            self.catalog().create_namespace(name)
        return name

    def duckdb(self) -> Any:
        """DuckDB with this catalog attached as `rest` (its tables are `rest.<namespace>.<table>`)."""
        from tests.support.iceberg import duckdb_connect

        con = duckdb_connect()
        con.execute(f"ATTACH '' AS rest (TYPE iceberg, ENDPOINT '{self.uri}', AUTHORIZATION_TYPE 'none')")
        return con

    def spark_read(self, table: str, columns: list[str]) -> tuple[str, list[str], dict[str, str]]:
        """A read for `spark_iceberg_reads` of `table` (`namespace.name`) through this catalog: the table in a Spark
        catalog of Iceberg's runtime (`org.apache.iceberg.spark.SparkCatalog`, `type=rest`), `columns`, and that
        catalog's configuration."""
        name = f"rest_{self.port}"  # Spark keeps a catalog by its name: one name per server
        prefix = f"spark.sql.catalog.{name}"
        return f"{name}.{table}", columns, {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "rest",
                                            f"{prefix}.uri": self.uri}

    def stop(self) -> None:
        stop_process(self.proc, 20)
