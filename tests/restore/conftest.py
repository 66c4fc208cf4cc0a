"""The restore tests' one disaster (`tests/support/restore.py`), set up once for the package's modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.restore import Disaster, disaster_clusters


@pytest.fixture(scope="package")
def disaster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Disaster]:
    with disaster_clusters(tmp_path_factory.mktemp("disaster")) as d:
        yield d
