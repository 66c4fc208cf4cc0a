"""Parts the Iceberg tests share beyond one module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.rest_catalog import RestCatalogServer


@pytest.fixture(scope="session")
def rest_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestCatalogServer]:
    """One Apache Iceberg REST catalog server for the session (~5 s to start); each test writes under a namespace
    of its own (`RestCatalogServer.namespace`)."""
    server = RestCatalogServer(tmp_path_factory.mktemp("rest-catalog"))
    yield server
    server.stop()
