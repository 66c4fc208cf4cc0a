"""The Python workers of a local master import PySpark from its installed bytecode, not from Spark's zip
(`tierproxy.jobs.spark.daemon`): the path rule without Spark, then a real session's workers."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tierproxy.jobs.spark.daemon import strip_spark_zips


def _spark_paths(root: Path) -> tuple[str, str]:
    lib = root / "pyspark" / "python" / "lib"
    return str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")


def test_the_zips_leave_the_path_only_where_pyspark_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    zip_, py4j = _spark_paths(tmp_path / "spark")
    site = tmp_path / "site"
    other = str(tmp_path / "elsewhere")
    monkeypatch.setattr(sys, "path", [zip_, py4j, other, str(site)])
    monkeypatch.setattr(sys, "path_importer_cache", {zip_: object(), other: None})
    strip_spark_zips()  # no installed PySpark yet: the zips are its only copy
    assert sys.path == [zip_, py4j, other, str(site)] and zip_ in sys.path_importer_cache
    (site / "pyspark").mkdir(parents=True)
    (site / "pyspark" / "daemon.py").write_text("")
    strip_spark_zips()
    assert sys.path == [other, str(site)]  # the rest of the path, in its order
    assert zip_ not in sys.path_importer_cache and other in sys.path_importer_cache


@pytest.mark.spark
def test_a_local_sessions_workers_load_pyspark_from_its_bytecode() -> None:
    from tests.support.spark import worker_session

    spark: Any = worker_session()
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == "tierproxy.jobs.spark.daemon"

    def where(_: Any) -> Any:
        import pyspark

        yield pyspark.__file__, [p for p in sys.path if p.endswith(".zip")], os.environ.get("PYTHONPATH", "")

    [(module, zips, pythonpath)] = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert "pyspark.zip" in pythonpath  # Spark still puts its zip first on the workers' PYTHONPATH...
    assert ".zip" not in module and not any("pyspark.zip" in z for z in zips)  # ...and they import the package
